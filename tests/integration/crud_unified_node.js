// A smoke runner of MongoDB's unified-format CRUD spec files through the Node.js `mongodb`
// driver (its own CRUD API: insertOne, bulkWrite, find, ... so the driver builds the
// commands), against one server. Usage:
//   node crud_unified_node.js mongodb://127.0.0.1:PORT/?directConnection=true FILE.json...
// Prints one JSON line per file: {file, passed, failed, skipped, failures: [...]}.
// Same rules as crud_unified.py: expectEvents ignored, numbers compared by value, extra
// fields allowed only in root-level documents, skips carry their reason.
'use strict';
const fs = require('fs');
const path = require('path');
const { MongoClient, MongoServerError, BSON } = require('mongodb');
const { EJSON } = BSON;

const SERVER_VERSION = [6, 0, 0];

function ver(s) {
  const p = s.split('.').map((x) => parseInt(x, 10) || 0);
  while (p.length < 3) p.push(0);
  return p;
}
function cmpVer(a, b) {
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}
function reqSkip(reqs) {
  if (!reqs) return null;
  const why = [];
  for (const r of reqs) {
    const w = [];
    if (r.minServerVersion && cmpVer(SERVER_VERSION, ver(r.minServerVersion)) < 0) w.push(`needs >= ${r.minServerVersion}`);
    if (r.maxServerVersion && cmpVer(SERVER_VERSION, ver(r.maxServerVersion)) > 0) w.push(`needs <= ${r.maxServerVersion}`);
    if (r.topologies && !r.topologies.includes('single')) w.push('needs a non-standalone topology');
    if (r.serverless === 'require') w.push('needs serverless');
    if (w.length === 0) return null;
    why.push(w.join(', '));
  }
  return why.join('; ');
}

const MISSING = Symbol('missing');
function isNum(v) {
  return typeof v === 'number' || (v && typeof v === 'object' &&
    ['Long', 'Int32', 'Double', 'Decimal128'].includes(v._bsontype));
}
function num(v) { return typeof v === 'number' ? v : Number(v.toString()); }
function isPlainDoc(v) {
  return v && typeof v === 'object' && !Array.isArray(v) && !v._bsontype && !(v instanceof Date);
}

function match(exp, act, root, p) {
  if (isPlainDoc(exp) && Object.keys(exp).length === 1 && Object.keys(exp)[0].startsWith('$$')) {
    const [k] = Object.keys(exp);
    const v = exp[k];
    if (k === '$$unsetOrMatches') return (act === MISSING || act === undefined || act === null) ? null : match(v, act, root, p);
    if (k === '$$exists') return ((act !== MISSING && act !== undefined) === v) ? null : `${p}: $$exists ${v}`;
    return `${p}: unsupported ${k}`;
  }
  if (act === MISSING || act === undefined) return `${p}: missing`;
  if (isNum(exp)) return isNum(act) && num(exp) === num(act) ? null : `${p}: expected ${exp}, got ${EJSON.stringify(act)}`;
  if (Array.isArray(exp)) {
    if (!Array.isArray(act) || act.length !== exp.length) return `${p}: expected array of ${exp.length}, got ${EJSON.stringify(act)}`;
    for (let i = 0; i < exp.length; i++) {
      const r = match(exp[i], act[i], root, `${p}[${i}]`);
      if (r) return r;
    }
    return null;
  }
  if (isPlainDoc(exp)) {
    if (!isPlainDoc(act)) return `${p}: expected a document, got ${EJSON.stringify(act)}`;
    for (const k of Object.keys(exp)) {
      const r = match(exp[k], k in act ? act[k] : MISSING, false, `${p}.${k}`);
      if (r) return r;
    }
    if (!root) {
      const extra = Object.keys(act).filter((k) => !(k in exp));
      if (extra.length) return `${p}: unexpected fields ${extra}`;
    }
    return null;
  }
  if (exp && exp._bsontype === 'ObjectId') return act && act.equals && act.equals(exp) ? null : `${p}: ObjectId differs`;
  return exp === act ? null : `${p}: expected ${EJSON.stringify(exp)}, got ${EJSON.stringify(act)}`;
}

class Skip extends Error {}

