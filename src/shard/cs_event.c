/* One oplog entry -> its change events (MongoDB 6.0's ChangeStreamDefaultEventTransformation,
 * change_stream_event_transform.cpp, and the invalidation rules of
 * DocumentSourceChangeStreamCheckInvalidate). See changestream.h. */
#include <stdio.h>
#include <string.h>

#include "common/bsonget.h"
#include "common/alloc.h"
#include "shard/changestream.h"
#include "storage/store.h"

/* The parts of an entry the transform reads (views into the entry). */
typedef struct cs_entry {
	uint64_t ts;
	int64_t wall;
	const char *op, *ns;
	bson_t o, o2;
	bool have_o, have_o2;
	bson_iter_t lsid, txn, upd;
	bool have_lsid, have_txn, have_upd, have_in_txn, have_origin;
	bool have_dockey; /* the entry records its documentKey (storage/store.h) */
	int32_t stmt;
} cs_entry;

static bool entry_read(const bson_t *e, cs_entry *x)
{
	bson_iter_t it;
	memset(x, 0, sizeof *x);
	if (!bson_iter_init(&it, e))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "ts") == 0 && BSON_ITER_HOLDS_TIMESTAMP(&it)) {
			uint32_t t, i;
			bson_iter_timestamp(&it, &t, &i);
			x->ts = sdb_store_ts_pack(t, i);
		} else if (strcmp(k, "wall") == 0 && BSON_ITER_HOLDS_DATE_TIME(&it)) {
			x->wall = bson_iter_date_time(&it);
		} else if (strcmp(k, "op") == 0 && BSON_ITER_HOLDS_UTF8(&it)) {
			x->op = bson_iter_utf8(&it, NULL);
		} else if (strcmp(k, "ns") == 0 && BSON_ITER_HOLDS_UTF8(&it)) {
			x->ns = bson_iter_utf8(&it, NULL);
		} else if (strcmp(k, "o") == 0) {
			x->have_o = sdb_bson_iter_doc(&it, &x->o);
		} else if (strcmp(k, "o2") == 0) {
			x->have_o2 = sdb_bson_iter_doc(&it, &x->o2);
		} else if (strcmp(k, "origin") == 0) {
			x->have_origin = true;
		} else if (strcmp(k, SDB_STORE_OPLOG_DOCKEY_FIELD) == 0) {
			x->have_dockey = bson_iter_as_bool(&it);
		} else if (strcmp(k, "lsid") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			x->lsid = it;
			x->have_lsid = true;
		} else if (strcmp(k, "txnNumber") == 0 && BSON_ITER_HOLDS_INT64(&it)) {
			x->txn = it;
			x->have_txn = true;
		} else if (strcmp(k, "stmtId") == 0 && BSON_ITER_HOLDS_INT32(&it)) {
			x->stmt = bson_iter_int32(&it);
		} else if (strcmp(k, "inTxn") == 0) {
			x->have_in_txn = bson_iter_as_bool(&it);
		} else if (strcmp(k, "updateDescription") == 0 && BSON_ITER_HOLDS_DOCUMENT(&it)) {
			x->upd = it;
			x->have_upd = true;
		}
	}
	return x->ts != 0 && x->op && x->ns && x->have_o;
}

/* Split "db.coll" at the first dot into db (buffer) and *coll; false without one. */
static bool ns_split(const char *ns, char *db, size_t dblen, const char **coll)
{
	const char *dot = strchr(ns, '.');
	if (!dot || (size_t)(dot - ns) >= dblen || dot == ns)
		return false;
	memcpy(db, ns, (size_t)(dot - ns));
	db[dot - ns] = '\0';
	*coll = dot + 1;
	return true;
}

static bool internal_db(const char *db)
{
	return strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 || strcmp(db, "local") == 0;
}

/* Does the scope see documents and drops of db.coll? (MongoDB: no system collections, no
 * internal databases in a cluster stream.) */
static bool in_scope(const shard_cs_scope *s, const char *db, const char *coll)
{
	if (strncmp(coll, "system.", 7) == 0 || coll[0] == '\0' || strchr(coll, '$'))
		return false;
	switch (s->kind) {
	case SHARD_CS_COLL:
		return strcmp(db, s->db) == 0 && strcmp(coll, s->coll) == 0;
	case SHARD_CS_DB:
		return strcmp(db, s->db) == 0;
	case SHARD_CS_CLUSTER:
		return !internal_db(db);
	}
	return false;
}

