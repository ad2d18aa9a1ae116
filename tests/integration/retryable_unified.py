"""MongoDB's unified-format retryable-writes spec tests against a shard or a proxy (issue #16).

The files come from mongodb/specifications (source/retryable-writes/tests/unified/). This
module extends crud_unified.Runner (which turns each CRUD operation into the server command
a driver sends) with the driver's part of the retryable writes specification, so that what
is tested is the SERVER's side of it:

- a session per client entity (pymongo explicit session: its lsid on every command) and,
  for a retryable write (insert, update/delete without multi statements, findAndModify,
  not unacknowledged, client retryWrites not false), a txnNumber incremented per write;
- one retry with the same lsid/txnNumber after a network error (the connection closed by
  the failCommand closeConnection option) or an error, or writeConcernError, labelled
  RetryableWriteError BY THE SERVER (MongoDB 4.4+ drivers do not label server errors
  themselves); a network error of a retryable write gets the label from the "driver";
  when the retry fails with NoWritesPerformed the first error is reported;
- the testRunner failPoint operation: configureFailPoint (failCommand, or
  onPrimaryTransactionalWrite, which only a replica set member has) sent to the server (it
  must run with test commands on), the fail points turned off after each test;
- expectEvents for commandStartedEvent (pymongo command monitoring): the commands sent for
  the client entity, in order, matched as the unified format says (root-level extra fields
  allowed); fail point, initialData and outcome commands are not observed.

Skips carry their reason: runOnRequirements the server does not meet (version, topology,
auth), MongoDB 8.0's client bulkWrite, a feature stripedb refuses (docs/compat.md), other
fail points.

    python3 retryable_unified.py mongodb://127.0.0.1:PORT [FILE.json ...]
"""
import itertools
import os
import sys

import pymongo
import pymongo.network
from bson import Int64, SON
from pymongo import monitoring

import crud_unified
from crud_unified import ClientError, NetworkError, ServerError, Skip, MISSING, match

NAME = "mongodb-retryable-writes-unified"
# After a network error the driver rediscovers the server no sooner than
# minHeartbeatFrequencyMS (500 ms, SDAM spec); drivers' own spec runners lower it, as here,
# so that the many closeConnection tests stay fast. Likewise pymongo 3.11's monitor notices
# that its streaming hello was cancelled (the app connection failed) by polling every 500 ms.
# Module-level: pymongo reads both at use.
pymongo.common.MIN_HEARTBEAT_INTERVAL = 0.02
pymongo.network._POLL_TIMEOUT = 0.02

# txnNumbers only grow, across tests: pymongo hands an ended session's lsid to the next
# session, and a server answers a reused (lsid, txnNumber) from its record of the first.
_TXN = itertools.count(1)


def compat_dir():
    return crud_unified.compat_dir(NAME)


class Listener(monitoring.CommandListener):
    """Records commandStartedEvents for the client entity in self.current (None: off)."""

    def __init__(self):
        self.current = None
        self.events = {}

    def started(self, event):
        if self.current is not None:
            self.events.setdefault(self.current, []).append(
                {"commandName": event.command_name, "databaseName": event.database_name,
                 "command": dict(event.command)})

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


