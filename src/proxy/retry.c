/* The proxy's one retry path (issue #24): see retry.h. The StaleConfig loop of every
 * routed operation is px_retry_run; the cluster (shards, fan-out, routing) is reached
 * through ctx->cluster only. */
#include "build_config.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "storage/collation.h"

/* ---------- the real cluster ---------- */

static int cluster_command(void *impl, const char *shard, const char *db, const bson_t *cmd,
			   uint32_t *sid, bson_t *reply, char *neterr, size_t nelen, int *fate)
{
	proxy *p = impl;

	return shardconn_command(p->sc, shard, db, cmd, sid, reply, neterr, nelen, fate);
}

static void cluster_fanout(void *impl, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
	proxy *p = impl;

	shardconn_wait_begin(); /* the units' calls run on the fan-out threads */
	shardconn_fanout(p->sc, n, fn, arg);
	shardconn_wait_end();
}

static route_coll *cluster_route(void *impl, const char *ns, bool force, char *err,
				 size_t errlen)
{
	return proxy_route(impl, ns, force, err, errlen);
}

static char *cluster_primary(void *impl)
{
	return proxy_primary(impl);
}

static size_t cluster_shard_ids(void *impl, char ***out)
{
	proxy *p = impl;
	char err[256];

	proxy_load_shards(p, err, sizeof err);
	return shardconn_shard_ids(p->sc, out);
}

static char *cluster_shard_hosts(void *impl, const char *id)
{
	proxy *p = impl;

	return shardconn_shard_hosts(p->sc, id);
}

static bool cluster_shard_down(void *impl, const char *id)
{
	proxy *p = impl;

	return shardconn_shard_down(p->sc, id);
}

static void cluster_set_shard_down(void *impl, const char *id, bool down)
{
	proxy *p = impl;

	shardconn_set_shard_down(p->sc, id, down);
}

const px_cluster px_cluster_default = {
	cluster_command,     cluster_fanout,	  cluster_route,
	cluster_primary,     cluster_shard_ids,	  cluster_shard_hosts,
	cluster_shard_down,  cluster_set_shard_down,
};

/* The cluster of p and its state. */
static const px_cluster *cluster_of(proxy *p, void **impl)
{
	if (p->cluster == NULL) {
		*impl = p;
		return &px_cluster_default;
	}
	*impl = p->cluster_impl;
	return p->cluster;
}

int proxy_shard_command(proxy *p, const char *shard, const char *db, const bson_t *cmd,
			uint32_t *sid, bson_t *reply, char *neterr, size_t nelen)
{
	return px_shard_call(p, sdb_mono_ms() + (uint64_t)p->stale_retry_ms, shard, db, cmd, sid,
			     reply, neterr, nelen);
}

void proxy_shard_fanout(proxy *p, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
	void *impl;
	const px_cluster *cl = cluster_of(p, &impl);

	cl->fanout(impl, n, fn, arg);
}

/* ---------- backoff: one rule for every retry ---------- */

/* Sleep for the next backoff step *ms (min_ms, doubling to max_ms; never past
 * deadline_ms, monotonic). False, without sleeping, when the deadline has passed. */
static bool backoff_sleep(int *ms, int min_ms, int max_ms, uint64_t deadline_ms)
{
	uint64_t now = sdb_mono_ms();

	if (now >= deadline_ms)
		return false;
	if (*ms == 0)
		*ms = min_ms;
	else if (*ms < max_ms)
		*ms = *ms * 2 > max_ms ? max_ms : *ms * 2;
	if (now + (uint64_t)*ms > deadline_ms)
		*ms = (int)(deadline_ms - now);
	shardconn_wait_begin();
	uv_sleep((unsigned)*ms);
	shardconn_wait_end();
	return true;
}

/* ---------- one shard: resending what a shard did not execute ---------- */

/* Commands whose re-execution changes nothing: retried even when the outcome of an attempt
 * is unknown (the connection broke after the command was sent). */
static bool idempotent_read(const bson_t *cmd)
{
	static const char *const reads[] = {"find", "count", "distinct", "listIndexes",
					    "listCollections", "collStats", "dbStats", "ping",
					    "validate"};
	bson_iter_t it;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return false;
	for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++)
		if (strcmp(bson_iter_key(&it), reads[i]) == 0)
			return true;
	return false;
}

