/* The failCommand fail point of the shard (issue #16), as mongod's test command
 * `configureFailPoint` (src/mongo/db/commands/fail_point_cmd.cpp and the driver
 * specifications' "failCommand" description), accepted only with --enable-test-commands
 * (MongoDB's enableTestCommands) so that drivers' retryable-writes specification tests can
 * make a shard fail a command on purpose.
 *
 *   {configureFailPoint: "failCommand", mode: "alwaysOn" | "off" | {times: N} | {skip: N},
 *    data: {failCommands: ["insert", ...], errorCode?: N, errorLabels?: [...],
 *           blockConnection?: bool, blockTimeMS?: N}}
 * -> {count: <times the previous setting fired>, ok: 1}
 *
 * A command named in failCommands, while the mode is on, is answered {ok: 0, code:
 * errorCode, errmsg, errorLabels} before it runs (nothing executed); with blockConnection
 * it first waits blockTimeMS (then fails with errorCode if given, else runs). Options this
 * shard does not implement (closeConnection, writeConcernError, appName, other fail
 * points) are refused with BadValue rather than ignored. The setting is one per process
 * (as mongod's), shared by the shard roles of a process.
 */
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "common/alloc.h"
#include "common/err.h"
#include "shard/shard.h"

typedef struct failpoint {
	pthread_mutex_t mu;
	bool on;
	bool always;
	int64_t times; /* fires left when !always and skip == 0 */
	int64_t skip;  /* matching commands to let through first ({skip: N}: then always) */
	int64_t fired;
	char **cmds;
	size_t n_cmds;
	int code;       /* 0: no error (block only) */
	bson_t *labels; /* array or NULL */
	int64_t block_ms;
} failpoint;

static failpoint fp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fp_clear(void)
{
	for (size_t i = 0; i < fp.n_cmds; i++)
		free(fp.cmds[i]);
	free(fp.cmds);
	if (fp.labels)
		bson_destroy(fp.labels);
	fp.cmds = NULL;
	fp.n_cmds = 0;
	fp.labels = NULL;
	fp.on = fp.always = false;
	fp.times = fp.skip = 0;
	fp.code = 0;
	fp.block_ms = 0;
}

/* Parse mode and data into a new setting; replies and returns false when refused. */
static bool fp_parse(shard_ctx *x, failpoint *n)
{
	bson_iter_t it, d;
	bool block = false;
	int64_t block_ms = 0;
	if (!bson_iter_init_find(&it, x->cmd, "mode")) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "configureFailPoint needs a mode");
		return false;
	}
	if (BSON_ITER_HOLDS_UTF8(&it)) {
		const char *m = bson_iter_utf8(&it, NULL);
		if (strcmp(m, "off") == 0)
			return true;
		if (strcmp(m, "alwaysOn") != 0) {
			shard_fail(x, WIRE_ERR_BAD_VALUE, "unknown fail point mode '%s'", m);
			return false;
		}
		n->always = true;
	} else if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &d) &&
		   bson_iter_next(&d) && BSON_ITER_HOLDS_NUMBER(&d) &&
		   (strcmp(bson_iter_key(&d), "times") == 0 ||
		    strcmp(bson_iter_key(&d), "skip") == 0)) {
		int64_t v = bson_iter_as_int64(&d);
		if (v < 0) {
			shard_fail(x, WIRE_ERR_BAD_VALUE, "fail point mode counts must be >= 0");
			return false;
		}
		if (strcmp(bson_iter_key(&d), "times") == 0) {
			n->times = v;
			if (v == 0)
				return true; /* {times: 0} is off */
		} else {
			n->skip = v;
			n->always = true;
		}
	} else {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "fail point mode must be 'alwaysOn', 'off', {times: N} or {skip: N}");
		return false;
	}
	n->on = true;
	if (!bson_iter_init_find(&it, x->cmd, "data") || !BSON_ITER_HOLDS_DOCUMENT(&it) ||
	    !bson_iter_recurse(&it, &d)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "failCommand needs data.failCommands");
		return false;
	}
	while (bson_iter_next(&d)) {
		const char *k = bson_iter_key(&d);
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
			uint32_t len;
			const uint8_t *data;
			bson_iter_array(&d, &len, &data);
			n->labels = bson_new_from_data(data, len);
		} else if (strcmp(k, "blockConnection") == 0) {
			block = bson_iter_as_bool(&d);
		} else if (strcmp(k, "blockTimeMS") == 0 && BSON_ITER_HOLDS_NUMBER(&d)) {
			block_ms = bson_iter_as_int64(&d);
		} else if (strcmp(k, "closeConnection") == 0 && !bson_iter_as_bool(&d)) {
			continue;
		} else {
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "failCommand option '%s' is not supported by the stripedb shard",
				   k);
			return false;
		}
	}
	if (block && (block_ms <= 0 || block_ms > 60000)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "blockConnection needs blockTimeMS between 1 and 60000");
		return false;
	}
	n->block_ms = block ? block_ms : 0;
	if (n->n_cmds == 0 || (n->code == 0 && n->block_ms == 0)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "failCommand needs data.failCommands and errorCode or blockConnection");
		return false;
	}
	return true;
}

