/* The s3:// CDC archive backend (issue #22). See archive.h for the object layout and s3.h
 * for the client (SigV4 by libcurl, retries, checksums).
 *
 * put: a closed segment's .idx then .seg are uploaded under names that carry its range
 * (PREFIX/<shard>/<first>-<next>-<first ts>-<last ts>.seg), so that one ListObjectsV2
 * gives the archive's range without reading any object; the .seg object is what makes a
 * segment archived (an .idx alone, left by a crash between the two uploads, is ignored
 * and overwritten by the retry). cdc_archive_put returns only once the server confirmed
 * both uploads: the embedded log deletes a segment only after that.
 *
 * reads: each reader has a view, a private cache directory under the archive's cache
 * root (mkdtemp in $TMPDIR), holding at most S3_VIEW_SEGS consecutive segments
 * downloaded with their checksums verified; the segdir.h reader reads them as it reads
 * the file: archive. A reader that reaches the end of its cached segments sees the end of
 * the archive, re-resolves its position (reader.c) and gets the next segment downloaded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdc/archive.h"
#include "cdc/s3.h"
#include "cdc/segdir.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

/* Segments a view keeps on disk (64 MiB each by default). */
#define S3_VIEW_SEGS 3

typedef struct s3_arch {
	cdc_s3 *s3;
	char *prefix;     /* "" or "PREFIX/" */
	char *cache_root; /* private, removed on close */
	atomic_uint views;
} s3_arch;

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	(void)remove(path); /* best effort: a cache directory */
	return 0;
}

static void rm_rf(const char *path)
{
	nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static char *obj_key(const s3_arch *s, const char *shard, const cdc_seginfo *g, const char *ext)
{
	return sdb_asprintf("%s%s/%020" PRIu64 "-%020" PRIu64 "-%020" PRIu64 "-%020" PRIu64 ".%s",
			    s->prefix, shard, g->first_offset, g->next_offset, g->first_ts,
			    g->last_ts, ext);
}

/* The archived segments of shard (sorted by first offset; heap array). */
static int s3_segments(s3_arch *s, const char *shard, cdc_seginfo **segs, size_t *n,
		       char *err, size_t errlen)
{
	char **keys = NULL;
	size_t nk = 0, cnt = 0;
	char *prefix = sdb_asprintf("%s%s/", s->prefix, shard);
	int rc = cdc_s3_list(s->s3, prefix, &keys, &nk, err, errlen);
	*segs = NULL;
	*n = 0;
	if (rc) {
		free(prefix);
		return rc;
	}
	cdc_seginfo *out = nk ? sdb_calloc(nk, sizeof *out) : NULL;
	size_t pl = strlen(prefix);
	for (size_t i = 0; i < nk; i++) {
		const char *name = keys[i] + pl;
		cdc_seginfo g = {0};
		int used = 0;
		if (strlen(keys[i]) == pl + 87 && strncmp(keys[i], prefix, pl) == 0 &&
		    sscanf(name, "%20" SCNu64 "-%20" SCNu64 "-%20" SCNu64 "-%20" SCNu64 ".seg%n",
			   &g.first_offset, &g.next_offset, &g.first_ts, &g.last_ts, &used) == 4 &&
		    used == 87 && g.next_offset > g.first_offset)
			out[cnt++] = g;
		free(keys[i]);
	}
	free(keys);
	free(prefix);
	*segs = out;
	*n = cnt;
	return 0;
}

static void s3a_close(cdc_archive *a)
{
	s3_arch *s = a->impl;
	if (s == NULL)
		return;
	cdc_s3_close(s->s3);
	if (s->cache_root) {
		rm_rf(s->cache_root);
		free(s->cache_root);
	}
	free(s->prefix);
	free(s);
}

static int s3a_put(cdc_archive *a, const char *shard, const char *live_dir,
		   uint64_t first_offset, char *err, size_t errlen)
{
	s3_arch *s = a->impl;
	cdc_seginfo *segs, *g = NULL;
	size_t n;
	int rc = cdc_segdir_list(live_dir, &segs, &n, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++)
		if (segs[i].first_offset == first_offset)
			g = &segs[i];
	if (g == NULL || g->next_offset == g->first_offset) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
			      "segment %" PRIu64 " of %s is missing or empty", first_offset,
			      live_dir);
		free(segs);
		return rc;
	}
	const char *ext[2] = {"idx", "seg"}; /* .seg last: it marks the segment archived */
	for (int i = 0; i < 2 && rc == 0; i++) {
		char *key = obj_key(s, shard, g, ext[i]);
		char *path = sdb_asprintf("%s/%020" PRIu64 ".%s", live_dir, first_offset, ext[i]);
		rc = cdc_s3_put_file(s->s3, key, path, err, errlen);
		free(key);
		free(path);
	}
	free(segs);
	return rc;
}

