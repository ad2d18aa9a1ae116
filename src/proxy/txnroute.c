/* Single-shard transactions through the proxy (see txnroute.h). */
#include "build_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "proxy/txnroute.h"

enum { TXN_NONE = 0, TXN_OPEN, TXN_COMMITTED, TXN_ABORTED };

struct pxtxn_sess {
	uint8_t *key; /* the lsid document's bytes */
	uint32_t klen;
	bson_t lsid;       /* copy */
	uv_mutex_t run;    /* held by the statement that has the session checked out */
	uv_mutex_t io;     /* one shard command of the session at a time (fan-out units) */
	int refs;          /* under the table's mutex */
	int64_t txn;       /* active txnNumber, -1 none */
	int state;         /* TXN_* */
	char *pinned;      /* the transaction's shard, or NULL before its first shard command */
	bool started;      /* startTransaction sent to pinned */
	bool has_rc;
	bson_t rc;         /* the first statement's readConcern */
	uint64_t last_ms;  /* last use (monotonic) */
	pxtxn_sess *next;
};

struct pxtxn_table {
	uv_mutex_t mu;
	pxtxn_sess *head;
	size_t n;
	uint64_t swept_ms;
};

pxtxn_table *pxtxn_table_new(void)
{
	pxtxn_table *t = sdb_calloc(1, sizeof *t);

	uv_mutex_init(&t->mu);
	return t;
}

static void sess_free(pxtxn_sess *s)
{
	free(s->key);
	bson_destroy(&s->lsid);
	if (s->has_rc)
		bson_destroy(&s->rc);
	free(s->pinned);
	uv_mutex_destroy(&s->run);
	uv_mutex_destroy(&s->io);
	free(s);
}

void pxtxn_table_free(pxtxn_table *t)
{
	pxtxn_sess *s, *nx;

	if (t == NULL)
		return;
	for (s = t->head; s; s = nx) {
		nx = s->next;
		sess_free(s);
	}
	uv_mutex_destroy(&t->mu);
	free(t);
}

size_t pxtxn_table_size(pxtxn_table *t)
{
	size_t n;

	uv_mutex_lock(&t->mu);
	n = t->n;
	uv_mutex_unlock(&t->mu);
	return n;
}

/* Drop the sessions idle for the session timeout (at most once a second). Under t->mu. */
static void sweep(pxtxn_table *t, uint64_t now)
{
	pxtxn_sess **pp = &t->head;

	if (now < t->swept_ms + 1000)
		return;
	t->swept_ms = now;
	while (*pp) {
		pxtxn_sess *s = *pp;
		if (s->refs == 0 && now > s->last_ms + (uint64_t)PXTXN_SESSION_TIMEOUT_MS) {
			*pp = s->next;
			t->n--;
			sess_free(s);
		} else {
			pp = &s->next;
		}
	}
}

/* The session of lsid (created when absent), referenced. */
static pxtxn_sess *sess_get(pxtxn_table *t, const bson_t *lsid)
{
	const uint8_t *k = bson_get_data(lsid);
	uint64_t now = sdb_mono_ms();
	pxtxn_sess *s;

	uv_mutex_lock(&t->mu);
	sweep(t, now);
	for (s = t->head; s; s = s->next)
		if (s->klen == lsid->len && memcmp(s->key, k, lsid->len) == 0)
			break;
	if (s == NULL) {
		s = sdb_calloc(1, sizeof *s);
		s->key = sdb_malloc(lsid->len);
		memcpy(s->key, k, lsid->len);
		s->klen = lsid->len;
		bson_copy_to(lsid, &s->lsid);
		uv_mutex_init(&s->run);
		uv_mutex_init(&s->io);
		s->txn = -1;
		s->next = t->head;
		t->head = s;
		t->n++;
	}
	s->refs++;
	s->last_ms = now;
	uv_mutex_unlock(&t->mu);
	return s;
}

static void sess_put(pxtxn_table *t, pxtxn_sess *s)
{
	uv_mutex_lock(&t->mu);
	s->refs--;
	s->last_ms = sdb_mono_ms();
	uv_mutex_unlock(&t->mu);
}

/* ---------- parsing ---------- */

bool pxtxn_is_txn_cmd(const bson_t *cmd)
{
	return bson_has_field(cmd, "autocommit");
}

