/* Catalog and administration commands of the shard role: create, drop, createIndexes,
 * dropIndexes, listIndexes, listCollections, listDatabases, dropDatabase, collStats,
 * dbStats, renameCollection, and the stripedb extensions stripedbSetVersion and stripedbCheck. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/err.h"
#include "common/renamecoll.h"
#include "shard/cmd_read_int.h" /* shard_coll_is_view */
#include "shard/shard.h"
#include "storage/collation.h"
#include "shard/util.h"
#include "shard/validation.h"
#include "storage/matcher.h"

static void append_uuid(bson_t *b, const char *key, const uint8_t *uuid)
{
	bson_append_binary(b, key, -1, BSON_SUBTYPE_UUID, uuid, 16);
}

static void id_index_spec(bson_t *out)
{
	bson_t key;
	bson_init(out);
	BSON_APPEND_INT32(out, "v", 2);
	BSON_APPEND_DOCUMENT_BEGIN(out, "key", &key);
	BSON_APPEND_INT32(&key, "_id", 1);
	bson_append_document_end(out, &key);
	BSON_APPEND_UTF8(out, "name", "_id_");
}

/* The end of a write command whose last store call returned rc (message in x->err): when
 * it failed, replies InternalError; else commits (shard_commit replies when that fails).
 * Returns a new reply document for the caller to fill and send with wire_req_reply when all
 * succeeded, else NULL. */
static bson_t *write_reply(shard_ctx *x, int rc)
{
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return NULL;
	}
	return shard_commit(x) ? bson_new() : NULL;
}

/* The collection x->cmd names (shard_coll_arg) in a new read transaction, with its catalog
 * entry in *co. When there is no such collection, replies NamespaceNotFound with missing
 * (a printf format taking the database and the collection name, both strings). Returns the
 * collection name, or NULL after a reply. */
static const char *coll_read(shard_ctx *x, const char *missing, const sdb_store_coll **co)
{
	const char *coll = shard_coll_arg(x);
	if (!coll || !shard_begin(x, false))
		return NULL;
	*co = NULL;
	if (sdb_store_coll_get(x->conn, x->db, coll, co, NULL, 0) != 0) {
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, missing, x->db, coll);
		return NULL;
	}
	return coll;
}

/* The create options (MongoDB 6.0 commands.idl `create`) stripedb does not honour: the
 * feature's name for a refusal (238 NotImplemented), "" for a field create does not know
 * at all (40415), NULL for one that is honoured (viewOn, pipeline, collation, validator,
 * validationLevel, validationAction: shard/validation.h) or a generic
 * argument. Accepting and dropping any of them would leave the collection without what
 * the application asked for (a validator that is not enforced, a TTL that never expires).
 */
static const char *create_option_refused(const char *k, const bson_iter_t *it)
{
	static const struct {
		const char *field, *feature;
	} refused[] = {
		{"capped", "capped collections"},
		{"size", "capped collections"},
		{"max", "capped collections"},
		{"timeseries", "time series collections"},
		{"expireAfterSeconds", "clustered collections with a TTL"},
		{"clusteredIndex", "clustered collections"},
		{"changeStreamPreAndPostImages", "change stream pre- and post-images"},
		{"recordPreImages", "change stream pre-images"},
		{"encryptedFields", "queryable encryption"},
		{"storageEngine", "storage engine options"},
		{"indexOptionDefaults", "index option defaults"},
		{"idIndex", "a custom _id index"},
		{"autoIndexId", "collections without an _id index"},
	};
	static const char *const honoured[] = {
		"viewOn", "pipeline", "collation", "validator", "validationLevel",
		"validationAction", "writeConcern", "lsid", "txnNumber", "autocommit",
		"startTransaction", "comment", "maxTimeMS", "apiVersion", "apiStrict",
		"apiDeprecationErrors", "readConcern", "flags", NULL};

	if (k[0] == '$')
		return NULL; /* $db, $readPreference, $clusterTime, stripedb's own */
	/* false/absent forms of a refused feature change nothing: capped: false, autoIndexId:
	 * true */
	if ((strcmp(k, "capped") == 0 && !bson_iter_as_bool(it)) ||
	    (strcmp(k, "autoIndexId") == 0 && bson_iter_as_bool(it)))
		return NULL;
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
		if (strcmp(refused[i].field, k) == 0)
			return refused[i].feature;
	for (size_t i = 0; honoured[i] != NULL; i++)
		if (strcmp(honoured[i], k) == 0)
			return NULL;
	return "";
}

void shard_cmd_create(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	bson_t opts = BSON_INITIALIZER;
	bson_iter_t it;
	if (bson_iter_init(&it, x->cmd)) {
		bson_iter_next(&it); /* create */
		while (bson_iter_next(&it)) {
			const char *k = bson_iter_key(&it);
			const char *refused = create_option_refused(k, &it);
			if (refused != NULL) {
				bson_destroy(&opts);
				if (strcmp(refused, "") == 0)
					shard_fail(x, 40415,
						   "BSON field 'create.%s' is an unknown field.", k);
				else
					shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
						   "BSON field 'create.%s' asks for %s, which "
						   "stripedb does not support (see "
						   "docs/compat.md)",
						   k, refused);
				return;
			}
			/* kept in the catalog: its document validation (checked here,
			 * enforced by the writes) */
			if (strcmp(k, "validator") == 0 || strcmp(k, "validationLevel") == 0 ||
			    strcmp(k, "validationAction") == 0) {
				int vc = shard_valid_check_opt(&it, "create", x->db,
							       coll, x->err,
							       sizeof x->err);
				if (vc != 0) {
					bson_destroy(&opts);
					shard_fail(x, vc, "%s", x->err);
					return;
				}
			}
			/* kept in the catalog: what the collection is (a view) and its
			 * default collation (issue #20): MongoDB's full spec, the locale's
			 * defaults filled in; {locale: "simple"} is the default and is not
			 * kept, as MongoDB */
			if (strcmp(k, "collation") == 0) {
				const sdb_collator *c = NULL;
				int code = 0;

				if (sdb_collation_parse(&it, &c, &code, x->err, sizeof x->err) !=
				    0) {
					bson_destroy(&opts);
					shard_fail(x, code, "%s", x->err);
					return;
				}
				if (c && bson_has_field(x->cmd, "viewOn")) {
					bson_destroy(&opts);
					shard_fail(x, WIRE_ERR_NOT_IMPLEMENTED,
						   "a view with a collation is not supported by "
						   "stripedb (see docs/compat.md)");
					return;
				}
				if (c)
					BSON_APPEND_DOCUMENT(&opts, k, sdb_collator_spec(c));
			}
			if (strcmp(k, "viewOn") == 0 || strcmp(k, "pipeline") == 0 ||
			    strcmp(k, "validator") == 0 || strcmp(k, "validationLevel") == 0 ||
			    strcmp(k, "validationAction") == 0)
				bson_append_iter(&opts, k, -1, &it);
		}
	}
	/* a view has no documents of its own to validate (create.cpp, as collMod's
	 * "option not supported on a view") */
	if (bson_has_field(&opts, "viewOn") &&
	    (bson_has_field(&opts, "validator") || bson_has_field(&opts, "validationLevel") ||
	     bson_has_field(&opts, "validationAction"))) {
		bson_destroy(&opts);
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "option not supported on a view: validator, validationLevel, "
			   "validationAction");
		return;
	}
	if (!shard_begin(x, true)) {
		bson_destroy(&opts);
		return;
	}
	int rc = sdb_store_coll_create(x->conn, x->db, coll, &opts, x->origin, NULL, x->err,
				       sizeof x->err);
	bson_destroy(&opts);
	if (rc == SDB_EEXISTS) {
		shard_fail(x, WIRE_ERR_NAMESPACE_EXISTS, "Collection %s.%s already exists.", x->db,
			   coll);
		return;
	}
	if (rc == SDB_EINVAL) {
		int code = sdb_store_write_code(x->conn);
		shard_fail(x, code ? code : WIRE_ERR_INVALID_NAMESPACE, "%s", x->err);
		return;
	}
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	if (shard_commit(x))
		wire_req_reply(x->req, bson_new());
}

