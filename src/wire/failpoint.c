/* The failCommand fail point of every wire server (issue #16), one implementation for the
 * shard and the proxy: MongoDB's test command `configureFailPoint` with the failCommand
 * fail point (src/mongo/db/commands/fail_point_cmd.cpp, CommandHelpers::
 * evaluateFailCommandFailPoint and the driver specifications' "failCommand" description),
 * accepted only by a server started with test commands on (wire_server_opts.test_commands,
 * the roles' --enable-test-commands, MongoDB's enableTestCommands).
 *
 *   {configureFailPoint: "failCommand", mode: "alwaysOn" | "off" | {times: N} | {skip: N},
 *    data: {failCommands: ["insert", ...], errorCode?: N, errorLabels?: [...],
 *           closeConnection?: bool, blockConnection?: bool, blockTimeMS?: N,
 *           writeConcernError?: {code, errmsg, errInfo?}}}
 * -> {count: <times the previous setting fired>, ok: 1}      (admin database only)
 *
 * A received command named in failCommands, while the mode is on, is handled in mongod's
 * order: closeConnection closes the connection without a reply (nothing executed);
 * blockConnection first waits blockTimeMS (a libuv timer: the loop keeps serving the
 * other connections); errorCode answers {ok: 0, code, codeName, errmsg, errorLabels?}
 * without running the command; writeConcernError lets the command run and adds
 * writeConcernError (and errorLabels) to its ok reply. errorLabels, when given (even
 * empty), are the labels of the reply; when absent, a retryable write (txnNumber, not in
 * a transaction) whose error or write concern error code is a retryable one gets
 * RetryableWriteError, as mongod's ErrorLabelBuilder. Other options (appName, threadName,
 * failInternalCommands, ...) and other fail points are refused with BadValue, never
 * ignored. The setting is per wire server (one per role, as one per mongod process).
 * Loop thread only: the command and the evaluation both run there.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "wire/internal.h"

struct wire_failpoint {
	bool on;
	bool always;
	int64_t times; /* fires left when !always */
	int64_t skip;  /* matching commands to let through first ({skip: N}: then always) */
	int64_t fired; /* since the last configureFailPoint */
	char **cmds;
	size_t n_cmds;
	int code;       /* 0: no error */
	bson_t *labels; /* errorLabels array as given, or NULL (computed) */
	bool close;
	int64_t block_ms;
	bson_t *wce; /* writeConcernError document or NULL */
};

/* What one firing does to one request (copied out of the setting). */
typedef struct fp_action {
	int code;
	bson_t *labels; /* owned */
	bson_t *wce;    /* owned */
	bool close;
	int64_t block_ms;
} fp_action;

typedef struct fp_block {
	uv_timer_t timer;
	wire_req *req;
	wire_cmd_entry *entry;
	fp_action a;
} fp_block;

static void fp_reset(wire_failpoint *fp)
{
	for (size_t i = 0; i < fp->n_cmds; i++)
		free(fp->cmds[i]);
	free(fp->cmds);
	if (fp->labels)
		bson_destroy(fp->labels);
	if (fp->wce)
		bson_destroy(fp->wce);
	memset(fp, 0, sizeof *fp);
}

wire_failpoint *wire__failpoint_new(void)
{
	return sdb_calloc(1, sizeof(wire_failpoint));
}

void wire__failpoint_free(wire_failpoint *fp)
{
	if (!fp)
		return;
	fp_reset(fp);
	free(fp);
}

/* Codes whose error makes a retryable write retryable (mongod's ErrorCategory
 * RetriableError plus the NotPrimary and Shutdown categories). */
static bool retryable_code(int code)
{
	switch (code) {
	case 6:     /* HostUnreachable */
	case 7:     /* HostNotFound */
	case 89:    /* NetworkTimeout */
	case 91:    /* ShutdownInProgress */
	case 189:   /* PrimarySteppedDown */
	case 262:   /* ExceededTimeLimit */
	case 9001:  /* SocketException */
	case 10107: /* NotWritablePrimary */
	case 11600: /* InterruptedAtShutdown */
	case 11602: /* InterruptedDueToReplStateChange */
	case 13435: /* NotPrimaryNoSecondaryOk */
	case 13436: /* NotPrimaryOrSecondary */
		return true;
	default:
		return false;
	}
}

