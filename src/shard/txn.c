/* Multi-document transactions on one shard (issue #16). Contract and design in txn.h and
 * src/shard/README.md "Transactions"; mongod's behaviour from transaction_participant.cpp
 * and error_labels.cpp (codes, messages, TransientTransactionError).
 *
 * Reads the private state of the member's replica set (repl_int.h: the apply connection,
 * the applied index, the Raft node) because a statement runs on the apply connection
 * between two applies. */
#include "shard/txn.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "shard/repl.h"
#include "shard/repl_int.h"
#include "storage/keyenc.h"

#include "shard/txn_int.h"

static const sdb_metric_def txns_metrics[] = {
	SDB_METRIC_COUNTER(shard_txns, c_started, "stripedb_shard_txn_started_total",
			   "Multi-document transactions started on this primary."),
	SDB_METRIC_COUNTER(shard_txns, c_committed, "stripedb_shard_txn_committed_total",
			   "Multi-document transactions committed (commitTransaction "
			   "answered ok, read-only ones included)."),
	SDB_METRIC_COUNTER(shard_txns, c_aborted, "stripedb_shard_txn_aborted_total",
			   "Multi-document transactions aborted (abortTransaction, "
			   "conflict, error, timeout, step down)."),
	SDB_METRIC_COUNTER(shard_txns, c_conflicts, "stripedb_shard_txn_write_conflicts_total",
			   "Transactions aborted by WriteConflict (112)."),
	SDB_METRIC_GAUGE(shard_txns, g_open, "stripedb_shard_txn_open",
			 "Multi-document transactions open on this primary."),
};

/* ------------------------------------------------------------------ records */

static void ops_free(shard_txn_rec *t)
{
	for (size_t i = 0; i < t->n_ops; i++) {
		free(t->ops[i].ns);
		bson_destroy(t->ops[i].o);
		if (t->ops[i].ud)
			bson_destroy(t->ops[i].ud);
		free(t->ops[i].k);
	}
	free(t->ops);
	t->ops = NULL;
	t->n_ops = t->cap_ops = 0;
	for (size_t i = 0; i < t->n_keys; i++) {
		free(t->keys[i].ns);
		free(t->keys[i].k);
	}
	free(t->keys);
	t->keys = NULL;
	t->n_keys = t->cap_keys = 0;
}

void shard_txn_rec_free(shard_txn_rec *t)
{
	if (!t)
		return;
	ops_free(t);
	free(t->lsid);
	free(t);
}

/* Add a key (k NULL: the namespace) unless already there. */
static void key_add(shard_txn_rec *t, const char *ns, const uint8_t *k, size_t klen)
{
	for (size_t i = 0; i < t->n_keys; i++) {
		txn_key *e = &t->keys[i];
		if (strcmp(e->ns, ns) != 0)
			continue;
		if (!e->k)
			return; /* the namespace covers it */
		if (k && e->klen == klen && memcmp(e->k, k, klen) == 0)
			return;
	}
	if (t->n_keys == t->cap_keys) {
		t->cap_keys = t->cap_keys ? t->cap_keys * 2 : 8;
		t->keys = sdb_realloc(t->keys, t->cap_keys * sizeof *t->keys);
	}
	txn_key *e = &t->keys[t->n_keys++];
	e->ns = sdb_strdup(ns);
	e->k = NULL;
	e->klen = klen;
	if (k) {
		e->k = sdb_malloc(klen ? klen : 1);
		memcpy(e->k, k, klen);
	}
}

/* The key of the _id value at it; false when it cannot be encoded. */
static bool id_key(const bson_iter_t *it, sdb_key *out)
{
	char err[128];
	sdb_key_init(out);
	return sdb_keyenc_append_iter(out, it, false, err, sizeof err) == 0;
}

static void key_add_iter(shard_txn_rec *t, const char *ns, const bson_iter_t *it)
{
	sdb_key k;
	if (BSON_ITER_HOLDS_REGEX(it) || !id_key(it, &k)) {
		key_add(t, ns, NULL, 0);
		return;
	}
	key_add(t, ns, k.data, k.len);
	sdb_key_free(&k);
}

/* Register what a filter may read: the _id values of an _id equality or $in, else the
 * whole namespace. */
static void keys_from_filter(shard_txn_rec *t, const char *ns, const bson_t *filter)
{
	bson_iter_t it, sub, arr;
	if (!filter || !bson_iter_init_find(&it, filter, "_id")) {
		key_add(t, ns, NULL, 0);
		return;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
		key_add_iter(t, ns, &it);
		return;
	}
	if (!bson_iter_recurse(&it, &sub) || !bson_iter_next(&sub) ||
	    bson_iter_key(&sub)[0] != '$') {
		key_add_iter(t, ns, &it); /* an embedded document as _id */
		return;
	}
	bson_iter_recurse(&it, &sub);
	while (bson_iter_next(&sub)) {
		const char *op = bson_iter_key(&sub);
		if (strcmp(op, "$eq") == 0) {
			key_add_iter(t, ns, &sub);
			return;
		}
		if (strcmp(op, "$in") == 0 && BSON_ITER_HOLDS_ARRAY(&sub) &&
		    bson_iter_recurse(&sub, &arr)) {
			while (bson_iter_next(&arr))
				key_add_iter(t, ns, &arr);
			return;
		}
	}
	key_add(t, ns, NULL, 0);
}

static void filter_of(shard_txn_rec *t, const char *ns, const bson_t *cmd, const char *field)
{
	bson_iter_t it;
	bson_t f;
	uint32_t len;
	const uint8_t *data;
	if (bson_iter_init_find(&it, cmd, field) && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_iter_document(&it, &len, &data);
		if (bson_init_static(&f, data, len)) {
			keys_from_filter(t, ns, &f);
			return;
		}
	}
	key_add(t, ns, NULL, 0);
}

