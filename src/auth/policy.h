/* Authorization of the proxy: tenant -> databases, collections, actions (issue #10,
 * DESIGN.md §5 step 1).
 *
 * Inputs come from the metadata service, as the proxy already reads them for quotas:
 *   listTenants:   {tenants: [{name, quota, policy}]}
 *   listDatabases: {databases: [{name, tenant}]}
 * A tenant may use the logical databases it owns (listDatabases.tenant) plus those its
 * policy grants. The policy document (setPolicy, all fields optional):
 *   {databases: ["extra_db", ...],                  granted besides the owned ones
 *    actions: ["find", "insert", ...],              tenant-wide; default: every action
 *    collections: {"db.coll": {actions: [...]}}}    per-collection override (other
 *                                                   fields, e.g. forbidScatter, are the
 *                                                   quota module's)
 * A decision depends only on the tenant's grants, never on whether a namespace exists,
 * so a denial reveals nothing about other tenants (MongoDB's Unauthorized (13)).
 */
#ifndef SDB_AUTH_POLICY_H
#define SDB_AUTH_POLICY_H

#include <bson/bson.h>
#include <stdbool.h>

/* Actions (bit set). Command -> action mapping lives in auth/gate.c. */
enum {
	AUTH_ACT_FIND = 1,         /* find, getMore, count, distinct, aggregate reads, listings */
	AUTH_ACT_INSERT = 2,       /* insert, $out/$merge targets, upserts */
	AUTH_ACT_UPDATE = 4,       /* update, findAndModify, $merge */
	AUTH_ACT_REMOVE = 8,       /* delete, findAndModify remove, $out replaces */
	AUTH_ACT_CREATE_INDEX = 16, /* createIndexes, dropIndexes */
	AUTH_ACT_ADMIN = 32,       /* create, drop, collMod, dropDatabase, validate */
	AUTH_ACT_ALL = 63,
};

/* Check a policy document as setPolicy receives it: the fields above only, actions
 * arrays of known action names, databases non-empty strings, collections keyed "db.coll"
 * with actions and the proxy's switches (forbidScatter, forbidUnindexed,
 * forbidUnbounded). Errors: SDB_EINVAL with a message naming the field. A stored policy
 * that does not validate grants nothing (auth_policy_build fails closed). */
int auth_policy_validate(const bson_t *policy, char *err, size_t errlen);

/* Action bit from its policy name ("find", ... "admin"); 0 when unknown. */
unsigned auth_action_parse(const char *name);
/* Policy name of one action bit ("?" when not exactly one known bit). */
const char *auth_action_name(unsigned action);

typedef struct auth_policy auth_policy;

/* Build a decision table from the metadata replies (either may be NULL = empty). Malformed
 * entries (non-string names, unknown action names) are skipped with a warning in err if
 * given; never fails. Free with auth_policy_free. Untrusted input is fine (fuzzed). */
auth_policy *auth_policy_build(const bson_t *tenants, const bson_t *dbs);
void auth_policy_free(auth_policy *pol);

/* May tenant do action (one AUTH_ACT_* bit or several: all must be allowed) on db, or on
 * db.coll when coll is non-NULL? Unknown tenant -> false. */
bool auth_policy_allowed(const auth_policy *pol, const char *tenant, const char *db,
			 const char *coll, unsigned action);

/* Databases tenant may use, sorted by name: calls fn for each (for listDatabases). */
void auth_policy_each_db(const auth_policy *pol, const char *tenant,
			 void (*fn)(void *arg, const char *db), void *arg);

/* Does the tenant exist in the table? */
bool auth_policy_has_tenant(const auth_policy *pol, const char *tenant);

#endif