void shard_cmd_drop(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	if (!shard_begin(x, true))
		return;
	/* the collection's filtering metadata goes with it (issue #17): a collection sharded
	 * again under the same name starts from its new routing */
	char *fns = sdb_ns_join(x->db, coll);
	int64_t fc = 0, fs = 0, fg = 0;
	bool had_filtering =
		sdb_store_filtering_get(x->conn, fns, &fc, &fs, &fg, NULL, x->err, sizeof x->err) == 0;
	int frc = had_filtering ? sdb_store_filtering_drop(x->conn, fns, x->err, sizeof x->err) : 0;
	free(fns);
	if (frc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	const sdb_store_coll *co = NULL;
	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0) {
		if (had_filtering && shard_commit(x)) {
			/* only filtering metadata was here (a shard that owned no document) */
			bson_t *reply = bson_new();
			BSON_APPEND_INT32(reply, "nIndexesWas", 0);
			wire_req_reply(x->req, reply);
			return;
		}
		if (!had_filtering)
			shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "ns not found");
		return;
	}
	int n_idx = (int)co->n_indexes + 1;
	bson_t *reply = write_reply(
		x, sdb_store_coll_drop(x->conn, x->db, coll, x->origin, x->err, sizeof x->err));
	if (!reply)
		return;
	BSON_APPEND_INT32(reply, "nIndexesWas", n_idx);
	char *ns = sdb_ns_join(x->db, coll);
	BSON_APPEND_UTF8(reply, "ns", ns);
	free(ns);
	wire_req_reply(x->req, reply);
}

/* True when db.coll is a view (any database; inside the command's transaction). */
static bool is_view(const sdb_store_coll *co)
{
	bson_iter_t it;

	return co != NULL && bson_iter_init_find(&it, co->options, "viewOn");
}

/* Fail x with IllegalOperation when the shard has filtering metadata for ns (a sharded
 * collection: its chunks are in the metadata service, a rename here would orphan them).
 * what: "source" or "target". Returns: true when it failed x. */
static bool refuse_sharded(shard_ctx *x, const char *ns, const char *what)
{
	int64_t cv = 0, sv = 0, gen = 0;
	int rc = sdb_store_filtering_get(x->conn, ns, &cv, &sv, &gen, NULL, x->err,
					 sizeof x->err);

	if (rc == SDB_ENOTFOUND)
		return false;
	if (rc) {
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return true;
	}
	shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION,
		   "%s namespace '%s' is sharded: stripedb does not rename sharded collections "
		   "(their chunks are recorded in the metadata service)",
		   what, ns);
	return true;
}

/* Copy of doc without the fields named in skip (NULL-terminated) into out (initialised
 * here). */
static void copy_without(const bson_t *doc, const char *const *skip, bson_t *out)
{
	bson_iter_t it;
	bson_init(out);
	if (!doc || !bson_iter_init(&it, doc))
		return;
	while (bson_iter_next(&it)) {
		bool drop = false;
		for (size_t i = 0; skip[i]; i++)
			drop = drop || strcmp(bson_iter_key(&it), skip[i]) == 0;
		if (!drop)
			bson_append_iter(out, NULL, 0, &it);
	}
}

/* `$stripedbIfTargetMatches: {exists, options, indexes}` of a renameCollection (the
 * writer of $out, cmd_outmerge.c and the proxy's outmerge.c): the target's existence,
 * create options and secondary index specs when the stage started. As MongoDB 6.0's
 * internalRenameIfOptionsAndIndexesMatch (rename_collection.cpp
 * doLocalRenameIfOptionsAndIndexesHaveNotChanged), checked here in the rename's own write
 * transaction: options compared without uuid/create, indexes as a set of specs without
 * ns/v. Replies CommandFailed (125) and returns false when they changed. */
static bool target_unchanged(shard_ctx *x, const char *to_ns, const sdb_store_coll *dst)
{
	static const char *const opt_skip[] = {"uuid", "create", NULL};
	static const char *const idx_skip[] = {"ns", "v", NULL};
	bson_iter_t it, e, f;
	if (!bson_iter_init_find(&it, x->cmd, "$stripedbIfTargetMatches"))
		return true;
	if (!BSON_ITER_HOLDS_DOCUMENT(&it) || !bson_iter_recurse(&it, &e)) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "$stripedbIfTargetMatches must be an object");
		return false;
	}
	bool exists = false;
	bson_t want_opts = BSON_INITIALIZER, want_idx = BSON_INITIALIZER;
	while (bson_iter_next(&e)) {
		const char *k = bson_iter_key(&e);
		bson_t sub;
		if (strcmp(k, "exists") == 0)
			exists = bson_iter_as_bool(&e);
		else if (strcmp(k, "options") == 0 && BSON_ITER_HOLDS_DOCUMENT(&e) &&
			 util_iter_bson(&e, &sub)) {
			bson_destroy(&want_opts);
			copy_without(&sub, opt_skip, &want_opts);
		} else if (strcmp(k, "indexes") == 0 && BSON_ITER_HOLDS_ARRAY(&e)) {
			util_iter_copy(&e, &want_idx);
		}
	}
	bson_t cur_opts;
	copy_without(dst ? dst->options : NULL, opt_skip, &cur_opts);
	bool same_opts = cur_opts.len == want_opts.len &&
			 memcmp(bson_get_data(&cur_opts), bson_get_data(&want_opts), cur_opts.len) == 0;
	bool same_idx = exists == (dst != NULL);
	size_t nwant = 0;
	if (same_idx && bson_iter_init(&f, &want_idx)) {
		while (same_idx && bson_iter_next(&f)) {
			bson_t sub, norm;
			bool found = false;
			nwant++;
			if (!BSON_ITER_HOLDS_DOCUMENT(&f)) {
				same_idx = false;
				break;
			}
			if (!util_iter_bson(&f, &sub)) {
				same_idx = false;
				break;
			}
			copy_without(&sub, idx_skip, &norm);
			for (size_t i = 0; dst && i < dst->n_indexes && !found; i++) {
				bson_t have;
				copy_without(dst->indexes[i].spec, idx_skip, &have);
				found = have.len == norm.len &&
					memcmp(bson_get_data(&have), bson_get_data(&norm), have.len) == 0;
				bson_destroy(&have);
			}
			bson_destroy(&norm);
			same_idx = found;
		}
	}
	if (same_idx && dst && dst->n_indexes != nwant)
		same_idx = false;
	bool ok = same_opts && same_idx;
	if (!same_opts) {
		char *a = bson_as_relaxed_extended_json(&want_opts, NULL);
		char *b = bson_as_relaxed_extended_json(&cur_opts, NULL);
		shard_fail(x, 125, "collection options of target collection %s changed during "
			   "processing. Original options: %.400s, new options: %.400s", to_ns,
			   a ? a : "?", b ? b : "?");
		bson_free(a);
		bson_free(b);
	} else if (!same_idx) {
		shard_fail(x, 125, "indexes of target collection %s changed during processing.",
			   to_ns);
	}
	bson_destroy(&cur_opts);
	bson_destroy(&want_opts);
	bson_destroy(&want_idx);
	return ok;
}