/* Register the reads of a statement (its writes are registered from its effects). */
static void keys_of_statement(shard_txn_rec *t, const char *name, const char *db,
			      const bson_t *cmd)
{
	bson_iter_t it, arr;
	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) || !BSON_ITER_HOLDS_UTF8(&it))
		return;
	char *ns = sdb_asprintf("%s.%s", db, bson_iter_utf8(&it, NULL));
	if (strcmp(name, "find") == 0)
		filter_of(t, ns, cmd, "filter");
	else if (strcmp(name, "count") == 0 || strcmp(name, "distinct") == 0 ||
		 strcmp(name, "findAndModify") == 0 || strcmp(name, "findandmodify") == 0)
		filter_of(t, ns, cmd, "query");
	else if (strcmp(name, "update") == 0 || strcmp(name, "delete") == 0) {
		const char *a = name[0] == 'u' ? "updates" : "deletes";
		if (bson_iter_init_find(&it, cmd, a) && BSON_ITER_HOLDS_ARRAY(&it) &&
		    bson_iter_recurse(&it, &arr)) {
			while (bson_iter_next(&arr)) {
				bson_t st;
				uint32_t len;
				const uint8_t *data;
				if (!BSON_ITER_HOLDS_DOCUMENT(&arr))
					continue;
				bson_iter_document(&arr, &len, &data);
				if (bson_init_static(&st, data, len))
					filter_of(t, ns, &st, "q");
			}
		}
	} else if (strcmp(name, "aggregate") == 0)
		key_add(t, ns, NULL, 0);
	free(ns);
}

/* Does write-log entry e (or an op of another commit) touch one of t's keys? */
bool txn_touches(const shard_txn_rec *t, const char *ns, const uint8_t *k, size_t klen,
		    bool all)
{
	if (all)
		return true;
	for (size_t i = 0; i < t->n_keys; i++) {
		const txn_key *e = &t->keys[i];
		if (strcmp(e->ns, ns) != 0)
			continue;
		if (!e->k || !k || (e->klen == klen && memcmp(e->k, k, klen) == 0))
			return true;
	}
	return false;
}

/* Is t still valid: no write applied after its start touched its keys? */
bool txn_valid(shard_txns *T, const shard_txn_rec *t)
{
	for (size_t i = T->n_log; i > 0; i--) {
		const wlog_ent *e = &T->log[i - 1];
		if (e->seq <= t->start_seq)
			break; /* the log is in apply order */
		if (txn_touches(t, e->ns, e->k, e->klen, e->all))
			return false;
	}
	return true;
}

/* ------------------------------------------------------------------ table */

shard_txns *txn_table(shard *sh)
{
	return sh->txns;
}

shard_txn_rec *txn_find_rec(shard_txns *T, const bson_t *lsid)
{
	const uint8_t *d = bson_get_data(lsid);
	for (shard_txn_rec *t = T->list; t; t = t->next)
		if (t->lsid_len == lsid->len && memcmp(t->lsid, d, lsid->len) == 0)
			return t;
	return NULL;
}

static void unlink_rec(shard_txns *T, shard_txn_rec *t)
{
	for (shard_txn_rec **pp = &T->list; *pp; pp = &(*pp)->next) {
		if (*pp == t) {
			*pp = t->next;
			t->next = NULL;
			return;
		}
	}
}

static size_t n_open(shard_txns *T)
{
	size_t n = 0;
	for (shard_txn_rec *t = T->list; t; t = t->next)
		n += t->state == TXN_OPEN;
	return n;
}

/* Does t still need the write log (open, or its commit waiting to be validated)? */
static bool needs_log(const shard_txn_rec *t)
{
	return t->state == TXN_OPEN || t->state == TXN_QUEUED;
}

/* Drop the write log before the oldest start of a transaction that still needs it. */
void txn_trim_log(shard_txns *T)
{
	uint64_t min = UINT64_MAX;
	for (shard_txn_rec *t = T->list; t; t = t->next)
		if (needs_log(t) && t->start_seq < min)
			min = t->start_seq;
	size_t drop = 0;
	while (drop < T->n_log && T->log[drop].seq <= min)
		drop++;
	for (size_t i = 0; i < drop; i++) {
		free(T->log[i].ns);
		free(T->log[i].k);
	}
	if (drop) {
		memmove(T->log, T->log + drop, (T->n_log - drop) * sizeof *T->log);
		T->n_log -= drop;
	}
	sdb_gauge_set(T->g_open, (int64_t)n_open(T));
}

/* End an open transaction: its effects are dropped, a tombstone remains. */
static void finish(shard_txns *T, shard_txn_rec *t, int state, const char *why)
{
	if (t->state == TXN_OPEN && state == TXN_ABORTED)
		sdb_counter_inc(T->c_aborted);
	t->state = state;
	t->end_ms = sdb_mono_ms();
	snprintf(t->why, sizeof t->why, "%s", why ? why : "");
	ops_free(t);
	txn_trim_log(T);
}

static void timer_cb(uv_timer_t *h)
{
	shard_txns *T = h->data;
	uint64_t now = sdb_mono_ms();
	shard_txn_rec **pp = &T->list;
	while (*pp) {
		shard_txn_rec *t = *pp;
		if (t->state == TXN_OPEN && now - t->start_ms >= (uint64_t)T->limit_ms) {
			sdb_info("shard: transaction aborted: transactionLifetimeLimitSeconds",
				 "txnNumber=%lld age_ms=%llu", (long long)t->txn,
				 (unsigned long long)(now - t->start_ms));
			finish(T, t, TXN_ABORTED, "it exceeded transactionLifetimeLimitSeconds");
		}
		if (t->state != TXN_OPEN && now - t->end_ms >= TXN_TOMBSTONE_MS) {
			*pp = t->next;
			shard_txn_rec_free(t);
			continue;
		}
		pp = &t->next;
	}
}

