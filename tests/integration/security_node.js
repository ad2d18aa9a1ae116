// Authentication through the Node.js `mongodb` driver against a stripedb proxy with
// --auth=enabled (tests/integration/test_security.py runs it).
// usage: node security_node.js PORT USER GOOD_PASSWORD BAD_PASSWORD OWN_DB OTHER_DB [MECH]
// MECH: SCRAM-SHA-256 (default) or SCRAM-SHA-1, with ":strict" for a strict Stable API
// client (its SCRAM conversation carries apiVersion and apiStrict).
// Prints one JSON line: {good: {...}, bad: {...}, other: {...}}.
const { MongoClient } = require("mongodb");

let mech = "SCRAM-SHA-256";
let serverApi; // MECH ":strict": the client declares {serverApi: {version: "1", strict: true}}

async function attempt(port, user, pw, fn) {
  const uri = `mongodb://${encodeURIComponent(user)}:${encodeURIComponent(pw)}@127.0.0.1:${port}/?directConnection=true&authSource=admin&authMechanism=${mech}&serverSelectionTimeoutMS=10000&retryWrites=false`;
  const client = new MongoClient(uri, serverApi ? { serverApi } : {});
  const started = process.hrtime.bigint();
  try {
    await client.connect();
    const value = await fn(client);
    return { ok: true, value };
  } catch (e) {
    return { ok: false, code: e.code ?? null, codeName: e.codeName ?? null,
             message: String(e.message), ms: Number(process.hrtime.bigint() - started) / 1e6 };
  } finally {
    await client.close().catch(() => {});
  }
}

(async () => {
  const [port, user, good, bad, ownDb, otherDb, m] = process.argv.slice(2);
  if (m) [mech] = m.split(":");
  if (m && m.endsWith(":strict")) serverApi = { version: "1", strict: true };
  const out = {};
  out.good = await attempt(port, user, good, async (c) => {
    await c.db(ownDb).collection("node").insertOne({ _id: 1, via: "node" });
    const docs = await c.db(ownDb).collection("node").find({}).toArray();
    return docs;
  });
  out.bad = await attempt(port, user, bad, async (c) => c.db(ownDb).collection("node").findOne({}));
  out.other = await attempt(port, user, good, async (c) =>
    c.db(otherDb).collection("c").find({}).toArray());
  console.log(JSON.stringify(out));
})();