async function runOp(ents, op) {
  // the smoke set's shard runs without --enable-test-commands; crud_unified.py runs the
  // failPoint operations (test_crud_unified.py, test_crud_report.py)
  if (op.object === 'testRunner') throw new Skip(`testRunner ${op.name}: not run by this smoke runner (crud_unified.py runs it)`);
  const o = ents[op.object];
  const a = Object.assign({}, op.arguments || {});
  const opts = {};
  for (const k of ['comment', 'ordered', 'upsert', 'sort', 'skip', 'limit', 'batchSize', 'projection',
    'hint', 'arrayFilters', 'maxTimeMS', 'allowDiskUse', 'let']) if (k in a) opts[k] = a[k];
  switch (op.name) {
    case 'insertOne': { const r = await o.insertOne(a.document, opts); return { insertedId: r.insertedId }; }
    case 'insertMany': { const r = await o.insertMany(a.documents, opts); return { insertedIds: r.insertedIds }; }
    case 'updateOne': case 'updateMany': case 'replaceOne': {
      const r = op.name === 'replaceOne' ? await o.replaceOne(a.filter, a.replacement, opts)
        : await o[op.name](a.filter, a.update, opts);
      const out = { matchedCount: r.matchedCount, modifiedCount: r.modifiedCount, upsertedCount: r.upsertedCount };
      if (r.upsertedId !== null && r.upsertedId !== undefined) out.upsertedId = r.upsertedId;
      return out;
    }
    case 'deleteOne': case 'deleteMany': { const r = await o[op.name](a.filter, opts); return { deletedCount: r.deletedCount }; }
    case 'find': return o.find(a.filter || {}, opts).toArray();
    case 'findOne': return o.findOne(a.filter || {}, opts);
    case 'aggregate': return o.aggregate(a.pipeline, opts).toArray();
    case 'countDocuments': return o.countDocuments(a.filter || {}, opts);
    case 'estimatedDocumentCount': return o.estimatedDocumentCount(opts);
    case 'distinct': return o.distinct(a.fieldName, a.filter || {}, opts);
    case 'bulkWrite': {
      const r = await o.bulkWrite(a.requests, opts);
      return { deletedCount: r.deletedCount, insertedCount: r.insertedCount, insertedIds: r.insertedIds,
        matchedCount: r.matchedCount, modifiedCount: r.modifiedCount, upsertedCount: r.upsertedCount,
        upsertedIds: r.upsertedIds };
    }
    case 'dropCollection': await o.dropCollection(a.collection).catch(() => {}); return null;
    case 'createCollection': { const n = a.collection; delete a.collection; await o.createCollection(n, a); return null; }
    default: throw new Skip(`operation ${op.name} not in the smoke set`);
  }
}

async function runFile(uri, file) {
  const spec = EJSON.parse(fs.readFileSync(file, 'utf8'), { relaxed: true });
  const client = new MongoClient(uri, { serverSelectionTimeoutMS: 10000, retryWrites: false, retryReads: false });
  await client.connect();
  const res = { file: path.basename(file), passed: 0, failed: 0, skipped: 0, failures: [], skips: [] };
  const fileSkip = reqSkip(spec.runOnRequirements);
  for (const t of spec.tests) {
    const skip = fileSkip || reqSkip(t.runOnRequirements) || t.skipReason;
    if (skip) { res.skipped++; res.skips.push(`${t.description}: ${skip}`); continue; }
    try {
      const ents = {};
      for (const e of spec.createEntities) {
        const [kind] = Object.keys(e);
        const d = e[kind];
        if (kind === 'database') ents[d.id] = client.db(d.databaseName);
        if (kind === 'collection') ents[d.id] = ents[d.database].collection(d.collectionName);
      }
      for (const d of spec.initialData || []) {
        const db = client.db(d.databaseName);
        await db.collection(d.collectionName).drop().catch(() => {});
        if (d.documents.length) await db.collection(d.collectionName).insertMany(d.documents);
        else await db.createCollection(d.collectionName);
      }
      let failure = null;
      for (const [i, op] of t.operations.entries()) {
        let result = null; let err = null;
        try { result = await runOp(ents, op); } catch (e) { if (e instanceof Skip) throw e; err = e; }
        if (op.expectError) {
          if (!err) { failure = `op ${i} ${op.name}: expected an error`; break; }
          const isClient = !(err instanceof MongoServerError) && !(err.writeErrors || err.code);
          if ('isClientError' in op.expectError && op.expectError.isClientError !== isClient) {
            failure = `op ${i} ${op.name}: isClientError ${op.expectError.isClientError}, got ${err}`; break;
          }
          if (op.expectError.errorCode !== undefined && err.code !== op.expectError.errorCode) {
            failure = `op ${i} ${op.name}: code ${op.expectError.errorCode}, got ${err.code}`; break;
          }
          if (op.expectError.expectResult && err.result) {
            const r = err.result;
            const got = { deletedCount: r.deletedCount, insertedCount: r.insertedCount, matchedCount: r.matchedCount,
              modifiedCount: r.modifiedCount, upsertedCount: r.upsertedCount, upsertedIds: r.upsertedIds || {} };
            const m = match(op.expectError.expectResult, got, true, '$');
            if (m) { failure = `op ${i} ${op.name}: partial result ${m}`; break; }
          }
          continue;
        }
        if (err) { failure = `op ${i} ${op.name}: unexpected error ${err}`; break; }
        if ('expectResult' in op) {
          const m = op.expectResult === null ? (result === null ? null : 'expected null')
            : match(op.expectResult, result === null ? MISSING : result, true, '$');
          if (m) { failure = `op ${i} ${op.name}: ${m}`; break; }
        }
      }
      if (!failure) {
        for (const d of t.outcome || []) {
          const docs = await client.db(d.databaseName).collection(d.collectionName).find({}).sort({ _id: 1 }).toArray();
          const m = match(d.documents, docs, false, `outcome ${d.collectionName}`);
          if (m) { failure = m; break; }
        }
      }
      if (failure) { res.failed++; res.failures.push(`${t.description}: ${failure}`); } else res.passed++;
    } catch (e) {
      if (e instanceof Skip) { res.skipped++; res.skips.push(`${t.description}: ${e.message}`); } else {
        res.failed++; res.failures.push(`${t.description}: runner error ${e}`);
      }
    }
  }
  await client.close();
  return res;
}

(async () => {
  const [uri, ...files] = process.argv.slice(2);
  for (const f of files) console.log(JSON.stringify(await runFile(uri, f)));
})().catch((e) => { console.error(e); process.exit(1); });