static void append_ns(bson_t *ev, const char *key, const char *db, const char *coll)
{
	bson_t ns;
	bson_append_document_begin(ev, key, -1, &ns);
	BSON_APPEND_UTF8(&ns, "db", db);
	if (coll)
		BSON_APPEND_UTF8(&ns, "coll", coll);
	bson_append_document_end(ev, &ns);
}

/* _id, operationType, clusterTime, wallTime (and lsid/txnNumber of a transaction op) */
static bson_t *event_head(const cs_entry *e, const sdb_cs_token *t, const char *type, bool txn)
{
	bson_t *ev = bson_new();
	sdb_cs_token_append(ev, "_id", t);
	BSON_APPEND_UTF8(ev, "operationType", type);
	BSON_APPEND_TIMESTAMP(ev, "clusterTime", (uint32_t)(e->ts >> 32), (uint32_t)e->ts);
	BSON_APPEND_DATE_TIME(ev, "wallTime", e->wall);
	if (txn) {
		bson_append_iter(ev, "txnNumber", -1, &e->txn);
		bson_append_iter(ev, "lsid", -1, &e->lsid);
	}
	return ev;
}

/* documentKey of an entry written before entries recorded it (no docKey field, storage/store.h):
 * the shard key's fields of doc (in the pattern's order, those present) and _id, or {_id}
 * when the collection has no filtering metadata here, with the pattern known NOW, not at
 * the time of the write. Kept so that such entries stay readable after an upgrade; it is
 * wrong for an entry written before a shardCollection, or before a drop and re-creation
 * with another key (the new key's fields are looked up in the old document). */
static void append_document_key_now(const shard_cs_scope *s, const char *ns, const bson_t *doc,
				    bson_t *ev)
{
	const bson_t *key = s->key_of ? s->key_of(s->arg, ns) : NULL;
	bson_t dk;
	bson_iter_t k, v, d;
	bool id_in_key = false;
	bson_append_document_begin(ev, "documentKey", -1, &dk);
	if (key && bson_iter_init(&k, key)) {
		while (bson_iter_next(&k)) {
			const char *f = bson_iter_key(&k);
			if (strcmp(f, "_id") == 0)
				id_in_key = true;
			if (bson_iter_init(&v, doc) && bson_iter_find_descendant(&v, f, &d))
				bson_append_iter(&dk, f, -1, &d);
		}
	}
	if (!id_in_key && bson_iter_init_find(&v, doc, "_id"))
		bson_append_iter(&dk, "_id", 3, &v);
	bson_append_document_end(ev, &dk);
}

/* documentKey of a CRUD entry, MongoDB 6.0's ChangeStreamDefaultEventTransformation: the
 * one the entry recorded at the time of the write (o2 of an insert or update, o of a
 * delete, with the shard key of the collection as it was then), else (an entry of an
 * earlier stripedb) append_document_key_now. */
static void append_document_key(const shard_cs_scope *s, const cs_entry *e, bson_t *ev)
{
	const bson_t *rec = NULL;
	bson_iter_t id;
	if (e->have_dockey)
		rec = e->op[0] == 'd' ? &e->o : e->have_o2 ? &e->o2 : NULL;
	if (rec && bson_iter_init_find(&id, rec, "_id")) {
		BSON_APPEND_DOCUMENT(ev, "documentKey", rec);
		return;
	}
	append_document_key_now(s, e->ns, &e->o, ev);
}

static bson_t *crud_event(const shard_cs_scope *s, const cs_entry *e, const sdb_cs_token *t,
			  const char *db, const char *coll, bool txn)
{
	const char *type;
	bool full = false, lookup = false;
	switch (e->op[0]) {
	case 'i':
		type = "insert";
		full = true;
		break;
	case 'u':
		type = e->have_upd ? "update" : "replace";
		full = !e->have_upd;
		lookup = e->have_upd && s->update_lookup;
		break;
	default:
		type = "delete";
		break;
	}
	bson_t *ev = event_head(e, t, type, txn);
	if (full) {
		BSON_APPEND_DOCUMENT(ev, "fullDocument", &e->o);
	} else if (lookup) {
		bson_iter_t id;
		bson_t cur;
		const bson_t *idsrc = e->have_o2 ? &e->o2 : &e->o;
		if (bson_iter_init_find(&id, idsrc, "_id") && s->lookup &&
		    s->lookup(s->arg, db, coll, &id, &cur)) {
			BSON_APPEND_DOCUMENT(ev, "fullDocument", &cur);
			bson_destroy(&cur);
		} else {
			BSON_APPEND_NULL(ev, "fullDocument");
		}
	}
	append_ns(ev, "ns", db, coll);
	append_document_key(s, e, ev);
	if (e->op[0] == 'u' && e->have_upd)
		bson_append_iter(ev, "updateDescription", -1, &e->upd);
	return ev;
}

