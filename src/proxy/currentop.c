/* currentOp and killOp through a proxy (issue #20), as mongos 6.0
 * (src/mongo/s/commands/cluster_current_op.cpp, cluster_kill_op.cpp):
 *  - currentOp reports the shards' operations, not the proxy's own (mongos' default,
 *    localOps: false): the command goes to every shard with the shard's id in
 *    `$stripedbShard`, so each op comes back as a mongod shard reports it to a mongos
 *    (`shard: <id>`, opid "<id>:<opid>", client_s) with the client's filter matched on the
 *    shard after that rewriting; the proxy concatenates the shards' `inprog`.
 *  - killOp {op: "<shard id>:<opid>"} forwards {killOp: 1, op: <opid>} to that shard and
 *    answers {shard, shardid: <opid>, ok: 1} whatever the shard said; a number kills one of
 *    the proxy's own operations (loop thread: h_kill_op).
 *  - a tenant's currentOp {$ownOps: true} lists its own operations on this proxy
 *    (px_current_op_own). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/curop.h"
#include "common/log.h"
#include "proxy/exec.h"
#include "auth/gate.h"
#include "storage/matcher.h"

typedef struct curop_fan {
	ctx *c;
	char **ids;
	bson_t *replies;
	int *cls;
	char (*nerr)[256];
} curop_fan;

static void curop_one(void *arg, size_t i)
{
	curop_fan *f = arg;
	bson_t cmd = BSON_INITIALIZER;

	px_copy_cmd(f->c->cmd, &cmd, NULL);
	BSON_APPEND_UTF8(&cmd, "$stripedbShard", f->ids[i]);
	f->cls[i] = px_run_on(f->c, f->ids[i], &cmd, NULL, &f->replies[i], f->nerr[i],
			      sizeof f->nerr[i]);
	bson_destroy(&cmd);
}

int px_do_current_op(ctx *c)
{
	curop_fan f;
	size_t n, i, k = 0;
	int st = 0;
	bool failed = false;

	if (strcmp(c->db, "admin") != 0)
		return px_error(c, WIRE_ERR_UNAUTHORIZED,
				"currentOp may only be run against the admin database.");
	memset(&f, 0, sizeof f);
	f.c = c;
	n = px_shard_ids(c, &f.ids);
	f.replies = sdb_calloc_bson(n ? n : 1, sizeof *f.replies);
	f.cls = sdb_calloc(n ? n : 1, sizeof *f.cls);
	f.nerr = sdb_calloc(n ? n : 1, sizeof *f.nerr);
	px_fanout(c, n, curop_one, &f);
	/* mongos' $currentOp has no partial results: one shard's failure fails it */
	for (i = 0; i < n && !failed; i++) {
		if (f.cls[i] != SHARDCONN_OK) {
			st = px_reply_shard_error(c, f.cls[i], &f.replies[i], f.nerr[i]);
			failed = true;
		}
	}
	if (!failed) {
		bson_t *reply = bson_new(), arr;
		bson_iter_t it, a;
		char key[16];

		BSON_APPEND_ARRAY_BEGIN(reply, "inprog", &arr);
		for (i = 0; i < n; i++) {
			if (!bson_iter_init_find(&it, &f.replies[i], "inprog") ||
			    !BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &a))
				continue;
			while (bson_iter_next(&a)) {
				snprintf(key, sizeof key, "%zu", k++);
				bson_append_iter(&arr, key, -1, &a);
			}
		}
		bson_append_array_end(reply, &arr);
		st = px_reply(c, reply);
	}
	for (i = 0; i < n; i++) {
		bson_destroy(&f.replies[i]);
		free(f.ids[i]);
	}
	free(f.ids);
	free(f.replies);
	free(f.cls);
	free(f.nerr);
	return st;
}

