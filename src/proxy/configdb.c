/* The `config` database through the proxy (issue #18): read-only views answered from the
 * metadata service in MongoDB's config-server shapes, so that mongosh's sh.status() and
 * Compass-style readers work against a proxy as against a mongos.
 *
 *   config.version      {_id: 1, currentVersion: 6, minCompatibleVersion: 5}
 *   config.shards       {_id, host ("rs/h:p,..." or "h:p"), state: 1, draining?}   listShards
 *   config.databases    {_id, primary (the db's own), partitioned: true, version: {lastMod: 1}}   listDatabases
 *   config.collections  {_id: ns, key, unique: false, noBalance: true}             listCollections
 *   config.chunks       {_id, ns, min, max, shard, lastmod: Timestamp(version, 0)} getRoutingTable
 *   config.settings     {_id: "balancer", mode: "off", stopped: true}, {_id: "autosplit", enabled: false}
 *   config.migrations   {_id: migration id, ns, min, max, fromShard, toShard, state}  the
 *                       Data Movement Platform migrations that have not ended (listMigrations;
 *                       min/max from the routing table while the chunk is known)
 *   config.changelog    {_id: migration id, server: "coordinator", shard, time: Date, what,
 *                       ns, details: {min, max, from, to, migration, state}}: one entry per
 *                       migration record, what = moveChunk.commit (complete), moveChunk.error
 *                       (aborted, rolled back) or moveChunk.start (still running); an
 *                       ended one also as the donor's {_id: "<id>-from", what:
 *                       "moveChunk.from", details: {from, to, chunk, migration, note:
 *                       "success" | "aborted", errmsg?}}, which sh.status() counts
 *   config.mongos       {_id: "host:port", advisoryHostFQDNs: [], mongoVersion, ping: Date,
 *                       up: seconds since the proxy started, waiting: true}   listProxies
 *                       (each proxy pings metadata every 10 s from cluster op version 3;
 *                       empty below it)
 *   anything else       empty (actionlog, locks, tags ...)
 *
 * find, aggregate and count run the request over these documents with the proxy's pipeline
 * engine (storage/pipeline.h); the result is a proxy cursor (getMore works). Every other
 * command on the config database is refused with IllegalOperation (20): it is not a
 * database clients write. Sources: MongoDB's config.* schemas (docs "Config Database"),
 * mongosh's getPrintableShardStatus (shell-api helpers.js). */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proxy/exec.h"
#include "proxy/sharding_int.h"
#include "storage/pipeline.h"

/* A growable list of owned documents. */
typedef struct doclist {
	bson_t **v;
	size_t n, cap;
} doclist;

static void dl_push(doclist *l, bson_t *d)
{
	if (l->n == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 16;
		l->v = sdb_realloc(l->v, l->cap * sizeof *l->v);
	}
	l->v[l->n++] = d;
}

static void dl_free(doclist *l)
{
	size_t i;

	for (i = 0; i < l->n; i++)
		bson_destroy(l->v[i]);
	free(l->v);
}

static void add_shard(const bson_t *s, void *arg)
{
	const char *id = px_str_of(s, "id"), *uri = px_str_of(s, "uri"), *state = px_str_of(s, "state");
	bson_t *d;
	char *host;

	if (id == NULL || uri == NULL)
		return;
	host = px_shard_host_string(uri);
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", id);
	BSON_APPEND_UTF8(d, "host", host);
	BSON_APPEND_INT32(d, "state", 1);
	if (state && strcmp(state, "active") != 0)
		BSON_APPEND_BOOL(d, "draining", true);
	free(host);
	dl_push(arg, d);
}

/* config.mongos from one listProxies row {addr, startedMS, pingMS, version}. */
static void add_mongos(const bson_t *s, void *arg)
{
	const char *addr = px_str_of(s, "addr"), *ver = px_str_of(s, "version");
	int64_t ping = px_get_int(s, "pingMS", 0), started = px_get_int(s, "startedMS", 0);
	bson_t *d, a;

	if (addr == NULL)
		return;
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", addr);
	BSON_APPEND_ARRAY_BEGIN(d, "advisoryHostFQDNs", &a);
	bson_append_array_end(d, &a);
	BSON_APPEND_UTF8(d, "mongoVersion", ver ? ver : "");
	BSON_APPEND_DATE_TIME(d, "ping", ping);
	BSON_APPEND_INT64(d, "up", ping > started ? (ping - started) / 1000 : 0);
	BSON_APPEND_BOOL(d, "waiting", true);
	dl_push(arg, d);
}

