"""A TCP relay in front of a shard that hands the proxy's OWN shard connections
(src/proxy/shardwire.c: their hello names the driver "stripedb") to an impostor, while
every other connection (libmongoc's monitoring and pool, the metadata service) reaches the
real shard byte for byte. The impostor plays one of two parts:

  "signature": answers hello and a SCRAM-SHA-256 conversation as if it knew the cluster
      key (a well-formed server-first, then done: true with a made-up server signature)
      and answers any later command {ok: 1, n: 1} -- a server that does not know the key;
  "other": relays them, byte for byte, to another server (other_port), as when another
      process (a member of another shard) took over the member's address;
  "garbage": relays hello and authentication to the real shard, then answers the first
      other command with bytes that are not an OP_MSG reply and closes;
  "big-bad-bson", "big-short-doc": the same, but the answer is a large (over 16 KiB: read
      straight into the reply's own buffer, shardwire.c recv_into) OP_MSG to that command
      whose document is invalid BSON, or a valid document followed by bytes that are not a
      section.

`commands` lists the names of the commands the impostor received beyond hello and
authentication."""
import base64
import os
import socket
import struct
import threading

import bson

OP_MSG = 2013
AUTH = {"hello", "isMaster", "ismaster", "saslStart", "saslContinue"}


def _recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        k = s.recv(n - len(buf))
        if not k:
            raise ConnectionError("eof")
        buf += k
    return buf


def _read_msg(s):
    hdr = _recv_exact(s, 16)
    length, req, _resp, op = struct.unpack("<iiii", hdr)
    return hdr + _recv_exact(s, length - 16), req, op


def _body(msg):
    # OP_MSG: header(16) flagBits(4) kind(1) document
    return bson.decode(msg[21:21 + struct.unpack("<i", msg[21:25])[0]])


def _reply(s, req, doc):
    body = struct.pack("<I", 0) + b"\x00" + bson.encode(doc)
    s.sendall(struct.pack("<iiii", 16 + len(body), 1, req, OP_MSG) + body)


class Impostor:
    def __init__(self, target_port, mode, other_port=None):
        self.target = ("127.0.0.1", target_port)
        self.other = ("127.0.0.1", other_port)
        self.mode = mode
        self.commands = []
        self.own = 0  # own connections seen
        self.lock = threading.Lock()
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.closed = True
        self.ls.close()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            first, req, op = _read_msg(c)
            own = False
            if op == OP_MSG:
                doc = _body(first)
                own = doc.get("client", {}).get("driver", {}).get("name") == "stripedb"
            if not own:
                self._relay(c, first)
                return
            with self.lock:
                self.own += 1
            if self.mode == "other":
                self._relay(c, first, self.other)
            elif self.mode == "signature":
                self._fake(c, first, req)
            else:
                self._garbage(c, first)
        except (OSError, ConnectionError, bson.errors.BSONError):
            pass
        finally:
            c.close()

    def _relay(self, c, first, target=None):
        u = socket.create_connection(target or self.target)
        u.sendall(first)

        def pump(a, b):
            try:
                while True:
                    d = a.recv(65536)
                    if not d:
                        break
                    b.sendall(d)
            except OSError:
                pass
            finally:
                for x in (a, b):
                    try:
                        x.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        t = threading.Thread(target=pump, args=(u, c), daemon=True)
        t.start()
        pump(c, u)
        t.join()
        u.close()

    def _fake(self, c, msg, req):
        while True:
            doc = _body(msg)
            name = next(iter(doc))
            if name in ("hello", "isMaster", "ismaster"):
                _reply(c, req, {"ok": 1, "isWritablePrimary": True, "ismaster": True,
                                "maxWireVersion": 17, "minWireVersion": 0,
                                "maxBsonObjectSize": 16777216,
                                "maxMessageSizeBytes": 48000000})
            elif name == "saslStart":
                first = bytes(doc["payload"]).decode()
                cnonce = first.split("r=", 1)[1]
                salt = base64.b64encode(os.urandom(16)).decode()
                payload = f"r={cnonce}{base64.b64encode(os.urandom(18)).decode()},s={salt},i=15000"
                _reply(c, req, {"ok": 1, "conversationId": 1, "done": False,
                                "payload": payload.encode()})
            elif name == "saslContinue":
                v = base64.b64encode(os.urandom(32)).decode()
                _reply(c, req, {"ok": 1, "conversationId": 1, "done": True,
                                "payload": f"v={v}".encode()})
            else:
                with self.lock:
                    self.commands.append(name)
                _reply(c, req, {"ok": 1, "n": 1})
            msg, req, _ = _read_msg(c)

    def _garbage_bytes(self, msg):
        _, req, _, _ = struct.unpack("<iiii", msg[:16])
        if self.mode == "big-bad-bson":
            # a 20,000-byte document whose one string element claims 2 GiB
            n = 20000
            doc = struct.pack("<i", n) + b"\x02a\x00" + struct.pack("<i", 0x7fffffff)
            doc += b"x" * (n - len(doc) - 1) + b"\x00"
        elif self.mode == "big-short-doc":
            doc = bson.encode({"ok": 1, "n": 1}) + b"\x00" * 20000
        else:
            return b"\x20\x00\x00\x00" + b"garbage!" * 3 + b"\x00" * 4
        body = struct.pack("<I", 0) + b"\x00" + doc
        return struct.pack("<iiii", 16 + len(body), 1, req, OP_MSG) + body

    def _garbage(self, c, first):
        u = socket.create_connection(self.target)
        try:
            msg = first
            while True:
                doc = _body(msg)
                name = next(iter(doc))
                if name not in AUTH:
                    with self.lock:
                        self.commands.append(name)
                    c.sendall(self._garbage_bytes(msg))
                    return
                u.sendall(msg)
                answer, _, _ = _read_msg(u)
                c.sendall(answer)
                msg, _, _ = _read_msg(c)
        finally:
            u.close()
