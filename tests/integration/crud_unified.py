"""A runner for MongoDB's unified-format CRUD specification tests against one server.

The test files come from mongodb/specifications (source/crud/tests/unified/); the format is
described in source/unified-test-format/unified-test-format.md. stripedb tests a SERVER, so
this runner plays the driver's part itself: every CRUD operation is turned into the server
command a driver sends for it (CRUD spec: insert/update/delete/find/aggregate/count/distinct/
findAndModify, with getMore to drain cursors), sent through pymongo's `Database.command`,
and the reply is turned back into the driver-level result the test expects. That keeps the
check independent of the installed pymongo version (Debian 12 ships pymongo 3.11, which
predates `comment` on write helpers).

What is checked: initialData, each operation's expectResult or expectError (isError,
isClientError, errorCode, errorCodeName, errorContains, errorResponse, and a bulk write's
partial result), and outcome. expectEvents (command monitoring) is about drivers and is
ignored, but what a driver adds to a command from the entities' options is sent (client
uriOptions readConcernLevel and w, databaseOptions / collectionOptions readConcern,
writeConcern and readPreference: readConcern and $readPreference on reads, writeConcern on
writes, all three on aggregate with $out/$merge), so the server answers what it would get.

The topology runOnRequirements are checked against is learnt from the server's hello, as a
driver's SDAM does: "sharded" for a mongos (msg: "isdbgrid", a stripedb proxy), "replicaset"
for a replica set member (setName, a shard started with --replica-set), else "single".

The testRunner failPoint operation sends its configureFailPoint (MongoDB's failCommand fail
point, src/wire/failpoint.c) to the admin database of the server: the server must run with
--enable-test-commands. Every fail point a test set is turned off (mode "off") when the test
ends, whatever its end. A connection the server closes (failCommand closeConnection) is a
network error: a client-side error for expectError (isClientError: true; the runner's client
has retryReads and retryWrites off). Matching follows "Evaluating Matches": numbers compare by value whatever their BSON
type, $$unsetOrMatches / $$exists / $$type / $$lte are honoured, and extra fields are
allowed only in root-level result documents (the result document, or each document of a
result array such as a cursor's); nested documents and the outcome's documents must match
exactly.

Skips (each with its reason): runOnRequirements that exclude the server's version (stripedb
reports 6.0.0) or its topology (a test the spec runs on a standalone or replica set only,
through a proxy), a refusal listed in docs/compat.md's refusal table, and test-level
skipReason.

Usable as a library (run_file) and from the command line:
    python3 crud_unified.py mongodb://127.0.0.1:PORT [FILE.json ...]
"""
import copy
import glob
import json
import os
import re
import sys

from bson import json_util, ObjectId, SON, Int64, Decimal128
from bson.codec_options import CodecOptions
import pymongo


def server_topology(client):
    """The unified format's topology name of the server client talks to, learnt from its
    hello reply as a driver's SDAM does: "sharded" for a mongos (msg "isdbgrid"),
    "replicaset" for a replica set member (setName), else "single"."""
    hello = client.admin.command("hello")
    if hello.get("msg") == "isdbgrid":
        return "sharded"
    if hello.get("setName"):
        return "replicaset"
    return "single"


class ClientError(Exception):
    """An error the driver raises without asking the server (validation, bad arguments)."""


class ServerError(Exception):
    def __init__(self, reply, partial=None):
        self.reply = reply or {}
        self.code = self.reply.get("code")
        self.code_name = self.reply.get("codeName")
        self.errmsg = self.reply.get("errmsg", "")
        self.partial = partial  # a bulk write's result so far
        super().__init__(f"server error {self.code} {self.code_name}: {self.errmsg}")


class NetworkError(ServerError):
    """The connection failed while a command was in flight (no reply): a client-side error
    for expectError (isClientError: true), as the unified format counts network errors."""

    def __init__(self, msg, labels=()):
        Exception.__init__(self, msg)
        self.reply = {"errorLabels": list(labels), "errmsg": msg}
        self.code = None
        self.code_name = None
        self.errmsg = msg
        self.partial = None


class Skip(Exception):
    pass


def refusal_table(path=None):
    """The rows of docs/compat.md's refusal table: [{feature, code, fragment, example}]."""
    if path is None:
        here = os.path.dirname(os.path.abspath(__file__))
        root = os.environ.get("STRIPEDB_SRCDIR") or os.path.join(here, "..", "..")
        path = os.path.join(root, "docs", "compat.md")
    rows, inside = [], False
    with open(path) as f:
        for line in f:
            if line.startswith("<!-- refusal-table"):
                inside = True
                continue
            if line.startswith("<!-- end of refusal-table"):
                break
            if not inside or not line.startswith("| ") or line.startswith("| feature") or \
                    line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            feature, code, frag, example = cells[0], cells[1], cells[2], cells[3]
            rows.append({"feature": feature, "code": int(code.split()[0]),
                         "fragment": frag.strip("`"),
                         "example": json_util.loads(example.strip("`"))})
    return rows