void shard_cmd_rename_collection(shard_ctx *x)
{
	sdb_rename_args a;
	char perr[512];
	const sdb_store_coll *src = NULL, *dst = NULL;
	int code = sdb_rename_parse(x->cmd, x->db, &a, perr, sizeof perr);

	if (code != 0) {
		shard_fail(x, code, "%s", perr);
		return;
	}
	if (!shard_begin(x, true))
		return;
	/* a sharded collection first (this shard may own none of its documents) */
	if (refuse_sharded(x, a.from_ns, "source") || refuse_sharded(x, a.to_ns, "target"))
		return;
	/* then rename_collection.cpp checkSourceAndTargetNamespaces, in its order */
	if (sdb_store_coll_get(x->conn, a.from_db, a.from_coll, &src, NULL, 0) != 0) {
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "Source collection %s does not exist",
			   a.from_ns);
		return;
	}
	if (is_view(src)) {
		shard_fail(x, WIRE_ERR_COMMAND_NOT_SUPPORTED_ON_VIEW, "cannot rename view: %s",
			   a.from_ns);
		return;
	}
	bool have_dst = sdb_store_coll_get(x->conn, a.to_db, a.to_coll, &dst, NULL, 0) == 0;
	if (!target_unchanged(x, a.to_ns, have_dst ? dst : NULL))
		return;
	if (have_dst) {
		if (is_view(dst)) {
			shard_fail(x, WIRE_ERR_NAMESPACE_EXISTS,
				   "a view already exists with that name: %s", a.to_ns);
			return;
		}
		if (!a.drop_target) {
			shard_fail(x, WIRE_ERR_NAMESPACE_EXISTS, "target namespace exists");
			return;
		}
	}
	int rc = sdb_store_coll_rename(x->conn, a.from_db, a.from_coll, a.to_db, a.to_coll,
				       a.drop_target, a.stay_temp, x->origin, x->err,
				       sizeof x->err);
	if (rc == SDB_EINVAL) {
		int code = sdb_store_write_code(x->conn);
		shard_fail(x, code ? code : WIRE_ERR_INVALID_NAMESPACE, "%s", x->err);
		return;
	}
	bson_t *reply = write_reply(x, rc);
	if (reply)
		wire_req_reply(x->req, reply);
}

void shard_cmd_drop_database(shard_ctx *x)
{
	if (!shard_begin(x, true))
		return;
	int n = 0;
	int rc = sdb_store_filtering_drop_db(x->conn, x->db, x->err, sizeof x->err);
	if (rc == 0)
		rc = sdb_store_db_drop(x->conn, x->db, x->origin, &n, x->err, sizeof x->err);
	bson_t *reply = write_reply(x, rc);
	if (!reply)
		return;
	if (n > 0)
		BSON_APPEND_UTF8(reply, "dropped", x->db);
	wire_req_reply(x->req, reply);
}

/* The fields MongoDB 6.0 accepts in an index specification (index_key_validate.h
 * allowedFieldNames; `clustered` is refused there through its own rules). Their values
 * are checked by refuse_index_options below (types, and the options stripedb refuses) and
 * by sdb_store_index_create (key, name, unique, sparse, partialFilterExpression,
 * expireAfterSeconds, collation, v); docs/compat.md "Index options" lists what each does. */
static const char *const index_spec_fields[] = {
	"2dsphereIndexVersion", "_id",	   "background",	"bits",
	"bucketSize",		"coarsestIndexedLevel", "collation",	"default_language",
	"dropDups",		"expireAfterSeconds",	"finestIndexedLevel", "hidden",
	"key",			"language_override",	"max",		"min",
	"name",			"ns",			"originalSpec",	"partialFilterExpression",
	"prepareUnique",	"sparse",		"storageEngine",	"textIndexVersion",
	"unique",		"v",			"weights",	"wildcardProjection",
	NULL};

static void format_value(bson_string_t *s, const bson_iter_t *it);

/* d as MongoDB's BSONObj::toString prints it ("{ key: { u: 1 }, name: \"u_1\" }", an
 * array "[ 1, 2 ]"), for the specification quoted in an error message. */
static void format_doc(bson_string_t *s, const bson_t *d, bool array)
{
	bson_iter_t it;
	bool first = true;
	bson_string_append(s, array ? "[" : "{");
	if (bson_iter_init(&it, d)) {
		while (bson_iter_next(&it)) {
			bson_string_append(s, first ? " " : ", ");
			if (!array)
				bson_string_append_printf(s, "%s: ", bson_iter_key(&it));
			format_value(s, &it);
			first = false;
		}
	}
	bson_string_append(s, first ? (array ? "]" : "}") : (array ? " ]" : " }"));
}