void shard_cmd_configure_fail_point(shard_ctx *x)
{
	bson_iter_t it;
	if (!x->sh->test_commands) {
		shard_fail(x, WIRE_ERR_COMMAND_NOT_FOUND,
			   "no such command: 'configureFailPoint' (a test command: start the shard "
			   "with --enable-test-commands)");
		return;
	}
	if (!bson_iter_init_find(&it, x->cmd, "configureFailPoint") ||
	    !BSON_ITER_HOLDS_UTF8(&it) || strcmp(bson_iter_utf8(&it, NULL), "failCommand") != 0) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "the stripedb shard implements the failCommand fail point only");
		return;
	}
	failpoint n = {.on = false};
	if (!fp_parse(x, &n)) {
		for (size_t i = 0; i < n.n_cmds; i++)
			free(n.cmds[i]);
		free(n.cmds);
		if (n.labels)
			bson_destroy(n.labels);
		return;
	}
	pthread_mutex_lock(&fp.mu);
	int64_t count = fp.fired;
	fp_clear();
	fp.on = n.on;
	fp.always = n.always;
	fp.times = n.times;
	fp.skip = n.skip;
	fp.cmds = n.cmds;
	fp.n_cmds = n.n_cmds;
	fp.code = n.code;
	fp.labels = n.labels;
	fp.block_ms = n.block_ms;
	fp.fired = 0;
	pthread_mutex_unlock(&fp.mu);
	bson_t *reply = bson_new();
	BSON_APPEND_INT64(reply, "count", count);
	wire_req_reply(x->req, reply);
}

bool shard_failpoint_fire(shard_ctx *x)
{
	const char *name;
	int code = 0;
	int64_t block = 0;
	bson_t *labels = NULL;
	bool hit = false;

	if (!x->sh->test_commands)
		return false;
	name = wire_req_name(x->req);
	pthread_mutex_lock(&fp.mu);
	for (size_t i = 0; fp.on && !hit && i < fp.n_cmds; i++)
		hit = strcmp(fp.cmds[i], name) == 0;
	if (hit && fp.skip > 0) {
		fp.skip--;
		hit = false;
	}
	if (hit) {
		fp.fired++;
		code = fp.code;
		block = fp.block_ms;
		labels = fp.labels ? bson_copy(fp.labels) : NULL;
		if (!fp.always && --fp.times <= 0)
			fp_clear();
	}
	pthread_mutex_unlock(&fp.mu);
	if (!hit)
		return false;
	if (block > 0)
		uv_sleep((unsigned)block);
	if (code == 0) {
		if (labels)
			bson_destroy(labels);
		return false; /* block only: the command runs */
	}
	bson_t *extra = NULL;
	if (labels) {
		extra = bson_new();
		BSON_APPEND_ARRAY(extra, "errorLabels", labels);
		bson_destroy(labels);
	}
	wire_req_error_extra(x->req, code, extra, "Failing command via 'failCommand' failpoint");
	return true;
}
