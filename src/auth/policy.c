/* Authorization decision table. See auth/policy.h. */
#include "auth/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/dblist.h"
#include "common/err.h"

typedef struct coll_rule {
	char *ns;       /* "db.coll" */
	unsigned actions;
} coll_rule;

typedef struct tenant {
	char *name;
	unsigned actions;
	char **dbs;     /* sorted */
	size_t n_dbs, cap_dbs;
	coll_rule *rules;
	size_t n_rules;
} tenant;

struct auth_policy {
	tenant *t;
	size_t n;
};

static const char *const act_names[] = {"find", "insert", "update", "remove", "createIndex",
					"admin"};

unsigned auth_action_parse(const char *name)
{
	for (size_t i = 0; i < sizeof act_names / sizeof act_names[0]; i++)
		if (strcmp(name, act_names[i]) == 0)
			return 1u << i;
	return 0;
}

const char *auth_action_name(unsigned action)
{
	for (size_t i = 0; i < sizeof act_names / sizeof act_names[0]; i++)
		if (action == 1u << i)
			return act_names[i];
	return "?";
}

static tenant *find_tenant(const auth_policy *pol, const char *name)
{
	for (size_t i = 0; i < pol->n; i++)
		if (strcmp(pol->t[i].name, name) == 0)
			return &pol->t[i];
	return NULL;
}

static void add_db(tenant *t, const char *db)
{
	for (size_t i = 0; i < t->n_dbs; i++)
		if (strcmp(t->dbs[i], db) == 0)
			return;
	if (t->n_dbs == t->cap_dbs) {
		t->cap_dbs = t->cap_dbs ? 2 * t->cap_dbs : 4;
		t->dbs = sdb_realloc(t->dbs, t->cap_dbs * sizeof *t->dbs);
	}
	t->dbs[t->n_dbs++] = sdb_strdup(db);
}

/* Actions from an array of names; *ok false when the field is not an array. */
static unsigned parse_actions(bson_iter_t *it, bool *present)
{
	bson_iter_t a;
	unsigned m = 0;
	*present = false;
	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a))
		return 0;
	*present = true;
	while (bson_iter_next(&a))
		if (BSON_ITER_HOLDS_UTF8(&a))
			m |= auth_action_parse(bson_iter_utf8(&a, NULL));
	return m;
}