/* A retryable write: a write command with txnNumber outside a transaction. */
static bool is_retryable_write(const wire_req *req)
{
	static const char *const writes[] = {"insert", "update", "delete", "findAndModify",
					     "findandmodify", "bulkWrite"};
	bson_iter_t it;
	bool write = false;

	for (size_t i = 0; i < sizeof writes / sizeof writes[0]; i++)
		write = write || strcmp(req->name, writes[i]) == 0;
	return write && bson_iter_init_find(&it, req->cmd, "txnNumber") &&
	       !bson_iter_init_find(&it, req->cmd, "autocommit");
}

/* The errorLabels array for an error of `code` on req: the fail point's own, else
 * computed. NULL for none. Returns a new document. */
static bson_t *labels_for(const wire_req *req, const fp_action *a, int code)
{
	if (a->labels)
		return bson_copy(a->labels);
	if (!retryable_code(code) || !is_retryable_write(req))
		return NULL;
	return BCON_NEW("0", BCON_UTF8("RetryableWriteError"));
}

static void action_free(fp_action *a)
{
	if (a->labels)
		bson_destroy(a->labels);
	if (a->wce)
		bson_destroy(a->wce);
}

/* The mode of configureFailPoint into always/times/skip. Returns 1 (on), 0 (off: "off" or
 * {times: 0}) or -1 after answering req with BadValue. */
static int parse_mode(wire_req *req, bool *always, int64_t *times, int64_t *skip)
{
	bson_iter_t it, d;

	if (!bson_iter_init_find(&it, req->cmd, "mode")) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "configureFailPoint needs a mode");
		return -1;
	}
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		const char *m = bson_iter_utf8(&it, NULL);
		if (strcmp(m, "off") == 0)
			return 0;
		if (strcmp(m, "alwaysOn") != 0) {
			wire_req_error(req, WIRE_ERR_BAD_VALUE, "unknown fail point mode '%.50s'", m);
			return -1;
		}
		*always = true;
	} else if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &d) &&
		   bson_iter_next(&d) && BSON_ITER_HOLDS_NUMBER(&d) &&
		   (strcmp(bson_iter_key(&d), "times") == 0 ||
		    strcmp(bson_iter_key(&d), "skip") == 0)) {
		int64_t v = bson_iter_as_int64(&d);
		if (v < 0) {
			wire_req_error(req, WIRE_ERR_BAD_VALUE, "fail point mode counts must be >= 0");
			return -1;
		}
		if (strcmp(bson_iter_key(&d), "times") == 0) {
			*times = v;
			if (v == 0)
				return 0; /* {times: 0} is off */
		} else {
			*skip = v;
			*always = true;
		}
	} else {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "fail point mode must be 'alwaysOn', 'off', {times: N} or {skip: N}");
		return -1;
	}
	return 1;
}

