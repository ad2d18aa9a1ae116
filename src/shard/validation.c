/* Document validation on the shard and collMod (see validation.h). */
#include "shard/validation.h"
#include "storage/collation.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "shard/util.h"

#define DOC_VALIDATION_FAILURE 121

int shard_valid_check_opt(const bson_iter_t *it, const char *cmd, const char *db,
			  const char *coll, char *err, size_t errlen)
{
	const char *k = bson_iter_key(it);

	if (strcmp(k, "validator") == 0) {
		bson_t v;
		uint32_t len;
		const uint8_t *data;
		sdb_validator *val = NULL;
		int code = 2;
		if (!BSON_ITER_HOLDS_DOCUMENT(it)) {
			snprintf(err, errlen,
				 "BSON field '%s.validator' is the wrong type '%s', expected type "
				 "'object'",
				 cmd, util_type_name(bson_iter_type(it)));
			return WIRE_ERR_TYPE_MISMATCH;
		}
		bson_iter_document(it, &len, &data);
		if (!bson_init_static(&v, data, len))
			return WIRE_ERR_BAD_VALUE;
		/* mongod's parseValidator (collection_impl.cpp): none on system collections nor
		 * in the internal databases; {} (no validator) is allowed everywhere */
		if (!bson_empty(&v) && coll && strncmp(coll, "system.", 7) == 0) {
			snprintf(err, errlen,
				 "Document validators not allowed on system collection %s.%s",
				 db ? db : "", coll);
			return WIRE_ERR_INVALID_OPTIONS;
		}
		if (!bson_empty(&v) && db &&
		    (strcmp(db, "admin") == 0 || strcmp(db, "local") == 0 ||
		     strcmp(db, "config") == 0)) {
			snprintf(err, errlen,
				 "Document validators are not allowed on collections in the %s "
				 "database",
				 db);
			return WIRE_ERR_INVALID_OPTIONS;
		}
		if (sdb_validator_new(&v, &val, &code, err, errlen) != 0)
			return code ? code : WIRE_ERR_BAD_VALUE;
		sdb_validator_free(val);
		return 0;
	}
	if (strcmp(k, "validationLevel") == 0 || strcmp(k, "validationAction") == 0) {
		bool level = k[10] == 'L';
		if (!BSON_ITER_HOLDS_UTF8(it)) {
			snprintf(err, errlen,
				 "BSON field '%s.%s' is the wrong type '%s', expected type 'string'",
				 cmd, k, util_type_name(bson_iter_type(it)));
			return WIRE_ERR_TYPE_MISMATCH;
		}
		const char *s = bson_iter_utf8(it, NULL);
		bool ok = level ? (strcmp(s, "off") == 0 || strcmp(s, "strict") == 0 ||
				   strcmp(s, "moderate") == 0)
				: (strcmp(s, "error") == 0 || strcmp(s, "warn") == 0);
		if (!ok) {
			snprintf(err, errlen,
				 "Enumeration value '%s' for field '%s.%s' is not a valid value.", s,
				 cmd, k);
			return WIRE_ERR_BAD_VALUE;
		}
		return 0;
	}
	return 0;
}

/* ------------------------------------------------------------------ validator cache */

#define VCACHE_SLOTS 64

/* A compiled validator shared by the writes of one collection (sdb_validator is immutable
 * and may be checked from several threads at once). */
struct shard_vcache_ent {
	uint8_t uuid[16];
	uint8_t *bytes; /* the validator document (NULL: free slot) */
	uint32_t len;
	sdb_validator *v;
	int refs;	/* shard_valid holding it; freed when evicted at 0 */
	uint64_t used; /* last use (for eviction) */
};

static pthread_mutex_t vcache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct shard_vcache_ent vcache[VCACHE_SLOTS];
static uint64_t vcache_clock;

static struct shard_vcache_ent *vcache_get(const uint8_t uuid[16], const bson_t *val)
{
	struct shard_vcache_ent *e = NULL;
	const uint8_t *data = bson_get_data(val);

	pthread_mutex_lock(&vcache_mu);
	for (size_t i = 0; i < VCACHE_SLOTS; i++) {
		struct shard_vcache_ent *c = &vcache[i];
		if (c->bytes && c->len == val->len && memcmp(c->uuid, uuid, 16) == 0 &&
		    memcmp(c->bytes, data, val->len) == 0) {
			e = c;
			break;
		}
	}
	if (e) {
		e->refs++;
		e->used = ++vcache_clock;
	}
	pthread_mutex_unlock(&vcache_mu);
	return e;
}