static int s3a_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		     size_t errlen)
{
	cdc_seginfo *segs;
	size_t n;
	int rc = s3_segments(a->impl, shard, &segs, &n, err, errlen);
	memset(out, 0, sizeof *out);
	if (rc)
		return rc;
	if (n > 0) {
		out->first_offset = segs[0].first_offset;
		out->first_ts = segs[0].first_ts;
		out->next_offset = segs[n - 1].next_offset;
		out->last_ts = segs[n - 1].last_ts;
	}
	free(segs);
	return 0;
}

static char *s3a_view_open(cdc_archive *a, const char *shard)
{
	s3_arch *s = a->impl;
	unsigned id = atomic_fetch_add(&s->views, 1);
	char *dir = sdb_asprintf("%s/%s.%u", s->cache_root, shard, id);
	if (mkdir(dir, 0700) != 0)
		sdb_warn("s3 archive view", "dir=%s error=\"%s\"", dir, strerror(errno));
	return dir;
}

static void s3a_view_close(cdc_archive *a, char *view)
{
	(void)a;
	rm_rf(view);
	free(view);
}

static void drop_cached(const char *view, uint64_t first)
{
	char e[128];
	if (cdc_segdir_remove(view, first, e, sizeof e) != 0)
		sdb_warn("s3 archive cache", "view=%s error=\"%s\"", view, e);
}

/* Make segs[k] present in view, keeping the view a run of at most S3_VIEW_SEGS
 * consecutive archived segments (so that the segdir.h functions over the view give the
 * answers they would give over the whole archive for the offsets and ts of segs[k]). */
static int fetch(cdc_archive *a, const char *shard, const char *view, const cdc_seginfo *segs,
		 size_t n, size_t k, char *err, size_t errlen)
{
	s3_arch *s = a->impl;
	cdc_seginfo *have;
	size_t nh;
	int rc = cdc_segdir_list(view, &have, &nh, err, errlen);
	if (rc)
		return rc;
	size_t lo = SIZE_MAX, hi = SIZE_MAX;
	if (nh > 0) {
		for (size_t i = 0; i < n; i++) {
			if (segs[i].first_offset == have[0].first_offset)
				lo = i;
			if (segs[i].first_offset == have[nh - 1].first_offset)
				hi = i;
		}
	}
	if (nh > 0 && lo != SIZE_MAX && hi != SIZE_MAX && hi - lo + 1 == nh && k >= lo && k <= hi) {
		free(have);
		return 0; /* already there */
	}
	int keep = nh > 0 && lo != SIZE_MAX && hi != SIZE_MAX && hi - lo + 1 == nh &&
		   (k == hi + 1 || k + 1 == lo);
	if (!keep) {
		for (size_t i = 0; i < nh; i++)
			drop_cached(view, have[i].first_offset);
	} else if (nh + 1 > S3_VIEW_SEGS) {
		drop_cached(view, k == hi + 1 ? have[0].first_offset : have[nh - 1].first_offset);
	}
	free(have);
	const char *ext[2] = {"idx", "seg"};
	for (int i = 0; i < 2 && rc == 0; i++) {
		char *key = obj_key(s, shard, &segs[k], ext[i]);
		char *path = sdb_asprintf("%s/%020" PRIu64 ".%s", view, segs[k].first_offset, ext[i]);
		rc = cdc_s3_get_file(s->s3, key, path, err, errlen);
		free(key);
		free(path);
	}
	if (rc)
		drop_cached(view, segs[k].first_offset);
	return rc;
}