/* Parse mode and data into n; answers req and returns false when refused. */
static bool fp_parse(wire_req *req, wire_failpoint *n)
{
	bson_iter_t it, d;
	bool block = false;
	int64_t block_ms = 0;

	int m = parse_mode(req, &n->always, &n->times, &n->skip);
	if (m <= 0)
		return m == 0;
	n->on = true;
	if (!bson_iter_init_find(&it, req->cmd, "data") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &d)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "failCommand needs data.failCommands");
		return false;
	}
	while (bson_iter_next(&d)) {
		const char *k = bson_iter_key(&d);
		uint32_t len;
		const uint8_t *data;

		if (strcmp(k, "failCommands") == 0 && BSON_ITER_HOLDS_ARRAY(&d)) {
			bson_iter_t a;
			size_t cap = 0;
			bson_iter_recurse(&d, &a);
			while (bson_iter_next(&a)) {
				if (!BSON_ITER_HOLDS_UTF8(&a))
					continue;
				if (n->n_cmds == cap) {
					cap = cap ? cap * 2 : 4;
					n->cmds = sdb_realloc(n->cmds, cap * sizeof *n->cmds);
				}
				n->cmds[n->n_cmds++] = sdb_strdup(bson_iter_utf8(&a, NULL));
			}
		} else if (strcmp(k, "errorCode") == 0 && BSON_ITER_HOLDS_NUMBER(&d)) {
			n->code = (int)bson_iter_as_int64(&d);
		} else if (strcmp(k, "errorLabels") == 0 && BSON_ITER_HOLDS_ARRAY(&d)) {
			bson_iter_array(&d, &len, &data);
			if (n->labels)
				bson_destroy(n->labels);
			n->labels = bson_new_from_data(data, len);
		} else if (strcmp(k, "writeConcernError") == 0 && BSON_ITER_HOLDS_DOCUMENT(&d)) {
			bson_iter_document(&d, &len, &data);
			if (n->wce)
				bson_destroy(n->wce);
			n->wce = bson_new_from_data(data, len);
		} else if (strcmp(k, "closeConnection") == 0) {
			n->close = bson_iter_as_bool(&d);
		} else if (strcmp(k, "blockConnection") == 0) {
			block = bson_iter_as_bool(&d);
		} else if (strcmp(k, "blockTimeMS") == 0 && BSON_ITER_HOLDS_NUMBER(&d)) {
			block_ms = bson_iter_as_int64(&d);
		} else {
			wire_req_error(req, WIRE_ERR_BAD_VALUE,
				       "failCommand option '%.100s' is not supported by stripedb", k);
			return false;
		}
	}
	if (block && (block_ms <= 0 || block_ms > 60000)) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "blockConnection needs blockTimeMS between 1 and 60000");
		return false;
	}
	n->block_ms = block ? block_ms : 0;
	if (n->n_cmds == 0) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE, "failCommand needs data.failCommands");
		return false;
	}
	if (n->code == 0 && !n->close && n->block_ms == 0 && !n->wce) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "failCommand needs errorCode, closeConnection, blockConnection or "
			       "writeConcernError");
		return false;
	}
	return true;
}

/* ---- onPrimaryTransactionalWrite (servers that run retryable writes: the shard) ---- */

struct wire_ptw {
	pthread_mutex_t mu; /* the setting is read by worker threads */
	bool on, always;
	int64_t times, skip, fired;
	bool close;     /* closeConnection (default true) */
	int fail_code;  /* failBeforeCommitExceptionCode, 0: none */
};

wire_ptw *wire__ptw_new(void)
{
	wire_ptw *p = sdb_calloc(1, sizeof *p);
	pthread_mutex_init(&p->mu, NULL);
	return p;
}

void wire__ptw_free(wire_ptw *p)
{
	if (!p)
		return;
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static void ptw_configure(wire_req *req, wire_ptw *p)
{
	wire_ptw n = {.close = true};
	bson_iter_t it, d;
	int m = parse_mode(req, &n.always, &n.times, &n.skip);
	int64_t count;

	if (m < 0)
		return;
	n.on = m == 1;
	if (bson_iter_init_find(&it, req->cmd, "data") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &d)) {
		while (bson_iter_next(&d)) {
			const char *k = bson_iter_key(&d);
			if (strcmp(k, "closeConnection") == 0) {
				n.close = bson_iter_as_bool(&d);
			} else if (strcmp(k, "failBeforeCommitExceptionCode") == 0 &&
				   BSON_ITER_HOLDS_NUMBER(&d) && bson_iter_as_int64(&d) > 0) {
				n.fail_code = (int)bson_iter_as_int64(&d);
			} else {
				wire_req_error(req, WIRE_ERR_BAD_VALUE,
					       "onPrimaryTransactionalWrite option '%.100s' is not "
					       "supported by stripedb",
					       k);
				return;
			}
		}
	}
	pthread_mutex_lock(&p->mu);
	count = p->fired;
	p->on = n.on;
	p->always = n.always;
	p->times = n.times;
	p->skip = n.skip;
	p->close = n.close;
	p->fail_code = n.fail_code;
	p->fired = 0;
	pthread_mutex_unlock(&p->mu);
	wire_req_reply(req, BCON_NEW("count", BCON_INT64(count)));
}