typedef struct db_arg {
	doclist *l;
	const char *primary;
} db_arg;

static void add_database(const bson_t *s, void *arg)
{
	db_arg *a = arg;
	const char *name = px_str_of(s, "name"), *tenant = px_str_of(s, "tenant");
	const char *own = px_str_of(s, "primary"); /* issue #18: the database's primary shard */
	bson_t *d, v;

	if (name == NULL)
		return;
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", name);
	BSON_APPEND_UTF8(d, "primary", own ? own : a->primary ? a->primary : "");
	BSON_APPEND_BOOL(d, "partitioned", true);
	BSON_APPEND_DOCUMENT_BEGIN(d, "version", &v);
	BSON_APPEND_INT32(&v, "lastMod", 1);
	bson_append_document_end(d, &v);
	if (tenant)
		BSON_APPEND_UTF8(d, "stripedbTenant", tenant);
	dl_push(a->l, d);
}

static void add_collection(const bson_t *s, void *arg)
{
	const char *ns = px_str_of(s, "ns");
	bool hashed = px_get_bool(s, "hashed", false);
	bson_t *d, key, k;
	bson_iter_t it;

	if (ns == NULL)
		return;
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", ns);
	BSON_APPEND_DOCUMENT_BEGIN(d, "key", &key);
	if (px_get_doc(s, "key", &k) && bson_iter_init(&it, &k))
		while (bson_iter_next(&it)) {
			if (hashed)
				BSON_APPEND_UTF8(&key, bson_iter_key(&it), "hashed");
			else
				BSON_APPEND_INT32(&key, bson_iter_key(&it), 1);
		}
	bson_append_document_end(d, &key);
	BSON_APPEND_BOOL(d, "unique", false);
	BSON_APPEND_BOOL(d, "noBalance", true); /* there is no balancer */
	dl_push(arg, d);
}

static void add_chunk(const bson_t *s, void *arg)
{
	bson_t *d = bson_new(), b;
	bson_iter_t it;
	int64_t version = px_get_int(s, "version", 0);

	if (bson_iter_init_find(&it, s, "id"))
		bson_append_iter(d, "_id", -1, &it);
	if (bson_iter_init_find(&it, s, "ns"))
		bson_append_iter(d, "ns", -1, &it);
	if (px_get_doc(s, "min", &b))
		BSON_APPEND_DOCUMENT(d, "min", &b);
	if (px_get_doc(s, "max", &b))
		BSON_APPEND_DOCUMENT(d, "max", &b);
	if (bson_iter_init_find(&it, s, "shard"))
		bson_append_iter(d, "shard", -1, &it);
	BSON_APPEND_TIMESTAMP(d, "lastmod", (uint32_t)version, 0);
	dl_push(arg, d);
}

/* add_migration's argument: the list, which view (config.changelog or config.migrations:
 * only migrations that have not ended), and the request (metadata reads of bounds). */
typedef struct mig_arg {
	doclist *l;
	bool changelog;
	ctx *c;
} mig_arg;

static bool mig_ended(const char *state)
{
	return strcmp(state, "complete") == 0 || strcmp(state, "aborted") == 0 ||
	       strcmp(state, "rolled_back") == 0;
}

/* min and max of chunk nid of ns from the metadata routing table into d (nothing when the
 * chunk is gone: split, merged or its collection dropped since). */