static void format_value(bson_string_t *s, const bson_iter_t *it)
{
	bson_t sub;
	switch (bson_iter_type(it)) {
	case BSON_TYPE_UTF8:
		bson_string_append_printf(s, "\"%s\"", bson_iter_utf8(it, NULL));
		break;
	case BSON_TYPE_INT32:
		bson_string_append_printf(s, "%d", bson_iter_int32(it));
		break;
	case BSON_TYPE_INT64:
		bson_string_append_printf(s, "%lld", (long long)bson_iter_int64(it));
		break;
	case BSON_TYPE_DOUBLE: {
		double v = bson_iter_double(it);
		/* MongoDB prints an integral double with ".0" */
		if (v == (double)(long long)v && v > -1e15 && v < 1e15)
			bson_string_append_printf(s, "%lld.0", (long long)v);
		else
			bson_string_append_printf(s, "%.17g", v);
		break;
	}
	case BSON_TYPE_BOOL:
		bson_string_append(s, bson_iter_bool(it) ? "true" : "false");
		break;
	case BSON_TYPE_NULL:
		bson_string_append(s, "null");
		break;
	case BSON_TYPE_DOCUMENT:
	case BSON_TYPE_ARRAY:
		if (util_iter_bson(it, &sub))
			format_doc(s, &sub, bson_iter_type(it) == BSON_TYPE_ARRAY);
		else
			bson_string_append(s, "{}");
		break;
	default: {
		/* other types: their relaxed extended JSON ({"v": X} minus the wrapper) */
		bson_t one = BSON_INITIALIZER;
		bson_append_iter(&one, "v", 1, it);
		size_t len = 0;
		char *js = bson_as_relaxed_extended_json(&one, &len);
		const char *v = js ? strstr(js, ": ") : NULL;
		if (v && len >= 2) {
			v += 2;
			size_t vlen = strlen(v);
			bson_string_append_printf(s, "%.*s", (int)(vlen >= 2 ? vlen - 2 : vlen), v);
		}
		bson_free(js);
		bson_destroy(&one);
		break;
	}
	}
}

/* An index specification with a field MongoDB does not know is refused, as mongod
 * (index_key_validate.cpp validateIndexSpecFieldNames, with parseAndValidateIndexSpecs'
 * context): InvalidIndexSpecificationOption (197) "Error in specification S :: caused by
 * :: The field 'F' is not valid for an index specification. Specification: S" (issue #20:
 * {uniqe: true} made a non-unique index). Returns true after that reply. */
static bool refuse_unknown_index_field(shard_ctx *x, const bson_t *spec)
{
	bson_iter_t it;
	if (!bson_iter_init(&it, spec))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bool known = false;
		for (size_t i = 0; index_spec_fields[i] && !known; i++)
			known = strcmp(k, index_spec_fields[i]) == 0;
		if (known)
			continue;
		bson_string_t *s = bson_string_new(NULL);
		format_doc(s, spec, false);
		shard_fail(x, 197,
			   "Error in specification %s :: caused by :: The field '%s' is not valid "
			   "for an index specification. Specification: %s",
			   s->str, k, s->str);
		bson_string_free(s, true);
		return true;
	}
	return false;
}

static bool field_is(const char *k, const char *const *names)
{
	for (size_t i = 0; names[i]; i++)
		if (strcmp(k, names[i]) == 0)
			return true;
	return false;
}

/* The options of one index specification, as MongoDB 6.0's validateIndexSpec
 * (index_key_validate.cpp) checks them, and those stripedb cannot honour (issue #20:
 * nothing accepted is silently ignored; docs/compat.md "Index options"):
 *   - types: unique sparse background dropDups prepareUnique a number or a bool (14
 *     "The field 'F has value V, which is not convertible to bool"); hidden a bool;
 *     default_language language_override strings; textIndexVersion 2dsphereIndexVersion
 *     bits min max coarsestIndexedLevel finestIndexedLevel numbers; weights an object or a
 *     string; originalSpec a non-empty object (14 TypeMismatch, 2 BadValue);
 *   - v: 1 or 2 (67 "cannot create an index with v=N"), v 1 without a collation;
 *   - weights outside a text index (stripedb has none): 67; wildcardProjection outside a
 *     '$**' index (stripedb has none): 2; unique with prepareUnique: 67;
 *   - refused as not implemented (238): prepareUnique: true (new duplicate keys refused
 *     while existing ones stay) and a non-empty storageEngine (WiredTiger configuration;
 *     the shard stores on SQLite). A copy of a collection's existing indexes passes: a
 *     migration's ($stripedbOrigin) and $out's into an existing collection
 *     ($stripedbIndexCopy, sent by src/shard/cmd_outmerge.c and src/proxy/outmerge.c;
 *     the proxy refuses $stripedb* fields from clients): such a spec can only come from an
 *     earlier release that accepted it, and the copy keeps what the source has.
 * The text and geo options (default_language ... finestIndexedLevel, bucketSize) have no
 * effect on the ascending/descending/hashed indexes stripedb builds, as in mongod.
 * Returns true after the error reply. */
