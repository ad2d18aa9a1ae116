/* The metadata state machine's tenants (quotas, policies) and users (SCRAM verifiers).
 * Command reference in src/metadata/README.md; internals in fsm_int.h. */
#include "raft/fsm.h"

#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "raft/migstate.h"
#include "raft/fsm_peers.h"
#include "raft/routing.h"
#include "raft/fsm_int.h"

int fsm_op_create_tenant(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name");
	if (!name || !*name)
		return fsm_lerr(res, E_BAD_VALUE, "createTenant needs a string field name");
	int e = fsm_exists(f, "SELECT 1 FROM tenants WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_DUPLICATE, "tenant %s already exists", name);
	return fsm_x(f, "INSERT INTO tenants(name, created_ms) VALUES(?, ?)", "ti", name, c->ts)
		       ? SDB_EIO
		       : 0;
}

int fsm_op_tenant_doc(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *tenant = fsm_arg_str(&c->args, "tenant");
	int quota = strcmp(c->op, "setQuota") == 0;
	bson_t d;
	if (!tenant || !fsm_arg_doc(&c->args, quota ? "quota" : "policy", &d, 0))
		return fsm_lerr(res, E_BAD_VALUE, "%s needs tenant and a %s document", c->op,
			    quota ? "quota" : "policy");
	int e = fsm_exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	return fsm_x(f,
		 quota ? "UPDATE tenants SET quota = ? WHERE name = ?"
		       : "UPDATE tenants SET policy = ? WHERE name = ?",
		 "bt", bson_get_data(&d), (int)d.len, tenant)
		       ? SDB_EIO
		       : 0;
}

static int arg_bin(const bson_t *args, const char *key, const uint8_t **data, uint32_t *len)
{
	bson_iter_t it;
	bson_subtype_t st;
	if (!bson_iter_init_find(&it, args, key) || !BSON_ITER_HOLDS_BINARY(&it))
		return 0;
	bson_iter_binary(&it, &st, len, data);
	return 1;
}

/* A SCRAM verifier in args (RFC 5802 §3): salt (16..64 bytes), iterations >= 4096,
 * storedKey and serverKey of keylen bytes (32: SHA-256, 20: SHA-1). */
typedef struct verifier {
	const uint8_t *salt, *sk, *svk;
	uint32_t lsalt, lsk, lsvk;
	int64_t iters;
} verifier;

static int arg_verifier(const bson_t *args, uint32_t keylen, verifier *v)
{
	return arg_bin(args, "salt", &v->salt, &v->lsalt) &&
	       arg_bin(args, "storedKey", &v->sk, &v->lsk) &&
	       arg_bin(args, "serverKey", &v->svk, &v->lsvk) &&
	       fsm_arg_int(args, "iterations", &v->iters) && v->iters >= 4096 &&
	       v->iters <= 10000000 && v->lsk == keylen && v->lsvk == keylen && v->lsalt >= 16 &&
	       v->lsalt <= 64;
}

/* Optional scramSha1: {salt, iterations, storedKey, serverKey}. Returns 1 when present and
 * valid (*has set), 1 when absent (*has clear), 0 when present but malformed. */
static int arg_sha1(const bson_t *args, verifier *v, int *has)
{
	bson_t d;
	*has = 0;
	if (!bson_has_field(args, "scramSha1"))
		return 1;
	if (!fsm_arg_doc(args, "scramSha1", &d, 0) || !arg_verifier(&d, 20, v))
		return 0;
	*has = 1;
	return 1;
}

/* Replace the user's SHA-1 verifier (none when has is 0). */
static int put_sha1(sdb_fsm *f, const char *name, int has, const verifier *v)
{
	if (fsm_x(f, "DELETE FROM user_sha1 WHERE name = ?", "t", name))
		return SDB_EIO;
	if (has && fsm_x(f,
		     "INSERT INTO user_sha1(name, salt, iterations, stored_key, server_key)"
		     " VALUES(?, ?, ?, ?, ?)",
		     "tbibb", name, v->salt, (int)v->lsalt, v->iters, v->sk, (int)v->lsk, v->svk,
		     (int)v->lsvk))
		return SDB_EIO;
	return 0;
}

/* Every change of a user's credentials bumps meta users_version (getUser and listTenants
 * report it; the proxy drops cached verifiers of older versions). */
static int bump_users(sdb_fsm *f)
{
	int64_t v;
	return fsm_next_id(f, "users_version", &v);
}

int fsm_op_create_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name"), *tenant = fsm_arg_str(&c->args, "tenant");
	verifier v, v1;
	int has1 = 0;
	if (!name || !*name || !tenant || !arg_verifier(&c->args, 32, &v) ||
	    !arg_sha1(&c->args, &v1, &has1))
		return fsm_lerr(res, E_BAD_VALUE,
			    "createUser needs name, tenant and a SCRAM-SHA-256 verifier (salt, "
			    "iterations >= 4096, storedKey, serverKey), optionally scramSha1");
	int e = fsm_exists(f, "SELECT 1 FROM tenants WHERE name = ?", tenant);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_NO_SUCH_KEY, "tenant %s not found", tenant);
	e = fsm_exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (e)
		return fsm_lerr(res, E_DUPLICATE, "user %s already exists", name);
	if (fsm_x(f,
	      "INSERT INTO users(name, tenant, mechanism, salt, iterations, stored_key, server_key)"
	      " VALUES(?, ?, 'SCRAM-SHA-256', ?, ?, ?, ?)",
	      "ttbibb", name, tenant, v.salt, (int)v.lsalt, v.iters, v.sk, (int)v.lsk, v.svk,
	      (int)v.lsvk) ||
	    put_sha1(f, name, has1, &v1) || bump_users(f))
		return SDB_EIO;
	return 0;
}