/* Put v (compiled from val) in the cache; returns its entry (one reference taken) or NULL
 * when every slot is in use (the caller then owns v alone). */
static struct shard_vcache_ent *vcache_put(const uint8_t uuid[16], const bson_t *val,
					   sdb_validator *v)
{
	struct shard_vcache_ent *victim = NULL;
	sdb_validator *old = NULL;
	uint8_t *old_bytes = NULL;

	pthread_mutex_lock(&vcache_mu);
	for (size_t i = 0; i < VCACHE_SLOTS; i++) {
		struct shard_vcache_ent *c = &vcache[i];
		if (c->refs == 0 &&
		    (!victim || !c->bytes || (victim->bytes && c->used < victim->used)))
			victim = c;
	}
	if (victim) {
		old = victim->v;
		old_bytes = victim->bytes;
		memcpy(victim->uuid, uuid, 16);
		victim->bytes = sdb_malloc(val->len);
		memcpy(victim->bytes, bson_get_data(val), val->len);
		victim->len = val->len;
		victim->v = v;
		victim->refs = 1;
		victim->used = ++vcache_clock;
	}
	pthread_mutex_unlock(&vcache_mu);
	sdb_validator_free(old);
	free(old_bytes);
	return victim;
}

static void vcache_release(struct shard_vcache_ent *e)
{
	pthread_mutex_lock(&vcache_mu);
	e->refs--;
	pthread_mutex_unlock(&vcache_mu);
}

bool shard_valid_open(shard_ctx *x, const char *coll, shard_valid *sv)
{
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	bson_t v;
	uint32_t len;
	const uint8_t *data;
	int code = 0;

	memset(sv, 0, sizeof *sv);
	snprintf(sv->ns, sizeof sv->ns, "%s.%s", x->db, coll);
	/* a migration's writes copy documents the source accepted (mongod's chunk migration
	 * bypasses validation too) */
	if (x->origin)
		return true;
	if (bson_iter_init_find(&it, x->cmd, "bypassDocumentValidation") &&
	    bson_iter_as_bool(&it))
		return true;
	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0 || !co)
		return true;
	if (bson_iter_init_find(&it, co->options, "collation") &&
	    sdb_collation_parse(&it, &sv->coll, &code, x->err, sizeof x->err) != 0)
		sv->coll = NULL; /* checked by create: cannot happen */
	if (bson_iter_init_find(&it, co->options, "validationLevel") &&
	    BSON_ITER_HOLDS_UTF8(&it)) {
		const char *l = bson_iter_utf8(&it, NULL);
		if (strcmp(l, "off") == 0)
			return true;
		sv->moderate = strcmp(l, "moderate") == 0;
	}
	if (bson_iter_init_find(&it, co->options, "validationAction") &&
	    BSON_ITER_HOLDS_UTF8(&it))
		sv->warn = strcmp(bson_iter_utf8(&it, NULL), "warn") == 0;
	if (!bson_iter_init_find(&it, co->options, "validator") ||
	    !BSON_ITER_HOLDS_DOCUMENT(&it))
		return true;
	bson_iter_document(&it, &len, &data);
	if (!bson_init_static(&v, data, len) || bson_empty(&v))
		return true;
	if ((sv->ent = vcache_get(co->uuid, &v)) != NULL) {
		sv->v = sv->ent->v;
		return true;
	}
	if (sdb_validator_new(&v, &sv->v, &code, x->err, sizeof x->err) != 0) {
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return false;
	}
	sv->ent = vcache_put(co->uuid, &v, sv->v);
	return true;
}

static int valid_doc(shard_ctx *x, const shard_valid *sv, const bson_t *old, const bson_t *doc);

int shard_valid_doc(shard_ctx *x, const shard_valid *sv, const bson_t *old, const bson_t *doc)
{
	/* the validator compares under the collection's default collation, whatever the
	 * write's own (mongod's validator is parsed with the collection's collator) */
	const sdb_collator *prev = sdb_collation_use(sv->coll);
	int rc = valid_doc(x, sv, old, doc);

	sdb_collation_use(prev);
	return rc;
}