/* The session fields of a transaction command: lsid (static view), txnNumber, whether it
 * starts the transaction. Returns: 0, or the code answered on c. */
static int parse(struct ctx *c, bson_t *lsid, int64_t *txn, bool *start)
{
	bson_iter_t it;
	uint32_t len;
	const uint8_t *data;

	*start = false;
	if (!bson_iter_init_find(&it, c->cmd, "autocommit") || !BSON_ITER_HOLDS_BOOL(&it)) {
		return px_error(c, WIRE_ERR_TYPE_MISMATCH, "BSON field 'autocommit' must be a boolean");
	}
	if (bson_iter_bool(&it)) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS, "Specifying autocommit=true is not allowed.");
	}
	if (bson_iter_init_find(&it, c->cmd, "startTransaction")) {
		if (!BSON_ITER_HOLDS_BOOL(&it) || !bson_iter_bool(&it)) {
			return px_error(c, WIRE_ERR_INVALID_OPTIONS,
					"Specifying startTransaction=false is not allowed.");
		}
		*start = true;
	}
	if (!bson_iter_init_find(&it, c->cmd, "lsid") || !BSON_ITER_HOLDS_DOCUMENT(&it)) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS,
				"Transaction number requires a session ID to also be specified");
	}
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(lsid, data, len)) {
		return px_error(c, WIRE_ERR_INVALID_BSON, "bad lsid");
	}
	if (!bson_iter_init_find(&it, c->cmd, "txnNumber") ||
	    !(BSON_ITER_HOLDS_INT64(&it) || BSON_ITER_HOLDS_INT32(&it)) ||
	    bson_iter_as_int64(&it) < 0) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS,
				"txnNumber must be provided for multi-document transactions");
	}
	*txn = bson_iter_as_int64(&it);
	return 0;
}

/* errorLabels: [label] as an answer's extra fields (a new document). */
static bson_t *labels1(const char *label)
{
	bson_t *extra = bson_new();
	bson_t arr;

	bson_append_array_begin(extra, "errorLabels", -1, &arr);
	BSON_APPEND_UTF8(&arr, "0", label);
	bson_append_array_end(extra, &arr);
	return extra;
}

/* Answer NoSuchTransaction (251) with TransientTransactionError. Returns: 251. */
static int no_such_txn(struct ctx *c, int64_t txn, const char *why)
{
	return px_error_extra(c, PXTXN_ERR_NO_SUCH_TXN, labels1("TransientTransactionError"),
			      "Transaction %lld %s", (long long)txn, why);
}

/* ---------- shard commands ---------- */

/* Append the transaction's fields to a shard command being built. */
static void append_txn(bson_t *cmd, const pxtxn_sess *s)
{
	BSON_APPEND_DOCUMENT(cmd, "lsid", &s->lsid);
	BSON_APPEND_INT64(cmd, "txnNumber", s->txn);
	BSON_APPEND_BOOL(cmd, "autocommit", false);
}

/* Send abortTransaction for s's open transaction to its pinned shard (best effort: the
 * shard also aborts at its transaction timeout). Under s->run. */
static void abort_on_shard(struct ctx *c, pxtxn_sess *s)
{
	bson_t cmd = BSON_INITIALIZER, reply;
	char nerr[256];
	uint32_t sid = 0;

	if (s->pinned == NULL || !s->started)
		return;
	BSON_APPEND_INT32(&cmd, "abortTransaction", 1);
	append_txn(&cmd, s);
	proxy_shard_command(c->p, s->pinned, "admin", &cmd, &sid, &reply, nerr, sizeof nerr);
	bson_destroy(&reply);
	bson_destroy(&cmd);
}

/* Record the failure that ends the statement (the first one only). Under s->io. */
static void fail(pxtxn_stmt *st, int kind, int cls, const bson_t *reply, const char *msg)
{
	if (st->failed)
		return;
	st->failed = true;
	st->fail_kind = kind;
	st->fail_cls = cls;
	bson_reinit(&st->fail_reply);
	if (reply)
		bson_copy_to_excluding_noinit(reply, &st->fail_reply, "$clusterTime",
					      "operationTime", NULL);
	snprintf(st->fail_msg, sizeof st->fail_msg, "%s", msg ? msg : "");
}