class RetryRunner(crud_unified.Runner):
    """crud_unified.Runner plus sessions, retries, fail points and command monitoring."""

    checks_events = True  # check_events: pymongo command monitoring

    def __init__(self, uri, spec):
        self.listener = Listener()
        super().__init__(uri, spec, event_listeners=[self.listener])
        self.clients = {}
        self.db_client = {}  # database/collection entity id -> client entity id
        self.cur_obj = None

    # -- entities

    def create_entities(self, entities=None, reset=True):
        if reset:
            for c in getattr(self, "clients", {}).values():
                c["session"].end_session()
            self.entities, self.clients, self.unacknowledged = {}, {}, set()
            self.db_client = {}
            self.listener.events = {}
        for e in (self.spec.get("createEntities", []) if entities is None else entities):
            (kind, d), = e.items()
            if kind == "client":
                for ev in d.get("observeEvents", []):
                    if ev != "commandStartedEvent":
                        raise Skip(f"observing {ev} is not supported by this runner")
                retry = d.get("uriOptions", {}).get("retryWrites", True)
                self.entities[d["id"]] = ("client", d["id"])
                self.clients[d["id"]] = {"retry": retry, "session": self.client.start_session(),
                                         "observe": bool(d.get("observeEvents"))}
            elif kind == "database":
                self.entities[d["id"]] = ("database", d["databaseName"])
                self.db_client[d["id"]] = d["client"]
            elif kind == "collection":
                dbname = self.entities[d["database"]][1]
                self.entities[d["id"]] = ("collection", (dbname, d["collectionName"]))
                self.db_client[d["id"]] = self.db_client[d["database"]]
                wc = d.get("collectionOptions", {}).get("writeConcern", {})
                if wc.get("w") == 0:
                    self.unacknowledged.add(d["id"])
            else:
                raise Skip(f"entity kind {kind} is not supported by this runner")

    # -- the driver's part: sessions, txnNumber, one retry

    def _retryable(self, command):
        name = next(iter(command))
        if name in ("insert", "findAndModify"):
            return True
        if name == "update":
            return not any(u.get("multi") for u in command["updates"])
        if name == "delete":
            return all(d.get("limit") == 1 for d in command["deletes"])
        return False

    def _send(self, dbname, command, session):
        try:
            return self.client[dbname].command(command, codec_options=self.opts,
                                               session=session)
        except pymongo.errors.OperationFailure as e:
            raise ServerError(e.details or {"errmsg": str(e), "code": e.code})
        except pymongo.errors.NotMasterError as e:  # a reply: not-primary/shutdown codes
            d = e.details if isinstance(e.details, dict) else None
            if d and "ok" in d:
                raise ServerError(d)
            raise NetworkError(str(e))
        except pymongo.errors.ConnectionFailure as e:
            raise NetworkError(str(e))

    def _check_wce(self, reply):
        """A writeConcernError in an ok reply is the operation's error (the driver's)."""
        wce = reply.get("writeConcernError")
        if not wce:
            return reply
        err = dict(reply)
        err.update({"code": wce.get("code"), "codeName": wce.get("codeName"),
                    "errmsg": wce.get("errmsg", "")})
        raise ServerError(err)

    def cmd(self, dbname, command):
        """Send a command for the current client entity (observed, with its session)."""
        cid = self.db_client.get(self.cur_obj) if self.cur_obj else None
        if cid is None:
            return super().cmd(dbname, command)  # runner-internal: unobserved
        cl = self.clients[cid]
        command = SON(command)
        name = next(iter(command))
        write = name in ("insert", "update", "delete", "findAndModify")
        if write and self.cur_obj in self.unacknowledged:
            command["writeConcern"] = {"w": 0}
        retry = write and cl["retry"] and self.cur_obj not in self.unacknowledged and \
            self._retryable(command)
        if retry:
            command["txnNumber"] = Int64(next(_TXN))
        self.listener.current = cid if cl["observe"] else None
        try:
            if self.cur_obj in self.unacknowledged and write:
                try:  # a driver sends it with moreToCome: nothing comes back
                    self._send(dbname, command, cl["session"])
                except ServerError:
                    pass
                return {"ok": 1}
            try:
                return self._check_wce(self._send(dbname, command, cl["session"]))
            except (ServerError, NetworkError) as first:
                if isinstance(first, NetworkError) and retry:
                    first.reply["errorLabels"].append("RetryableWriteError")
                if not retry or "RetryableWriteError" not in first.reply.get("errorLabels",
                                                                               []):
                    raise
                try:
                    return self._check_wce(self._send(dbname, command, cl["session"]))
                except NetworkError as second:
                    second.reply["errorLabels"].append("RetryableWriteError")
                    raise
                except ServerError as second:
                    if "NoWritesPerformed" in second.reply.get("errorLabels", []):
                        raise first
                    raise
        finally:
            self.listener.current = None

    # -- operations

    def run_operation(self, op):
        if op["object"] == "testRunner":
            args = op.get("arguments", {})
            if op["name"] == "failPoint":
                fp = args["failPoint"]
                if fp["configureFailPoint"] not in ("failCommand",
                                                    "onPrimaryTransactionalWrite"):
                    raise Skip(f"the {fp['configureFailPoint']} fail point is not built")
                self.cur_obj = None
                self.fail_points.add(fp["configureFailPoint"])
                # failCommand's closeConnection; onPrimaryTransactionalWrite closes the
                # connection unless its data says closeConnection: false (mongod's)
                data = fp.get("data") or {}
                if data.get("closeConnection",
                            fp["configureFailPoint"] == "onPrimaryTransactionalWrite"):
                    self.closes_connection = True
                super().cmd("admin", SON(fp))
                return None
            if op["name"] == "createEntities":
                self.create_entities(args["entities"], reset=False)
                return None
        self.cur_obj = op["object"]
        try:
            return super().run_operation(op)
        finally:
            self.cur_obj = None

    def check_error(self, exp, exc):
        if isinstance(exc, NetworkError):
            if not self.closes_connection:  # a crash or a hang never meets expectError
                return f"a network error with no closeConnection fail point set: {exc!r}"
            if exp.get("isClientError") is False or "errorCode" in exp or \
                    "errorCodeName" in exp or "errorResponse" in exp:
                return f"expected a server error, got a network error {exc}"
            return crud_unified.check_labels(exp, exc.reply["errorLabels"])
        return super().check_error(exp, exc)

    def check_events(self, expected):
        for block in expected or []:
            if block.get("eventType", "command") != "command":
                raise Skip(f"{block['eventType']} events are not observed by this runner")
            got = self.listener.events.get(block["client"], [])
            exp = block["events"]
            if len(exp) != len(got):
                return (f"client {block['client']}: expected {len(exp)} events, got "
                        f"{len(got)}: {[g['commandName'] for g in got]}")
            for i, (e, g) in enumerate(zip(exp, got)):
                (kind, d), = e.items()
                if kind != "commandStartedEvent":
                    raise Skip(f"{kind} is not observed by this runner")
                for k in ("commandName", "databaseName"):
                    if k in d and d[k] != g[k]:
                        return f"event {i}: {k} {d[k]!r}, got {g[k]!r}"
                if "command" in d:
                    m = match(d["command"], g["command"], True, f"event {i} command")
                    if m:
                        return m
        return None

    def run_test(self, test):
        try:
            status, detail = super().run_test(test)
            if status == "passed":
                r = self.check_events(test.get("expectEvents"))
                if r:
                    return "failed", r
            return status, detail
        except Skip as s:
            return "skipped", str(s)
        finally:
            self.cur_obj = None  # (crud_unified.Runner.run_test turned the fail points off)

    def close(self):
        for c in self.clients.values():
            c["session"].end_session()
        super().close()


def run_file(uri, path):
    """Run every test of one file: (file name, [(description, status, detail)])."""
    return crud_unified.run_file(uri, path, RetryRunner)


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    files = argv[2:] or sorted(os.path.join(compat_dir(), f) for f in os.listdir(compat_dir())
                               if f.endswith(".json"))
    return crud_unified.run_files(argv[1], files, run_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