static int valid_doc(shard_ctx *x, const shard_valid *sv, const bson_t *old, const bson_t *doc)
{
	bson_t details;
	int code = 0, rc;

	if (!sv->v)
		return 0;
	/* moderate: an update of a document that did not satisfy the validator is allowed; one
	 * whose evaluation throws counts as not satisfying it (mongod 6.0's checkValidation
	 * catches the exception) */
	if (old && sv->moderate) {
		rc = sdb_validator_check(sv->v, old, NULL, &code, x->err, sizeof x->err);
		if (rc == SDB_ETOOBIG)
			return code ? code : WIRE_ERR_BAD_VALUE;
		if (rc <= 0)
			return 0;
	}
	rc = sdb_validator_check(sv->v, doc, &details, &code, x->err, sizeof x->err);
	if (rc == 1)
		return 0;
	if (rc == SDB_ETOOBIG) /* a regex's match limit: an error of the write, never a pass */
		return code ? code : WIRE_ERR_BAD_VALUE;
	if (rc < 0) {
		/* mongod 6.0 (collection_impl.cpp checkValidation) catches an exception of the
		 * validator's evaluation and fails the document with 121 (warn: logs it and
		 * writes it); the details say why, as doc_validation_error's "failed to
		 * evaluate aggregation expression" with the error */
		bson_t d;
		bson_init(&details);
		BSON_APPEND_UTF8(&details, "operatorName", "$expr");
		BSON_APPEND_UTF8(&details, "reason", "failed to evaluate aggregation expression");
		BSON_APPEND_DOCUMENT_BEGIN(&details, "details", &d);
		BSON_APPEND_INT32(&d, "code", code ? code : WIRE_ERR_BAD_VALUE);
		BSON_APPEND_UTF8(&d, "errmsg", x->err);
		bson_append_document_end(&details, &d);
	}
	bson_t *info = bson_new();
	bson_iter_t id;
	if (bson_iter_init_find(&id, doc, "_id"))
		bson_append_iter(info, "failingDocumentId", -1, &id);
	BSON_APPEND_DOCUMENT(info, "details", &details);
	bson_destroy(&details);
	if (info->len > SHARD_VALID_INFO_MAX) {
		bson_t *t = shard_valid_info_truncated(info);
		bson_destroy(info);
		info = t;
	}
	if (sv->warn) {
		char *js = bson_as_relaxed_extended_json(info, NULL);
		sdb_log(SDB_LOG_WARN, "Document would fail validation", "ns=%s errInfo=%s", sv->ns,
			js ? js : "");
		bson_free(js);
		bson_destroy(info);
		return 0;
	}
	if (x->err_info)
		bson_destroy(x->err_info);
	x->err_info = info;
	snprintf(x->err, sizeof x->err, "Document failed validation");
	return DOC_VALIDATION_FAILURE;
}

bson_t *shard_valid_info_truncated(const bson_t *info)
{
	bson_t *t = bson_new(), d;
	bson_iter_t it, op;

	if (bson_iter_init_find(&it, info, "failingDocumentId"))
		bson_append_iter(t, "failingDocumentId", -1, &it);
	BSON_APPEND_DOCUMENT_BEGIN(t, "details", &d);
	if (bson_iter_init_find(&it, info, "details") && BSON_ITER_HOLDS_DOCUMENT(&it) &&
	    bson_iter_recurse(&it, &op) && bson_iter_find(&op, "operatorName"))
		bson_append_iter(&d, "operatorName", -1, &op);
	BSON_APPEND_UTF8(&d, "reason", "details omitted: the error would be too large");
	bson_append_document_end(t, &d);
	return t;
}

void shard_valid_close(shard_valid *sv)
{
	if (sv->ent)
		vcache_release(sv->ent);
	else
		sdb_validator_free(sv->v);
	sv->ent = NULL;
	sv->v = NULL;
}

/* ------------------------------------------------------------------ collMod */

/* The fields collMod knows (MongoDB 6.0 coll_mod.idl) that stripedb does not implement. */
static const char *const coll_mod_unsupported[] = {
	"recordPreImages", "changeStreamPreAndPostImages", "expireAfterSeconds", "timeseries",
	"dryRun",	   "cappedSize",		   "cappedMax",		 "collectionUUID",
	"isTimeseriesNamespace",
};

static const char *const generic_args[] = {
	"writeConcern", "lsid",	      "txnNumber", "autocommit",	   "startTransaction",
	"comment",	"maxTimeMS",  "apiVersion", "apiStrict", "apiDeprecationErrors",
	"readConcern",	"flags",      NULL};