bool wire_failpoint_primary_write_armed(const wire_req *req)
{
	wire_ptw *p = req->srv ? req->srv->ptw : NULL;
	bool on;

	if (!p)
		return false;
	pthread_mutex_lock(&p->mu);
	on = p->on;
	pthread_mutex_unlock(&p->mu);
	return on;
}

bool wire_failpoint_primary_write(wire_req *req)
{
	wire_ptw *p = req->srv ? req->srv->ptw : NULL;
	bool hit = false, close = false;
	int code = 0;

	if (!p)
		return false;
	pthread_mutex_lock(&p->mu);
	if (p->on && p->skip > 0) {
		p->skip--;
	} else if (p->on) {
		hit = true;
		p->fired++;
		close = p->close;
		code = p->fail_code;
		if (!p->always && --p->times <= 0)
			p->on = false;
	}
	pthread_mutex_unlock(&p->mu);
	if (!hit)
		return false;
	sdb_debug("wire: onPrimaryTransactionalWrite fired", "cmd=%s close=%d code=%d", req->name,
		  (int)close, code);
	if (close) {
		/* mongod ends the client's session: no reply reaches the client */
		req->no_reply = true;
		req->close_after = true;
	}
	if (code == 0)
		return false; /* the write runs (and commits); only its reply is lost */
	if (close)
		wire_req_reply(req, NULL);
	else
		wire_req_error(req, code, "Failing write for test before commit");
	return true;
}

void wire__cmd_configure_fail_point(wire_req *req, void *role_data)
{
	wire_failpoint *fp = req->srv->fp;
	wire_failpoint n = {.on = false};
	bson_iter_t it;
	int64_t count;

	(void)role_data;
	if (!fp) {
		wire_req_error(req, WIRE_ERR_COMMAND_NOT_FOUND,
			       "no such command: 'configureFailPoint' (a test command: start the "
			       "%s with --enable-test-commands)",
			       req->srv->role);
		return;
	}
	if (strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "configureFailPoint may only be run against the admin database.");
		return;
	}
	if (bson_iter_init_find(&it, req->cmd, "configureFailPoint") &&
	    BSON_ITER_HOLDS_UTF8(&it) &&
	    strcmp(bson_iter_utf8(&it, NULL), "onPrimaryTransactionalWrite") == 0 &&
	    req->srv->ptw) {
		ptw_configure(req, req->srv->ptw);
		return;
	}
	if (!bson_iter_init_find(&it, req->cmd, "configureFailPoint") ||
	    !BSON_ITER_HOLDS_UTF8(&it) || strcmp(bson_iter_utf8(&it, NULL), "failCommand") != 0) {
		wire_req_error(req, WIRE_ERR_BAD_VALUE,
			       "stripedb implements the failCommand fail point%s only",
			       req->srv->ptw ? " and onPrimaryTransactionalWrite" : "");
		return;
	}
	if (!fp_parse(req, &n)) {
		fp_reset(&n);
		return;
	}
	count = fp->fired;
	fp_reset(fp);
	*fp = n;
	sdb_info("wire: failCommand fail point set", "role=%s on=%d commands=%zu code=%d",
		 req->srv->role, (int)n.on, n.n_cmds, n.code);
	wire_req_reply(req, BCON_NEW("count", BCON_INT64(count)));
}