int pxtxn_run_on(struct ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid,
		 bson_t *reply, char *neterr, size_t nelen)
{
	pxtxn_stmt *st = c->tx;
	pxtxn_sess *s = st->s;
	bson_t fwd = BSON_INITIALIZER;
	bson_iter_t it;
	int cls;

	uv_mutex_lock(&s->io);
	if (st->failed) {
		/* the statement is over: nothing more is sent */
		bson_init(reply);
		BSON_APPEND_DOUBLE(reply, "ok", 0.0);
		BSON_APPEND_UTF8(reply, "errmsg", "transaction statement already failed");
		BSON_APPEND_INT32(reply, "code", PXTXN_ERR_NOT_IN_TXN);
		snprintf(neterr, nelen, "transaction statement already failed");
		cls = SHARDCONN_CMD_ERR;
		goto out;
	}
	if (s->pinned == NULL) {
		s->pinned = sdb_strdup(shard);
	} else if (strcmp(s->pinned, shard) != 0) {
		char msg[512];
		snprintf(msg, sizeof msg,
			 "Transaction %lld would touch a second shard (%s; its first shard is %s): "
			 "stripedb runs single-shard transactions only; the transaction was aborted "
			 "and nothing of it applied",
			 (long long)s->txn, shard, s->pinned);
		bson_init(reply);
		BSON_APPEND_DOUBLE(reply, "ok", 0.0);
		BSON_APPEND_UTF8(reply, "errmsg", msg);
		BSON_APPEND_INT32(reply, "code", PXTXN_ERR_NOT_IN_TXN);
		BSON_APPEND_UTF8(reply, "codeName", "OperationNotSupportedInTransaction");
		fail(st, PXTXN_FAIL_SECOND_SHARD, SHARDCONN_CMD_ERR, reply, msg);
		snprintf(neterr, nelen, "%s", msg);
		cls = SHARDCONN_CMD_ERR;
		goto out;
	}
	if (bson_iter_init(&it, cmd))
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "lsid") == 0 || strcmp(k, "txnNumber") == 0 ||
			    strcmp(k, "stmtId") == 0 || strcmp(k, "stmtIds") == 0 ||
			    strcmp(k, "autocommit") == 0 || strcmp(k, "startTransaction") == 0 ||
			    strcmp(k, "readConcern") == 0)
				continue;
			bson_append_iter(&fwd, k, -1, &it);
		}
	append_txn(&fwd, s);
	if (!s->started) {
		BSON_APPEND_BOOL(&fwd, "startTransaction", true);
		if (s->has_rc)
			BSON_APPEND_DOCUMENT(&fwd, "readConcern", &s->rc);
		s->started = true;
	}
	cls = px_shard_call(c->p, c->deadline_ms, shard, c->db, &fwd, sid, reply, neterr, nelen);
	if (cls == SHARDCONN_NET_ERR)
		fail(st, PXTXN_FAIL_NET, cls, reply, neterr);
	else if (cls == SHARDCONN_STALE)
		fail(st, PXTXN_FAIL_STALE, cls, reply, NULL);
	else if (cls == SHARDCONN_CMD_ERR)
		fail(st, PXTXN_FAIL_SHARD, cls, reply, NULL);
out:
	uv_mutex_unlock(&s->io);
	bson_destroy(&fwd);
	return cls;
}

bson_t *pxtxn_cursor_fields(struct ctx *c)
{
	bson_t *f;

	if (c->tx == NULL)
		return NULL;
	f = bson_new();
	append_txn(f, c->tx->s);
	return f;
}

/* ---------- statements ---------- */