shard_txns *shard_txns_start(shard *sh, int64_t limit_s)
{
	shard_txns *T = sdb_calloc(1, sizeof *T);
	T->sh = sh;
	T->limit_ms = limit_s * 1000;
	uint64_t tick = (uint64_t)T->limit_ms / 4;
	if (tick > 1000)
		tick = 1000;
	if (tick < 50)
		tick = 50;
	uv_timer_init(sh->role->loop, &T->timer);
	T->timer.data = T;
	uv_timer_start(&T->timer, timer_cb, tick, tick);
	SDB_METRICS_REGISTER(T, txns_metrics, NULL);
	return T;
}

static void timer_closed(uv_handle_t *h)
{
	shard_txns *T = h->data;
	void (*cb)(void *) = T->closed_cb;
	void *arg = T->closed_arg;
	while (T->list) {
		shard_txn_rec *t = T->list;
		T->list = t->next;
		shard_txn_rec_free(t);
	}
	for (size_t i = 0; i < T->n_log; i++) {
		free(T->log[i].ns);
		free(T->log[i].k);
	}
	free(T->log);
	free(T);
	cb(arg);
}

void shard_txns_stop(shard_txns *T, void (*cb)(void *arg), void *arg)
{
	if (!T) {
		cb(arg);
		return;
	}
	T->closed_cb = cb;
	T->closed_arg = arg;
	uv_timer_stop(&T->timer);
	uv_close((uv_handle_t *)&T->timer, timer_closed);
}

bool shard_txns_active(shard *sh)
{
	shard_txns *T = txn_table(sh);
	if (!T)
		return false;
	for (shard_txn_rec *t = T->list; t; t = t->next)
		if (needs_log(t))
			return true;
	return false;
}

static void log_add(shard_txns *T, uint64_t seq, const char *ns, const uint8_t *k, size_t klen,
		    bool all)
{
	if (T->n_log == T->cap_log) {
		T->cap_log = T->cap_log ? T->cap_log * 2 : 64;
		T->log = sdb_realloc(T->log, T->cap_log * sizeof *T->log);
	}
	wlog_ent *e = &T->log[T->n_log++];
	e->seq = seq;
	e->ns = sdb_strdup(ns ? ns : "");
	e->k = NULL;
	e->klen = klen;
	if (k) {
		e->k = sdb_malloc(klen ? klen : 1);
		memcpy(e->k, k, klen);
	}
	e->all = all;
}

/* The namespace, op and _id key of an oplog entry; false for entries that change no
 * document ("n"); *all for commands ("c"). */
static bool entry_key(const bson_t *e, const char **ns, char *op, sdb_key *k, bool *all)
{
	bson_iter_t it, sub;
	*ns = NULL;
	*op = 0;
	*all = false;
	sdb_key_init(k);
	if (bson_iter_init_find(&it, e, "op") && BSON_ITER_HOLDS_UTF8(&it))
		*op = bson_iter_utf8(&it, NULL)[0];
	if (bson_iter_init_find(&it, e, "ns") && BSON_ITER_HOLDS_UTF8(&it))
		*ns = bson_iter_utf8(&it, NULL);
	if (*op == 'c') {
		*all = true;
		return true;
	}
	if (*op != 'i' && *op != 'u' && *op != 'd')
		return false;
	const char *from = *op == 'u' ? "o2" : "o";
	if (!*ns || !bson_iter_init_find(&it, e, from) || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &sub) || !bson_iter_find(&sub, "_id") || !id_key(&sub, k)) {
		*all = true; /* cannot tell: conflict with everything (safe) */
		return true;
	}
	return true;
}

void shard_txns_note_apply(shard *sh, sdb_store_conn *conn, uint64_t index, uint64_t before,
			   bool all)
{
	shard_txns *T = txn_table(sh);
	bson_t **docs = NULL;
	size_t n = 0;
	char err[256];
	if (!T)
		return;
	if (all)
		log_add(T, index, "", NULL, 0, true);
	if (sdb_store_oplog_read(conn, before, SIZE_MAX, &docs, &n, err, sizeof err) != 0) {
		log_add(T, index, "", NULL, 0, true); /* unknown: conflict with everything */
		sdb_warn("shard: transactions: cannot read the applied entry's oplog",
			 "err=\"%s\"", err);
	}
	for (size_t i = 0; i < n; i++) {
		const char *ns;
		char op;
		sdb_key k;
		bool a;
		if (entry_key(docs[i], &ns, &op, &k, &a))
			log_add(T, index, ns, a ? NULL : k.data, a ? 0 : k.len, a);
		sdb_key_free(&k);
		sdb_doc_free(docs[i]);
	}
	free(docs);
}

void shard_txns_abort_all(shard *sh, const char *why)
{
	shard_txns *T = txn_table(sh);
	if (!T)
		return;
	for (shard_txn_rec *t = T->list; t; t = t->next) {
		if (t->state == TXN_OPEN)
			finish(T, t, TXN_ABORTED, why);
		else if (t->state == TXN_QUEUED)
			t->state = TXN_ABORTED; /* its queued commit is refused (not primary) */
	}
	txn_trim_log(T);
}

/* ------------------------------------------------------------------ replies */

static bool transient(int code)
{
	return code == WIRE_ERR_WRITE_CONFLICT || code == WIRE_ERR_NO_SUCH_TRANSACTION ||
	       code == WIRE_ERR_STALE_CONFIG || code == 24 /* LockTimeout */;
}

/* Answer an error with mongod's labels: TransientTransactionError on the codes after which
 * the whole transaction may be retried. */
void txn_fail(wire_req *req, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	bson_t *extra = bson_new();
	if (transient(code)) {
		bson_t labels;
		bson_append_array_begin(extra, "errorLabels", -1, &labels);
		BSON_APPEND_UTF8(&labels, "0", "TransientTransactionError");
		bson_append_array_end(extra, &labels);
	}
	wire_req_error_extra(req, code, extra, "%s", msg);
}

/* ------------------------------------------------------------------ session fields */

typedef struct txn_args {
	bson_t lsid; /* static view */
	int64_t txn;
	bool start;
	bool has_rc; /* readConcern given */
	bool has_wc;
} txn_args;