static bool refuse_index_options(shard_ctx *x, const bson_t *spec)
{
	static const char *const boolish[] = {"unique",	 "sparse",	  "background",
					      "dropDups", "prepareUnique", NULL};
	static const char *const strings[] = {"default_language", "language_override", NULL};
	static const char *const numbers[] = {"textIndexVersion", "2dsphereIndexVersion",
					      "bits",		  "min",
					      "max",		  "coarsestIndexedLevel",
					      "finestIndexedLevel", NULL};
	bson_iter_t it;
	bool unique = false, prepare_unique = false, collation = false;
	int version = 2;
	const char *refuse238 = NULL;

	if (!bson_iter_init(&it, spec))
		return false;
	while (bson_iter_next(&it)) {
		const char *k = bson_iter_key(&it);
		bson_type_t t = bson_iter_type(&it);
		const char *tn = sdb_bson_type_name(t);
		if (field_is(k, boolish)) {
			if (!BSON_ITER_HOLDS_NUMBER(&it) && !BSON_ITER_HOLDS_BOOL(&it)) {
				bson_string_t *v = bson_string_new(NULL);
				format_value(v, &it);
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "The field '%s has value %s: %s, which is not convertible "
					   "to bool",
					   k, k, v->str);
				bson_string_free(v, true);
				return true;
			}
			if (strcmp(k, "unique") == 0)
				unique = bson_iter_as_bool(&it);
			if (strcmp(k, "prepareUnique") == 0)
				prepare_unique = bson_iter_as_bool(&it);
		} else if (strcmp(k, "hidden") == 0 && !BSON_ITER_HOLDS_BOOL(&it)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
				   "The field 'hidden' must be a bool, but got %s", tn);
			return true;
		} else if (field_is(k, strings) && !BSON_ITER_HOLDS_UTF8(&it)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
				   "The field '%s' must be a string, but got %s", k, tn);
			return true;
		} else if (field_is(k, numbers) && !BSON_ITER_HOLDS_NUMBER(&it)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
				   "The field '%s' must be a number, but got %s", k, tn);
			return true;
		} else if (strcmp(k, "weights") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it) && !BSON_ITER_HOLDS_ARRAY(&it) &&
			    !BSON_ITER_HOLDS_UTF8(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "The field 'weights' must be an object, but got %s", tn);
				return true;
			}
			bson_string_t *sp = bson_string_new(NULL);
			format_doc(sp, spec, false);
			shard_fail(x, 67,
				   "Invalid index specification %s; the field 'weights' can only be "
				   "specified with text indexes",
				   sp->str);
			bson_string_free(sp, true);
			return true;
		} else if (strcmp(k, "wildcardProjection") == 0) {
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "The field 'wildcardProjection' is only allowed in '$**' indexes");
			return true;
		} else if (strcmp(k, "originalSpec") == 0) {
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "The field 'originalSpec' must be an object, but got %s",
					   tn);
				return true;
			}
			bson_t o;
			if (util_iter_bson(&it, &o) && bson_empty(&o)) {
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "The field 'originalSpec' cannot be an empty object.");
				return true;
			}
		} else if (strcmp(k, "v") == 0) {
			if (!BSON_ITER_HOLDS_NUMBER(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "The field 'v' must be a number, but got %s", tn);
				return true;
			}
			double d = bson_iter_as_double(&it);
			if (!(d >= -2147483648.0 && d <= 2147483647.0) || d != (double)(int)d) {
				bson_string_t *v = bson_string_new(NULL);
				format_value(v, &it);
				shard_fail(x, WIRE_ERR_BAD_VALUE,
					   "Index version must be representable as a 32-bit integer, "
					   "but got %s",
					   v->str);
				bson_string_free(v, true);
				return true;
			}
			version = (int)d;
			if (version != 1 && version != 2) {
				bson_string_t *sp = bson_string_new(NULL);
				format_doc(sp, spec, false);
				shard_fail(x, 67,
					   "Invalid index specification %s; cannot create an index "
					   "with v=%d",
					   sp->str, version);
				bson_string_free(sp, true);
				return true;
			}
		} else if (strcmp(k, "collation") == 0) {
			collation = true;
		} else if (strcmp(k, "storageEngine") == 0) {
			bson_t o;
			if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
				shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
					   "The field 'storageEngine' must be an object, but got %s",
					   tn);
				return true;
			}
			if (util_iter_bson(&it, &o) && !bson_empty(&o))
				refuse238 = "storageEngine";
		}
	}
	if (version < 2 && collation) {
		bson_string_t *sp = bson_string_new(NULL);
		format_doc(sp, spec, false);
		shard_fail(x, 67,
			   "Invalid index specification %s; cannot create an index with the "
			   "'collation' option and v=%d",
			   sp->str, version);
		bson_string_free(sp, true);
		return true;
	}
	if (unique && prepare_unique) {
		bson_string_t *sp = bson_string_new(NULL);
		format_doc(sp, spec, false);
		shard_fail(x, 67,
			   "Invalid index specification %s; cannot create an index with the "
			   "'unique' option and the 'prepareUnique' option",
			   sp->str);
		bson_string_free(sp, true);
		return true;
	}
	if (prepare_unique)
		refuse238 = "prepareUnique";
	if (refuse238 && !x->origin && !bson_has_field(x->cmd, "$stripedbIndexCopy")) {
		shard_fail(x, 238,
			   "the index option '%s' is not supported by stripedb (%s; see "
			   "docs/compat.md)",
			   refuse238,
			   strcmp(refuse238, "prepareUnique") == 0
				   ? "create the index with unique: true once the collection has no "
				     "duplicate keys"
				   : "the shard stores on SQLite: no storage engine options");
		return true;
	}
	return false;
}

void shard_cmd_create_indexes(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	bson_iter_t it, arr;
	if (!bson_iter_init_find(&it, x->cmd, "indexes") || !BSON_ITER_HOLDS_ARRAY(&it) ||
	    !bson_iter_recurse(&it, &arr)) {
		shard_fail(x, 40414,
			   "BSON field 'createIndexes.indexes' is missing but a required field");
		return;
	}
	/* every specification's field names first, before any index is built (mongod
	 * validates them all before it builds one) */
	bson_iter_t pre = arr;
	while (bson_iter_next(&pre) && BSON_ITER_HOLDS_DOCUMENT(&pre)) {
		bson_t spec;
		if (util_iter_bson(&pre, &spec) &&
		    (refuse_unknown_index_field(x, &spec) || refuse_index_options(x, &spec)))
			return;
	}
	if (!shard_begin(x, true))
		return;
	if (shard_refuse_view(x, coll))
		return;
	const sdb_store_coll *co = NULL;
	bool created_coll = sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0;
	int before = created_coll ? 1 : (int)co->n_indexes + 1;
	int created = 0;
	bool any = false;
	while (bson_iter_next(&arr)) {
		any = true;
		if (!BSON_ITER_HOLDS_DOCUMENT(&arr)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH, "index specification must be an object");
			return;
		}
		bson_t spec;
		util_iter_bson(&arr, &spec);
		bool made = false;
		int code = 0;
		int rc = sdb_store_index_create(x->conn, x->db, coll, &spec, x->origin, &made,
						&code, x->err, sizeof x->err);
		if (rc == SDB_EEXISTS && code == 0)
			continue;
		if (rc) {
			if (code == 11000)
				shard_fail(x, WIRE_ERR_DUPLICATE_KEY, "Index build failed: %s",
					   x->err);
			else
				shard_fail(x, code ? code : shard_code_of(rc), "%s", x->err);
			return;
		}
		if (made)
			created++;
	}
	if (!any) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "Must specify at least one index to create");
		return;
	}
	if (!shard_commit(x))
		return;
	bson_t *reply = bson_new();
	BSON_APPEND_INT32(reply, "numIndexesBefore", before);
	BSON_APPEND_INT32(reply, "numIndexesAfter", before + created);
	BSON_APPEND_BOOL(reply, "createdCollectionAutomatically", created_coll);
	if (created == 0)
		BSON_APPEND_UTF8(reply, "note", "all indexes already exist");
	wire_req_reply(x->req, reply);
}