static void append_bounds(ctx *c, const char *ns, int64_t nid, bson_t *d)
{
	bson_t cmd = BSON_INITIALIZER, reply, chunks, ch, b;
	bson_iter_t it;
	char err[256];
	int code = 0;

	BSON_APPEND_UTF8(&cmd, "getRoutingTable", ns);
	BSON_APPEND_INT64(&cmd, "sinceVersion", 0);
	if (proxy_meta_command(c->p, &cmd, &reply, &code, err, sizeof err) == 0 &&
	    px_get_array(&reply, "chunks", &chunks) &&
	    bson_iter_init(&it, &chunks)) {
		while (bson_iter_next(&it)) {
			uint32_t len;
			const uint8_t *data;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it))
				continue;
			bson_iter_document(&it, &len, &data);
			if (!bson_init_static(&ch, data, len) || px_get_int(&ch, "id", 0) != nid)
				continue;
			if (px_get_doc(&ch, "min", &b))
				BSON_APPEND_DOCUMENT(d, "min", &b);
			if (px_get_doc(&ch, "max", &b))
				BSON_APPEND_DOCUMENT(d, "max", &b);
			break;
		}
	}
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

static void add_migration(const bson_t *m, void *arg)
{
	mig_arg *a = arg;
	const char *id = px_str_of(m, "id"), *ns = px_str_of(m, "ns"), *state = px_str_of(m, "state");
	const char *from = NULL, *to = NULL;
	int64_t nid = 0;
	bson_t spec, *d, det;

	if (id == NULL || ns == NULL || state == NULL || (!a->changelog && mig_ended(state)))
		return;
	if (px_get_doc(m, "spec", &spec)) { /* its registerMigration {ns, chunk, from, to} */
		from = px_str_of(&spec, "from");
		to = px_str_of(&spec, "to");
		nid = px_get_int(&spec, "chunk", 0);
	}
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", id);
	if (a->changelog) {
		BSON_APPEND_UTF8(d, "server", "coordinator");
		BSON_APPEND_UTF8(d, "shard", from ? from : "");
		BSON_APPEND_DATE_TIME(d, "time", px_get_int(m, "updatedMS", 0));
		BSON_APPEND_UTF8(d, "what", strcmp(state, "complete") == 0 ? "moveChunk.commit"
					    : mig_ended(state)		     ? "moveChunk.error"
										     : "moveChunk.start");
		BSON_APPEND_UTF8(d, "ns", ns);
		BSON_APPEND_DOCUMENT_BEGIN(d, "details", &det);
		if (!mig_ended(state) && nid)
			append_bounds(a->c, ns, nid, &det);
		BSON_APPEND_UTF8(&det, "from", from ? from : "");
		BSON_APPEND_UTF8(&det, "to", to ? to : "");
		BSON_APPEND_INT64(&det, "chunk", nid);
		BSON_APPEND_UTF8(&det, "migration", id);
		BSON_APPEND_UTF8(&det, "state", state);
		BSON_APPEND_DATE_TIME(&det, "started", px_get_int(m, "createdMS", 0));
		bson_append_document_end(d, &det);
		if (mig_ended(state)) {
			/* the donor's own entry, which sh.status() counts under "Migration
			 * results for the last 24 hours": details.note "success", else errmsg */
			bson_t *f = bson_new(), fd;
			char fid[300];
			bson_t stats;
			const char *why = px_get_doc(m, "stats", &stats) ? px_str_of(&stats, "error")
									  : NULL;
			snprintf(fid, sizeof fid, "%s-from", id);
			BSON_APPEND_UTF8(f, "_id", fid);
			BSON_APPEND_UTF8(f, "server", "coordinator");
			BSON_APPEND_UTF8(f, "shard", from ? from : "");
			BSON_APPEND_DATE_TIME(f, "time", px_get_int(m, "updatedMS", 0));
			BSON_APPEND_UTF8(f, "what", "moveChunk.from");
			BSON_APPEND_UTF8(f, "ns", ns);
			BSON_APPEND_DOCUMENT_BEGIN(f, "details", &fd);
			BSON_APPEND_UTF8(&fd, "from", from ? from : "");
			BSON_APPEND_UTF8(&fd, "to", to ? to : "");
			BSON_APPEND_INT64(&fd, "chunk", nid);
			BSON_APPEND_UTF8(&fd, "migration", id);
			if (strcmp(state, "complete") == 0) {
				BSON_APPEND_UTF8(&fd, "note", "success");
			} else {
				BSON_APPEND_UTF8(&fd, "note", "aborted");
				BSON_APPEND_UTF8(&fd, "errmsg", why ? why : state);
			}
			bson_append_document_end(f, &fd);
			dl_push(a->l, f);
		}
	} else {
		BSON_APPEND_UTF8(d, "ns", ns);
		if (nid)
			append_bounds(a->c, ns, nid, d);
		BSON_APPEND_UTF8(d, "fromShard", from ? from : "");
		BSON_APPEND_UTF8(d, "toShard", to ? to : "");
		BSON_APPEND_UTF8(d, "state", state);
	}
	dl_push(a->l, d);
}