/* The index a collMod's index option names (by name or keyPattern). Returns it, or NULL
 * after filling err/code. */
static const sdb_store_index *coll_mod_index(const sdb_store_coll *co, const bson_t *ix,
					     const char *ns, int *code, char *err, size_t errlen)
{
	bson_iter_t it;
	const sdb_store_index *found = NULL;

	if (bson_iter_init_find(&it, ix, "name")) {
		const char *name = bson_iter_utf8(&it, NULL);
		for (size_t i = 0; i < co->n_indexes; i++)
			if (strcmp(co->indexes[i].name, name) == 0)
				found = &co->indexes[i];
		if (!found) {
			*code = WIRE_ERR_INDEX_NOT_FOUND;
			snprintf(err, errlen, "cannot find index %s for ns %s", name, ns);
		}
		return found;
	}
	bson_iter_init_find(&it, ix, "keyPattern");
	bson_t kp;
	uint32_t len;
	const uint8_t *data;
	bson_iter_document(&it, &len, &data);
	bson_init_static(&kp, data, len);
	size_t n = 0;
	for (size_t i = 0; i < co->n_indexes; i++)
		if (bson_equal(co->indexes[i].key, &kp)) {
			found = &co->indexes[i];
			n++;
		}
	if (n > 1) {
		*code = WIRE_ERR_BAD_VALUE;
		snprintf(err, errlen, "index keyPattern matches %zu indexes, must use index name",
			 n);
		return NULL;
	}
	if (!found) {
		char *js = bson_as_relaxed_extended_json(&kp, NULL);
		*code = WIRE_ERR_INDEX_NOT_FOUND;
		snprintf(err, errlen, "cannot find index %s for ns %s", js ? js : "", ns);
		bson_free(js);
	}
	return found;
}