void shard_cmd_drop_indexes(shard_ctx *x)
{
	const char *coll = shard_coll_arg(x);
	if (!coll)
		return;
	bson_iter_t it;
	if (!bson_iter_init_find(&it, x->cmd, "index")) {
		shard_fail(x, 40414, "BSON field 'dropIndexes.index' is missing but a required field");
		return;
	}
	if (!shard_begin(x, true))
		return;
	const sdb_store_coll *co = NULL;
	if (sdb_store_coll_get(x->conn, x->db, coll, &co, NULL, 0) != 0) {
		shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "ns not found %s.%s", x->db, coll);
		return;
	}
	int was = (int)co->n_indexes + 1;
	/* the names to drop */
	char **names = NULL;
	size_t n = 0;
	if (BSON_ITER_HOLDS_UTF8(&it) && strcmp(bson_iter_utf8(&it, NULL), "*") == 0) {
		for (size_t i = 0; i < co->n_indexes; i++) {
			names = sdb_realloc(names, (n + 1) * sizeof *names);
			names[n++] = sdb_strdup(co->indexes[i].name);
		}
	} else if (BSON_ITER_HOLDS_UTF8(&it)) {
		names = sdb_malloc(sizeof *names);
		names[n++] = sdb_strdup(bson_iter_utf8(&it, NULL));
	} else if (BSON_ITER_HOLDS_ARRAY(&it)) {
		bson_iter_t sub;
		bson_iter_recurse(&it, &sub);
		while (bson_iter_next(&sub)) {
			if (!BSON_ITER_HOLDS_UTF8(&sub))
				continue;
			names = sdb_realloc(names, (n + 1) * sizeof *names);
			names[n++] = sdb_strdup(bson_iter_utf8(&sub, NULL));
		}
	} else if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
		bson_t key;
		util_iter_bson(&it, &key);
		size_t matches = 0;
		for (size_t i = 0; i < co->n_indexes; i++) {
			if (bson_equal(co->indexes[i].key, &key)) {
				if (matches++ == 0) {
					names = sdb_malloc(sizeof *names);
					names[n++] = sdb_strdup(co->indexes[i].name);
				}
			}
		}
		if (matches > 1) {
			/* partial indexes may share a key pattern (mongod drop_indexes.cpp) */
			bson_string_t *ks = bson_string_new(NULL);
			format_doc(ks, &key, false);
			shard_fail(x, 286,
				   "%zu indexes found for key: %s, identify by name instead.",
				   matches, ks->str);
			bson_string_free(ks, true);
			free(names[0]);
			free(names);
			return;
		}
		if (n == 0) {
			char *js = bson_as_relaxed_extended_json(&key, NULL);
			shard_fail(x, WIRE_ERR_INDEX_NOT_FOUND, "can't find index with key: %s",
				   js ? js : "?");
			bson_free(js);
			return;
		}
	}
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (strcmp(names[i], "_id_") == 0) {
			shard_fail(x, 72, "cannot drop _id index");
			rc = -1;
			break;
		}
		rc = sdb_store_index_drop(x->conn, x->db, coll, names[i], x->origin, x->err,
					  sizeof x->err);
		if (rc == SDB_ENOTFOUND)
			shard_fail(x, WIRE_ERR_INDEX_NOT_FOUND, "index not found with name [%s]",
				   names[i]);
		else if (rc)
			shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc)
		return;
	if (!shard_commit(x))
		return;
	bson_t *reply = bson_new();
	BSON_APPEND_INT32(reply, "nIndexesWas", was);
	wire_req_reply(x->req, reply);
}

static void reply_listing(shard_ctx *x, const char *ns, bson_t **docs, size_t n)
{
	bson_t *reply = bson_new();
	size_t taken;
	shard_cursor_reply(reply, ns, 0, true, docs, n, 0, &taken, NULL);
	util_docs_free(docs, n);
	wire_req_reply(x->req, reply);
}

void shard_cmd_list_indexes(shard_ctx *x)
{
	const sdb_store_coll *co;
	const char *coll = coll_read(x, "ns does not exist: %s.%s", &co);
	if (!coll)
		return;
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	bson_t *idx = sdb_doc_new();
	bson_t tmp;
	id_index_spec(&tmp);
	bson_concat(idx, &tmp);
	bson_destroy(&tmp);
	util_docs_push(&docs, &n, &cap, idx);
	for (size_t i = 0; i < co->n_indexes; i++)
		util_docs_push(&docs, &n, &cap, sdb_doc_copy(co->indexes[i].spec));
	sdb_store_rollback(x->conn);
	char *ns = sdb_asprintf("%s.$cmd.listIndexes.%s", x->db, coll);
	reply_listing(x, ns, docs, n);
	free(ns);
}

/* The common start of listCollections and listDatabases: reads the command's optional
 * `filter` (a document; cmd names the command in the TypeMismatch message) and `nameOnly`
 * (any type, its truth) into *name_only, builds a matcher for the filter (no filter: one
 * that matches every document) and opens a read transaction.
 * Returns: the matcher, owned by the caller (sdb_matcher_free), with the read transaction
 * open; NULL once x has been answered with an error and no transaction is left open.
 * Errors: a filter that is not a document (util_get_doc's error); a filter the matcher
 * refuses (the matcher's code, BadValue when it gives none); shard_begin's errors. */
static sdb_matcher *listing_begin(shard_ctx *x, const char *cmd, bool *name_only)
{
	bson_iter_t it;
	bson_t filter = BSON_INITIALIZER;
	*name_only = false;
	if (bson_iter_init_find(&it, x->cmd, "filter") && !util_get_doc(x, cmd, &it, &filter)) {
		bson_destroy(&filter);
		return NULL;
	}
	if (bson_iter_init_find(&it, x->cmd, "nameOnly"))
		*name_only = bson_iter_as_bool(&it);
	sdb_matcher *m = NULL;
	int code = 0;
	if (sdb_matcher_new(&filter, &m, &code, x->err, sizeof x->err) != 0) {
		bson_destroy(&filter);
		shard_fail(x, code ? code : WIRE_ERR_BAD_VALUE, "%s", x->err);
		return NULL;
	}
	bson_destroy(&filter);
	if (!shard_begin(x, false)) {
		sdb_matcher_free(m);
		return NULL;
	}
	return m;
}

void shard_cmd_list_collections(shard_ctx *x)
{
	bool name_only;
	sdb_matcher *m = listing_begin(x, "listCollections", &name_only);
	if (!m)
		return;
	char **names = NULL;
	size_t nn = 0;
	sdb_store_coll_list(x->conn, x->db, &names, &nn, NULL, 0);
	bson_t **docs = NULL;
	size_t n = 0, cap = 0;
	for (size_t i = 0; i < nn; i++) {
		const sdb_store_coll *co = NULL;
		if (sdb_store_coll_get(x->conn, x->db, names[i * 2 + 1], &co, NULL, 0) != 0)
			continue;
		bson_t *d = sdb_doc_new();
		BSON_APPEND_UTF8(d, "name", co->coll);
		bson_iter_t vit;
		BSON_APPEND_UTF8(d, "type", bson_iter_init_find(&vit, co->options, "viewOn")
						    ? "view"
						    : "collection");
		if (!name_only) {
			BSON_APPEND_DOCUMENT(d, "options", co->options);
			bson_t info, idx;
			BSON_APPEND_DOCUMENT_BEGIN(d, "info", &info);
			BSON_APPEND_BOOL(&info, "readOnly", false);
			append_uuid(&info, "uuid", co->uuid);
			bson_append_document_end(d, &info);
			id_index_spec(&idx);
			BSON_APPEND_DOCUMENT(d, "idIndex", &idx);
			bson_destroy(&idx);
		}
		if (sdb_matcher_match(m, d))
			util_docs_push(&docs, &n, &cap, d);
		else
			sdb_doc_free(d);
	}
	sdb_store_names_free(names, nn);
	sdb_store_rollback(x->conn);
	sdb_matcher_free(m);
	char *ns = sdb_asprintf("%s.$cmd.listCollections", x->db);
	reply_listing(x, ns, docs, n);
	free(ns);
}

