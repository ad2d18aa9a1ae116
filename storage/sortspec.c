/* Sort specifications: see sortspec.h. */
#include "storage/sortspec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/bsonval.h"
#include "storage/collation.h"
#include "storage/path.h"

#define SORT_MAX_FIELDS 32

struct sdb_sortspec {
	size_t n;
	char *paths[SORT_MAX_FIELDS];
	int dirs[SORT_MAX_FIELDS];
	int natural;
};

static int set_code(int *code, int c, int rc)
{
	if (code)
		*code = c;
	return rc;
}

/* 1 or -1 from an int32/int64/double/decimal value, 0 otherwise. */
static int direction(const bson_iter_t *it)
{
	double d;

	switch (bson_iter_type(it)) {
	case BSON_TYPE_INT32:
	case BSON_TYPE_INT64:
		switch (bson_iter_as_int64(it)) {
		case 1:
			return 1;
		case -1:
			return -1;
		default:
			return 0;
		}
	case BSON_TYPE_DOUBLE:
		d = bson_iter_double(it);
		return d == 1.0 ? 1 : d == -1.0 ? -1 : 0;
	case BSON_TYPE_DECIMAL128: {
		bson_iter_t c = *it;
		sdb_bson_num n, one;
		bson_value_t v1 = {.value_type = BSON_TYPE_INT32, .value.v_int32 = 1};

		sdb_bson_num_canon(bson_iter_value(&c), &n);
		sdb_bson_num_canon(&v1, &one);
		if (n.exp == one.exp && n.frac == one.frac && (n.cls == 4 || n.cls == 2))
			return n.cls == 4 ? 1 : -1;
		return 0;
	}
	default:
		return 0;
	}
}

int sdb_sortspec_parse(const bson_t *spec, sdb_sortspec **out, int *code, char *err,
		       size_t errlen)
{
	sdb_sortspec *s = sdb_calloc(1, sizeof *s);
	bson_iter_t it;
	int rc = 0;

	*out = NULL;
	if (code)
		*code = 0;
	if (!bson_iter_init(&it, spec)) {
		rc = set_code(code, 2, sdb_errf(err, errlen, SDB_EINVAL, "corrupt sort document"));
		goto fail;
	}
	while (bson_iter_next(&it)) {
		const char *key = bson_iter_key(&it);
		int dir;

		if (BSON_ITER_HOLDS_DOCUMENT(&it)) {
			rc = set_code(code, 2,
				      sdb_errf(err, errlen, SDB_EINVAL,
					       "$meta sort (field %s) is not supported by stripedb",
					       key));
			goto fail;
		}
		dir = direction(&it);
		if (dir == 0) {
			rc = set_code(code, 15975,
				      sdb_errf(err, errlen, SDB_EINVAL,
					       "$sort key ordering must be 1 (for ascending) or -1 "
					       "(for descending)"));
			goto fail;
		}
		if (strcmp(key, "$natural") == 0) {
			s->natural = dir;
			continue;
		}
		if (key[0] == '\0') {
			rc = set_code(code, 40352,
				      sdb_errf(err, errlen, SDB_EINVAL,
					       "FieldPath cannot be constructed with empty string"));
			goto fail;
		}
		if (!sdb_path_valid(key, err, errlen)) {
			rc = set_code(code, 2, SDB_EINVAL);
			goto fail;
		}
		if (s->n == SORT_MAX_FIELDS) {
			rc = set_code(code, 2,
				      sdb_errf(err, errlen, SDB_EINVAL,
					       "sort has more than %d fields", SORT_MAX_FIELDS));
			goto fail;
		}
		s->paths[s->n] = sdb_strdup(key);
		s->dirs[s->n] = dir;
		s->n++;
	}
	if (s->natural && s->n) {
		rc = set_code(code, 2,
			      sdb_errf(err, errlen, SDB_EINVAL,
				       "$natural sort cannot be mixed with other sort fields"));
		goto fail;
	}
	*out = s;
	return 0;
fail:
	sdb_sortspec_free(s);
	return rc;
}

void sdb_sortspec_free(sdb_sortspec *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		free(s->paths[i]);
	free(s);
}

size_t sdb_sortspec_nfields(const sdb_sortspec *s)
{
	return s->n;
}

const char *sdb_sortspec_path(const sdb_sortspec *s, size_t i)
{
	return s->paths[i];
}

int sdb_sortspec_dir(const sdb_sortspec *s, size_t i)
{
	return s->dirs[i];
}

int sdb_sortspec_natural(const sdb_sortspec *s)
{
	return s->natural;
}

int sdb_sortspec_cmp(const sdb_sortspec *s, const bson_t *a, const bson_t *b)
{
	for (size_t i = 0; i < s->n; i++) {
		bson_value_t va, vb;
		int c;

		sdb_path_sort_value(a, s->paths[i], s->dirs[i] < 0, &va);
		sdb_path_sort_value(b, s->paths[i], s->dirs[i] < 0, &vb);
		c = sdb_bson_value_cmp(&va, &vb);
		if (c)
			return s->dirs[i] < 0 ? -c : c;
	}
	return 0;
}

int sdb_sortspec_key(const sdb_sortspec *s, const bson_t *doc, sdb_key *out, char *err,
		     size_t errlen)
{
	for (size_t i = 0; i < s->n; i++) {
		bson_value_t v;
		int rc;

		sdb_path_sort_value(doc, s->paths[i], s->dirs[i] < 0, &v);
		rc = sdb_keyenc_append_value_coll(out, &v, s->dirs[i] < 0, sdb_collation_current(), err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}