static bson_t *invalidate_event(const cs_entry *e, const sdb_cs_token *ev_tok, sdb_cs_token *t)
{
	*t = *ev_tok;
	t->kind = SDB_CS_INVALIDATE;
	bson_t *inv = bson_new();
	sdb_cs_token_append(inv, "_id", t);
	BSON_APPEND_UTF8(inv, "operationType", "invalidate");
	BSON_APPEND_TIMESTAMP(inv, "clusterTime", (uint32_t)(e->ts >> 32), (uint32_t)e->ts);
	BSON_APPEND_DATE_TIME(inv, "wallTime", e->wall);
	return inv;
}

size_t shard_cs_transform(const shard_cs_scope *s, const bson_t *entry, bson_t *out[2],
			  sdb_cs_token tok[2], bool *invalidates)
{
	cs_entry e;
	char db[128], db2[128];
	const char *coll, *coll2;
	bson_iter_t it;
	size_t n = 0;
	bool inv = false;

	*invalidates = false;
	if (!entry_read(entry, &e) || e.have_origin)
		return 0;
	memset(&tok[0], 0, sizeof tok[0]);
	tok[0].ts = e.ts;
	tok[0].kind = SDB_CS_EVENT;
	snprintf(tok[0].shard, sizeof tok[0].shard, "%s", s->shard ? s->shard : "");
	if (strcmp(e.op, "i") == 0 || strcmp(e.op, "u") == 0 || strcmp(e.op, "d") == 0) {
		if (!ns_split(e.ns, db, sizeof db, &coll) || !in_scope(s, db, coll))
			return 0;
		bool txn = e.have_lsid && e.have_txn && e.have_in_txn;
		if (txn && e.stmt >= 0)
			tok[0].idx = (uint32_t)e.stmt;
		out[n++] = crud_event(s, &e, &tok[0], db, coll, txn);
		return n;
	}
	if (strcmp(e.op, "c") != 0 || !ns_split(e.ns, db, sizeof db, &coll) ||
	    strcmp(coll, "$cmd") != 0)
		return 0;
	if (bson_iter_init_find(&it, &e.o, "drop") && BSON_ITER_HOLDS_UTF8(&it)) {
		coll = bson_iter_utf8(&it, NULL);
		if (!in_scope(s, db, coll))
			return 0;
		out[n] = event_head(&e, &tok[0], "drop", false);
		append_ns(out[n++], "ns", db, coll);
		inv = s->kind == SHARD_CS_COLL;
	} else if (bson_iter_init_find(&it, &e.o, "renameCollection") &&
		   BSON_ITER_HOLDS_UTF8(&it)) {
		const char *from = bson_iter_utf8(&it, NULL), *to = NULL;
		if (bson_iter_init_find(&it, &e.o, "to") && BSON_ITER_HOLDS_UTF8(&it))
			to = bson_iter_utf8(&it, NULL);
		if (!to || !ns_split(from, db, sizeof db, &coll) ||
		    !ns_split(to, db2, sizeof db2, &coll2))
			return 0;
		bool src = in_scope(s, db, coll), dst = in_scope(s, db2, coll2);
		if (!src && !dst)
			return 0;
		out[n] = event_head(&e, &tok[0], "rename", false);
		append_ns(out[n], "ns", db, coll);
		append_ns(out[n++], "to", db2, coll2);
		inv = s->kind == SHARD_CS_COLL;
	} else if (bson_iter_init_find(&it, &e.o, "dropDatabase")) {
		if ((s->kind != SHARD_CS_CLUSTER && strcmp(db, s->db) != 0) ||
		    (s->kind == SHARD_CS_CLUSTER && internal_db(db)))
			return 0;
		out[n] = event_head(&e, &tok[0], "dropDatabase", false);
		append_ns(out[n++], "ns", db, NULL);
		inv = s->kind != SHARD_CS_CLUSTER;
	} else {
		return 0; /* create, createIndexes, collMod ...: expanded events only */
	}
	if (inv) {
		*invalidates = true;
		if (!s->merge) {
			out[n] = invalidate_event(&e, &tok[0], &tok[n]);
			n++;
		}
	}
	return n;
}