REFUSALS = refusal_table()


def refusal_of(exc):
    """The docs/compat.md row whose refusal exc is (a ServerError), or None."""
    if not isinstance(exc, ServerError):
        return None
    for r in REFUSALS:
        if exc.code == r["code"] and r["fragment"] in exc.errmsg:
            return r
    return None


def compat_dir(name="mongodb-crud-unified"):
    """Where spec files are: $STRIPEDB_COMPAT_DIR (the compat folder, or the set itself for
    the CRUD set), else ../shared/compat/NAME of the repo, else /work/shared/compat/NAME."""
    env = os.environ.get("STRIPEDB_COMPAT_DIR")
    if env:
        d = env if os.path.basename(env.rstrip("/")) == name else os.path.join(env, name)
        if os.path.isdir(d):
            return d
        if name == "mongodb-crud-unified" and os.path.isdir(env):
            return env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.environ.get("STRIPEDB_SRCDIR") or os.path.join(here, "..", "..")
    for cand in (os.path.join(root, "..", "shared", "compat", name),
                 os.path.join("/work/shared/compat", name)):
        if os.path.isdir(cand):
            return os.path.abspath(cand)
    return None


def load_file(path):
    with open(path) as f:
        return json_util.loads(f.read(), json_options=json_util.CANONICAL_JSON_OPTIONS)


# ----------------------------------------------------------------------------- matching

def _is_num(v):
    return isinstance(v, (int, float, Decimal128)) and not isinstance(v, bool)


def _num(v):
    if isinstance(v, Decimal128):
        return float(v.to_decimal())
    return v


_TYPE_NAMES = {
    "double": float, "string": str, "object": dict, "array": list, "objectId": ObjectId,
    "bool": bool, "null": type(None), "int": int, "long": int, "decimal": Decimal128,
}


def _type_ok(v, names):
    if isinstance(names, str):
        names = [names]
    for n in names:
        if n == "int" and isinstance(v, int) and not isinstance(v, (bool, Int64)):
            return True
        if n == "long" and isinstance(v, Int64):
            return True
        if n == "number" and _is_num(v):
            return True
        t = _TYPE_NAMES.get(n)
        if t and n not in ("int", "long") and isinstance(v, t):
            if t is int and isinstance(v, bool):
                continue
            return True
        if n == "date" and v.__class__.__name__ == "datetime":
            return True
    return False


MISSING = object()


def match(expected, actual, root=True, path="$"):
    """Return None when actual matches expected, else a string saying where it differs."""
    if isinstance(expected, dict) and len(expected) == 1:
        (k, v), = expected.items()
        if k == "$$unsetOrMatches":
            if actual is MISSING or actual is None:
                return None
            return match(v, actual, root, path)
        if k == "$$exists":
            ok = (actual is not MISSING) == bool(v)
            return None if ok else f"{path}: $$exists {v} but got {actual!r}"
        if k == "$$type":
            return None if actual is not MISSING and _type_ok(actual, v) else \
                f"{path}: expected type {v}, got {actual!r}"
        if k == "$$lte":
            return None if _is_num(actual) and _num(actual) <= _num(v) else \
                f"{path}: expected <= {v}, got {actual!r}"
        if k.startswith("$$"):
            raise Skip(f"special operator {k} is not supported by this runner")
    if actual is MISSING:
        return f"{path}: missing, expected {expected!r}"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path}: expected a document, got {actual!r}"
        for k, v in expected.items():
            r = match(v, actual.get(k, MISSING), False, f"{path}.{k}")
            if r:
                return r
        if not root:
            extra = [k for k in actual if k not in expected]
            if extra:
                return f"{path}: unexpected fields {extra} in {dict(actual)!r}"
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list):
            return f"{path}: expected an array, got {actual!r}"
        if len(expected) != len(actual):
            return f"{path}: expected {len(expected)} elements, got {len(actual)}: {actual!r}"
        # documents of a root-level array (a cursor's results) are root-level documents
        for i, (e, a) in enumerate(zip(expected, actual)):
            r = match(e, a, root, f"{path}[{i}]")
            if r:
                return r
        return None
    if _is_num(expected):
        if _is_num(actual) and _num(expected) == _num(actual):
            return None
        return f"{path}: expected {expected!r}, got {actual!r}"
    if isinstance(expected, bool) or isinstance(actual, bool):
        return None if type(expected) is type(actual) and expected == actual else \
            f"{path}: expected {expected!r}, got {actual!r}"
    return None if expected == actual else f"{path}: expected {expected!r}, got {actual!r}"