/* Parse the session fields of a transaction command; answers and returns false when they
 * are malformed (InvalidOptions 72, as mongod's validateSessionOptions). */
static bool parse_args(wire_req *req, txn_args *a)
{
	const bson_t *cmd = wire_req_cmd(req);
	const char *name = wire_req_name(req);
	bool commit_or_abort = strcmp(name, "commitTransaction") == 0 ||
			       strcmp(name, "abortTransaction") == 0;
	bson_iter_t it;
	bool have_lsid = false, have_txn = false, have_ac = false;
	memset(a, 0, sizeof *a);
	if (bson_iter_init_find(&it, cmd, "lsid") && BSON_ITER_HOLDS_DOCUMENT(&it)) {
		uint32_t len;
		const uint8_t *data;
		bson_iter_document(&it, &len, &data);
		have_lsid = bson_init_static(&a->lsid, data, len);
	}
	if (bson_iter_init_find(&it, cmd, "txnNumber")) {
		if (!(BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it)) ||
		    bson_iter_as_int64(&it) < 0) {
			wire_req_error(req, WIRE_ERR_TYPE_MISMATCH,
				       "BSON field 'txnNumber' must be a non-negative long");
			return false;
		}
		a->txn = bson_iter_as_int64(&it);
		have_txn = true;
	}
	if (bson_iter_init_find(&it, cmd, "autocommit")) {
		if (!BSON_ITER_HOLDS_BOOL(&it)) {
			wire_req_error(req, WIRE_ERR_TYPE_MISMATCH,
				       "BSON field 'autocommit' is the wrong type, expected type "
				       "'bool'");
			return false;
		}
		if (bson_iter_bool(&it)) {
			wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
				       "Specifying autocommit=true is not allowed.");
			return false;
		}
		have_ac = true;
	}
	if (bson_iter_init_find(&it, cmd, "startTransaction")) {
		if (!BSON_ITER_HOLDS_BOOL(&it) || !bson_iter_bool(&it)) {
			wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
				       "Specifying startTransaction=false is not allowed.");
			return false;
		}
		a->start = true;
	}
	a->has_rc = bson_iter_init_find(&it, cmd, "readConcern");
	a->has_wc = bson_iter_init_find(&it, cmd, "writeConcern");
	if (!have_ac) {
		wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
			       commit_or_abort
				       ? "%s must be run within a transaction"
				       : "txnNumber may only be provided for multi-document "
					 "transactions and retryable write commands. autocommit:false "
					 "was not provided%s",
			       commit_or_abort ? name : "");
		return false;
	}
	if (!have_txn) {
		wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
			       "'autocommit' field requires a transaction number to also be "
			       "specified");
		return false;
	}
	if (!have_lsid) {
		wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
			       "Transaction number requires a session ID to also be specified");
		return false;
	}
	return true;
}

/* The durable record of lsid on the apply connection (between applies): *stored the
 * session's txnNumber (-1: none live), *committed whether its transaction committed. */
static int durable_state(shard_repl *r, const bson_t *lsid, int64_t txn, int64_t *stored,
			 bool *committed)
{
	char err[256];
	bson_t *res = NULL;
	*stored = -1;
	*committed = false;
	if (sdb_store_begin(r->conn, false, err, sizeof err) != 0)
		return SDB_EIO;
	int rc = sdb_store_session_peek(r->conn, lsid, txn, SHARD_STMT_TXN_COMMITTED, &res, err,
					sizeof err);
	if (rc == 1)
		*committed = true;
	sdb_doc_free(res);
	if (rc >= 0) {
		int64_t cur = 0;
		int k = sdb_store_session_txn(r->conn, lsid, &cur, err, sizeof err);
		if (k == 1)
			*stored = cur;
		else if (k < 0)
			rc = k;
	}
	sdb_store_rollback(r->conn);
	return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------------ statements */

/* Whether command name on database db may run inside a transaction: mongod's list (count is
 * not in it since 4.2: countDocuments runs an aggregate; nothing on admin, config or local),
 * else OperationNotSupportedInTransaction (263). */
static bool allowed_in_txn(const char *name, const char *db)
{
	static const char *const ok[] = {"find",	  "insert",	   "update",	"delete",
					 "findAndModify", "findandmodify", "distinct",	"aggregate",
					 "getMore",	  "killCursors"};
	if (db && (strcmp(db, "admin") == 0 || strcmp(db, "config") == 0 ||
		   strcmp(db, "local") == 0))
		return false;
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
		if (strcmp(ok[i], name) == 0)
			return true;
	return false;
}

/* The command without the session and transaction fields (run like a plain command). */
static bson_t *stripped(const bson_t *cmd)
{
	static const char *const drop[] = {"lsid",	  "txnNumber", "autocommit",
					   "startTransaction", "readConcern", "stmtId",
					   "stmtIds",	  "$clusterTime", "writeConcern",
					   "$readPreference"};
	bson_t *out = bson_new();
	bson_iter_t it;
	if (!bson_iter_init(&it, cmd))
		return out;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool skip = false;
		for (size_t i = 0; i < sizeof drop / sizeof drop[0] && !skip; i++)
			skip = strcmp(k, drop[i]) == 0;
		if (!skip)
			bson_append_iter(out, k, -1, &it);
	}
	return out;
}

static bool split_ns(const char *ns, char *db, size_t dblen, const char **coll)
{
	const char *dot = strchr(ns, '.');
	if (!dot || (size_t)(dot - ns) >= dblen)
		return false;
	memcpy(db, ns, (size_t)(dot - ns));
	db[dot - ns] = 0;
	*coll = dot + 1;
	return true;
}

/* Apply one effect on conn (in a write transaction or apply savepoint); ud (may be NULL):
 * a "u" effect's updateDescription, written as captured. 0 or an SDB_E* code (duplicate
 * key: dup filled). */