static int s3a_locate_once(cdc_archive *a, const char *shard, const char *view,
			   uint64_t after_ts, uint64_t *offset, char *err, size_t errlen)
{
	cdc_seginfo *segs;
	size_t n, k;
	int rc = s3_segments(a->impl, shard, &segs, &n, err, errlen);
	if (rc)
		return rc;
	for (k = 0; k < n && segs[k].last_ts <= after_ts; k++)
		;
	if (k == n) {
		*offset = n ? segs[n - 1].next_offset : 0;
	} else {
		rc = fetch(a, shard, view, segs, n, k, err, errlen);
		if (rc == 0)
			rc = cdc_segdir_locate(view, after_ts, offset, err, errlen);
	}
	free(segs);
	return rc;
}

static int s3a_read_open_once(cdc_archive *a, const char *shard, const char *view,
			      uint64_t offset, cdc_segread **out, char *err, size_t errlen)
{
	cdc_seginfo *segs;
	size_t n, k;
	int rc = s3_segments(a->impl, shard, &segs, &n, err, errlen);
	if (rc)
		return rc;
	for (k = 0; k < n && !(offset >= segs[k].first_offset && offset < segs[k].next_offset); k++)
		;
	if (k == n)
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
			      "archive %s: no segment of %s holds offset %" PRIu64, a->spec, shard,
			      offset);
	else
		rc = fetch(a, shard, view, segs, n, k, err, errlen);
	if (rc == 0)
		rc = cdc_segread_open(view, offset, out, err, errlen);
	free(segs);
	return rc;
}

/* The .seg object goes first: without it the segment is not in the archive any more (a
 * crash between the two deletes leaves an .idx that listings ignore). */
static int s3a_expire(cdc_archive *a, const char *shard, uint64_t before_ts, size_t *removed,
		      char *err, size_t errlen)
{
	s3_arch *s = a->impl;
	cdc_seginfo *segs;
	size_t n;
	int rc = s3_segments(s, shard, &segs, &n, err, errlen);
	*removed = 0;
	if (rc)
		return rc;
	for (size_t i = 0; rc == 0 && i < n && segs[i].last_ts < before_ts; i++) {
		const char *ext[2] = {"seg", "idx"};
		for (int e = 0; e < 2 && rc == 0; e++) {
			char *key = obj_key(s, shard, &segs[i], ext[e]);
			rc = cdc_s3_delete(s->s3, key, err, errlen);
			free(key);
		}
		if (rc == 0)
			(*removed)++;
	}
	free(segs);
	return rc;
}

/* A segment listed a moment ago may be gone when we get it (deleted by the archive's
 * retention in another coordinator): list again, so that the caller sees the archive as it
 * is now (and the reader reports a position that exists nowhere as such). */
#define S3_RELIST 3

static int s3a_locate(cdc_archive *a, const char *shard, const char *view, uint64_t after_ts,
		      uint64_t *offset, char *err, size_t errlen)
{
	int rc = SDB_ENOTFOUND;
	for (int i = 0; i < S3_RELIST && rc == SDB_ENOTFOUND; i++)
		rc = s3a_locate_once(a, shard, view, after_ts, offset, err, errlen);
	return rc;
}

static int s3a_read_open(cdc_archive *a, const char *shard, const char *view, uint64_t offset,
			 cdc_segread **out, char *err, size_t errlen)
{
	int rc = SDB_ENOTFOUND;
	for (int i = 0; i < S3_RELIST && rc == SDB_ENOTFOUND; i++)
		rc = s3a_read_open_once(a, shard, view, offset, out, err, errlen);
	return rc;
}

/* ------------------------------------------------------------ plain objects */

static int s3a_obj_put(cdc_archive *a, const char *key, const char *path, char *err,
		       size_t errlen)
{
	s3_arch *s = a->impl;
	char *k = sdb_asprintf("%s%s", s->prefix, key);
	int rc = cdc_s3_put_file(s->s3, k, path, err, errlen);
	free(k);
	return rc;
}