/* Does the setting fire for this command now? Fills a and counts the firing. */
static bool fp_fire(wire_failpoint *fp, const char *name, fp_action *a)
{
	bool hit = false;

	for (size_t i = 0; fp->on && !hit && i < fp->n_cmds; i++)
		hit = strcmp(fp->cmds[i], name) == 0;
	if (!hit)
		return false;
	if (fp->skip > 0) {
		fp->skip--;
		return false;
	}
	fp->fired++;
	memset(a, 0, sizeof *a);
	a->code = fp->code;
	a->labels = fp->labels ? bson_copy(fp->labels) : NULL;
	a->wce = fp->wce ? bson_copy(fp->wce) : NULL;
	a->close = fp->close;
	a->block_ms = fp->block_ms;
	if (!fp->always && --fp->times <= 0) {
		int64_t fired = fp->fired;
		fp_reset(fp);
		fp->fired = fired;
	}
	return true;
}

/* The part after blocking: answer with the error, or arrange the write concern error
 * and return false for the command to run. Loop thread. */
static bool fp_finish(wire_req *req, fp_action *a)
{
	if (a->code != 0) {
		bson_t *labels = labels_for(req, a, a->code);
		bson_t *extra = bson_new();
		if (labels) {
			BSON_APPEND_ARRAY(extra, "errorLabels", labels);
			bson_destroy(labels);
		}
		/* mongod's appendErrorLabelsAndTopologyVersion: an error of the NotPrimaryError
		 * or ShutdownError category carries the server's current topologyVersion, so that
		 * a driver (SDAM spec, "stale errors") does not mark the server Unknown (and wait
		 * for its monitor) for an error no newer than what its monitor knows. Only the fail
		 * point's errors get it here: mongod bumps topologyVersion BEFORE answering a real
		 * step-down's errors, while a stripedb role bumps it after noticing the change, so
		 * a real error carrying it could be taken for stale. */
		if (wire_state_change_code(a->code))
			wire__append_topology_version(req->srv, extra);
		wire_req_error_extra(req, a->code, extra,
				     "Failing command via 'failCommand' failpoint");
		return true;
	}
	if (a->wce) {
		bson_iter_t it;
		int code = bson_iter_init_find(&it, a->wce, "code") && BSON_ITER_HOLDS_NUMBER(&it)
				   ? (int)bson_iter_as_int64(&it)
				   : 0;
		bson_t *labels = labels_for(req, a, code);
		req->reply_extra = bson_new();
		BSON_APPEND_DOCUMENT(req->reply_extra, "writeConcernError", a->wce);
		if (labels) {
			BSON_APPEND_ARRAY(req->reply_extra, "errorLabels", labels);
			bson_destroy(labels);
		}
	}
	return false;
}

static void on_block_closed(uv_handle_t *h)
{
	free(h->data);
}

static void on_block_done(uv_timer_t *t)
{
	fp_block *b = t->data;
	wire_req *req = b->req;
	wire_cmd_entry *entry = b->entry;
	bool answered = fp_finish(req, &b->a);

	action_free(&b->a);
	b->timer.data = b;
	uv_close((uv_handle_t *)&b->timer, on_block_closed);
	if (!answered)
		entry->fn(req, req->srv->role_data);
}

bool wire__failpoint_intercept(wire_req *req, wire_cmd_entry *entry)
{
	fp_action a;

	if (!req->srv->fp || !fp_fire(req->srv->fp, req->name, &a))
		return false;
	sdb_debug("wire: failCommand fired", "cmd=%s code=%d close=%d block_ms=%lld", req->name,
		  a.code, (int)a.close, (long long)a.block_ms);
	if (a.close) {
		/* mongod ends the session: no reply, the connection goes */
		action_free(&a);
		req->no_reply = true;
		req->close_after = true;
		wire_req_reply(req, NULL);
		return true;
	}
	if (a.block_ms > 0) {
		fp_block *b = sdb_calloc(1, sizeof *b);
		b->req = req;
		b->entry = entry;
		b->a = a;
		uv_timer_init(req->srv->loop, &b->timer);
		b->timer.data = b;
		uv_timer_start(&b->timer, on_block_done, (uint64_t)a.block_ms, 0);
		return true;
	}
	bool answered = fp_finish(req, &a);
	action_free(&a);
	return answered;
}