int txn_apply_op(sdb_store_conn *conn, char op, const char *ns, const bson_t *o,
		    const bson_t *ud, sdb_store_dup *dup, char *err, size_t errlen)
{
	char db[128];
	const char *coll;
	bson_iter_t id;
	bson_t old;
	if (!split_ns(ns, db, sizeof db, &coll))
		return sdb_errf(err, errlen, SDB_EINVAL, "bad namespace %s", ns);
	if (op == 'i')
		return sdb_store_insert(conn, db, coll, o, NULL, dup, err, errlen);
	if (!bson_iter_init_find(&id, o, "_id"))
		return sdb_errf(err, errlen, SDB_EINVAL, "transaction op without _id");
	int rc = sdb_store_get_by_id(conn, db, coll, &id, &old, err, errlen);
	if (op == 'u') {
		if (rc == SDB_ENOTFOUND)
			return sdb_store_insert(conn, db, coll, o, NULL, dup, err, errlen);
		if (rc)
			return rc;
		/* ud NULL: a replacement, no updateDescription; old: the stored image, just read */
		rc = sdb_store_update_stored(conn, db, coll, &old, o, SDB_STORE_UPD_REPLACE, ud,
					     NULL, dup, err, errlen);
		bson_destroy(&old);
		return rc;
	}
	if (rc == SDB_ENOTFOUND)
		return 0;
	if (rc)
		return rc;
	rc = sdb_store_delete(conn, db, coll, &old, NULL, err, errlen);
	bson_destroy(&old);
	return rc;
}

static void op_add(shard_txn_rec *t, char op, const char *ns, const bson_t *o,
		   const bson_t *ud, const sdb_key *k)
{
	if (t->n_ops == t->cap_ops) {
		t->cap_ops = t->cap_ops ? t->cap_ops * 2 : 8;
		t->ops = sdb_realloc(t->ops, t->cap_ops * sizeof *t->ops);
	}
	txn_op *e = &t->ops[t->n_ops++];
	e->op = op;
	e->ns = sdb_strdup(ns);
	e->o = bson_copy(o);
	e->ud = ud ? bson_copy(ud) : NULL;
	e->klen = k->len;
	e->k = sdb_malloc(k->len ? k->len : 1);
	memcpy(e->k, k->data, k->len);
	key_add(t, ns, k->data, k->len);
}

/* Record the effects of the statement: the oplog entries written after before. */
static int capture(shard_txn_rec *t, sdb_store_conn *conn, uint64_t before, char *err,
		   size_t errlen)
{
	bson_t **docs = NULL;
	size_t n = 0;
	int rc = sdb_store_oplog_read(conn, before, SIZE_MAX, &docs, &n, err, errlen);
	for (size_t i = 0; i < n; i++) {
		const char *ns;
		char op;
		sdb_key k;
		bool all;
		bson_iter_t it;
		if (rc == 0 && entry_key(docs[i], &ns, &op, &k, &all) && op != 'c') {
			if (all || !bson_iter_init_find(&it, docs[i], "o") ||
			    !BSON_ITER_HOLDS_DOCUMENT(&it)) {
				rc = sdb_errf(err, errlen, SDB_EINVAL,
					      "transaction: an effect without its document");
			} else {
				uint32_t len;
				const uint8_t *data;
				bson_t o, ud;
				bool have_ud = false;
				bson_iter_t u;
				bson_iter_document(&it, &len, &data);
				if (op == 'u' &&
				    bson_iter_init_find(&u, docs[i], "updateDescription") &&
				    BSON_ITER_HOLDS_DOCUMENT(&u)) {
					uint32_t ulen;
					const uint8_t *udata;
					bson_iter_document(&u, &ulen, &udata);
					have_ud = bson_init_static(&ud, udata, ulen);
				}
				if (bson_init_static(&o, data, len))
					op_add(t, op, ns, &o, have_ud ? &ud : NULL, &k);
			}
		}
		sdb_key_free(&k);
		sdb_doc_free(docs[i]);
	}
	free(docs);
	return rc;
}

/* Run statement (name, fn) of t tentatively on the apply connection: replay t's effects,
 * run it, capture its effects into t, roll everything back. Returns the statement's reply
 * (heap) or NULL with err set (internal failure). */
static bson_t *run_tentative(shard *sh, shard_txn_rec *t, const char *db, const bson_t *cmd,
			     shard_cmd_fn fn, char *err, size_t errlen)
{
	shard_repl *r = sh->repl;
	sdb_store_conn *conn = r->conn;
	sdb_store_det det;
	memset(&det, 0, sizeof det);
	det.now_ms = sdb_store_now_ms(conn);
	det.term = (int64_t)sdb_node_term(r->node);
	if (getrandom(det.seed, sizeof det.seed, 0) != (ssize_t)sizeof det.seed) {
		bson_oid_t o;
		bson_oid_init(&o, NULL);
		memcpy(det.seed, o.bytes + 4, sizeof det.seed);
	}
	if (sdb_store_apply_begin(conn, &det, err, errlen) != 0)
		return NULL;
	int rc = 0;
	if (t->n_ops) {
		rc = sdb_store_begin(conn, true, err, errlen);
		for (size_t i = 0; rc == 0 && i < t->n_ops; i++) {
			sdb_store_dup dup = {0};
			rc = txn_apply_op(conn, t->ops[i].op, t->ops[i].ns, t->ops[i].o,
				      t->ops[i].ud, &dup, err, errlen);
			sdb_store_dup_clear(&dup);
		}
		if (rc == 0)
			rc = sdb_store_commit(conn, err, errlen);
		else
			sdb_store_rollback(conn);
	}
	if (rc) {
		sdb_store_apply_rollback(conn);
		return NULL;
	}
	uint64_t before = sdb_store_oplog_last(conn);
	wire_req *dreq = wire_req_detached_new(db, cmd);
	shard_ctx x;
	shard_ctx_init(&x, sh, conn, dreq);
	x.in_txn = true;
	shard_ctx_run(&x, fn);
	sdb_store_rollback(conn); /* a command that failed half-way */
	bson_t *reply = wire_req_detached_take(dreq);
	wire_req_detached_free(dreq);
	bson_iter_t it;
	bool ok = reply && bson_iter_init_find(&it, reply, "ok") && bson_iter_as_bool(&it);
	if (ok && capture(t, conn, before, err, errlen) != 0) {
		bson_destroy(reply);
		reply = NULL;
	}
	sdb_store_apply_rollback(conn);
	if (sdb_store_take_io_fault()) {
		/* a disk failure on the apply connection: the next apply stops the member */
		sdb_warn("shard: transaction statement hit a disk error", "err=\"%s\"", err);
	}
	if (!reply && !*err)
		snprintf(err, errlen, "the statement did not reply");
	return reply;
}

