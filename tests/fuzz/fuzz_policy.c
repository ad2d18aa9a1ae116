/* libFuzzer target for the authorization evaluator (src/auth/policy.c) and the command
 * classification of the proxy gate (auth_gate_authorize in src/auth/gate.c).
 *
 * Input: a stream of BSON documents: the first is a listTenants reply, the second a
 * listDatabases reply (both untrusted, as from a compromised or buggy metadata service),
 * each further one a command document run as every tenant on the databases it names.
 * Invariants (abort): a tenant is never allowed a database outside its own list
 * (auth_policy_each_db); an unknown tenant is allowed nothing; the decision is
 * deterministic. */
#include <bson/bson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "auth/gate.h"
#include "auth/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct owned {
	const char *db;
	bool found;
} owned;

static void find_db(void *arg, const char *db)
{
	owned *o = arg;
	if (strcmp(o->db, db) == 0)
		o->found = true;
}

static bool is_open(const char *name)
{
	static const char *const open_cmds[] = {"hello", "isMaster", "ismaster", "ping",
						"buildInfo", "buildinfo", "whatsmyuri",
						"connectionStatus", "endSessions", "saslStart",
						"saslContinue", NULL};
	for (int i = 0; open_cmds[i]; i++)
		if (strcmp(open_cmds[i], name) == 0)
			return true;
	return false;
}

static void check_cmd(const auth_policy *pol, const bson_t *tenants, const bson_t *cmd)
{
	static const char *const dbs[] = {"a", "b", "admin", ""};
	bson_iter_t it, arr, d;
	const char *name;
	char what[300];

	if (!bson_iter_init(&it, cmd) || !bson_iter_next(&it))
		return;
	name = bson_iter_key(&it);
	/* tenants named in the input, plus one that does not exist */
	const char *names[8] = {"no-such-tenant"};
	size_t n = 1;
	if (bson_iter_init_find(&it, tenants, "tenants") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (n < 8 && bson_iter_next(&arr))
			if (BSON_ITER_HOLDS_DOCUMENT(&arr) && bson_iter_recurse(&arr, &d) &&
			    bson_iter_find(&d, "name") && BSON_ITER_HOLDS_UTF8(&d))
				names[n++] = bson_iter_utf8(&d, NULL);
	}
	for (size_t t = 0; t < n; t++) {
		for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
			bool ok = auth_gate_authorize(pol, names[t], name, dbs[i], cmd, what,
						      sizeof what);
			bool again = auth_gate_authorize(pol, names[t], name, dbs[i], cmd, what,
							 sizeof what);
			owned o = {dbs[i], false};
			if (ok != again)
				abort();
			auth_policy_each_db(pol, names[t], find_db, &o);
			if (ok && !is_open(name) && !o.found)
				abort(); /* allowed on a database the tenant does not have */
			if (auth_policy_allowed(pol, names[t], dbs[i], "c", AUTH_ACT_FIND) && !o.found)
				abort();
			if (t == 0 && !auth_policy_has_tenant(pol, names[0]) &&
			    auth_policy_allowed(pol, names[0], dbs[i], NULL, AUTH_ACT_FIND))
				abort();
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	bson_reader_t *r = bson_reader_new_from_data(data, size);
	const bson_t *doc;
	bson_t *tenants = NULL, *dbs = NULL;
	auth_policy *pol = NULL;
	bool eof = false;
	int k = 0;

	while ((doc = bson_reader_read(r, &eof)) != NULL && k < 16) {
		if (!bson_validate(doc, BSON_VALIDATE_NONE, NULL))
			break;
		if (k == 0) {
			tenants = bson_copy(doc);
		} else if (k == 1) {
			dbs = bson_copy(doc);
			pol = auth_policy_build(tenants, dbs);
		} else {
			check_cmd(pol, tenants, doc);
		}
		k++;
	}
	if (!pol && tenants)
		pol = auth_policy_build(tenants, NULL);
	auth_policy_free(pol);
	bson_destroy(tenants);
	bson_destroy(dbs);
	bson_reader_destroy(r);
	return 0;
}