/* ---- the collections: one loader each ---- */

/* One collection of the config database: its name, and how its documents are loaded. For
 * the views of a metadata list command, list_cmd names the command ({list_cmd: 1}), field
 * the reply's array and add the conversion of one element (its arg: the doclist). */
typedef struct cfg_coll {
	const char *name;
	/* Push the collection's documents into l. Returns: 0, or the code answered on c. */
	int (*load)(ctx *c, const struct cfg_coll *cc, doclist *l);
	const char *list_cmd;
	const char *field;
	void (*add)(const bson_t *doc, void *arg);
} cfg_coll;

/* Run {cc->list_cmd: 1} on the metadata service and pass each element of the reply's
 * cc->field to add(elem, arg). Returns: 0 with *reply (the caller destroys it), or the code
 * answered on c, *reply then not to be touched. */
static int meta_list(ctx *c, const cfg_coll *cc, void (*add)(const bson_t *, void *),
		     void *arg, bson_t *reply)
{
	bson_t cmd = BSON_INITIALIZER;
	int st;

	BSON_APPEND_INT32(&cmd, cc->list_cmd, 1);
	st = px_sharding_meta_call(c, &cmd, reply, NULL, NULL);
	bson_destroy(&cmd);
	if (st == 0)
		px_each_doc(reply, cc->field, add, arg);
	return st;
}

/* config.shards, config.collections, config.mongos: cc->add over the list command. */
static int load_listed(ctx *c, const cfg_coll *cc, doclist *l)
{
	bson_t reply;
	int st;

	if ((st = meta_list(c, cc, cc->add, l, &reply)) != 0)
		return st;
	bson_destroy(&reply);
	return 0;
}

static int load_version(ctx *c, const cfg_coll *cc, doclist *l)
{
	bson_t *d = bson_new();

	(void)c, (void)cc;
	BSON_APPEND_INT32(d, "_id", 1);
	BSON_APPEND_INT32(d, "minCompatibleVersion", 5);
	BSON_APPEND_INT32(d, "currentVersion", 6);
	dl_push(l, d);
	return 0;
}

static int load_settings(ctx *c, const cfg_coll *cc, doclist *l)
{
	bson_t *d = bson_new();

	(void)c, (void)cc;
	BSON_APPEND_UTF8(d, "_id", "balancer");
	BSON_APPEND_UTF8(d, "mode", "off");
	BSON_APPEND_BOOL(d, "stopped", true);
	dl_push(l, d);
	d = bson_new();
	BSON_APPEND_UTF8(d, "_id", "autosplit");
	BSON_APPEND_BOOL(d, "enabled", false);
	dl_push(l, d);
	return 0;
}

static int load_databases(ctx *c, const cfg_coll *cc, doclist *l)
{
	db_arg a = {l, NULL};
	char *primary = px_primary(c);
	bson_t reply;
	int st;

	a.primary = primary;
	if ((st = meta_list(c, cc, add_database, &a, &reply)) == 0) {
		/* a fresh list: this proxy's routing of unsharded collections follows it at
		 * once (`ctl db create --primary` then a read of config.databases) */
		proxy_set_db_primaries(c->p, &reply);
		bson_destroy(&reply);
	}
	free(primary);
	return st;
}

static int load_chunks(ctx *c, const cfg_coll *cc, doclist *l)
{
	(void)cc;
	return px_each_routing_chunk(c, add_chunk, l);
}