static void load_policy(tenant *t, bson_iter_t *pol)
{
	bson_iter_t f, sub, rule;
	bool present;

	while (bson_iter_next(pol)) {
		const char *k = bson_iter_key(pol);
		if (strcmp(k, "actions") == 0) {
			unsigned m = parse_actions(pol, &present);
			if (present)
				t->actions = m;
		} else if (strcmp(k, "databases") == 0 && BSON_ITER_HOLDS_ARRAY(pol) &&
			   bson_iter_recurse(pol, &sub)) {
			while (bson_iter_next(&sub))
				if (BSON_ITER_HOLDS_UTF8(&sub) && bson_iter_utf8(&sub, NULL)[0])
					add_db(t, bson_iter_utf8(&sub, NULL));
		} else if (strcmp(k, "collections") == 0 && BSON_ITER_HOLDS_DOCUMENT(pol) &&
			   bson_iter_recurse(pol, &sub)) {
			while (bson_iter_next(&sub)) {
				if (!BSON_ITER_HOLDS_DOCUMENT(&sub) || !bson_iter_recurse(&sub, &rule))
					continue;
				f = rule;
				if (!bson_iter_find(&f, "actions"))
					continue;
				unsigned m = parse_actions(&f, &present);
				if (!present)
					continue;
				t->rules = sdb_realloc(t->rules, (t->n_rules + 1) * sizeof *t->rules);
				t->rules[t->n_rules].ns = sdb_strdup(bson_iter_key(&sub));
				t->rules[t->n_rules].actions = m;
				t->n_rules++;
			}
		}
	}
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* An array of known action names; false (message in err) otherwise. */
static bool valid_actions(bson_iter_t *it, const char *where, char *err, size_t errlen)
{
	bson_iter_t a;
	if (!BSON_ITER_HOLDS_ARRAY(it) || !bson_iter_recurse(it, &a)) {
		snprintf(err, errlen, "%s must be an array of action names", where);
		return false;
	}
	while (bson_iter_next(&a)) {
		if (!BSON_ITER_HOLDS_UTF8(&a) || auth_action_parse(bson_iter_utf8(&a, NULL)) == 0) {
			snprintf(err, errlen,
				 "%s: unknown action %s%s%s (want find, insert, update, remove, "
				 "createIndex or admin)",
				 where, BSON_ITER_HOLDS_UTF8(&a) ? "'" : "",
				 BSON_ITER_HOLDS_UTF8(&a) ? bson_iter_utf8(&a, NULL) : "of a non-string type",
				 BSON_ITER_HOLDS_UTF8(&a) ? "'" : "");
			return false;
		}
	}
	return true;
}

int auth_policy_validate(const bson_t *policy, char *err, size_t errlen)
{
	static const char *const switches[] = {"forbidScatter", "forbidUnindexed",
					       "forbidUnbounded"};
	bson_iter_t it, sub, rule;

	if (!bson_iter_init(&it, policy)) {
		snprintf(err, errlen, "policy: not a document");
		return SDB_EINVAL;
	}
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "actions") == 0) {
			if (!valid_actions(&it, "policy.actions", err, errlen))
				return SDB_EINVAL;
		} else if (strcmp(k, "databases") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&it) || !bson_iter_recurse(&it, &sub)) {
				snprintf(err, errlen, "policy.databases must be an array of names");
				return SDB_EINVAL;
			}
			while (bson_iter_next(&sub))
				if (!BSON_ITER_HOLDS_UTF8(&sub) || !bson_iter_utf8(&sub, NULL)[0]) {
					snprintf(err, errlen,
						 "policy.databases must hold non-empty strings");
					return SDB_EINVAL;
				}
		} else if (strcmp(k, "collections") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &sub)) {
				snprintf(err, errlen, "policy.collections must be a document "
						      "{\"db.coll\": {actions: [...]}}");
				return SDB_EINVAL;
			}
			while (bson_iter_next(&sub)) {
				const char *ns = bson_iter_key(&sub);
				char where[300];
				if (!strchr(ns, '.') || ns[0] == '.' || !BSON_ITER_HOLDS_DOCUMENT(&sub) ||
				    !bson_iter_recurse(&sub, &rule)) {
					snprintf(err, errlen,
						 "policy.collections: '%.200s' must be \"db.coll\": "
						 "{actions: [...]}", ns);
					return SDB_EINVAL;
				}
				while (bson_iter_next(&rule)) {
					const char *rk = bson_iter_key(&rule);
					bool known = strcmp(rk, "actions") == 0;
					snprintf(where, sizeof where, "policy.collections.%.200s.%s", ns, rk);
					if (known && !valid_actions(&rule, where, err, errlen))
						return SDB_EINVAL;
					for (size_t i = 0; !known && i < sizeof switches / sizeof switches[0];
					     i++)
						known = strcmp(rk, switches[i]) == 0;
					if (!known) {
						snprintf(err, errlen, "%s: unknown field", where);
						return SDB_EINVAL;
					}
				}
			}
		} else {
			snprintf(err, errlen,
				 "policy: unknown field '%.100s' (want actions, databases, collections)",
				 k);
			return SDB_EINVAL;
		}
	}
	return 0;
}