# ----------------------------------------------------------------------------- commands

def _write_error(reply):
    """The driver's error for a single write's writeErrors[0]: its code and message, with
    the reply's top-level errorLabels (a retryable write's labels live there)."""
    err = dict(reply["writeErrors"][0])
    if "errorLabels" in reply:
        err["errorLabels"] = list(reply["errorLabels"])
    return err


def check_labels(exp, labels):
    """None when labels (an error's errorLabels) meet expectError exp's errorLabelsContain
    and errorLabelsOmit, else why not."""
    for lab in exp.get("errorLabelsContain", []):
        if lab not in labels:
            return f"error label {lab} missing"
    for lab in exp.get("errorLabelsOmit", []):
        if lab in labels:
            return f"error label {lab} present"
    return None


class Runner:
    """Runs one spec file against one server (pymongo client to its URI)."""

    def __init__(self, uri, spec, **client_kwargs):
        self.uri = uri
        self.spec = spec
        self.client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=10000,
                                          retryWrites=False, retryReads=False,
                                          **client_kwargs)
        self.opts = CodecOptions(document_class=dict, tz_aware=False)
        info = self.client.admin.command("buildInfo")
        self.version = tuple(int(x) for x in re.findall(r"\d+", info["version"])[:3])
        # what runOnRequirements' topologies are checked against
        self.topology = server_topology(self.client)
        self.entities = {}
        self.fail_points = set()  # fail points configured by the current test
        # a fail point of the current test closes connections: only then is a network
        # error the client-side error a test may expect (else it is a failure: a crash
        # or a hang must never satisfy expectError)
        self.closes_connection = False
        self.cur_opts = {}  # the options of the entity of the current operation

    def close(self):
        self.client.close()

    # -- plumbing

    def cmd(self, dbname, command):
        """Send command; return the reply; raise ServerError on ok: 0."""
        try:
            return self.client[dbname].command(command, codec_options=self.opts)
        except pymongo.errors.OperationFailure as e:
            raise ServerError(e.details or {"errmsg": str(e), "code": e.code})
        except pymongo.errors.NotMasterError as e:  # a reply: not-primary/shutdown codes
            d = e.details if isinstance(e.details, dict) else None
            if d and "ok" in d:
                raise ServerError(d)
            raise NetworkError(str(e))
        except pymongo.errors.ConnectionFailure as e:  # e.g. failCommand closeConnection
            raise NetworkError(str(e))

    def drain(self, dbname, coll, reply, batch_size=None):
        cur = reply["cursor"]
        docs = list(cur.get("firstBatch", []))
        cid = cur.get("id", 0)
        ns_coll = cur.get("ns", "").split(".", 1)[1] if "." in cur.get("ns", "") else coll
        while cid:
            gm = SON([("getMore", Int64(cid)), ("collection", ns_coll)])
            if batch_size:
                gm["batchSize"] = batch_size
            r = self.cmd(dbname, gm)
            docs.extend(r["cursor"].get("nextBatch", []))
            cid = r["cursor"].get("id", 0)
        return docs

    # -- requirements

    def _ver(self, s):
        t = tuple(int(x) for x in re.findall(r"\d+", s)[:3])
        return t + (0,) * (3 - len(t))

    def requirement_skip(self, reqs):
        """None when any requirement is met, else the reason none is."""
        if not reqs:
            return None
        reasons = []
        for r in reqs:
            why = []
            if "minServerVersion" in r and self.version < self._ver(r["minServerVersion"]):
                why.append(f"needs server >= {r['minServerVersion']}")
            if "maxServerVersion" in r and self.version > self._ver(r["maxServerVersion"]):
                why.append(f"needs server <= {r['maxServerVersion']} (the shard reports "
                           f"{'.'.join(map(str, self.version))})")
            if "topologies" in r and self.topology not in r["topologies"]:
                kind = {"single": "standalone", "replicaset": "replica set member",
                        "sharded": "mongos"}.get(self.topology, self.topology)
                why.append(f"the spec runs it on topologies {r['topologies']} only (the "
                           f"server is a {kind})")
            if r.get("serverless") == "require":
                why.append("needs a serverless deployment")
            if r.get("auth") is True:
                why.append("needs authentication")
            if "serverParameters" in r or r.get("csfle"):
                why.append("needs server parameters/CSFLE")
            if not why:
                return None
            reasons.append(", ".join(why))
        return "; ".join(reasons)

    # -- entities and data

    def create_entities(self):
        self.entities = {}
        self.unacknowledged = set()  # collections with writeConcern {w: 0}
        self.options = {}  # entity id -> {readConcern, writeConcern, readPreference}
        for e in self.spec.get("createEntities", []):
            (kind, d), = e.items()
            if kind == "client":
                self.entities[d["id"]] = ("client", None)
                uo = d.get("uriOptions", {})
                o = {}
                if "readConcernLevel" in uo:
                    o["readConcern"] = {"level": uo["readConcernLevel"]}
                if "w" in uo:
                    o["writeConcern"] = {"w": uo["w"]}
                self.options[d["id"]] = o
            elif kind == "database":
                self.entities[d["id"]] = ("database", d["databaseName"])
                self.options[d["id"]] = self._inherit(d["client"], d.get("databaseOptions"))
            elif kind == "collection":
                dbname = self.entities[d["database"]][1]
                self.entities[d["id"]] = ("collection", (dbname, d["collectionName"]))
                self.options[d["id"]] = self._inherit(d["database"],
                                                      d.get("collectionOptions"))
                wc = d.get("collectionOptions", {}).get("writeConcern", {})
                if wc.get("w") == 0:
                    self.unacknowledged.add(d["id"])
            elif kind == "session":
                raise Skip("sessions are not used by the CRUD files this runner targets")
            else:
                raise Skip(f"entity kind {kind} is not supported by this runner")

    def _inherit(self, parent, given):
        """A database's or collection's read/write concern and read preference: its own
        options (databaseOptions/collectionOptions), else its parent entity's."""
        o = dict(self.options.get(parent, {}))
        for k in ("readConcern", "writeConcern", "readPreference"):
            if given and k in given:
                o[k] = given[k]
        return o

    def _apply_options(self, cmd):
        """Add what a driver adds to a command from the entity's options (the read/write
        concern specification, and server selection's $readPreference for a mode other
        than primary): readConcern on reads (aggregate, find, count, distinct) and on
        aggregate with $out/$merge, writeConcern on writes and on aggregate with
        $out/$merge (an unacknowledged w: 0 is the runner's own business), and
        $readPreference on reads, including aggregate with $out/$merge (MongoDB 5.0+)."""
        opts = self.cur_opts
        if not opts:
            return cmd
        name = next(iter(cmd))
        write_stage = name == "aggregate" and any(
            isinstance(st, dict) and ("$out" in st or "$merge" in st)
            for st in cmd.get("pipeline", []))
        read = name in ("aggregate", "find", "count", "distinct")
        write = write_stage or name in ("insert", "update", "delete", "findAndModify")
        if read and "readConcern" in opts and "readConcern" not in cmd:
            cmd["readConcern"] = opts["readConcern"]
        if write and "writeConcern" in opts and opts["writeConcern"].get("w") != 0 and \
                "writeConcern" not in cmd:
            cmd["writeConcern"] = opts["writeConcern"]
        rp = opts.get("readPreference")
        if read and rp and rp.get("mode", "primary") != "primary":
            cmd["$readPreference"] = rp
        return cmd

    def load_initial_data(self):
        for d in self.spec.get("initialData", []):
            db, coll = d["databaseName"], d["collectionName"]
            try:
                self.cmd(db, SON([("drop", coll)]))
            except ServerError as e:
                if e.code != 26:
                    raise
            if d.get("documents"):
                self.cmd(db, SON([("insert", coll), ("documents", d["documents"]),
                                  ("writeConcern", {"w": "majority"})]))
            else:
                self.cmd(db, SON([("create", coll)]))

    def check_outcome(self, outcome):
        for d in outcome or []:
            db, coll = d["databaseName"], d["collectionName"]
            r = self.cmd(db, SON([("find", coll), ("filter", {}), ("sort", {"_id": 1})]))
            docs = self.drain(db, coll, r)
            m = match(d["documents"], docs, root=False, path=f"outcome {db}.{coll}")
            if m:
                return m
        return None

    # -- write helpers

    @staticmethod
    def _with(cmd, args, *names):
        for n in names:
            if n in args:
                cmd[n] = args[n]
        return cmd

    @staticmethod
    def _check_update_doc(u):
        if isinstance(u, list):
            return  # pipeline update
        if not u or not next(iter(u)).startswith("$"):
            raise ClientError("update document must contain atomic operators")

    @staticmethod
    def _check_replacement(r):
        if r and next(iter(r)).startswith("$"):
            raise ClientError("replacement document must not contain atomic operators")

    def _write(self, db, cmd):
        r = self.cmd(db, cmd)
        return r

    # -- bulk write (the driver's batching: ordered = consecutive runs of one kind)

    def bulk(self, db, coll, requests, ordered=True, comment=MISSING, let=None):
        ops = []
        for i, req in enumerate(requests):
            (kind, a), = req.items()
            if kind == "insertOne":
                doc = dict(a["document"])
                if "_id" not in doc:
                    doc = {"_id": ObjectId(), **doc}
                ops.append(("insert", i, doc))
            elif kind in ("updateOne", "updateMany"):
                self._check_update_doc(a["update"])
                st = SON([("q", a["filter"]), ("u", a["update"]),
                          ("multi", kind == "updateMany")])
                self._with(st, a, "upsert", "arrayFilters", "hint", "collation", "sort")
                ops.append(("update", i, st))
            elif kind == "replaceOne":
                self._check_replacement(a["replacement"])
                st = SON([("q", a["filter"]), ("u", a["replacement"]), ("multi", False)])
                self._with(st, a, "upsert", "hint", "collation", "sort")
                ops.append(("update", i, st))
            elif kind in ("deleteOne", "deleteMany"):
                st = SON([("q", a["filter"]), ("limit", 1 if kind == "deleteOne" else 0)])
                self._with(st, a, "hint", "collation")
                ops.append(("delete", i, st))
            else:
                raise ClientError(f"unknown bulk write request {kind}")
        if not ops:
            raise ClientError("bulk write needs at least one request")
        batches = []
        if ordered:
            for op in ops:
                if batches and batches[-1][0] == op[0]:
                    batches[-1][1].append(op)
                else:
                    batches.append((op[0], [op]))
        else:
            for kind in ("insert", "update", "delete"):
                group = [op for op in ops if op[0] == kind]
                if group:
                    batches.append((kind, group))
        res = {"deletedCount": 0, "insertedCount": 0, "insertedIds": {}, "matchedCount": 0,
               "modifiedCount": 0, "upsertedCount": 0, "upsertedIds": {}}
        errors = []
        for kind, group in batches:
            field = {"insert": "documents", "update": "updates", "delete": "deletes"}[kind]
            cmd = SON([(kind, coll), (field, [op[2] for op in group]), ("ordered", ordered)])
            if comment is not MISSING:
                cmd["comment"] = comment
            if let is not None:
                cmd["let"] = let
            r = self.cmd(db, self._apply_options(cmd))
            n = r.get("n", 0)
            failed = {e["index"] for e in r.get("writeErrors", [])}
            if kind == "insert":
                res["insertedCount"] += n
                for j, op in enumerate(group):
                    if j not in failed and (not ordered or not failed or j < min(failed)):
                        res["insertedIds"][str(op[1])] = op[2]["_id"]
            elif kind == "update":
                ups = r.get("upserted", [])
                res["matchedCount"] += n - len(ups)
                res["modifiedCount"] += r.get("nModified", 0)
                res["upsertedCount"] += len(ups)
                for u in ups:
                    res["upsertedIds"][str(group[u["index"]][1])] = u["_id"]
            else:
                res["deletedCount"] += n
            for e in r.get("writeErrors", []):
                e = dict(e)
                e["index"] = group[e["index"]][1]
                errors.append(e)
            if errors and ordered:
                break
        if errors:
            err = ServerError({"code": errors[0].get("code"), "codeName":
                               errors[0].get("codeName"), "errmsg": errors[0].get("errmsg", ""),
                               "writeErrors": errors}, partial=res)
            raise err
        return res

    # -- operations

    def run_operation(self, op):
        name = op["name"]
        obj = op["object"]
        args = copy.deepcopy(op.get("arguments", {}))
        if obj == "testRunner":
            if name == "failPoint":
                # configureFailPoint on the admin database of the named client (the one
                # server this runner talks to, started with --enable-test-commands);
                # run_test turns it off at the end of the test
                fp = args["failPoint"]
                self.fail_points.add(fp["configureFailPoint"])
                if (fp.get("data") or {}).get("closeConnection"):
                    self.closes_connection = True
                self.cmd("admin", SON(fp))
                return None
            raise Skip(f"testRunner operation {name} is not supported")
        kind, ref = self.entities[obj]
        self.cur_opts = getattr(self, "options", {}).get(obj, {})
        if kind == "client" and name == "clientBulkWrite":
            # The driver validates the models before it sends anything (the CRUD spec's
            # client bulkWrite rules); the command itself is MongoDB 8.0's bulkWrite.
            for m in args.get("models", []):
                (mk, mv), = m.items()
                if mk == "replaceOne" and any(k.startswith("$") for k in mv["replacement"]):
                    raise ClientError("replaceOne: the replacement has atomic modifiers")
                if mk in ("updateOne", "updateMany") and isinstance(mv["update"], dict) and \
                        not all(k.startswith("$") for k in mv["update"]):
                    raise ClientError(f"{mk}: the update has no atomic modifiers")
            raise Skip("clientBulkWrite needs MongoDB 8.0's bulkWrite command; the server "
                       "reports 6.0")
        comment = args.pop("comment", MISSING)

        def com(cmd):
            if comment is not MISSING:
                cmd["comment"] = comment
            return self._apply_options(cmd)

        if kind == "database":
            db = ref
            if name == "aggregate":
                cmd = SON([("aggregate", 1), ("pipeline", args["pipeline"]), ("cursor", {})])
                if "batchSize" in args:
                    cmd["cursor"] = {"batchSize": args["batchSize"]}
                self._with(cmd, args, "allowDiskUse", "maxTimeMS", "let")
                r = self.cmd(db, com(cmd))
                return self.drain(db, None, r, args.get("batchSize"))
            if name == "dropCollection":
                try:
                    self.cmd(db, SON([("drop", args["collection"])]))
                except ServerError as e:
                    if e.code != 26:
                        raise
                return None
            if name == "createCollection":
                cmd = SON([("create", args.pop("collection"))])
                cmd.update(args)
                self.cmd(db, cmd)
                return None
            if name == "modifyCollection":  # the driver's collMod helper
                cmd = SON([("collMod", args.pop("collection"))])
                cmd.update(args)
                self.cmd(db, cmd)
                return None
            if name == "runCommand":
                return self.cmd(db, SON(args["command"]))
            if name == "listCollectionNames":
                r = self.cmd(db, SON([("listCollections", 1), ("nameOnly", True)]))
                return [d["name"] for d in self.drain(db, None, r)]
            raise Skip(f"database operation {name} is not supported by this runner")

        db, coll = ref
        if name == "insertOne":
            doc = dict(args["document"])
            if "_id" not in doc:
                doc = {"_id": ObjectId(), **doc}
            r = self.cmd(db, com(SON([("insert", coll), ("documents", [doc]),
                                      ("ordered", True)])))
            if r.get("writeErrors"):
                raise ServerError(_write_error(r))
            return {"insertedId": doc["_id"]}
        if name == "insertMany":
            reqs = [{"insertOne": {"document": d}} for d in args["documents"]]
            res = self.bulk(db, coll, reqs, args.get("ordered", True), comment)
            return {"insertedIds": res["insertedIds"]}
        if name in ("updateOne", "updateMany", "replaceOne"):
            if name == "replaceOne":
                self._check_replacement(args["replacement"])
                u = args["replacement"]
            else:
                self._check_update_doc(args["update"])
                u = args["update"]
            st = SON([("q", args["filter"]), ("u", u), ("multi", name == "updateMany")])
            self._with(st, args, "upsert", "arrayFilters", "hint", "collation", "sort")
            cmd = com(SON([("update", coll), ("updates", [st]), ("ordered", True)]))
            self._with(cmd, args, "let")
            r = self.cmd(db, cmd)
            if r.get("writeErrors"):
                raise ServerError(_write_error(r))
            ups = r.get("upserted", [])
            out = {"matchedCount": r.get("n", 0) - len(ups), "modifiedCount":
                   r.get("nModified", 0), "upsertedCount": len(ups)}
            if ups:
                out["upsertedId"] = ups[0]["_id"]
            return out
        if name in ("deleteOne", "deleteMany"):
            st = SON([("q", args["filter"]), ("limit", 1 if name == "deleteOne" else 0)])
            self._with(st, args, "hint", "collation")
            cmd = com(SON([("delete", coll), ("deletes", [st]), ("ordered", True)]))
            self._with(cmd, args, "let")
            r = self.cmd(db, cmd)
            if r.get("writeErrors"):
                raise ServerError(_write_error(r))
            return {"deletedCount": r.get("n", 0)}
        if name == "bulkWrite":
            return self.bulk(db, coll, args["requests"], args.get("ordered", True), comment,
                             args.get("let"))
        if name in ("find", "findOne"):
            cmd = SON([("find", coll), ("filter", args.get("filter", {}))])
            self._with(cmd, args, "sort", "projection", "skip", "hint", "maxTimeMS", "let",
                       "allowDiskUse", "min", "max", "returnKey", "showRecordId", "collation")
            if name == "findOne":
                cmd["limit"] = 1
                cmd["singleBatch"] = True
            else:
                self._with(cmd, args, "limit", "batchSize")
            r = self.cmd(db, com(cmd))
            docs = self.drain(db, coll, r, args.get("batchSize"))
            if name == "findOne":
                return docs[0] if docs else None
            return docs
        if name == "aggregate":
            cmd = SON([("aggregate", coll), ("pipeline", args["pipeline"]), ("cursor", {})])
            if "batchSize" in args:
                cmd["cursor"] = {"batchSize": args["batchSize"]}
            self._with(cmd, args, "allowDiskUse", "maxTimeMS", "let", "hint", "collation")
            r = self.cmd(db, com(cmd))
            return self.drain(db, coll, r, args.get("batchSize"))
        if name == "countDocuments":
            pipeline = [{"$match": args.get("filter", {})}]
            if "skip" in args:
                pipeline.append({"$skip": args["skip"]})
            if "limit" in args:
                pipeline.append({"$limit": args["limit"]})
            pipeline.append({"$group": {"_id": 1, "n": {"$sum": 1}}})
            cmd = SON([("aggregate", coll), ("pipeline", pipeline), ("cursor", {})])
            self._with(cmd, args, "hint", "maxTimeMS", "collation")
            docs = self.drain(db, coll, self.cmd(db, com(cmd)))
            return docs[0]["n"] if docs else 0
        if name == "estimatedDocumentCount":
            cmd = SON([("count", coll)])
            self._with(cmd, args, "maxTimeMS")
            return self.cmd(db, com(cmd))["n"]
        if name == "count":
            cmd = SON([("count", coll), ("query", args.get("filter", {}))])
            self._with(cmd, args, "skip", "limit", "hint", "maxTimeMS", "collation")
            return self.cmd(db, com(cmd))["n"]
        if name == "distinct":
            cmd = SON([("distinct", coll), ("key", args["fieldName"]),
                       ("query", args.get("filter", {}))])
            self._with(cmd, args, "maxTimeMS", "collation")
            return self.cmd(db, com(cmd))["values"]
        if name in ("findOneAndDelete", "findOneAndUpdate", "findOneAndReplace"):
            cmd = SON([("findAndModify", coll), ("query", args.get("filter", {}))])
            if name == "findOneAndDelete":
                cmd["remove"] = True
            elif name == "findOneAndUpdate":
                self._check_update_doc(args["update"])
                cmd["update"] = args["update"]
            else:
                self._check_replacement(args["replacement"])
                cmd["update"] = args["replacement"]
            if args.get("returnDocument", "Before").lower() == "after":
                cmd["new"] = True
            if "projection" in args:
                cmd["fields"] = args["projection"]
            self._with(cmd, args, "sort", "upsert", "arrayFilters", "hint", "maxTimeMS",
                       "let", "collation")
            r = self.cmd(db, com(cmd))
            return r.get("value")
        if name == "createIndex":
            spec = SON([("key", args["keys"])])
            spec["name"] = args.get("name") or "_".join(f"{k}_{v}" for k, v in
                                                         args["keys"].items())
            self._with(spec, args, "unique", "sparse")
            self.cmd(db, SON([("createIndexes", coll), ("indexes", [spec])]))
            return spec["name"]
        if name == "dropIndex":
            self.cmd(db, SON([("dropIndexes", coll), ("index", args["name"])]))
            return None
        if name == "listIndexes":
            return self.drain(db, coll, self.cmd(db, SON([("listIndexes", coll)])))
        raise Skip(f"collection operation {name} is not supported by this runner")

    def check_error(self, exp, exc):
        """None if exc satisfies expectError exp, else why not."""
        if exc is None:
            return f"expected an error {exp!r}, the operation succeeded"
        if isinstance(exc, NetworkError) and not self.closes_connection:
            return f"a network error with no closeConnection fail point set: {exc!r}"
        is_client = isinstance(exc, (ClientError, NetworkError))
        if "isClientError" in exp and exp["isClientError"] != is_client:
            return f"isClientError {exp['isClientError']} but got {exc!r}"
        if is_client:
            for k in ("errorCode", "errorCodeName", "errorResponse", "expectResult"):
                if k in exp:
                    return f"expected a server error ({k}) but got a client error {exc}"
            return check_labels(exp, exc.reply.get("errorLabels", [])
                                if isinstance(exc, NetworkError) else [])
        if "errorCode" in exp and exc.code != exp["errorCode"]:
            return f"errorCode {exp['errorCode']} but got {exc.code} ({exc.errmsg})"
        if "errorCodeName" in exp and exc.code_name != exp["errorCodeName"]:
            return f"errorCodeName {exp['errorCodeName']} but got {exc.code_name}"
        if "errorContains" in exp and exp["errorContains"].lower() not in exc.errmsg.lower():
            return f"errorContains {exp['errorContains']!r} but got {exc.errmsg!r}"
        if "errorResponse" in exp:
            m = match(exp["errorResponse"], exc.reply)
            if m:
                return m
        if "expectResult" in exp:
            if exc.partial is None:
                return "expected a partial result with the error"
            m = match(exp["expectResult"], exc.partial)
            if m:
                return m
        return check_labels(exp, exc.reply.get("errorLabels", []))

    def run_test(self, test):
        """Return ("passed"|"failed"|"skipped", detail); the fail points the test set are
        turned off (mode "off") whatever its end, as the unified format says."""
        if "skipReason" in test:
            return "skipped", test["skipReason"]
        why = self.requirement_skip(test.get("runOnRequirements"))
        if why:
            return "skipped", why
        try:
            return self._run_test(test)
        finally:
            self.cur_opts = {}
            for name in sorted(self.fail_points):
                Runner.cmd(self, "admin", SON([("configureFailPoint", name), ("mode", "off")]))
            self.fail_points = set()
            self.closes_connection = False

    # whether this runner checks expectEvents (RetryRunner does, with a command listener)
    checks_events = False

    def _run_test(self, test):
        ops = test.get("operations", [])
        if (not self.checks_events and test.get("expectEvents") and "outcome" not in test and
                not any("expectResult" in op or "expectError" in op for op in ops)):
            # nothing but the driver's command events is asserted: running the operations
            # would count a pass that checked nothing
            return "skipped", ("the test asserts only the command events a driver sends "
                               "(expectEvents), which this server-side runner does not check")
        try:
            self.create_entities()
            self.load_initial_data()
            for i, op in enumerate(test["operations"]):
                result, exc = None, None
                try:
                    result = self.run_operation(op)
                except (ClientError, ServerError) as e:
                    exc = e
                if exc is None and op.get("object") in self.unacknowledged:
                    result = None  # a driver returns nothing for an unacknowledged write
                if "expectError" in op:
                    r = self.check_error(op["expectError"], exc)
                    if r and refusal_of(exc):
                        raise Skip(f"refused by stripedb: {refusal_of(exc)['feature']} "
                                   "(docs/compat.md)")
                    if r:
                        return "failed", f"operation {i} ({op['name']}): {r}"
                    continue
                if exc is not None and refusal_of(exc):
                    raise Skip(f"refused by stripedb: {refusal_of(exc)['feature']} "
                               "(docs/compat.md)")
                if exc is not None:
                    return "failed", f"operation {i} ({op['name']}): unexpected error {exc}"
                if "expectResult" in op:
                    exp = op["expectResult"]
                    if exp is None:
                        r = None if result is None else f"expected null, got {result!r}"
                    else:
                        r = match(exp, MISSING if result is None else result)
                    if r:
                        return "failed", f"operation {i} ({op['name']}): {r}"
            r = self.check_outcome(test.get("outcome"))
            if r:
                return "failed", r
            return "passed", ""
        except Skip as s:
            return "skipped", str(s)