int pxtxn_begin(struct ctx *c, pxtxn_stmt *st)
{
	bson_t lsid, rc;
	int64_t txn;
	bool start;
	pxtxn_sess *s;
	int rc_st;

	memset(st, 0, sizeof *st);
	bson_init(&st->fail_reply);
	if ((rc_st = parse(c, &lsid, &txn, &start)) != 0) {
		bson_destroy(&st->fail_reply);
		return rc_st;
	}
	s = sess_get(c->p->txns, &lsid);
	shardconn_wait_begin(); /* behind another statement of the session, on a shard */
	uv_mutex_lock(&s->run);
	shardconn_wait_end();
	if (start) {
		if (s->txn > txn) {
			rc_st = px_error(c, WIRE_ERR_TRANSACTION_TOO_OLD,
					 "Cannot start transaction %lld on session because a newer "
					 "transaction %lld has already started",
					 (long long)txn, (long long)s->txn);
			goto refuse;
		}
		if (s->txn == txn && s->state != TXN_NONE) {
			rc_st = px_error(c, PXTXN_ERR_RESTART,
					 "Cannot start a transaction at given transaction number %lld: a "
					 "transaction with the same number was started already",
					 (long long)txn);
			goto refuse;
		}
		if (s->state == TXN_OPEN)
			abort_on_shard(c, s); /* an older one left open by the driver */
		s->txn = txn;
		s->state = TXN_OPEN;
		free(s->pinned);
		s->pinned = NULL;
		s->started = false;
		if (s->has_rc)
			bson_destroy(&s->rc);
		s->has_rc = px_get_doc(c->cmd, "readConcern", &rc);
		if (s->has_rc)
			bson_copy_to(&rc, &s->rc);
	} else {
		if (s->txn > txn) {
			rc_st = px_error(c, WIRE_ERR_TRANSACTION_TOO_OLD,
					 "txnNumber %lld is less than last txnNumber %lld seen in session",
					 (long long)txn, (long long)s->txn);
			goto refuse;
		}
		if (s->txn != txn || s->state == TXN_NONE) {
			rc_st = no_such_txn(c, txn,
				    "is not known to this proxy (not started, or started through "
				    "another proxy or before a restart of this one)");
			goto refuse;
		}
		if (s->state == TXN_ABORTED) {
			rc_st = no_such_txn(c, txn, "has been aborted.");
			goto refuse;
		}
		if (s->state == TXN_COMMITTED) {
			rc_st = px_error(c, PXTXN_ERR_TXN_COMMITTED,
					 "Transaction %lld has been committed.", (long long)txn);
			goto refuse;
		}
		if (bson_has_field(c->cmd, "readConcern")) {
			rc_st = px_error(c, WIRE_ERR_INVALID_OPTIONS,
					 "Only the first command in a transaction may specify a "
					 "readConcern");
			goto refuse;
		}
	}
	st->s = s;
	c->tx = st;
	return 0;
refuse: /* answered: rc_st */
	uv_mutex_unlock(&s->run);
	sess_put(c->p->txns, s);
	bson_destroy(&st->fail_reply);
	return rc_st;
}

/* The extra fields of an error answer built from a shard's error reply: its errorLabels,
 * plus `add` when given and missing. */
static bson_t *labels_of(const bson_t *reply, const char *add)
{
	bson_t *extra = bson_new();
	bson_t arr;
	bson_iter_t it, a;
	int n = 0;
	bool have = false;
	char k[16];

	bson_append_array_begin(extra, "errorLabels", -1, &arr);
	if (reply && bson_iter_init_find(&it, reply, "errorLabels") &&
	    BSON_ITER_HOLDS_ARRAY(&it) && bson_iter_recurse(&it, &a))
		while (bson_iter_next(&a))
			if (BSON_ITER_HOLDS_UTF8(&a)) {
				const char *l = bson_iter_utf8(&a, NULL);
				if (add && strcmp(l, add) == 0)
					have = true;
				snprintf(k, sizeof k, "%d", n++);
				BSON_APPEND_UTF8(&arr, k, l);
			}
	if (add && !have) {
		snprintf(k, sizeof k, "%d", n++);
		BSON_APPEND_UTF8(&arr, k, add);
	}
	bson_append_array_end(extra, &arr);
	if (n == 0) {
		bson_destroy(extra);
		return NULL;
	}
	return extra;
}

static const char *reply_msg(const bson_t *reply, const char *def)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return def;
}

/* Append recoveryToken: {recoveryShardId} to a reply (mongos' field, sent back by drivers
 * with commitTransaction / abortTransaction). */
static void add_recovery_token(bson_t *reply, const char *shard)
{
	bson_t tok;

	if (shard == NULL || bson_has_field(reply, "recoveryToken"))
		return;
	bson_append_document_begin(reply, "recoveryToken", -1, &tok);
	BSON_APPEND_UTF8(&tok, "recoveryShardId", shard);
	bson_append_document_end(reply, &tok);
}