auth_policy *auth_policy_build(const bson_t *tenants, const bson_t *dbs)
{
	auth_policy *pol = sdb_calloc(1, sizeof *pol);
	bson_iter_t it, arr, d, f;

	if (tenants && bson_iter_init_find(&it, tenants, "tenants") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &arr)) {
		while (bson_iter_next(&arr)) {
			const char *name;
			if (!BSON_ITER_HOLDS_DOCUMENT(&arr) || !bson_iter_recurse(&arr, &d))
				continue;
			f = d;
			if (!bson_iter_find(&f, "name") || !BSON_ITER_HOLDS_UTF8(&f))
				continue;
			name = bson_iter_utf8(&f, NULL);
			if (!name[0] || find_tenant(pol, name))
				continue;
			pol->t = sdb_realloc(pol->t, (pol->n + 1) * sizeof *pol->t);
			tenant *t = &pol->t[pol->n++];
			memset(t, 0, sizeof *t);
			t->name = sdb_strdup(name);
			t->actions = AUTH_ACT_ALL;
			f = d;
			if (bson_iter_find(&f, "policy") && BSON_ITER_HOLDS_DOCUMENT(&f)) {
				uint32_t len;
				const uint8_t *data;
				bson_t doc;
				char err[256];
				bson_iter_document(&f, &len, &data);
				/* fail closed: a policy that does not validate (stored by an
				 * older version, or corrupt) grants nothing */
				if (!bson_init_static(&doc, data, len) ||
				    auth_policy_validate(&doc, err, sizeof err) != 0)
					t->actions = 0;
				else if (bson_iter_recurse(&f, &d))
					load_policy(t, &d);
			}
		}
	}
	if (dbs) {
		const char *name, *owner;
		sdb_dblist l;
		tenant *t;
		sdb_dblist_init(&l, dbs);
		while (sdb_dblist_next(&l, "tenant", &name, &owner))
			if (name && name[0] && owner && (t = find_tenant(pol, owner)))
				add_db(t, name);
	}
	for (size_t i = 0; i < pol->n; i++)
		if (pol->t[i].n_dbs > 1)
			sdb_qsort(pol->t[i].dbs, pol->t[i].n_dbs, sizeof(char *), cmp_str);
	return pol;
}

void auth_policy_free(auth_policy *pol)
{
	if (!pol)
		return;
	for (size_t i = 0; i < pol->n; i++) {
		tenant *t = &pol->t[i];
		for (size_t j = 0; j < t->n_dbs; j++)
			free(t->dbs[j]);
		for (size_t j = 0; j < t->n_rules; j++)
			free(t->rules[j].ns);
		free(t->dbs);
		free(t->rules);
		free(t->name);
	}
	free(pol->t);
	free(pol);
}

bool auth_policy_has_tenant(const auth_policy *pol, const char *tenant_name)
{
	return pol && tenant_name && find_tenant(pol, tenant_name) != NULL;
}

bool auth_policy_allowed(const auth_policy *pol, const char *tenant_name, const char *db,
			 const char *coll, unsigned action)
{
	tenant *t;
	unsigned mask;
	bool owned = false;

	if (!pol || !tenant_name || !db || !db[0] || action == 0 || (action & ~AUTH_ACT_ALL))
		return false;
	t = find_tenant(pol, tenant_name);
	if (!t)
		return false;
	for (size_t i = 0; i < t->n_dbs && !owned; i++)
		owned = strcmp(t->dbs[i], db) == 0;
	if (!owned)
		return false;
	mask = t->actions;
	if (coll) {
		size_t dl = strlen(db);
		for (size_t i = 0; i < t->n_rules; i++) {
			const char *ns = t->rules[i].ns;
			if (strncmp(ns, db, dl) == 0 && ns[dl] == '.' && strcmp(ns + dl + 1, coll) == 0) {
				mask = t->rules[i].actions;
				break;
			}
		}
	}
	return (mask & action) == action;
}

void auth_policy_each_db(const auth_policy *pol, const char *tenant_name,
			 void (*fn)(void *arg, const char *db), void *arg)
{
	tenant *t = pol && tenant_name ? find_tenant(pol, tenant_name) : NULL;
	if (!t)
		return;
	for (size_t i = 0; i < t->n_dbs; i++)
		fn(arg, t->dbs[i]);
}