/* A retryable write (lsid and txnNumber, issue #16): the shard records each executed
 * statement with the write and answers a retry from the record, so resending it after an
 * unknown outcome never applies it twice. */
static bool retryable_write(const bson_t *cmd)
{
	bson_iter_t it;
	const char *name;

	if (!bson_iter_init_find(&it, cmd, "txnNumber") || !bson_iter_init_find(&it, cmd, "lsid"))
		return false;
	if (!bson_iter_init_find(&it, cmd, "autocommit"))
		return true;
	/* a transaction's statement is never re-sent after an unknown outcome (the proxy
	 * answers TransientTransactionError); its commit and abort are retryable */
	bson_iter_init(&it, cmd);
	name = bson_iter_next(&it) ? bson_iter_key(&it) : "";
	return strcmp(name, "commitTransaction") == 0 || strcmp(name, "abortTransaction") == 0;
}

/* An aggregate whose pipeline ends in $out or $merge: it writes, a batch at a time, and
 * is never resent unless the shard certainly never received it (mongos's
 * ClusterAggregate: getDesiredRetryPolicy is kNoRetry for a pipeline with a writing
 * stage). Answers from a shard such as NotWritablePrimary do not prove that none of its
 * writes was applied. */
static bool aggregate_writes(const bson_t *cmd)
{
	bson_iter_t it, st, last;
	bool have = false;

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it) ||
	    strcmp(bson_iter_key(&it), "aggregate") != 0)
		return false;
	if (!bson_iter_init_find(&it, cmd, "pipeline") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &st))
		return false;
	while (bson_iter_next(&st)) {
		last = st;
		have = true;
	}
	if (!have || !BSON_ITER_HOLDS_DOCUMENT(&last) || !bson_iter_recurse(&last, &st) ||
	    !bson_iter_next(&st))
		return false;
	return strcmp(bson_iter_key(&st), "$out") == 0 || strcmp(bson_iter_key(&st), "$merge") == 0;
}

/* The numeric code of an error reply, 0 when it has none. */
static int64_t reply_code(const bson_t *reply)
{
	bson_iter_t it;

	if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_int64(&it);
	return 0;
}

/* What an attempt's result says about cmd: *unexecuted when the shard certainly did not
 * run it (a network error before sending; a refusal, wire_not_executed_code), *ambiguous
 * when it may have (a network error after sending; the other state-change codes,
 * wire_state_change_code: interrupted by a step-down or a shutdown) (px_shard_call's
 * contract). */
static void classify(int cls, int fate, const bson_t *reply, bool *unexecuted, bool *ambiguous)
{
	int64_t code = cls == SHARDCONN_CMD_ERR ? reply_code(reply) : 0;

	*unexecuted = (cls == SHARDCONN_NET_ERR && fate == SHARDCONN_UNSENT) ||
		      wire_not_executed_code(code);
	*ambiguous = (cls == SHARDCONN_NET_ERR && fate == SHARDCONN_UNKNOWN_OUTCOME) ||
		     (wire_state_change_code(code) && !wire_not_executed_code(code));
}