def run_file(uri, path, runner_class=None):
    """Run every test of one file. Returns (file name, [(description, status, detail)])."""
    spec = load_file(path)
    runner = (runner_class or Runner)(uri, spec)
    results = []
    try:
        why = runner.requirement_skip(spec.get("runOnRequirements"))
        for test in spec["tests"]:
            if why:
                results.append((test["description"], "skipped", why))
                continue
            try:
                status, detail = runner.run_test(test)
            except Exception as e:  # noqa: BLE001 - report, do not stop the file
                status, detail = "failed", f"runner error: {e!r}"
            results.append((test["description"], status, detail))
    finally:
        runner.close()
    return os.path.basename(path), results


def summarize(name, results):
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    lines = []
    for desc, status, detail in results:
        counts[status] += 1
        if status != "passed":
            lines.append(f"    {status.upper()}: {desc}: {detail}")
    head = f"{name}: {counts['passed']} passed, {counts['failed']} failed, " \
           f"{counts['skipped']} skipped"
    return counts, "\n".join([head] + lines)


def run_files(uri, files, run=None):
    """Run the spec files (run: a run_file(uri, path); this module's by default), print each
    file's summary and the total; the exit code: 1 when any test failed, else 0."""
    run = run or run_file
    total = {"passed": 0, "failed": 0, "skipped": 0}
    for f in files:
        name, results = run(uri, f)
        counts, text = summarize(name, results)
        print(text)
        for k in total:
            total[k] += counts[k]
    print(f"TOTAL: {total['passed']} passed, {total['failed']} failed, "
          f"{total['skipped']} skipped")
    return 1 if total["failed"] else 0


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    files = argv[2:] or sorted(glob.glob(os.path.join(compat_dir() or ".", "*.json")))
    return run_files(argv[1], files)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