/* Add errorLabels [TransientTransactionError] to an error reply with such a code. */
static bson_t *label_reply(bson_t *reply)
{
	bson_iter_t it;
	int code = 0;
	if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		code = (int)bson_iter_as_int64(&it);
	if (!transient(code) || bson_iter_init_find(&it, reply, "errorLabels"))
		return reply;
	bson_t *out = bson_copy(reply);
	bson_t labels;
	bson_append_array_begin(out, "errorLabels", -1, &labels);
	BSON_APPEND_UTF8(&labels, "0", "TransientTransactionError");
	bson_append_array_end(out, &labels);
	bson_destroy(reply);
	return out;
}

static void not_primary(shard *sh, wire_req *req)
{
	shard_repl_reply_not_primary(sh->repl, req);
}

/* A new record of transaction txn of the session whose lsid document is lsid (lsid_len
 * bytes, copied), in state; not linked. Freed with shard_txn_rec_free. */
static shard_txn_rec *rec_new(const uint8_t *lsid, size_t lsid_len, int64_t txn, int state)
{
	shard_txn_rec *t = sdb_calloc(1, sizeof *t);
	t->lsid_len = lsid_len;
	t->lsid = sdb_malloc(lsid_len);
	memcpy(t->lsid, lsid, lsid_len);
	t->txn = txn;
	t->state = state;
	return t;
}

/* Reply TransactionTooOld to a request to verb ("start", "continue", "commit", "abort")
 * transaction txn of a session on which the newer transaction newer has started. */
static void reply_too_old(wire_req *req, const char *verb, int64_t txn, int64_t newer)
{
	wire_req_error(req, WIRE_ERR_TRANSACTION_TOO_OLD,
		       "Cannot %s transaction %lld on session because a newer transaction %lld "
		       "has %sstarted",
		       verb, (long long)txn, (long long)newer,
		       strcmp(verb, "start") == 0 ? "already " : "");
}

/* Reply TransactionCommitted: transaction txn has been committed. */
static void reply_committed(wire_req *req, int64_t txn)
{
	wire_req_error(req, WIRE_ERR_TRANSACTION_COMMITTED, "Transaction %lld has been committed.",
		       (long long)txn);
}

/* Reply NoSuchTransaction (labelled TransientTransactionError) for transaction txn, which t
 * records as aborted (with t->why when known). */
static void reply_aborted(wire_req *req, const shard_txn_rec *t, int64_t txn)
{
	txn_fail(req, WIRE_ERR_NO_SUCH_TRANSACTION, "Transaction %lld has been aborted%s%s.",
	     (long long)txn, t->why[0] ? ": " : "", t->why);
}

/* t failed validation (valid): count the conflict, abort t and reply WriteConflict (labelled
 * TransientTransactionError) with msg. */
static void abort_conflict(shard_txns *T, shard_txn_rec *t, wire_req *req, const char *msg)
{
	sdb_counter_inc(T->c_conflicts);
	finish(T, t, TXN_ABORTED, "a write conflict");
	txn_fail(req, WIRE_ERR_WRITE_CONFLICT, "%s", msg);
}

/* When the command name may not run in a multi-document transaction on the request's
 * database (allowed_in_txn): replies NotInTransaction and returns true. */
static bool refuse_not_allowed(wire_req *req, const char *name)
{
	if (allowed_in_txn(name, wire_req_db(req)))
		return false;
	wire_req_error(req, WIRE_ERR_NOT_IN_TRANSACTION,
		       "Cannot run '%s' on database '%s' in a multi-document transaction.", name,
		       wire_req_db(req));
	return true;
}