int px_shard_call(proxy *p, uint64_t deadline_ms, const char *shard, const char *db,
		  const bson_t *cmd, uint32_t *sid, bson_t *reply, char *neterr, size_t nelen)
{
	void *impl;
	const px_cluster *cl = cluster_of(p, &impl);
	uint32_t first_server = *sid;
	bool resendable = (idempotent_read(cmd) && !bson_has_field(cmd, "autocommit")) ||
			  retryable_write(cmd);
	bool was_down = cl->shard_down != NULL && cl->shard_down(impl, shard);
	bool writes_out = aggregate_writes(cmd);
	int backoff = 0, rc;

	if (writes_out)
		resendable = false;

	for (;;) {
		int fate = SHARDCONN_ANSWERED;
		bool unexecuted, ambiguous;

		rc = cl->command(impl, shard, db, cmd, sid, reply, neterr, nelen, &fate);
		classify(rc, fate, reply, &unexecuted, &ambiguous);
		if (writes_out && !(rc == SHARDCONN_NET_ERR && fate == SHARDCONN_UNSENT))
			unexecuted = false; /* $out/$merge: only what was never sent is resent */
		if (was_down && rc != SHARDCONN_NET_ERR && !unexecuted && cl->set_shard_down)
			cl->set_shard_down(impl, shard, false); /* it answered */
		if (first_server != 0 && rc == SHARDCONN_CMD_ERR &&
		    wire_state_change_code(reply_code(reply)))
			return rc; /* pinned (a cursor's member): another attempt there cannot help */
		if (!unexecuted && !(ambiguous && resendable))
			return rc;
		if (was_down || !backoff_sleep(&backoff, PX_RESEND_MIN_MS, PX_RESEND_MAX_MS,
					       deadline_ms)) {
			if (!was_down) {
				sdb_warn("shard retry budget spent",
					 "shard=%s err=\"%s\" code=%lld", shard,
					 rc == SHARDCONN_NET_ERR ? neterr : "refused by the shard",
					 (long long)(rc == SHARDCONN_NET_ERR ? 0 : reply_code(reply)));
				if (cl->set_shard_down)
					cl->set_shard_down(impl, shard, true);
			}
			if (!unexecuted)
				return rc; /* a read after an ambiguous network error */
			if (rc != SHARDCONN_NET_ERR)
				sdb_errf(neterr, nelen, SDB_EUNAVAILABLE,
					 "shard %s refused the command unexecuted until the retry "
					 "budget ran out (code %lld: shutting down, or no primary)",
					 shard, (long long)reply_code(reply));
			bson_reinit(reply);
			BSON_APPEND_BOOL(reply, SHARDCONN_UNEXECUTED_FIELD, true);
			return SHARDCONN_NET_ERR;
		}
		sdb_debug("shard did not execute a command, resending", "shard=%s backoff_ms=%d",
			  shard, backoff);
		if (p->m_shard_retries)
			sdb_counter_inc(p->m_shard_retries);
		bson_destroy(reply);
		*sid = first_server; /* 0: select again (the restarted shard, the new primary) */
	}
}

/* ---------- one shard ---------- */

/* Run a command on a shard; returns SHARDCONN_* and fills reply. */
int px_run_on(ctx *c, const char *shard, const bson_t *cmd, uint32_t *sid, bson_t *reply,
		  char *neterr, size_t nelen)
{
	uint32_t local = 0;
	bson_t rp, fwd;
	int rc;

	if (c->tx != NULL) /* a transaction's statement: pinned shard, txn fields (primary) */
		return pxtxn_run_on(c, shard, cmd, sid ? sid : &local, reply, neterr, nelen);
	if (!px_read_pref_applies(c, cmd, &rp))
		return px_shard_call(c->p, c->deadline_ms, shard, c->db, cmd, sid ? sid : &local,
				     reply, neterr, nelen);
	/* a read under the client's read preference: the shard's member is selected with it
	 * (shardconn.c), and a secondary serves it only when the command carries it */
	bson_init(&fwd);
	bson_copy_to_excluding_noinit(cmd, &fwd, "$readPreference", NULL);
	BSON_APPEND_DOCUMENT(&fwd, "$readPreference", &rp);
	rc = px_shard_call(c->p, c->deadline_ms, shard, c->db, &fwd, sid ? sid : &local, reply,
			   neterr, nelen);
	bson_destroy(&fwd);
	return rc;
}

void px_fanout(ctx *c, size_t n, void (*fn)(void *arg, size_t i), void *arg)
{
	proxy_shard_fanout(c->p, n, fn, arg);
}

/* ---------- routing and targeting ---------- */

route_coll *px_route(ctx *c, bool force, char *err, size_t errlen)
{
	void *impl;
	const px_cluster *cl = cluster_of(c->p, &impl);

	return cl->route(impl, c->ns, force, err, errlen);
}

char *px_primary(ctx *c)
{
	void *impl;
	const px_cluster *cl = cluster_of(c->p, &impl);
	/* issue #18: a metadata database's own primary shard; any other database (and admin
	 * commands) the cluster's default, the lowest shard id */
	char *own = c->p->cluster == NULL ? proxy_db_primary_lookup(c->p, c->db)
					   : proxy_db_primary(c->p, c->db);

	if (own)
		return own;
	return cl->primary(impl);
}

size_t px_shard_ids(ctx *c, char ***out)
{
	void *impl;
	const px_cluster *cl = cluster_of(c->p, &impl);

	return cl->shard_ids(impl, out);
}

char *px_shard_hosts(ctx *c, const char *id)
{
	void *impl;
	const px_cluster *cl = cluster_of(c->p, &impl);

	return cl->shard_hosts(impl, id);
}