void pxtxn_end(struct ctx *c)
{
	pxtxn_stmt *st = c->tx;
	pxtxn_sess *s;

	if (st == NULL)
		return;
	s = st->s;
	if (st->failed) {
		int code = (int)px_get_int(&st->fail_reply, "code", WIRE_ERR_INTERNAL);
		px_answer_clear(c->ans);
		switch (st->fail_kind) {
		case PXTXN_FAIL_SECOND_SHARD:
			px_error(c, PXTXN_ERR_NOT_IN_TXN, "%s", st->fail_msg);
			break;
		case PXTXN_FAIL_STALE: {
			char err[256];
			route_coll *rc = px_route(c, true, err, sizeof err); /* for the retry */
			if (rc)
				route_coll_unref(rc);
			px_error_extra(c, WIRE_ERR_STALE_CONFIG,
				       labels1("TransientTransactionError"),
				       "%s (the chunk moved: transaction %lld aborted, retry it)",
				       reply_msg(&st->fail_reply, "StaleConfig"), (long long)s->txn);
			break;
		}
		case PXTXN_FAIL_NET:
			px_error_extra(c, WIRE_ERR_HOST_UNREACHABLE,
				       labels1("TransientTransactionError"),
				       "%s (transaction %lld aborted)", st->fail_msg,
				       (long long)s->txn);
			break;
		default: {
			const char *add = NULL;
			if (code == PXTXN_ERR_NO_SUCH_TXN || code == PXTXN_ERR_WRITE_CONFLICT)
				add = "TransientTransactionError";
			px_error_extra(c, code, labels_of(&st->fail_reply, add), "%s",
				       reply_msg(&st->fail_reply, "shard error"));
			break;
		}
		}
		if (st->fail_kind != PXTXN_FAIL_SHARD) {
			abort_on_shard(c, s);
			s->state = TXN_ABORTED;
		}
	} else if (c->ans->state == 1) {
		add_recovery_token(c->ans->reply, s->pinned);
	}
	bson_destroy(&st->fail_reply);
	c->tx = NULL;
	uv_mutex_unlock(&s->run);
	sess_put(c->p->txns, s);
}

/* ---------- commitTransaction / abortTransaction ---------- */

/* Is code a shard error after which a commit's outcome is unknown (mongos' list: the
 * retryable errors, plus a write concern failure)? */
static bool commit_unknown(int64_t code)
{
	if (wire_state_change_code(code)) /* a member that lost or is losing the primary role */
		return true;
	switch (code) {
	case WIRE_ERR_HOST_UNREACHABLE:
	case WIRE_ERR_NETWORK_TIMEOUT:
	case WIRE_ERR_MAX_TIME_EXPIRED:
	case WIRE_ERR_WRITE_CONCERN_FAILED:
		return true;
	default:
		return false;
	}
}

/* The recoveryToken's shard of c->cmd (static), or NULL. */
static const char *recovery_shard(struct ctx *c)
{
	bson_iter_t it;

	if (bson_iter_init(&it, c->cmd) &&
	    bson_iter_find_descendant(&it, "recoveryToken.recoveryShardId", &it) &&
	    BSON_ITER_HOLDS_UTF8(&it))
		return bson_iter_utf8(&it, NULL);
	return NULL;
}