static void statement(shard *sh, shard_txns *T, wire_req *req, const txn_args *a)
{
	const char *name = wire_req_name(req);
	shard_txn_rec *t = txn_find_rec(T, &a->lsid);
	if (a->start) {
		if (t && t->txn > a->txn) {
			reply_too_old(req, "start", a->txn, t->txn);
			return;
		}
		if (t && t->txn < a->txn && t->state == TXN_QUEUED) {
			/* its validation needs the write log and its record until it is proposed */
			wire_req_error(req, 117 /* ConflictingOperationInProgress */,
				       "Cannot start transaction %lld on session while the commit of "
				       "transaction %lld is in progress",
				       (long long)a->txn, (long long)t->txn);
			return;
		}
		if (t && t->txn == a->txn) {
			if (t->state == TXN_COMMITTED || t->state == TXN_QUEUED)
				reply_committed(req, a->txn);
			else
				wire_req_error(req, WIRE_ERR_TXN_NUMBER_IN_USE,
					       "Cannot start a transaction at given transaction "
					       "number %lld a transaction with the same number is "
					       "in state %s",
					       (long long)a->txn,
					       t->state == TXN_OPEN ? "TxnInProgress"
								    : "TxnAborted");
			return;
		}
		int64_t stored;
		bool committed;
		if (durable_state(sh->repl, &a->lsid, a->txn, &stored, &committed) != 0) {
			wire_req_error(req, WIRE_ERR_INTERNAL,
				       "shard: cannot read the session's record");
			return;
		}
		if (stored > a->txn) {
			reply_too_old(req, "start", a->txn, stored);
			return;
		}
		if (stored == a->txn) {
			if (committed)
				reply_committed(req, a->txn);
			else
				wire_req_error(req, WIRE_ERR_TXN_NUMBER_IN_USE,
					       "Cannot start a transaction at given transaction "
					       "number %lld: a retryable write with the same number "
					       "ran on this session",
					       (long long)a->txn);
			return;
		}
		if (a->has_rc) {
			bson_iter_t it, sub;
			const char *level = "local";
			bson_iter_init_find(&it, wire_req_cmd(req), "readConcern");
			if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &sub)) {
				while (bson_iter_next(&sub)) {
					const char *k = bson_iter_key(&sub);
					if (strcmp(k, "level") == 0 && BSON_ITER_HOLDS_UTF8(&sub))
						level = bson_iter_utf8(&sub, NULL);
					else if (strcmp(k, "afterClusterTime") != 0 &&
						 strcmp(k, "provenance") != 0) {
						wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
							       "readConcern.%s is not supported in "
							       "a transaction by stripedb",
							       k);
						return;
					}
				}
			}
			if (strcmp(level, "local") != 0 && strcmp(level, "majority") != 0 &&
			    strcmp(level, "snapshot") != 0) {
				wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
					       "The readConcern level must be either 'local' "
					       "(default), 'majority' or 'snapshot' in order to run "
					       "in a transaction");
				return;
			}
		}
		if (refuse_not_allowed(req, name))
			return;
		if (t) {
			if (t->state == TXN_OPEN)
				finish(T, t, TXN_ABORTED, "a newer transaction started");
			unlink_rec(T, t);
			shard_txn_rec_free(t);
		}
		t = rec_new(bson_get_data(&a->lsid), a->lsid.len, a->txn, TXN_OPEN);
		t->start_seq = sh->repl->last_applied;
		t->start_ms = sdb_mono_ms();
		t->next = T->list;
		T->list = t;
		sdb_counter_inc(T->c_started);
		sdb_gauge_set(T->g_open, (int64_t)n_open(T));
	} else {
		if (!t || t->txn != a->txn) {
			if (t && t->txn > a->txn)
				reply_too_old(req, "continue", a->txn, t->txn);
			else
				txn_fail(req, WIRE_ERR_NO_SUCH_TRANSACTION,
				     "Given transaction number %lld does not match any "
				     "in-progress transactions.",
				     (long long)a->txn);
			return;
		}
		if (t->state == TXN_ABORTED) {
			reply_aborted(req, t, a->txn);
			return;
		}
		if (t->state != TXN_OPEN) {
			reply_committed(req, a->txn);
			return;
		}
		if (a->has_rc) {
			wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
				       "Only the first command in a transaction may specify a "
				       "readConcern");
			return;
		}
		/* refused before it runs: the transaction goes on, as on mongod */
		if (refuse_not_allowed(req, name))
			return;
	}
	if (a->has_wc) {
		finish(T, t, TXN_ABORTED, "a statement carried a writeConcern");
		wire_req_error(req, WIRE_ERR_INVALID_OPTIONS,
			       "Cannot set write concern after starting a transaction.");
		return;
	}
	if (T->limit_ms > 0 && sdb_mono_ms() - t->start_ms >= (uint64_t)T->limit_ms) {
		finish(T, t, TXN_ABORTED, "it exceeded transactionLifetimeLimitSeconds");
		txn_fail(req, WIRE_ERR_NO_SUCH_TRANSACTION,
		     "Transaction %lld has been aborted: it exceeded "
		     "transactionLifetimeLimitSeconds.",
		     (long long)a->txn);
		return;
	}
	shard_cmd_fn fn = shard_cmd_lookup(name);
	bson_t *cmd = stripped(wire_req_cmd(req));
	char err[512] = "";
	size_t ops_before = t->n_ops;
	keys_of_statement(t, name, wire_req_db(req), cmd);
	bson_t *reply = fn ? run_tentative(sh, t, wire_req_db(req), cmd, fn, err, sizeof err)
			   : NULL;
	bson_destroy(cmd);
	if (!reply) {
		finish(T, t, TXN_ABORTED, "an internal error");
		wire_req_error(req, WIRE_ERR_INTERNAL, "shard: transaction statement: %s", err);
		return;
	}
	(void)ops_before;
	if (!txn_valid(T, t)) {
		bson_destroy(reply);
		abort_conflict(T, t, req,
			       "Write conflict during plan execution and yielding is disabled. :: "
			       "Please retry your operation or multi-document transaction.");
		return;
	}
	bson_iter_t it;
	bool ok = bson_iter_init_find(&it, reply, "ok") && bson_iter_as_bool(&it);
	if (!ok || bson_iter_init_find(&it, reply, "writeErrors")) {
		/* mongod aborts a transaction whose statement failed */
		finish(T, t, TXN_ABORTED, "a statement failed");
		reply = label_reply(reply);
	}
	wire_req_reply(req, reply);
}

/* ------------------------------------------------------------------ commit / abort */

static shard_txn_rec *check_rec(const txn_args *a)
{
	shard_txn_rec *c = rec_new(bson_get_data(&a->lsid), a->lsid.len, a->txn, TXN_QUEUED);
	c->check = true;
	return c;
}