/* The primary shard, or ShardNotFound answered (see exec.h). */
int px_with_primary(ctx *c, char **primary)
{
	*primary = px_primary(c);
	if (*primary == NULL)
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND,
				"no shard is registered in the metadata service");
	return 0;
}

/* The routing of c->ns, or HostUnreachable answered (see exec.h). */
int px_route_or_fail(ctx *c, route_coll **out)
{
	char err[256];

	*out = px_route(c, false, err, sizeof err);
	if (*out == NULL)
		return px_error(c, WIRE_ERR_HOST_UNREACHABLE, "routing of %s unavailable: %s",
				c->ns, err);
	return 0;
}

/* Does the document hold a string or symbol value anywhere (keys aside)? */
static bool holds_strings(const uint8_t *data, size_t len, int depth)
{
	bson_iter_t it;

	if (depth > SDB_BSON_MAX_DEPTH || !bson_iter_init_from_data(&it, data, len))
		return true;
	while (bson_iter_next(&it)) {
		const uint8_t *d;
		uint32_t n;

		if (BSON_ITER_HOLDS_UTF8(&it) || BSON_ITER_HOLDS_SYMBOL(&it))
			return true;
		if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			bson_iter_document(&it, &n, &d);
			if (holds_strings(d, n, depth + 1))
				return true;
		} else if (BSON_ITER_HOLDS_ARRAY(&it)) {
			bson_iter_array(&it, &n, &d);
			if (holds_strings(d, n, depth + 1))
				return true;
		}
	}
	return false;
}

bool *px_target(route_coll *rc, const bson_t *q, const bson_t *coll_from, size_t *nsel,
		bool *exact)
{
	bool *sel = sdb_calloc(rc->nchunks ? rc->nchunks : 1, sizeof *sel);
	bson_iter_t it;

	if (q && coll_from && bson_iter_init_find(&it, coll_from, "collation") &&
	    !sdb_collation_is_simple_spec(&it) && holds_strings(bson_get_data(q), q->len, 0)) {
		for (size_t i = 0; i < rc->nchunks; i++)
			sel[i] = true;
		*nsel = rc->nchunks;
		*exact = false;
		return sel;
	}
	*nsel = route_target(rc, q, sel, exact);
	return sel;
}

void px_note_target(ctx *c, const route_coll *rc, size_t nsel)
{
	if (nsel < rc->nchunks)
		sdb_counter_inc(c->p->m_targeted);
	else
		sdb_counter_inc(c->p->m_scatter);
}

/* ---------- the retry loop ---------- */

/* Count a stale retry and sleep for the next StaleConfig backoff (PX_STALE_*, within
 * c->deadline_ms). False when the budget is spent (no sleep). */
static bool stale_backoff(ctx *c)
{
	sdb_counter_inc(c->p->m_stale_retries);
	return backoff_sleep(&c->backoff_ms, PX_STALE_MIN_MS, PX_STALE_MAX_MS, c->deadline_ms);
}

/* A newer routing snapshot of c->ns than old (old's reference is released; old itself is
 * returned when metadata cannot be reached). */
static route_coll *refresh(ctx *c, route_coll *old)
{
	char err[256];
	route_coll *n = px_route(c, false, err, sizeof err); /* the cached table (cluster seam) */

	/* another request (or the refresh thread) may have loaded a newer table already */
	if (n != NULL && old != NULL && n->version > old->version) {
		route_coll_unref(old);
		return n;
	}
	if (n != NULL)
		route_coll_unref(n);
	n = px_route(c, true, err, sizeof err);

	if (n == NULL)
		return old;
	if (old)
		route_coll_unref(old);
	return n;
}

void px_failure_set(px_failure *f, int cls, const bson_t *reply, const char *nerr)
{
	bson_destroy(&f->reply);
	bson_copy_to(reply, &f->reply);
	f->cls = cls;
	snprintf(f->nerr, sizeof f->nerr, "%s", nerr ? nerr : "");
}

void px_retry_init(px_retry *r, ctx *c, route_coll *rc, int (*execute)(px_retry *r, void *arg),
		   void (*exhausted)(px_retry *r, void *arg), void *arg)
{
	memset(r, 0, sizeof *r);
	bson_init(&r->last.reply);
	r->c = c;
	r->rc = rc;
	r->status = -1;
	r->execute = execute;
	r->exhausted = exhausted;
	r->arg = arg;
}

