// Issue #20's bullets, one section each, as a mongosh user runs them (run by
// test_semantics_mongosh.py against a shard, through a proxy to unsharded collections and
// through a proxy to sharded ones). MODE ("shard", "proxy-unsharded", "proxy-sharded") is
// set by the caller's --eval; the database `sem` is prepared by the caller (in
// proxy-sharded mode sem.c and sem.f are sharded on {k: 1}, split at k 50, over the shards).
// Prints one JSON line: {section: "ok" | "<what failed>"}.
const S = db.getSiblingDB("sem");
const results = {};

function eq(a, b, what) {
  const ja = EJSON.stringify(a), jb = EJSON.stringify(b);
  if (ja !== jb) throw new Error(`${what}: got ${ja}, want ${jb}`);
}

// The server error code of fn(), or 0 when it succeeds.
function codeOf(fn) {
  try {
    fn();
  } catch (e) {
    return e.code === undefined ? `no code: ${e.message}` : e.code;
  }
  return 0;
}

function section(name, fn) {
  try {
    fn();
    results[name] = "ok";
  } catch (e) {
    results[name] = String(e && e.message ? e.message : e);
  }
}

const ids = (docs) => docs.map((d) => d._id);
// a number from an int, double or Long
const num = (x) => (x !== null && typeof x === "object" && x.toNumber ? x.toNumber() : Number(x));

S.c.insertMany([
  { _id: 1, k: 10, x: "ping", n: 5, tags: ["a", "b"] },
  { _id: 2, k: 20, x: "PING", n: 7, tags: ["b"] },
  { _id: 3, k: 60, x: "pong", n: 1, tags: [] },
  { _id: 4, k: 70, x: "Pong", n: 9, tags: ["c"] },
]);
S.f.insertMany([
  { _id: 100, k: 10, ref: 1, v: "f1" },
  { _id: 101, k: 60, ref: 1, v: "f2" },
  { _id: 102, k: 70, ref: 4, v: "f3" },
]);

section("collation", () => {
  const ci = { locale: "en_US", strength: 2 };
  eq(ids(S.c.find({ x: "PING" }).collation(ci).sort({ _id: 1 }).toArray()), [1, 2], "case-insensitive find");
  eq(S.c.countDocuments({ x: "pong" }, { collation: ci }), 2, "count under a collation");
  eq(S.c.distinct("x", {}, { collation: ci }).length, 2, "distinct dedups case-insensitively");
  eq(codeOf(() => S.c.find({}).collation({ locale: "xx_NOPE" }).toArray()), 2, "a bogus locale");
  // a collection's default collation; numericOrdering in a sort
  S.createCollection("coll_ci", { collation: ci });
  S.coll_ci.insertMany([{ _id: 1, s: "Ab" }, { _id: 2, s: "aB" }, { _id: 3, s: "b" }]);
  eq(S.coll_ci.countDocuments({ s: "ab" }), 2, "the collection default");
  S.nums.insertMany([{ _id: 1, v: "10" }, { _id: 2, v: "9" }, { _id: 3, v: "100" }]);
  eq(S.nums.find().sort({ v: 1 }).collation({ locale: "en", numericOrdering: true }).toArray().map((d) => d.v),
     ["9", "10", "100"], "numericOrdering");
});

section("validator", () => {
  S.createCollection("v", { validator: { $jsonSchema: { required: ["a"], properties: { a: { bsonType: "int", minimum: 0 } } } } });
  eq(codeOf(() => S.v.insertOne({ b: 1 })), 121, "invalid insert");
  S.v.insertOne({ a: 1 });
  eq(codeOf(() => S.v.updateOne({ a: 1 }, { $unset: { a: "" } })), 121, "invalid update");
  eq(codeOf(() => S.v.insertOne({ a: -1 })), 121, "below minimum");
  eq(S.v.countDocuments({}), 1, "documents after refusals");
  // collMod: a looser validator, then the document it allows
  S.runCommand({ collMod: "v", validator: { a: { $exists: true } }, validationLevel: "strict" });
  S.v.insertOne({ a: "text" });
  eq(S.v.countDocuments({}), 2, "after collMod");
  S.v.insertOne({ b: 2 }, { bypassDocumentValidation: true });
  eq(S.v.countDocuments({}), 3, "bypassDocumentValidation");
});

section("ttl_index", () => {
  S.t.createIndex({ at: 1 }, { expireAfterSeconds: 3600 });
  const ix = S.t.getIndexes().find((i) => i.name === "at_1");
  eq(num(ix.expireAfterSeconds), 3600, "expireAfterSeconds kept");
  // a TTL index on _id is refused, as mongod
  eq(codeOf(() => S.t.createIndex({ _id: 1 }, { expireAfterSeconds: 1, name: "id_ttl" })), 67, "ttl on _id");
});