static void commit(shard *sh, shard_txns *T, wire_req *req, const txn_args *a)
{
	shard_txn_rec *t = txn_find_rec(T, &a->lsid);
	if (t && t->txn > a->txn) {
		reply_too_old(req, "commit", a->txn, t->txn);
		return;
	}
	if (!t || t->txn != a->txn || t->state == TXN_QUEUED ||
	    (t->state == TXN_COMMITTED && !t->read_only_ok)) {
		/* a retry: the durable record answers, through the log (after any commit of
		 * it still in flight) */
		shard_repl_submit_txn(sh->repl, req, check_rec(a));
		return;
	}
	if (t->state == TXN_COMMITTED) {
		wire_req_reply(req, bson_new());
		return;
	}
	if (t->state == TXN_ABORTED) {
		reply_aborted(req, t, a->txn);
		return;
	}
	if (!txn_valid(T, t)) {
		abort_conflict(T, t, req,
			       "Write conflict during commit: a document this transaction read or "
			       "wrote was written since it started. Please retry the transaction.");
		return;
	}
	if (t->n_ops == 0) {
		/* read-only: its reads were valid at each statement and still are */
		sdb_counter_inc(T->c_committed);
		finish(T, t, TXN_COMMITTED, NULL);
		t->read_only_ok = true;
		wire_req_reply(req, bson_new());
		return;
	}
	size_t bytes = 0;
	for (size_t i = 0; i < t->n_ops; i++)
		bytes += t->ops[i].o->len + strlen(t->ops[i].ns) + 32 +
			 (t->ops[i].ud ? t->ops[i].ud->len + 8 : 0);
	if (bytes > SHARD_MAX_REPLY_BYTES) {
		/* one Raft entry, one BSON command: mongod's 16 MB transaction oplog limit */
		finish(T, t, TXN_ABORTED, "it was too large");
		wire_req_error(req, 257 /* TransactionTooLarge */,
			       "Total size of the transaction's operations (%zu bytes) exceeds the "
			       "limit of %d bytes; the transaction was aborted",
			       bytes, SHARD_MAX_REPLY_BYTES);
		return;
	}
	/* the record goes to the proposal queue; a tombstone stays */
	unlink_rec(T, t);
	shard_txn_rec *tomb = rec_new(t->lsid, t->lsid_len, t->txn, TXN_QUEUED);
	tomb->start_seq = t->start_seq;
	tomb->start_ms = t->start_ms;
	tomb->end_ms = sdb_mono_ms();
	tomb->next = T->list;
	T->list = tomb;
	t->state = TXN_QUEUED;
	txn_trim_log(T);
	shard_repl_submit_txn(sh->repl, req, t);
}

static void abort_txn(shard_txns *T, wire_req *req, const txn_args *a)
{
	shard_txn_rec *t = txn_find_rec(T, &a->lsid);
	if (t && t->txn == a->txn && t->state == TXN_OPEN) {
		finish(T, t, TXN_ABORTED, "abortTransaction");
		wire_req_reply(req, bson_new());
		return;
	}
	if (t && t->txn == a->txn && (t->state == TXN_COMMITTED || t->state == TXN_QUEUED)) {
		reply_committed(req, a->txn);
		return;
	}
	if (t && t->txn > a->txn) {
		reply_too_old(req, "abort", a->txn, t->txn);
		return;
	}
	txn_fail(req, WIRE_ERR_NO_SUCH_TRANSACTION,
	     t && t->txn == a->txn ? "Transaction %lld has been aborted."
				   : "Given transaction number %lld does not match any "
				     "in-progress transactions.",
	     (long long)a->txn);
}

bool shard_txn_wants(wire_req *req)
{
	const char *name = wire_req_name(req);
	bson_iter_t it;
	if (strcmp(name, "commitTransaction") == 0 || strcmp(name, "abortTransaction") == 0)
		return true;
	return wire_req_cmd_find(req, "autocommit", &it) ||
	       wire_req_cmd_find(req, "startTransaction", &it);
}

void shard_txn_dispatch(shard *sh, wire_req *req)
{
	shard_txns *T = txn_table(sh);
	const char *name = wire_req_name(req);
	txn_args a;
	shard_sessions_note(sh, req, wire_req_cmd(req)); /* $listLocalSessions */
	if (!T || !parse_args(req, &a))
		return T ? (void)0
			 : wire_req_error(req, WIRE_ERR_INTERRUPTED_AT_SHUTDOWN,
					  "the shard is shutting down");
	bool cmd_commit = strcmp(name, "commitTransaction") == 0;
	bool cmd_abort = strcmp(name, "abortTransaction") == 0;
	if ((cmd_commit || cmd_abort) && strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "%s may only be run against the admin database.", name);
		return;
	}
	if (!shard_repl_writable(sh->repl)) {
		/* transactions run on the primary only (reads too: readPreference primary) */
		not_primary(sh, req);
		return;
	}
	if (cmd_commit)
		commit(sh, T, req, &a);
	else if (cmd_abort)
		abort_txn(T, req, &a);
	else
		statement(sh, T, req, &a);
}

bool shard_txn_retryable_check(shard *sh, wire_req *req)
{
	shard_txns *T = txn_table(sh);
	const bson_t *cmd = wire_req_cmd(req);
	bson_iter_t it;
	bson_t lsid;
	if (!T || !T->list || !bson_iter_init_find(&it, cmd, "txnNumber") ||
	    !(BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it)))
		return false;
	int64_t txn = bson_iter_as_int64(&it);
	if (!bson_iter_init_find(&it, cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT(&it))
		return false;
	uint32_t len;
	const uint8_t *data;
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&lsid, data, len))
		return false;
	shard_txn_rec *t = txn_find_rec(T, &lsid);
	/* any transaction this primary remembers (open, committing, committed or aborted) owns
	 * its txnNumber: a retryable write may not reuse it (mongod) */
	if (!t)
		return false;
	if (t->txn > txn) {
		wire_req_error(req, WIRE_ERR_TRANSACTION_TOO_OLD,
			       "Retryable write with txnNumber %lld is prohibited on session because "
			       "a newer transaction with txnNumber %lld has already started on this "
			       "session.",
			       (long long)txn, (long long)t->txn);
		return true;
	}
	if (t->txn == txn) {
		wire_req_error(req, WIRE_ERR_INCOMPLETE_TXN_HISTORY,
			       "Cannot retry a retryable write that has been converted into a "
			       "transaction");
		return true;
	}
	if (t->state == TXN_OPEN)
		finish(T, t, TXN_ABORTED, "a newer retryable write started on its session");
	return false;
}