void px_retry_done(px_retry *r)
{
	bson_destroy(&r->last.reply);
	if (r->rc)
		route_coll_unref(r->rc);
	r->rc = NULL;
}

int px_retry_run(px_retry *r)
{
	for (r->attempt = 0;; r->attempt++) {
		int res = r->execute(r, r->arg);

		if (res == PX_RETRY_DONE)
			return PX_RETRY_DONE;
		if (res == PX_RETRY_AGAIN)
			continue;
		/* no proxy-side retry inside a transaction: the statement answers StaleConfig
		 * with TransientTransactionError (txnroute.c) and the driver retries it all */
		if (r->c->tx != NULL || !stale_backoff(r->c)) {
			if (r->exhausted)
				r->exhausted(r, r->arg);
			else if (r->last.cls != SHARDCONN_OK)
				r->status = px_reply_shard_error(r->c, r->last.cls, &r->last.reply,
								 r->last.nerr);
			else
				r->status = px_error(
					r->c, WIRE_ERR_STALE_CONFIG,
					"routing kept changing: StaleConfig retry budget exhausted");
			return PX_RETRY_STALE;
		}
		r->rc = refresh(r->c, r->rc);
	}
}

/* ---------- classification: a failed shard call as the client's error ---------- */

/* Answer with the error a shard gave (code and errmsg kept). */
int px_reply_shard_error(ctx *c, int cls, const bson_t *reply, const char *neterr)
{
	bson_iter_t it;
	int code = WIRE_ERR_INTERNAL;
	const char *msg = "shard error";

	if (cls == SHARDCONN_NET_ERR) {
		bson_t *extra = NULL;
		bson_t labels;
		/* issue #11: a driver retries a write only on this label, so it is given only
		 * when the shard certainly did not execute the command; after a network error
		 * with an unknown outcome the error goes to the application unlabelled (reads
		 * are retried by drivers on HostUnreachable's code anyway) */
		if (shardconn_unexecuted(reply)) {
			extra = bson_new();
			bson_append_array_begin(extra, "errorLabels", -1, &labels);
			BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
			bson_append_array_end(extra, &labels);
		}
		return px_error_extra(c, WIRE_ERR_HOST_UNREACHABLE, extra, "%s", neterr);
	}
	/* a shard's code as px_reply reads one: a positive int32, else InternalError (an
	 * error answered with code 0 would read as success) */
	if (bson_iter_init_find(&it, reply, "code") && BSON_ITER_HOLDS_NUMBER(&it)) {
		int64_t v = px_get_int(reply, "code", 0);
		if (v > 0 && v <= INT32_MAX)
			code = (int)v;
	}
	if (bson_iter_init_find(&it, reply, "errmsg") && BSON_ITER_HOLDS_UTF8(&it))
		msg = bson_iter_utf8(&it, NULL);
	/* a DuplicateKey error's extra info (e.g. of a $merge run whole on the shard), as
	 * mongos passes it on (DuplicateKeyErrorInfo) */
	if (code == 11000 && bson_iter_init_find(&it, reply, "keyPattern")) {
		bson_t *extra = bson_new();
		bson_append_iter(extra, "keyPattern", -1, &it);
		if (bson_iter_init_find(&it, reply, "keyValue"))
			bson_append_iter(extra, "keyValue", -1, &it);
		return px_error_extra(c, code, extra, "%s", msg);
	}
	return px_error(c, code, "%s", msg);
}

/* A network error of a retryable write (txn.h: the shards recognise a retry, so the
 * driver may resend it whatever its outcome was): HostUnreachable with the
 * RetryableWriteError label, plus NoWritesPerformed when no shard executed any of it. */
int px_reply_retryable_net_error(ctx *c, bool nothing_written, const char *neterr)
{
	bson_t *extra = bson_new();
	bson_t labels;

	bson_append_array_begin(extra, "errorLabels", -1, &labels);
	BSON_APPEND_UTF8(&labels, "0", "RetryableWriteError");
	if (nothing_written)
		BSON_APPEND_UTF8(&labels, "1", "NoWritesPerformed");
	bson_append_array_end(extra, &labels);
	return px_error_extra(c, WIRE_ERR_HOST_UNREACHABLE, extra, "%s", neterr);
}