/* killOp {op: "<shard id>:<opid>"} (the string form; h_kill_op answers the others). */
int px_do_kill_op(ctx *c)
{
	bson_iter_t it;
	const char *s, *sep;
	char shard[256], *end = NULL;
	size_t len;
	long long v;
	bson_t cmd = BSON_INITIALIZER, reply, *out;
	char nerr[256];

	if (!bson_iter_init_find(&it, c->cmd, "op") || !BSON_ITER_HOLDS_UTF8(&it))
		return px_error(c, WIRE_ERR_BAD_VALUE, "\"op\" must be a string here");
	s = bson_iter_utf8(&it, NULL);
	len = strlen(s);
	sep = strchr(s, ':');
	if (len < 3 || !sep || sep == s || sep == s + len - 1)
		return px_error(c, 28625,
				"The op argument to killOp must be of the format shardid:opid but "
				"found \"%s\"",
				s);
	if ((size_t)(sep - s) >= sizeof shard)
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %.*s not found", 200, s);
	memcpy(shard, s, (size_t)(sep - s));
	shard[sep - s] = '\0';
	if (!shardconn_has_shard(c->p->sc, shard))
		return px_error(c, WIRE_ERR_SHARD_NOT_FOUND, "Shard %s not found", shard);
	errno = 0;
	v = strtoll(sep + 1, &end, 10);
	/* NumberParser().base(10) into an int: the whole rest, in range */
	if (errno != 0 || end == sep + 1 || *end != '\0' || v < INT32_MIN || v > INT32_MAX)
		return px_error(c, WIRE_ERR_FAILED_TO_PARSE,
				"Failed to parse opid \"%s\" of killOp: not a 32-bit integer",
				sep + 1);
	sdb_info("proxy: killOp", "op=%s", s);
	BSON_APPEND_INT32(&cmd, "killOp", 1);
	BSON_APPEND_INT32(&cmd, "op", (int32_t)v);
	/* the shard's answer is ignored, as mongos ignores it (legacy killOp) */
	(void)px_run_on(c, shard, &cmd, NULL, &reply, nerr, sizeof nerr);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	out = bson_new();
	BSON_APPEND_UTF8(out, "shard", shard);
	BSON_APPEND_INT32(out, "shardid", (int32_t)v);
	return px_reply(c, out);
}

int px_refuse_current_op_stage(ctx *c, const bson_t *stages)
{
	bson_iter_t it, st;

	if (!bson_iter_init(&it, stages))
		return 0;
	while (bson_iter_next(&it)) {
		if (BSON_ITER_HOLDS_DOCUMENT(&it) && bson_iter_recurse(&it, &st) &&
		    bson_iter_next(&st) && strcmp(bson_iter_key(&st), "$currentOp") == 0)
			return px_error(c, WIRE_ERR_NOT_IMPLEMENTED,
					"$currentOp is not supported through a stripedb proxy: use "
					"the currentOp command");
	}
	return 0;
}

typedef struct own_run {
	const char *user;
	sdb_matcher *m;
	bson_t arr;
	uint32_t n;
} own_run;

static void own_decorate(void *arg, const wire_conn *conn, bson_t *op)
{
	(void)arg;
	auth_gate_append_effective_users(conn, op);
}

static void own_each(void *arg, const wire_conn *conn, const bson_t *op)
{
	own_run *r = arg;
	const char *u = auth_gate_conn_user(conn);
	char key[16];

	if (!u || strcmp(u, r->user) != 0 || !sdb_matcher_match(r->m, op))
		return;
	snprintf(key, sizeof key, "%u", r->n++);
	BSON_APPEND_DOCUMENT(&r->arr, key, op);
}

void px_current_op_own(wire_server *srv, wire_req *req, const char *user)
{
	sdb_curop_args a;
	own_run r;
	char err[512];
	int code = 0;
	bson_t *reply;

	if (strcmp(wire_req_db(req), "admin") != 0) {
		wire_req_error(req, WIRE_ERR_UNAUTHORIZED,
			       "currentOp may only be run against the admin database.");
		return;
	}
	memset(&r, 0, sizeof r);
	r.user = user;
	sdb_curop_args_parse(wire_req_cmd(req), NULL, false, &a);
	if (sdb_matcher_new(&a.filter, &r.m, &code, err, sizeof err) != 0) {
		bson_destroy(&a.filter);
		wire_req_error(req, code ? code : WIRE_ERR_BAD_VALUE, "%s", err);
		return;
	}
	reply = bson_new();
	bson_append_array_begin(reply, "inprog", -1, &r.arr);
	wire_op_opts o = {
		.idle = a.all,
		.truncate = a.truncate,
		.decorate = own_decorate,
		.each = own_each,
		.arg = &r,
	};
	wire_server_each_op(srv, &o);
	bson_append_array_end(reply, &r.arr);
	sdb_matcher_free(r.m);
	bson_destroy(&a.filter);
	wire_req_reply(req, reply);
}