void shard_cmd_list_databases(shard_ctx *x)
{
	bool name_only;
	/* filter (MongoDB list_databases.cpp): a query over each database's document as the
	 * reply shows it ({name, sizeOnDisk, empty}; {name} with nameOnly), totalSize the sum
	 * over the databases it keeps */
	sdb_matcher *m = listing_begin(x, "listDatabases", &name_only);
	if (!m)
		return;
	char **names = NULL;
	size_t nn = 0;
	sdb_store_coll_list(x->conn, NULL, &names, &nn, NULL, 0);
	bson_t *reply = bson_new();
	bson_t arr;
	int64_t total = 0;
	int k = 0;
	BSON_APPEND_ARRAY_BEGIN(reply, "databases", &arr);
	for (size_t i = 0; i < nn; i++) {
		bool seen = false;
		for (size_t j = 0; j < i; j++)
			if (strcmp(names[j * 2], names[i * 2]) == 0)
				seen = true;
		if (seen)
			continue;
		int64_t size = 0;
		for (size_t j = i; j < nn; j++)
			if (strcmp(names[j * 2], names[i * 2]) == 0)
				size += sdb_store_data_size(x->conn, names[j * 2], names[j * 2 + 1]);
		char key[16];
		bson_t d = BSON_INITIALIZER;
		BSON_APPEND_UTF8(&d, "name", names[i * 2]);
		if (!name_only) {
			BSON_APPEND_INT64(&d, "sizeOnDisk", size);
			BSON_APPEND_BOOL(&d, "empty", size == 0);
		}
		if (sdb_matcher_match(m, &d)) {
			total += size;
			snprintf(key, sizeof key, "%d", k++);
			BSON_APPEND_DOCUMENT(&arr, key, &d);
		}
		bson_destroy(&d);
	}
	bson_append_array_end(reply, &arr);
	if (!name_only)
		BSON_APPEND_INT64(reply, "totalSize", total);
	sdb_store_names_free(names, nn);
	sdb_matcher_free(m);
	sdb_store_rollback(x->conn);
	wire_req_reply(x->req, reply);
}

void shard_coll_stats_append(shard_ctx *x, const char *coll, const sdb_store_coll *co,
			     bson_t *reply)
{
	int64_t count = sdb_store_count(x->conn, x->db, coll);
	int64_t size = sdb_store_data_size(x->conn, x->db, coll);
	char *ns = sdb_ns_join(x->db, coll);
	BSON_APPEND_UTF8(reply, "ns", ns);
	free(ns);
	BSON_APPEND_INT64(reply, "size", size);
	BSON_APPEND_INT64(reply, "count", count);
	BSON_APPEND_INT64(reply, "avgObjSize", count ? size / count : 0);
	BSON_APPEND_INT64(reply, "storageSize", size);
	BSON_APPEND_INT32(reply, "nindexes", (int32_t)co->n_indexes + 1);
	bson_t sizes;
	BSON_APPEND_DOCUMENT_BEGIN(reply, "indexSizes", &sizes);
	BSON_APPEND_INT64(&sizes, "_id_", 0);
	for (size_t i = 0; i < co->n_indexes; i++)
		BSON_APPEND_INT64(&sizes, co->indexes[i].name, 0);
	bson_append_document_end(reply, &sizes);
	BSON_APPEND_INT64(reply, "totalIndexSize", 0);
	BSON_APPEND_BOOL(reply, "capped", false);
}

void shard_cmd_coll_stats(shard_ctx *x)
{
	const sdb_store_coll *co;
	const char *coll = coll_read(x, "Collection [%s.%s] not found.", &co);
	if (!coll)
		return;
	/* a view has no storage: 166 as mongod (a fresh user's $collStats over a view through
	 * a proxy, which sends this command, answered count 0) */
	if (shard_refuse_view(x, coll))
		return;
	bson_t *reply = bson_new();
	shard_coll_stats_append(x, coll, co, reply);
	sdb_store_rollback(x->conn);
	wire_req_reply(x->req, reply);
}

/* validate (MongoDB 6.0 validate.cpp): {validate: coll, full?, background?, repair?,
 * enforceFastCount?, metadata?}. Every validation here is full (documents and every index
 * entry) and runs in one read transaction, a snapshot that does not block writes, so
 * `full` and `background` and `enforceFastCount` (counts are exact) are honoured as given;
 * MongoDB's option rules are kept (background with full or repair, metadata with anything:
 * InvalidOptions 72); repair is refused as on a replica set member (IllegalOperation 20). */
void shard_cmd_validate(shard_ctx *x)
{
	static const char *const opts[] = {"full", "background", "repair", "enforceFastCount",
					   "metadata"};
	bool on[5] = {false};
	bson_iter_t it;

	/* mongod reads each with trueValue(): any type, its truth */
	for (size_t i = 0; i < 5; i++)
		if (bson_iter_init_find(&it, x->cmd, opts[i]))
			on[i] = bson_iter_as_bool(&it);
	if (on[2]) {
		shard_fail(x, WIRE_ERR_ILLEGAL_OPERATION,
			   "Running the validate command with { repair: true } can only be "
			   "performed in standalone mode.");
		return;
	}
	if (on[1] && on[0]) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "Running the validate command with both { background: true } and { "
			   "full: true } is not supported.");
		return;
	}
	if (on[4] && (on[0] || on[1] || on[3])) {
		shard_fail(x, WIRE_ERR_INVALID_OPTIONS,
			   "Running the validate command with { metadata: true } is not supported "
			   "with any other options");
		return;
	}
	const char *coll = shard_coll_arg(x);
	if (!coll || !shard_begin(x, false))
		return;
	if (shard_coll_is_view(x, coll)) {
		sdb_store_rollback(x->conn);
		shard_fail(x, WIRE_ERR_COMMAND_NOT_SUPPORTED_ON_VIEW,
			   "Namespace %s.%s is a view, not a collection", x->db, coll);
		return;
	}
	sdb_store_validation v;
	bson_t problems = BSON_INITIALIZER;
	int n = 0;
	int rc = sdb_store_validate(x->conn, x->db, coll, on[4], &v, &problems, &n, x->err,
				    sizeof x->err);
	sdb_store_rollback(x->conn);
	if (rc) {
		bson_destroy(&problems);
		sdb_store_validation_free(&v);
		if (rc == SDB_ENOTFOUND)
			shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND,
				   "Collection '%s.%s' does not exist to validate.", x->db, coll);
		else
			shard_fail(x, WIRE_ERR_INTERNAL, "validate: %s", x->err);
		return;
	}
	char ns[512];
	snprintf(ns, sizeof ns, "%s.%s", x->db, coll);
	bson_t *reply = bson_new(), d, sub;
	BSON_APPEND_UTF8(reply, "ns", ns);
	BSON_APPEND_INT64(reply, "nInvalidDocuments", v.n_invalid);
	BSON_APPEND_INT64(reply, "nNonCompliantDocuments", 0);
	if (!on[4])
		BSON_APPEND_INT64(reply, "nrecords", v.nrecords);
	BSON_APPEND_INT64(reply, "nIndexes", (int64_t)v.n_indexes + 1);
	if (!on[4]) {
		bson_append_document_begin(reply, "keysPerIndex", -1, &d);
		BSON_APPEND_INT64(&d, "_id_", v.nrecords - v.n_invalid);
		for (size_t i = 0; i < v.n_indexes; i++)
			BSON_APPEND_INT64(&d, v.index_names[i], v.index_keys[i]);
		bson_append_document_end(reply, &d);
	}
	bson_append_document_begin(reply, "indexDetails", -1, &d);
	for (size_t i = 0; i <= v.n_indexes; i++) {
		bson_append_document_begin(&d, i == 0 ? "_id_" : v.index_names[i - 1], -1, &sub);
		BSON_APPEND_BOOL(&sub, "valid", true);
		bson_append_document_end(&d, &sub);
	}
	bson_append_document_end(reply, &d);
	BSON_APPEND_BOOL(reply, "valid", n == 0);
	BSON_APPEND_BOOL(reply, "repaired", false);
	bson_append_array_begin(reply, "warnings", -1, &d);
	bson_append_array_end(reply, &d);
	BSON_APPEND_ARRAY(reply, "errors", &problems);
	bson_destroy(&problems);
	sdb_store_validation_free(&v);
	wire_req_reply(x->req, reply);
}