static int s3a_obj_get(cdc_archive *a, const char *key, const char *path, char *err,
		       size_t errlen)
{
	s3_arch *s = a->impl;
	char *k = sdb_asprintf("%s%s", s->prefix, key);
	int rc = cdc_s3_get_file(s->s3, k, path, err, errlen);
	free(k);
	return rc;
}

static int s3a_obj_list(cdc_archive *a, const char *prefix, char ***keys, size_t *n,
			char *err, size_t errlen)
{
	s3_arch *s = a->impl;
	char *p = sdb_asprintf("%s%s", s->prefix, prefix);
	size_t pl = strlen(s->prefix);
	int rc = cdc_s3_list(s->s3, p, keys, n, err, errlen);
	free(p);
	if (rc)
		return rc;
	for (size_t i = 0; i < *n; i++) /* keys relative to the archive's prefix */
		memmove((*keys)[i], (*keys)[i] + pl, strlen((*keys)[i] + pl) + 1);
	return 0;
}

static int s3a_obj_delete(cdc_archive *a, const char *key, char *err, size_t errlen)
{
	s3_arch *s = a->impl;
	char *k = sdb_asprintf("%s%s", s->prefix, key);
	int rc = cdc_s3_delete(s->s3, k, err, errlen);
	free(k);
	return rc;
}

static const cdc_archive_ops s3_ops = {
	.scheme = "s3",
	.close = s3a_close,
	.put = s3a_put,
	.range = s3a_range,
	.view_open = s3a_view_open,
	.view_close = s3a_view_close,
	.locate = s3a_locate,
	.read_open = s3a_read_open,
	.expire = s3a_expire,
	.obj_put = s3a_obj_put,
	.obj_get = s3a_obj_get,
	.obj_list = s3a_obj_list,
	.obj_delete = s3a_obj_delete,
};

int cdc_archive_s3_open(const char *spec, const cdc_log_opts *opts, cdc_archive **out,
			char *err, size_t errlen)
{
	const char *b = spec + 5, *slash = strchr(b, '/');
	char *bucket = slash ? sdb_strndup(b, (size_t)(slash - b)) : sdb_strdup(b);
	const char *prefix = slash ? slash + 1 : "";
	size_t pl = strlen(prefix);
	while (pl > 0 && prefix[pl - 1] == '/')
		pl--;
	cdc_s3_conf conf = {
		.endpoint = opts ? opts->s3_endpoint : NULL,
		.region = opts ? opts->s3_region : NULL,
		.credentials_file = opts ? opts->s3_credentials_file : NULL,
	};
	cdc_archive *a = sdb_calloc(1, sizeof *a);
	s3_arch *s = sdb_calloc(1, sizeof *s);
	a->ops = &s3_ops;
	a->spec = sdb_strdup(spec);
	a->impl = s;
	atomic_init(&s->views, 0);
	s->prefix = pl ? sdb_asprintf("%.*s/", (int)pl, prefix) : sdb_strdup("");
	int rc = cdc_s3_open(bucket, &conf, &s->s3, err, errlen);
	if (rc)
		goto fail;
	const char *tmp = getenv("TMPDIR");
	s->cache_root = sdb_asprintf("%s/stripedb-s3-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
	if (mkdtemp(s->cache_root) == NULL) {
		rc = sdb_errf(err, errlen, SDB_EIO, "s3 archive cache %s: %s", s->cache_root,
			      strerror(errno));
		free(s->cache_root);
		s->cache_root = NULL;
		goto fail;
	}
	rc = cdc_s3_check(s->s3, err, errlen);
	if (rc == SDB_EUNAVAILABLE) {
		/* a coordinator must start (and publish: the log keeps what is not archived)
		 * while the store is down; refused credentials or a missing bucket stop it */
		sdb_warn("s3 archive unreachable", "archive=%s error=\"%s\"", spec, err);
		rc = 0;
	}
	if (rc)
		goto fail;
	free(bucket);
	*out = a;
	return 0;
fail:
	sdb_errwrap(err, errlen, rc, "archive %s", spec);
	free(bucket);
	cdc_archive_close(a);
	return rc;
}