/* config.migrations and config.changelog: two views of listMigrations (add_migration). */
static int load_migration_view(ctx *c, const cfg_coll *cc, doclist *l, bool changelog)
{
	mig_arg a = {l, changelog, c};
	bson_t reply;
	int st;

	if ((st = meta_list(c, cc, add_migration, &a, &reply)) != 0)
		return st;
	bson_destroy(&reply);
	return 0;
}

static int load_migrations(ctx *c, const cfg_coll *cc, doclist *l)
{
	return load_migration_view(c, cc, l, false);
}

static int load_changelog(ctx *c, const cfg_coll *cc, doclist *l)
{
	return load_migration_view(c, cc, l, true);
}

/* Every collection answered here, in listCollections order (by name). Any other name is
 * an empty collection (actionlog, locks, tags ...). */
static const cfg_coll cfg_colls[] = {
	{"changelog", load_changelog, "listMigrations", "migrations", NULL},
	{"chunks", load_chunks, NULL, NULL, NULL},
	{"collections", load_listed, "listCollections", "collections", add_collection},
	{"databases", load_databases, "listDatabases", "databases", NULL},
	{"migrations", load_migrations, "listMigrations", "migrations", NULL},
	{"mongos", load_listed, "listProxies", "proxies", add_mongos},
	{"settings", load_settings, NULL, NULL, NULL},
	{"shards", load_listed, "listShards", "shards", add_shard},
	{"version", load_version, NULL, NULL, NULL},
};

#define N_COLLS (sizeof cfg_colls / sizeof cfg_colls[0])

/* The documents of config.<coll> into l. Returns: 0, or the code answered on c. */
static int load(ctx *c, const char *coll, doclist *l)
{
	for (size_t i = 0; i < N_COLLS; i++)
		if (strcmp(cfg_colls[i].name, coll) == 0)
			return cfg_colls[i].load(c, &cfg_colls[i], l);
	return 0;
}

typedef struct feed {
	doclist *l;
	size_t i;
} feed;

static int feed_next(void *arg, const bson_t **doc, int *code, char *err, size_t errlen)
{
	feed *f = arg;

	(void)code, (void)err, (void)errlen;
	if (f->i >= f->l->n)
		return 0;
	*doc = f->l->v[f->i++];
	return 1;
}

/* Run stages over l; the output into out (appended). Returns: 0, or the code answered
 * on c. */