int px_reply_write_result(ctx *c, int cls, const bson_t *reply, const char *neterr)
{
	if (cls == SHARDCONN_NET_ERR && c->txn.on)
		return px_reply_retryable_net_error(c, shardconn_unexecuted(reply), neterr);
	if (cls == SHARDCONN_NET_ERR)
		return px_reply_shard_error(c, cls, reply, neterr);
	return px_reply_copy(c, reply);
}

/* The errmsg of a masked state-change error (px_answer_mask_state_change): bson_malloc'd. */
static char *masked_msg(int64_t code, const char *msg)
{
	return bson_strdup_printf("%s (%d) from a shard: %s", wire_code_name((int)code), (int)code,
				  msg ? msg : "");
}

/* A writeConcernError (or writeErrors entry) document with its state-change code masked,
 * appended as key. */
static void append_masked_wce(bson_t *out, const char *key, const bson_iter_t *wce)
{
	bson_iter_t it;
	bson_t sub;
	const char *msg = NULL;
	int64_t code = 0;

	if (bson_iter_recurse(wce, &it) && bson_iter_find(&it, "code") &&
	    BSON_ITER_HOLDS_NUMBER(&it))
		code = bson_iter_as_int64(&it);
	if (bson_iter_recurse(wce, &it) && bson_iter_find(&it, "errmsg") &&
	    BSON_ITER_HOLDS_UTF8(&it))
		msg = bson_iter_utf8(&it, NULL);
	bson_append_document_begin(out, key, -1, &sub);
	BSON_APPEND_INT32(&sub, "code", WIRE_ERR_HOST_UNREACHABLE);
	BSON_APPEND_UTF8(&sub, "codeName", wire_code_name(WIRE_ERR_HOST_UNREACHABLE));
	char *m = masked_msg(code, msg);
	BSON_APPEND_UTF8(&sub, "errmsg", m);
	bson_free(m);
	if (bson_iter_recurse(wce, &it))
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			if (strcmp(k, "code") != 0 && strcmp(k, "codeName") != 0 &&
			    strcmp(k, "errmsg") != 0)
				bson_append_iter(&sub, k, -1, &it);
		}
	bson_append_document_end(out, &sub);
}

/* The code of the writeConcernError document at it (0 when it has none). */
static int64_t wce_code(const bson_iter_t *wce)
{
	bson_iter_t it;

	if (BSON_ITER_HOLDS_DOCUMENT(wce) && bson_iter_recurse(wce, &it) &&
	    bson_iter_find(&it, "code") && BSON_ITER_HOLDS_NUMBER(&it))
		return bson_iter_as_int64(&it);
	return 0;
}

/* Does the writeErrors array at it hold an entry with a state-change code? */
static bool write_errors_state_change(const bson_iter_t *arr)
{
	bson_iter_t it;

	if (!BSON_ITER_HOLDS_ARRAY(arr) || !bson_iter_recurse(arr, &it))
		return false;
	while (bson_iter_next(&it))
		if (wire_state_change_code(wce_code(&it)))
			return true;
	return false;
}

/* The writeErrors array at arr with its entries' state-change codes masked, appended as
 * key (the other entries as they are). */
static void append_masked_write_errors(bson_t *out, const char *key, const bson_iter_t *arr)
{
	bson_iter_t it;
	bson_t sub;

	bson_append_array_begin(out, key, -1, &sub);
	if (bson_iter_recurse(arr, &it))
		while (bson_iter_next(&it)) {
			if (wire_state_change_code(wce_code(&it)))
				append_masked_wce(&sub, bson_iter_key(&it), &it);
			else
				bson_append_iter(&sub, bson_iter_key(&it), -1, &it);
		}
	bson_append_array_end(out, &sub);
}

/* reply with its state-change codes masked (px_answer_mask_state_change), or NULL when it
 * has none to mask. */