void shard_cmd_db_stats(shard_ctx *x)
{
	if (!shard_begin(x, false))
		return;
	char **names = NULL;
	size_t nn = 0;
	sdb_store_coll_list(x->conn, x->db, &names, &nn, NULL, 0);
	int64_t objects = 0, size = 0, indexes = 0;
	for (size_t i = 0; i < nn; i++) {
		objects += sdb_store_count(x->conn, x->db, names[i * 2 + 1]);
		size += sdb_store_data_size(x->conn, x->db, names[i * 2 + 1]);
		const sdb_store_coll *co = NULL;
		if (sdb_store_coll_get(x->conn, x->db, names[i * 2 + 1], &co, NULL, 0) == 0)
			indexes += (int64_t)co->n_indexes + 1;
	}
	sdb_store_names_free(names, nn);
	sdb_store_rollback(x->conn);
	bson_t *reply = bson_new();
	BSON_APPEND_UTF8(reply, "db", x->db);
	BSON_APPEND_INT64(reply, "collections", (int64_t)nn);
	BSON_APPEND_INT64(reply, "views", 0);
	BSON_APPEND_INT64(reply, "objects", objects);
	BSON_APPEND_DOUBLE(reply, "avgObjSize", objects ? (double)size / (double)objects : 0);
	BSON_APPEND_INT64(reply, "dataSize", size);
	BSON_APPEND_INT64(reply, "storageSize", size);
	BSON_APPEND_INT64(reply, "indexes", indexes);
	BSON_APPEND_INT64(reply, "indexSize", 0);
	wire_req_reply(x->req, reply);
}

void shard_cmd_set_version(shard_ctx *x)
{
	bson_iter_t it;
	const char *chunk = NULL;
	int64_t token = 0;
	bool have_token = false;
	if (bson_iter_init_find(&it, x->cmd, "chunk") && BSON_ITER_HOLDS_UTF8(&it))
		chunk = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, x->cmd, "token") && util_token(&it, &token))
		have_token = true;
	if (!chunk || !*chunk || !have_token) {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "stripedbSetVersion needs chunk: <string> and token: <integer>");
		return;
	}
	/* a bump is not itself gated by the token it moves */
	x->chunk = NULL;
	if (!shard_begin(x, true))
		return;
	int64_t stored = 0;
	bson_t *reply = write_reply(
		x, sdb_store_version_set(x->conn, chunk, token, &stored, x->err, sizeof x->err));
	if (!reply)
		return;
	BSON_APPEND_UTF8(reply, "chunk", chunk);
	BSON_APPEND_INT64(reply, "token", stored);
	wire_req_reply(x->req, reply);
}

void shard_cmd_check(shard_ctx *x)
{
	if (!shard_begin(x, false))
		return;
	bson_t problems = BSON_INITIALIZER;
	int n = 0;
	int rc = sdb_store_check(x->conn, &problems, &n, x->err, sizeof x->err);
	sdb_store_rollback(x->conn);
	if (rc) {
		bson_destroy(&problems);
		shard_fail(x, WIRE_ERR_INTERNAL, "%s", x->err);
		return;
	}
	bson_t *reply = bson_new();
	BSON_APPEND_INT32(reply, "nProblems", n);
	BSON_APPEND_ARRAY(reply, "problems", &problems);
	bson_destroy(&problems);
	wire_req_reply(x->req, reply);
}

void shard_cmd_append_oplog_note(shard_ctx *x)
{
	bson_iter_t it;
	bson_t data;
	uint64_t floor = 0;
	bool written = false;

	if (strcmp(x->db, "admin") != 0) {
		shard_fail(x, WIRE_ERR_UNAUTHORIZED,
			   "appendOplogNote may only be run against the admin database.");
		return;
	}
	/* mongod's AppendOplogNoteCmd: bsonExtractTypedField of data (Object) and of the
	 * optional maxClusterTime (Timestamp) */
	if (!bson_iter_init_find(&it, x->cmd, "data")) {
		shard_fail(x, 4, "Missing expected field \"data\"");
		return;
	}
	if (!BSON_ITER_HOLDS_DOCUMENT(&it)) {
		shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
			   "\"data\" had the wrong type. Expected object, found %s",
			   util_type_name(bson_iter_type(&it)));
		return;
	}
	util_iter_bson(&it, &data);
	if (bson_iter_init_find(&it, x->cmd, "maxClusterTime")) {
		uint32_t t, i;
		if (!BSON_ITER_HOLDS_TIMESTAMP(&it)) {
			shard_fail(x, WIRE_ERR_TYPE_MISMATCH,
				   "\"maxClusterTime\" had the wrong type. Expected timestamp, "
				   "found %s",
				   util_type_name(bson_iter_type(&it)));
			return;
		}
		bson_iter_timestamp(&it, &t, &i);
		floor = sdb_store_ts_pack(t, i);
	}
	if (!shard_begin(x, true))
		return;
	int rc = sdb_store_oplog_note(x->conn, &data, floor, &written, x->err, sizeof x->err);
	if (rc == SDB_EINVAL) {
		shard_fail(x, WIRE_ERR_BAD_VALUE, "%s", x->err);
		return;
	}
	bson_t *reply = write_reply(x, rc);
	if (reply)
		wire_req_reply(x->req, reply);
}