section("views", () => {
  S.createView("cv", "c", [{ $match: { n: { $gte: 5 } } }, { $project: { n: 1 } }]);
  const c = codeOf(() => S.cv.find().toArray());
  if (MODE === "proxy-sharded") {
    // a view over a sharded collection would read one shard's share: refused
    eq(c, 238, "view over a sharded collection");
  } else {
    eq(c, 0, "view read");
    eq(S.cv.find().sort({ _id: 1 }).toArray(), [{ _id: 1, n: 5 }, { _id: 2, n: 7 }, { _id: 4, n: 9 }], "view");
    eq(S.cv.countDocuments({}), 3, "view count");
  }
});

section("strict_parsing", () => {
  eq(codeOf(() => S.runCommand({ update: "c", updates: [{ q: { _id: 1 }, u: { $set: { y: 1 } }, sort: { a: 1 } }] }, { checkResponse: true })),
     40415, "update statement with sort");
  eq(codeOf(() => S.runCommand({ find: "c", filter: {}, bogusField: 1 })), 40415, "unknown find field");
  eq(codeOf(() => S.c.insertOne({ _id: { $a: 1 } })), 52, "$-prefixed field in _id");
  // the generic fields drivers send are accepted
  eq(S.runCommand({ find: "c", filter: { _id: 1 }, comment: "x", maxTimeMS: 5000 }).ok, 1, "generic fields");
});

section("write_concern", () => {
  // mongosh raises the writeConcernError (UnsatisfiableWriteConcern); the write is applied
  eq(codeOf(() => S.runCommand({ insert: "wc", documents: [{ _id: 1 }], writeConcern: { w: 3, wtimeout: 2000 } })),
     100, "w: 3 on a smaller set");
  eq(S.wc.countDocuments({}), 1, "the write is applied");
});

section("pipeline_update", () => {
  S.c.updateOne({ _id: 1 }, [{ $set: { m: { $multiply: ["$n", 2] } } }, { $unset: "tags" }]);
  eq(S.c.findOne({ _id: 1 }, { m: 1, tags: 1 }), { _id: 1, m: 10 }, "pipeline update");
  S.c.updateMany({}, [{ $set: { z: "$$two" } }], { let: { two: 2 } });
  eq(S.c.countDocuments({ z: 2 }), 4, "pipeline update with let");
});

section("expr_and_let", () => {
  eq(ids(S.c.find({ $expr: { $gt: ["$n", "$$lim"] } }, null, { let: { lim: 6 } }).sort({ _id: 1 }).toArray()),
     [2, 4], "$expr with let in find");
});

section("lookup", () => {
  const out = S.c.aggregate([
    { $sort: { _id: 1 } },
    { $lookup: { from: "f", localField: "_id", foreignField: "ref", as: "fs" } },
    { $project: { fs: "$fs._id" } },
  ]).toArray();
  eq(out.map((d) => [d._id, d.fs.sort()]), [[1, [100, 101]], [2, []], [3, []], [4, [102]]], "$lookup");
  const p = S.c.aggregate([
    { $match: { _id: 4 } },
    { $lookup: { from: "f", let: { kk: "$k" }, pipeline: [{ $match: { $expr: { $eq: ["$k", "$$kk"] } } }], as: "fs" } },
    { $project: { v: "$fs.v" } },
  ]).toArray();
  eq(p, [{ _id: 4, v: ["f3"] }], "$lookup pipeline form");
});

section("graph_lookup", () => {
  S.g.insertMany([{ _id: "a", next: "b" }, { _id: "b", next: "c" }, { _id: "c", next: "a" }]);
  const out = S.g.aggregate([
    { $match: { _id: "a" } },
    { $graphLookup: { from: "g", startWith: "$next", connectFromField: "next", connectToField: "_id", as: "r", depthField: "d" } },
  ]).toArray();
  eq(out[0].r.map((x) => [x._id, num(x.d)]).sort(), [["a", 2], ["b", 0], ["c", 1]], "$graphLookup cycle");
});

section("facet_bucket", () => {
  const out = S.c.aggregate([
    { $facet: {
      byN: [{ $bucket: { groupBy: "$n", boundaries: [0, 6, 10], output: { c: { $sum: 1 } } } }],
      auto: [{ $bucketAuto: { groupBy: "$k", buckets: 2 } }],
      count: [{ $sortByCount: { $gt: ["$k", 50] } }],
    } },
  ]).toArray()[0];
  eq(out.byN, [{ _id: 0, c: 2 }, { _id: 6, c: 2 }], "$bucket");
  eq(out.auto, [{ _id: { min: 10, max: 60 }, count: 2 }, { _id: { min: 60, max: 70 }, count: 2 }], "$bucketAuto");
  eq(out.count.map((d) => d.count), [2, 2], "$sortByCount");
});