/* updateUser (MongoDB's name): new verifiers for an existing user. The SHA-1 verifier is
 * replaced too, or removed when the command carries none, so an old password never
 * keeps working through the other mechanism. */
int fsm_op_update_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name");
	verifier v, v1;
	int has1 = 0;
	if (!name || !*name || !arg_verifier(&c->args, 32, &v) || !arg_sha1(&c->args, &v1, &has1))
		return fsm_lerr(res, E_BAD_VALUE,
			    "updateUser needs name and a SCRAM-SHA-256 verifier (salt, iterations "
			    ">= 4096, storedKey, serverKey), optionally scramSha1");
	int e = fsm_exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_USER_NOT_FOUND, "Could not find user \"%s\"", name);
	if (fsm_x(f,
	      "UPDATE users SET mechanism = 'SCRAM-SHA-256', salt = ?, iterations = ?,"
	      " stored_key = ?, server_key = ? WHERE name = ?",
	      "bibbt", v.salt, (int)v.lsalt, v.iters, v.sk, (int)v.lsk, v.svk, (int)v.lsvk, name) ||
	    put_sha1(f, name, has1, &v1) || bump_users(f))
		return SDB_EIO;
	return 0;
}

int fsm_op_drop_user(sdb_fsm *f, cmdctx *c, bson_t *res)
{
	const char *name = fsm_arg_str(&c->args, "name");
	if (!name || !*name)
		return fsm_lerr(res, E_BAD_VALUE, "dropUser needs a string field name");
	int e = fsm_exists(f, "SELECT 1 FROM users WHERE name = ?", name);
	if (e < 0)
		return e;
	if (!e)
		return fsm_lerr(res, E_USER_NOT_FOUND, "Could not find user \"%s\"", name);
	if (fsm_x(f, "DELETE FROM users WHERE name = ?", "t", name) ||
	    fsm_x(f, "DELETE FROM user_sha1 WHERE name = ?", "t", name) || bump_users(f))
		return SDB_EIO;
	return 0;
}