static bson_t *masked_reply(const bson_t *reply)
{
	bson_iter_t it;
	bool failed = false, top = false, wce = false, tv = false, werr = false;
	const char *msg = NULL;
	int64_t code = 0;

	if (!bson_iter_init(&it, reply))
		return NULL;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "ok") == 0)
			failed = !bson_iter_as_bool(&it);
		else if (strcmp(k, "code") == 0 && BSON_ITER_HOLDS_NUMBER(&it))
			code = bson_iter_as_int64(&it);
		else if (strcmp(k, "errmsg") == 0 && BSON_ITER_HOLDS_UTF8(&it))
			msg = bson_iter_utf8(&it, NULL);
		else if (strcmp(k, "topologyVersion") == 0)
			tv = true;
		else if (strcmp(k, "writeConcernError") == 0)
			wce = wire_state_change_code(wce_code(&it));
		else if (strcmp(k, "writeErrors") == 0)
			werr = write_errors_state_change(&it);
	}
	top = failed && wire_state_change_code(code);
	if (!top && !wce && !werr && !(failed && tv))
		return NULL;

	bson_t *out = bson_new();
	bson_iter_init(&it, reply);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (failed && strcmp(k, "topologyVersion") == 0)
			continue;
		if (top && strcmp(k, "code") == 0) {
			BSON_APPEND_INT32(out, "code", WIRE_ERR_HOST_UNREACHABLE);
		} else if (top && strcmp(k, "codeName") == 0) {
			continue; /* appended with the errmsg */
		} else if (top && strcmp(k, "errmsg") == 0) {
			continue;
		} else if (wce && strcmp(k, "writeConcernError") == 0) {
			append_masked_wce(out, k, &it);
		} else if (werr && strcmp(k, "writeErrors") == 0) {
			append_masked_write_errors(out, k, &it);
		} else {
			bson_append_iter(out, k, -1, &it);
		}
	}
	if (top) {
		char *m = masked_msg(code, msg);
		BSON_APPEND_UTF8(out, "codeName", wire_code_name(WIRE_ERR_HOST_UNREACHABLE));
		BSON_APPEND_UTF8(out, "errmsg", m);
		bson_free(m);
	}
	return out;
}

void px_answer_mask_state_change(px_answer *a)
{
	if (a->state == 1 && a->reply != NULL) {
		bson_t *m = masked_reply(a->reply);
		if (m != NULL) {
			bson_destroy(a->reply);
			a->reply = m;
		}
	} else if (a->state == 2 && wire_state_change_code(a->code)) {
		char *m = masked_msg(a->code, a->msg);
		bson_free(a->msg);
		a->msg = m;
		a->code = WIRE_ERR_HOST_UNREACHABLE;
		if (a->extra != NULL && bson_has_field(a->extra, "topologyVersion")) {
			bson_t *x = bson_new();
			bson_copy_to_excluding_noinit(a->extra, x, "topologyVersion", NULL);
			bson_destroy(a->extra);
			a->extra = x;
		}
	}
}

/* ---------- fan-out: one call per shard ---------- */

/* Fan-out unit: call i of a pcall array. */
void px_pcall_one(void *arg, size_t i)
{
	pcall *pc = &((pcall *)arg)[i];

	bson_destroy(&pc->reply);
	pc->cls = px_run_on(pc->c, pc->shard, &pc->cmd, NULL, &pc->reply, pc->nerr, sizeof pc->nerr);
}

/* n calls for the shards ids (their strings are taken over; the array is freed). */
pcall *px_pcalls_new(ctx *c, char **ids, size_t n)
{
	pcall *pc = sdb_calloc_bson(n ? n : 1, sizeof *pc);
	size_t i;

	for (i = 0; i < n; i++) {
		pc[i].c = c;
		pc[i].shard = ids[i];
		bson_init(&pc[i].cmd);
		bson_init(&pc[i].reply);
	}
	free(ids);
	return pc;
}

/* Free n calls (their shards, commands and replies). */
void px_pcalls_free(pcall *pc, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		free(pc[i].shard);
		bson_destroy(&pc[i].cmd);
		bson_destroy(&pc[i].reply);
	}
	free(pc);
}

/* The first failed call (NULL when all succeeded); codes in skip_codes (0-terminated) of
 * shard errors are not failures. */
pcall *px_pcalls_failed(pcall *pc, size_t n, const int *skip_codes)
{
	size_t i, k;

	for (i = 0; i < n; i++) {
		bool skip = false;
		if (pc[i].cls == SHARDCONN_OK)
			continue;
		for (k = 0; skip_codes && skip_codes[k] && pc[i].cls == SHARDCONN_CMD_ERR; k++)
			if (px_get_int(&pc[i].reply, "code", 0) == skip_codes[k])
				skip = true;
		if (!skip)
			return &pc[i];
	}
	return NULL;
}