static int run_pipeline(ctx *c, const bson_t *stages, doclist *l, doclist *out)
{
	sdb_pipeline *pl = NULL;
	sdb_pipeline_cursor *pc = NULL;
	feed f = {l, 0};
	int code = 0, r;
	char err[512];

	if (sdb_pipeline_parse(stages, NULL, &pl, &code, err, sizeof err) != 0)
		return px_error(c, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
	sdb_pipeline_open(pl, feed_next, &f, &pc);
	for (;;) {
		const bson_t *d;
		r = sdb_pipeline_cursor_next(pc, &d, &code, err, sizeof err);
		if (r <= 0)
			break;
		dl_push(out, bson_copy(d));
	}
	sdb_pipeline_cursor_free(pc);
	sdb_pipeline_free(pl);
	if (r < 0)
		return px_error(c, code ? code : WIRE_ERR_INTERNAL, "%s", err);
	return 0;
}

/* The stages of a find: $match, $sort, $skip, $limit, $project. Returns: 0 with stages
 * initialised, or the code answered on c (a bad skip, limit or batchSize). */
static int find_stages(ctx *c, bson_t *stages, int64_t *batch, bool *single)
{
	bson_t f, st;
	int64_t skip, limit;
	uint32_t i = 0;
	char k[16];
	int rc;

	if ((rc = px_client_int(c, "skip", 0, INT64_MAX, 0, &skip)) != 0 ||
	    (rc = px_client_int(c, "limit", 0, INT64_MAX, 0, &limit)) != 0 ||
	    (rc = px_client_int(c, "batchSize", 0, INT64_MAX, 101, batch)) != 0)
		return rc;
	*single = px_get_bool(c->cmd, "singleBatch", false);
	bson_init(stages);
#define STAGE(name, append)                                                                 \
	do {                                                                                \
		snprintf(k, sizeof k, "%u", i++);                                           \
		BSON_APPEND_DOCUMENT_BEGIN(stages, k, &st);                                 \
		append;                                                                     \
		bson_append_document_end(stages, &st);                                      \
	} while (0)
	if (px_get_doc(c->cmd, "filter", &f) && !bson_empty(&f))
		STAGE("$match", BSON_APPEND_DOCUMENT(&st, "$match", &f));
	if (px_get_doc(c->cmd, "sort", &f) && !bson_empty(&f))
		STAGE("$sort", BSON_APPEND_DOCUMENT(&st, "$sort", &f));
	if (skip > 0)
		STAGE("$skip", BSON_APPEND_INT64(&st, "$skip", skip));
	if (limit > 0)
		STAGE("$limit", BSON_APPEND_INT64(&st, "$limit", limit));
	if (px_get_doc(c->cmd, "projection", &f) && !bson_empty(&f))
		STAGE("$project", BSON_APPEND_DOCUMENT(&st, "$project", &f));
#undef STAGE
	return 0;
}

/* Answer c with out as a proxy cursor over c->ns (out's documents taken over). Returns: the
 * status of the answer (px_answer_cursor). */
static int answer_docs(ctx *c, doclist *out, int64_t batch, bool single)
{
	bson_t arr = BSON_INITIALIZER;
	bool ok = true;
	pstream *s;
	size_t i;

	for (i = 0; i < out->n; i++) {
		ok = ok && pstream_docs_append(&arr, (uint32_t)i, out->v[i]);
		bson_destroy(out->v[i]);
	}
	free(out->v);
	memset(out, 0, sizeof *out);
	if (!ok) { /* past libbson's 1 GiB: never a config listing in practice */
		bson_destroy(&arr);
		return px_error(c, WIRE_ERR_BSON_TOO_LARGE, "%s: over 1 GiB of documents", c->ns);
	}
	s = sdb_calloc_bson(1, sizeof *s);
	memset(s, 0, sizeof *s);
	s->chunk = -1;
	bson_init(&s->err_reply);
	pstream_take_docs(s, &arr);
	bson_destroy(&arr);
	return px_answer_cursor(c, proxy_cursor_new(c->p, c->ns, s, 1, NULL, NULL, 0, 0), batch,
				single, "firstBatch", c->ns);
}

/* listCollections on config: the collections answered here. Returns: the answer's status. */
static int list_collections(ctx *c)
{
	doclist l = {0}, out = {0};
	bson_t f, stages = BSON_INITIALIZER, st;
	size_t i;
	int rc;

	for (i = 0; i < N_COLLS; i++) {
		bson_t *d = bson_new(), o;
		BSON_APPEND_UTF8(d, "name", cfg_colls[i].name);
		BSON_APPEND_UTF8(d, "type", "collection");
		BSON_APPEND_DOCUMENT_BEGIN(d, "options", &o);
		bson_append_document_end(d, &o);
		BSON_APPEND_DOCUMENT_BEGIN(d, "info", &o);
		BSON_APPEND_BOOL(&o, "readOnly", true);
		bson_append_document_end(d, &o);
		dl_push(&l, d);
	}
	if (px_get_doc(c->cmd, "filter", &f) && !bson_empty(&f)) {
		BSON_APPEND_DOCUMENT_BEGIN(&stages, "0", &st);
		BSON_APPEND_DOCUMENT(&st, "$match", &f);
		bson_append_document_end(&stages, &st);
	}
	if ((rc = run_pipeline(c, &stages, &l, &out)) == 0) {
		snprintf(c->ns, sizeof c->ns, "config.$cmd.listCollections");
		rc = answer_docs(c, &out, INT64_MAX, true);
	}
	dl_free(&out);
	dl_free(&l);
	bson_destroy(&stages);
	return rc;
}

/* ---- the commands: one handler each ---- */

/* Run stages over config.<c->coll> and answer c: a cursor of batch (single: no getMore),
 * or for count {n}. Takes stages over (destroys it). Returns: the answer's status. */
static int answer_view(ctx *c, bson_t *stages, int64_t batch, bool single, bool count)
{
	doclist l = {0}, out = {0};
	int rc;

	if (px_uses_js(stages, 0)) {
		bson_destroy(stages);
		/* stages come from c->cmd: it uses JavaScript too */
		return px_refuse_js(c, c->cmd);
	}
	if ((rc = load(c, c->coll, &l)) == 0 && (rc = run_pipeline(c, stages, &l, &out)) == 0) {
		if (count) {
			bson_t *r = bson_new();
			BSON_APPEND_INT64(r, "n", out.n ? px_get_int(out.v[0], "n", 0) : 0);
			rc = px_reply(c, r);
		} else {
			rc = answer_docs(c, &out, batch, single);
		}
	}
	dl_free(&out);
	dl_free(&l);
	bson_destroy(stages);
	return rc;
}

static int cfg_find(ctx *c)
{
	bson_t stages;
	int64_t batch = 101;
	bool single = false;
	int rc;

	if ((rc = find_stages(c, &stages, &batch, &single)) != 0)
		return rc;
	return answer_view(c, &stages, batch, single, false);
}

static int cfg_aggregate(ctx *c)
{
	bson_t p, stages;
	int64_t batch;
	int rc;

	if ((rc = px_agg_args(c, &p, &batch)) != 0)
		return rc;
	if (px_cs_pipeline_kind(&p) != 0) /* mongod's refusal for the internal databases */
		return px_error(c, WIRE_ERR_INVALID_NAMESPACE,
				"$changeStream may not be opened on the internal config database");
	bson_copy_to(&p, &stages);
	return answer_view(c, &stages, batch, false, false);
}

/* count: [{$match: query}, {$count: "n"}] */
static int cfg_count(ctx *c)
{
	bson_t q, st, stages = BSON_INITIALIZER;

	BSON_APPEND_DOCUMENT_BEGIN(&stages, "0", &st);
	if (px_get_doc(c->cmd, "query", &q))
		BSON_APPEND_DOCUMENT(&st, "$match", &q);
	else
		BSON_APPEND_DOCUMENT(&st, "$match", &(bson_t)BSON_INITIALIZER);
	bson_append_document_end(&stages, &st);
	BSON_APPEND_DOCUMENT_BEGIN(&stages, "1", &st);
	BSON_APPEND_UTF8(&st, "$count", "n");
	bson_append_document_end(&stages, &st);
	return answer_view(c, &stages, 101, false, true);
}

/* A command on the config database: its handler (answers c exactly once and returns the
 * answer's status, as px_cmd's run), or NULL for
 * the commands the proxy's own handlers answer (getMore and killCursors of the cursors
 * opened here); coll: it needs a collection name. */
typedef struct cfg_cmd {
	const char *name;
	int (*run)(ctx *c);
	bool coll;
} cfg_cmd;

static const cfg_cmd cfg_cmds[] = {
	{"find", cfg_find, true},
	{"aggregate", cfg_aggregate, true},
	{"count", cfg_count, true},
	{"listCollections", list_collections, false},
	{"getMore", NULL, false},
	{"killCursors", NULL, false},
};

int px_config_db(ctx *c, const px_cmd *cmd, bool *done)
{
	const cfg_cmd *e = NULL;

	*done = false;
	if (c->db == NULL || strcmp(c->db, "config") != 0)
		return 0;
	for (size_t i = 0; i < sizeof cfg_cmds / sizeof cfg_cmds[0]; i++)
		if (strcmp(cfg_cmds[i].name, cmd->name) == 0)
			e = &cfg_cmds[i];
	if (e != NULL && e->run == NULL)
		return 0; /* the proxy cursors answered by the command's own handler */
	*done = true;
	if (e == NULL || (e->coll && c->coll == NULL))
		return px_error(c, WIRE_ERR_ILLEGAL_OPERATION,
				"%s on the config database is not supported by stripedb: config is a "
				"read-only view of the metadata service (find, aggregate, count)",
				cmd->name);
	return e->run(c);
}