/* commitTransaction (commit true) or abortTransaction. Returns: the status of the answer. */
static int finish(struct ctx *c, bool commit)
{
	const char *name = commit ? "commitTransaction" : "abortTransaction";
	bson_t lsid, cmd = BSON_INITIALIZER, reply, wc;
	int64_t txn, code, mt;
	bool start;
	pxtxn_sess *s;
	char *shard = NULL;
	char nerr[256];
	uint32_t sid = 0;
	int cls, st;

	if (strcmp(c->db, "admin") != 0) {
		return px_error(c, WIRE_ERR_UNAUTHORIZED, "%s may only be run against the admin database.",
				name);
	}
	if (!pxtxn_is_txn_cmd(c->cmd)) {
		return px_error(c, WIRE_ERR_INVALID_OPTIONS, "%s must be run within a transaction", name);
	}
	if ((st = parse(c, &lsid, &txn, &start)) != 0)
		return st;
	s = sess_get(c->p->txns, &lsid);
	shardconn_wait_begin(); /* behind another statement of the session, on a shard */
	uv_mutex_lock(&s->run);
	shardconn_wait_end();
	if (s->txn > txn) {
		st = px_error(c, WIRE_ERR_TRANSACTION_TOO_OLD,
			      "txnNumber %lld is less than last txnNumber %lld seen in session",
			      (long long)txn, (long long)s->txn);
		goto out;
	}
	if (s->txn == txn && s->state != TXN_NONE) {
		if (s->state == TXN_ABORTED && commit) {
			st = no_such_txn(c, txn, "has been aborted.");
			goto out;
		}
		if (s->pinned == NULL || !s->started) {
			/* no statement reached a shard: a read-only commit is fine, an abort has
			 * no participant (mongos: NoSuchTransaction) */
			s->state = commit ? TXN_COMMITTED : TXN_ABORTED;
			if (commit)
				st = px_reply(c, bson_new());
			else
				st = px_error_extra(c, PXTXN_ERR_NO_SUCH_TXN,
						    labels1("TransientTransactionError"),
						    "no known command has been sent by this router for "
						    "this transaction"); /* mongos' words */
			goto out;
		}
		shard = sdb_strdup(s->pinned);
	} else {
		/* another proxy ran the transaction (or this one restarted): the driver's
		 * recoveryToken names its shard */
		const char *rs = recovery_shard(c);
		if (rs == NULL) {
			st = px_error_extra(c, PXTXN_ERR_NO_SUCH_TXN,
					    labels1("TransientTransactionError"),
					    "Cannot recover the transaction decision without a "
					    "recoveryToken (transaction %lld is not known to this proxy)",
					    (long long)txn); /* mongos' words */
			goto out;
		}
		shard = sdb_strdup(rs);
		s->txn = txn;
		s->state = TXN_OPEN;
		free(s->pinned);
		s->pinned = sdb_strdup(rs);
		s->started = true;
	}
	BSON_APPEND_INT32(&cmd, name, 1);
	append_txn(&cmd, s);
	if (px_get_doc(c->cmd, "writeConcern", &wc))
		BSON_APPEND_DOCUMENT(&cmd, "writeConcern", &wc);
	mt = px_get_int(c->cmd, "maxTimeMS", 0);
	if (mt > 0)
		BSON_APPEND_INT64(&cmd, "maxTimeMS", mt);
	/* px_shard_call re-sends a commit / abort (lsid + txnNumber: retryable) after an unknown
	 * outcome to the shard's new primary within the retry budget */
	cls = px_shard_call(c->p, c->deadline_ms, shard, "admin", &cmd, &sid, &reply, nerr,
			    sizeof nerr);
	if (cls == SHARDCONN_OK) {
		bson_t *out = bson_new();
		bson_copy_to_excluding_noinit(&reply, out, "$clusterTime", "operationTime", NULL);
		add_recovery_token(out, shard);
		s->state = commit ? TXN_COMMITTED : TXN_ABORTED;
		st = px_reply(c, out);
	} else if (cls == SHARDCONN_NET_ERR) {
		st = px_error_extra(c, WIRE_ERR_HOST_UNREACHABLE,
				    commit ? labels1("UnknownTransactionCommitResult") : NULL,
				    "%s of transaction %lld: %s", name, (long long)txn, nerr);
	} else {
		code = px_get_int(&reply, "code", WIRE_ERR_INTERNAL);
		if (!commit || code == PXTXN_ERR_NO_SUCH_TXN)
			s->state = TXN_ABORTED;
		st = px_error_extra(c, (int)code,
				    labels_of(&reply, commit && commit_unknown(code)
				    ? "UnknownTransactionCommitResult"
				    : NULL),
				    "%s", reply_msg(&reply, "shard error"));
	}
	bson_destroy(&reply);
out:
	bson_destroy(&cmd);
	free(shard);
	uv_mutex_unlock(&s->run);
	sess_put(c->p->txns, s);
	return st;
}

int pxtxn_do_commit(struct ctx *c)
{
	return finish(c, true);
}

int pxtxn_do_abort(struct ctx *c)
{
	return finish(c, false);
}