void shard_cmd_coll_mod(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	const sdb_store_coll *co = NULL;
	bson_iter_t it;
	bool is_view;
	bool have_index = false, have_opts = false;
	bson_t index_opt, newopts, newspec = BSON_INITIALIZER, oplog_o, *reply = NULL;
	const sdb_store_index *ix = NULL;
	char ns[300];
	int code = 0, rc;

	if (!coll)
		return;
	snprintf(ns, sizeof ns, "%s.%s", x->db, coll);
	/* syntax first, as the IDL parser */
	bson_iter_init(&it, x->cmd);
	bson_iter_next(&it);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool generic = k[0] == '$';
		for (size_t i = 0; !generic && generic_args[i]; i++)
			generic = strcmp(generic_args[i], k) == 0;
		if (generic)
			continue;
		for (size_t i = 0; i < sizeof coll_mod_unsupported / sizeof coll_mod_unsupported[0];
		     i++)
			if (strcmp(coll_mod_unsupported[i], k) == 0) {
				shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
					   "collMod option '%s' is not supported by stripedb (see "
					   "docs/compat.md)",
					   k);
				return;
			}
		if (strcmp(k, "validator") == 0 || strcmp(k, "validationLevel") == 0 ||
		    strcmp(k, "validationAction") == 0) {
			if ((code = shard_valid_check_opt(&it, "collMod", x->db, coll, x->err,
							 sizeof x->err)) !=
			    0) {
				shard_fail(x, code, "%s", x->err);
				return;
			}
		} else if (strcmp(k, "index") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field 'collMod.index' is the wrong type '%s', "
					   "expected type 'object'",
					   util_type_name(bson_iter_type(&it)));
				return;
			}
		} else if (strcmp(k, "viewOn") == 0) {
			if (!BSON_ITER_HOLDS_UTF8(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field 'collMod.viewOn' is the wrong type '%s', "
					   "expected type 'string'",
					   util_type_name(bson_iter_type(&it)));
				return;
			}
		} else if (strcmp(k, "pipeline") == 0) {
			if (!BSON_ITER_HOLDS_ARRAY(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "BSON field 'collMod.pipeline' is the wrong type '%s', "
					   "expected type 'array'",
					   util_type_name(bson_iter_type(&it)));
				return;
			}
		} else {
			shard_fail(x, 40415, "BSON field 'collMod.%s' is an unknown field.", k);
			return;
		}
	}
	if (!shard_begin(x, true))
		return;
	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0 || !co) {
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "ns does not exist: %s", ns);
		return;
	}
	is_view = bson_iter_init_find(&it, co->options, "viewOn");
	bson_init(&newopts);
	bson_init(&oplog_o);
	bson_init(&index_opt);
	BSON_APPEND_UTF8(&oplog_o, "collMod", coll);
	/* the new options: the old ones with the changed fields replaced */
	bson_iter_init(&it, co->options);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bson_iter_t c;
		if (bson_iter_init_find(&c, x->cmd, k) &&
		    (strcmp(k, "validator") == 0 || strcmp(k, "validationLevel") == 0 ||
		     strcmp(k, "validationAction") == 0 || strcmp(k, "viewOn") == 0 ||
		     strcmp(k, "pipeline") == 0))
			continue;
		bson_append_iter(&newopts, k, -1, &it);
	}
	bson_iter_init(&it, x->cmd);
	bson_iter_next(&it);
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		if (strcmp(k, "validator") == 0 || strcmp(k, "validationLevel") == 0 ||
		    strcmp(k, "validationAction") == 0) {
			if (is_view) {
				code = WIRE_ERR_INVALID_OPTIONS;
				snprintf(x->err, sizeof x->err, "option not supported on a view: %s",
					 k);
				goto fail;
			}
		} else if (strcmp(k, "viewOn") == 0 || strcmp(k, "pipeline") == 0) {
			if (!is_view) {
				code = WIRE_ERR_INVALID_OPTIONS;
				snprintf(x->err, sizeof x->err, "'%s' option only supported on a view",
					 k);
				goto fail;
			}
		} else if (strcmp(k, "index") == 0) {
			if (is_view) {
				code = WIRE_ERR_INVALID_OPTIONS;
				snprintf(x->err, sizeof x->err, "option not supported on a view: %s",
					 k);
				goto fail;
			}
			bson_destroy(&index_opt);
			util_iter_copy(&it, &index_opt);
			have_index = true;
			continue; /* added to the oplog entry below (hidden may be dropped) */
		} else {
			continue; /* generic arguments stay out of the oplog entry */
		}
		bson_append_iter(&newopts, k, -1, &it);
		bson_append_iter(&oplog_o, k, -1, &it);
		have_opts = true;
	}
	reply = bson_new();
	if (have_index) {
		bson_iter_t f, name, kp, exp, hid;
		bson_iter_init(&f, &index_opt);
		while (bson_iter_next(&f)) {
			const char *k = bson_iter_key(&f);
			if (strcmp(k, "name") != 0 && strcmp(k, "keyPattern") != 0 &&
			    strcmp(k, "expireAfterSeconds") != 0 && strcmp(k, "hidden") != 0) {
				code = 40415;
				snprintf(x->err, sizeof x->err,
					 "BSON field 'collMod.index.%s' is an unknown field.", k);
				goto fail;
			}
		}
		bool hn = bson_iter_init_find(&name, &index_opt, "name");
		bool hk = bson_iter_init_find(&kp, &index_opt, "keyPattern");
		bool he = bson_iter_init_find(&exp, &index_opt, "expireAfterSeconds");
		bool hh = bson_iter_init_find(&hid, &index_opt, "hidden");
		code = WIRE_ERR_INVALID_OPTIONS;
		if (hn && hk) {
			snprintf(x->err, sizeof x->err, "Cannot specify both key pattern and name.");
			goto fail;
		}
		if (!hn && !hk) {
			snprintf(x->err, sizeof x->err,
				 "Must specify either index name or key pattern.");
			goto fail;
		}
		if (hn && !BSON_ITER_HOLDS_UTF8(&name)) {
			snprintf(x->err, sizeof x->err, "Index name must be a string.");
			goto fail;
		}
		if (hk && !BSON_ITER_HOLDS_DOCUMENT(&kp)) {
			snprintf(x->err, sizeof x->err, "Key pattern must be an object.");
			goto fail;
		}
		if (!he && !hh) {
			snprintf(x->err, sizeof x->err,
				 "no expireAfterSeconds or hidden field");
			goto fail;
		}
		if (he && !BSON_ITER_HOLDS_NUMBER(&exp)) {
			snprintf(x->err, sizeof x->err, "expireAfterSeconds field must be a number");
			goto fail;
		}
		if (hh && !BSON_ITER_HOLDS_BOOL(&hid)) {
			snprintf(x->err, sizeof x->err, "hidden field must be a boolean");
			goto fail;
		}
		bool is_id = (hn && strcmp(bson_iter_utf8(&name, NULL), "_id_") == 0);
		if (hk && !is_id) {
			bson_t k;
			uint32_t len;
			const uint8_t *data;
			bson_iter_t one;
			bson_iter_document(&kp, &len, &data);
			bson_init_static(&k, data, len);
			is_id = bson_count_keys(&k) == 1 && bson_iter_init_find(&one, &k, "_id");
		}
		if (is_id) {
			if (hh) {
				code = WIRE_ERR_BAD_VALUE;
				snprintf(x->err, sizeof x->err, "can't hide _id index");
				goto fail;
			}
			snprintf(x->err, sizeof x->err, "no expireAfterSeconds field to update");
			goto fail;
		}
		ix = coll_mod_index(co, &index_opt, ns, &code, x->err, sizeof x->err);
		if (!ix)
			goto fail;
		bson_iter_t old_exp;
		bool had_exp = bson_iter_init_find(&old_exp, ix->spec, "expireAfterSeconds");
		if (he) {
			double v = bson_iter_as_double(&exp);
			if (!had_exp) {
				snprintf(x->err, sizeof x->err, "no expireAfterSeconds field to update");
				goto fail;
			}
			if (v != v || v < 0 || v > 2147483647.0) {
				code = WIRE_ERR_INVALID_OPTIONS;
				snprintf(x->err, sizeof x->err,
					 "TTL index 'expireAfterSeconds' option must be within an "
					 "acceptable range, try a lower number");
				goto fail;
			}
		}
		/* the new spec, and the reply's old/new values (coll_mod.cpp) */
		bson_iter_t s;
		bson_iter_init(&s, ix->spec);
		while (bson_iter_next(&s)) {
			const char *k = bson_iter_key(&s);
			if ((he && strcmp(k, "expireAfterSeconds") == 0) ||
			    (hh && strcmp(k, "hidden") == 0))
				continue;
			bson_append_iter(&newspec, k, -1, &s);
		}
		bson_t oplog_ix;
		BSON_APPEND_DOCUMENT_BEGIN(&oplog_o, "index", &oplog_ix);
		if (hn)
			bson_append_iter(&oplog_ix, "name", -1, &name);
		else
			bson_append_iter(&oplog_ix, "keyPattern", -1, &kp);
		if (he) {
			BSON_APPEND_INT64(&newspec, "expireAfterSeconds",
					  (int64_t)bson_iter_as_double(&exp));
			bson_append_iter(reply, "expireAfterSeconds_old", -1, &old_exp);
			BSON_APPEND_INT64(reply, "expireAfterSeconds_new",
					  (int64_t)bson_iter_as_double(&exp));
			bson_append_iter(&oplog_ix, "expireAfterSeconds", -1, &exp);
		}
		if (hh) {
			bool nh = bson_iter_bool(&hid);
			if (nh)
				BSON_APPEND_BOOL(&newspec, "hidden", true);
			if (nh != ix->hidden) {
				BSON_APPEND_BOOL(reply, "hidden_old", ix->hidden);
				BSON_APPEND_BOOL(reply, "hidden_new", nh);
				BSON_APPEND_BOOL(&oplog_ix, "hidden", nh);
			}
		}
		bson_append_document_end(&oplog_o, &oplog_ix);
	}
	code = 0;
	char ixname[256];
	if (ix)
		snprintf(ixname, sizeof ixname, "%s", ix->name);
	rc = sdb_store_coll_mod(x->conn, x->db, coll, have_opts ? &newopts : NULL,
				ix ? ixname : NULL, ix ? &newspec : NULL, &oplog_o, x->origin,
				x->err, sizeof x->err);
	bson_destroy(&newspec);
	if (rc) {
		code = WIRE_ERR_INTERNAL;
		goto fail;
	}
	bson_destroy(&newopts);
	bson_destroy(&oplog_o);
	bson_destroy(&index_opt);
	if (shard_commit(x))
		wire_req_reply(x->req, reply);
	else
		bson_destroy(reply);
	return;
fail:
	bson_destroy(&newspec);
	if (reply)
		bson_destroy(reply);
	bson_destroy(&newopts);
	bson_destroy(&oplog_o);
	bson_destroy(&index_opt);
	shard_fail(x, code, "%s", x->err);
}