section("union_with", () => {
  eq(S.c.aggregate([{ $project: { _id: 1 } }, { $unionWith: { coll: "f", pipeline: [{ $project: { _id: 1 } }] } }, { $sort: { _id: 1 } }])
       .toArray().map((d) => d._id), [1, 2, 3, 4, 100, 101, 102], "$unionWith");
});

section("documents", () => {
  eq(S.aggregate([{ $documents: [{ a: 1 }, { a: 2 }] }, { $match: { a: 2 } }]).toArray(), [{ a: 2 }], "$documents");
});

section("out_merge", () => {
  S.c.aggregate([{ $match: { n: { $gt: 6 } } }, { $project: { n: 1 } }, { $out: "outc" }]).toArray();
  eq(S.outc.find().sort({ _id: 1 }).toArray(), [{ _id: 2, n: 7 }, { _id: 4, n: 9 }], "$out");
  // $out again replaces the whole collection
  S.c.aggregate([{ $match: { _id: 1 } }, { $project: { n: 1 } }, { $out: "outc" }]).toArray();
  eq(S.outc.find().toArray(), [{ _id: 1, n: 5 }], "$out replaces");
  S.mergec.insertOne({ _id: 1, n: 0, keep: true });
  S.c.aggregate([{ $project: { n: 1 } }, { $merge: { into: "mergec", whenMatched: "merge", whenNotMatched: "insert" } }]).toArray();
  eq(S.mergec.find().sort({ _id: 1 }).toArray(),
     [{ _id: 1, n: 5, keep: true }, { _id: 2, n: 7 }, { _id: 3, n: 1 }, { _id: 4, n: 9 }], "$merge");
  eq(codeOf(() => S.c.aggregate([{ $merge: { into: "mergec", on: "n" } }]).toArray()), 51183, "$merge on without a unique index");
});

section("change_streams", () => {
  // db.c.watch(): the events of writes after it (through a proxy: merged from every shard
  // in resume-token order, src/proxy/README.md "Change streams")
  const cs = S.c.watch([{ $match: { operationType: { $in: ["insert", "delete"] } } }],
                       { maxAwaitTimeMS: 200 });
  S.c.insertOne({ _id: 100, k: 60, n: 1 });
  S.c.insertOne({ _id: 101, k: 1, n: 1 });
  S.c.deleteOne({ _id: 100, k: 60 });
  const evs = [];
  const end = Date.now() + 20000;
  while (evs.length < 3 && Date.now() < end) {
    const e = cs.tryNext();
    if (e) evs.push(e);
  }
  const token = cs.getResumeToken();
  cs.close();
  eq(evs.map((e) => `${e.operationType} ${e.documentKey._id}`).sort(),
     ["delete 100", "insert 100", "insert 101"], "watch events");
  eq(typeof token._data, "string", "resume token");
  // resumeAfter the first event: the two after it
  const again = S.c.watch([], { resumeAfter: evs[0]._id, maxAwaitTimeMS: 200 });
  const more = [];
  const end2 = Date.now() + 20000;
  while (more.length < 2 && Date.now() < end2) {
    const e = again.tryNext();
    if (e) more.push(e);
  }
  again.close();
  S.c.deleteOne({ _id: 101, k: 1 });
  eq(more.map((e) => EJSON.stringify(e._id)), evs.slice(1).map((e) => EJSON.stringify(e._id)),
     "resumeAfter");
  eq(codeOf(() => S.c.watch([{ $group: { _id: 1 } }]).tryNext()), 20, "stage not allowed");
});

section("text_search", () => {
  eq(codeOf(() => S.c.createIndex({ x: "text" })), 67, "text index");
  eq(codeOf(() => S.c.find({ $text: { $search: "ping" } }).toArray()), 2, "$text");
});

section("admin_commands", () => {
  if (MODE === "shard") {
    const st = S.c.aggregate([{ $collStats: { count: {} } }]).toArray();
    eq(num(st[0].count), 4, "$collStats count " + EJSON.stringify(st));
  }
  eq(S.c.validate().valid, true, "validate");
  if (MODE !== "proxy-sharded") {
    S.rn.insertOne({ _id: 1 });
    S.rn.renameCollection("rn2");
    eq(S.rn2.find().toArray(), [{ _id: 1 }], "renameCollection");
  }
  const cur = db.getSiblingDB("admin").runCommand({ currentOp: 1 });
  eq([cur.ok, Array.isArray(cur.inprog)], [1, true], "currentOp");
  // this very command is in progress
  if (!cur.inprog.some((op) => op.command && op.command.currentOp)) throw new Error("currentOp does not list itself");
  eq(codeOf(() => db.getSiblingDB("admin").runCommand({ killOp: 1, op: MODE === "shard" ? 987654 : "nosuch:1" })),
     MODE === "shard" ? 0 : 70, "killOp of an unknown op");
});

print(JSON.stringify(results));
