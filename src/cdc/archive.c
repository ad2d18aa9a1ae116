/* The CDC archive: the backend vtable, the file: backend and the Kafka archiver. See
 * archive.h; the s3 backend is archive_s3.c. */
#include "cdc/archive.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdc/segdir.h"
#include "common/alloc.h"
#include "common/err.h"

/* ------------------------------------------------------------ file: backend */

static char *file_dir(const cdc_archive *a, const char *shard)
{
	return sdb_asprintf("%s/%s", (const char *)a->impl, shard);
}

static void file_close(cdc_archive *a)
{
	free(a->impl);
}

static int file_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen)
{
	char *dir = file_dir(a, shard);
	int rc = cdc_segdir_copy(live_dir, dir, first_offset, err, errlen);
	free(dir);
	return rc;
}

static int file_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen)
{
	char *dir = file_dir(a, shard);
	int rc = cdc_segdir_range(dir, out, err, errlen);
	free(dir);
	return rc;
}

/* The view of a file: archive is the shard's directory itself. */
static char *file_view_open(cdc_archive *a, const char *shard)
{
	return file_dir(a, shard);
}

static void file_view_close(cdc_archive *a, char *view)
{
	(void)a;
	free(view);
}

static int file_locate(cdc_archive *a, const char *shard, const char *view, uint64_t after_ts,
		       uint64_t *offset, char *err, size_t errlen)
{
	(void)a;
	(void)shard;
	return cdc_segdir_locate(view, after_ts, offset, err, errlen);
}

static int file_read_open(cdc_archive *a, const char *shard, const char *view, uint64_t offset,
			  cdc_segread **out, char *err, size_t errlen)
{
	(void)a;
	(void)shard;
	return cdc_segread_open(view, offset, out, err, errlen);
}

static int file_expire(cdc_archive *a, const char *shard, uint64_t before_ts, size_t *removed,
		       char *err, size_t errlen)
{
	char *dir = file_dir(a, shard);
	cdc_seginfo *segs;
	size_t n;
	int rc = cdc_segdir_list(dir, &segs, &n, err, errlen);
	*removed = 0;
	if (rc) {
		free(dir);
		return rc;
	}
	for (size_t i = 0; rc == 0 && i < n && segs[i].last_ts < before_ts; i++) {
		rc = cdc_segdir_remove(dir, segs[i].first_offset, err, errlen);
		if (rc == 0)
			(*removed)++;
	}
	free(segs);
	free(dir);
	return rc;
}

/* Copy src to dst durably: dst.tmp, fsync, rename, fsync the directory. */
static int copy_file(const char *src, const char *dst, char *err, size_t errlen)
{
	char *tmp = sdb_asprintf("%s.tmp", dst);
	char buf[65536];
	int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
	if (in < 0) {
		rc = sdb_errf(err, errlen, errno == ENOENT ? SDB_ENOTFOUND : SDB_EIO, "open %s: %s",
			      src, strerror(errno));
		goto done;
	}
	out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (out < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "create %s: %s", tmp, strerror(errno));
		goto done;
	}
	for (;;) {
		ssize_t r = read(in, buf, sizeof buf);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "read %s: %s", src, strerror(errno));
			goto done;
		}
		if (r == 0)
			break;
		for (ssize_t d = 0; d < r;) {
			ssize_t w = write(out, buf + d, (size_t)(r - d));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				rc = sdb_errf(err, errlen, SDB_EIO, "write %s: %s", tmp,
					      strerror(errno));
				goto done;
			}
			d += w;
		}
	}
	if (fsync(out) != 0 || close(out) != 0) {
		out = -1;
		rc = sdb_errf(err, errlen, SDB_EIO, "fsync %s: %s", tmp, strerror(errno));
		goto done;
	}
	out = -1;
	if (rename(tmp, dst) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "rename %s: %s", dst, strerror(errno));
		goto done;
	}
	char *dir = sdb_strdup(dst), *slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		int fd = open(dir, O_RDONLY | O_DIRECTORY);
		if (fd >= 0) {
			(void)fsync(fd);
			close(fd);
		}
	}
	free(dir);
done:
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	if (rc)
		(void)unlink(tmp);
	free(tmp);
	return rc;
}

static int file_obj_put(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen)
{
	char *dst = sdb_asprintf("%s/%s", (const char *)a->impl, key);
	char *dir = sdb_strdup(dst);
	int rc = 0;
	char *slash = strrchr(dir, '/');
	*slash = '\0';
	rc = cdc_mkdirs(dir, err, errlen);
	if (rc == 0)
		rc = copy_file(path, dst, err, errlen);
	free(dir);
	free(dst);
	return rc;
}

static int file_obj_get(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen)
{
	char *src = sdb_asprintf("%s/%s", (const char *)a->impl, key);
	int rc = copy_file(src, path, err, errlen);
	free(src);
	return rc;
}

static int cmp_str(const void *x, const void *y)
{
	return strcmp(*(char *const *)x, *(char *const *)y);
}

/* Append the files under DIR/rel (recursively) to *keys. */
static int list_rec(const char *root, const char *rel, char ***keys, size_t *n, size_t *cap,
		    char *err, size_t errlen)
{
	char *path = sdb_asprintf("%s/%s", root, rel);
	DIR *d = opendir(path);
	int rc = 0;
	if (d == NULL) {
		if (errno != ENOENT && errno != ENOTDIR)
			rc = sdb_errf(err, errlen, SDB_EIO, "opendir %s: %s", path,
				      strerror(errno));
		free(path);
		return rc;
	}
	struct dirent *e;
	while (rc == 0 && (e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		size_t l = strlen(e->d_name);
		if (l > 4 && strcmp(e->d_name + l - 4, ".tmp") == 0)
			continue;
		char *sub = rel[0] ? sdb_asprintf("%s/%s", rel, e->d_name) : sdb_strdup(e->d_name);
		char *full = sdb_asprintf("%s/%s", root, sub);
		struct stat st;
		if (stat(full, &st) == 0 && S_ISDIR(st.st_mode)) {
			rc = list_rec(root, sub, keys, n, cap, err, errlen);
			free(sub);
		} else {
			if (*n == *cap) {
				*cap = *cap ? *cap * 2 : 16;
				*keys = sdb_realloc(*keys, *cap * sizeof **keys);
			}
			(*keys)[(*n)++] = sub;
		}
		free(full);
	}
	closedir(d);
	free(path);
	return rc;
}

static int file_obj_list(cdc_archive *a, const char *prefix, char ***keys, size_t *n,
			 char *err, size_t errlen)
{
	/* prefix is a directory path ("backups/" or "backups/shard-a/") */
	char *rel = sdb_strdup(prefix);
	size_t l = strlen(rel), cap = 0;
	while (l > 0 && rel[l - 1] == '/')
		rel[--l] = '\0';
	*keys = NULL;
	*n = 0;
	int rc = list_rec(a->impl, rel, keys, n, &cap, err, errlen);
	free(rel);
	if (rc) {
		for (size_t i = 0; i < *n; i++)
			free((*keys)[i]);
		free(*keys);
		*keys = NULL;
		*n = 0;
		return rc;
	}
	if (*n > 1)
		qsort(*keys, *n, sizeof **keys, cmp_str);
	return 0;
}

static int file_obj_delete(cdc_archive *a, const char *key, char *err, size_t errlen)
{
	char *path = sdb_asprintf("%s/%s", (const char *)a->impl, key);
	int rc = 0;
	if (unlink(path) != 0 && errno != ENOENT)
		rc = sdb_errf(err, errlen, SDB_EIO, "unlink %s: %s", path, strerror(errno));
	/* remove the directories left empty (best effort) */
	char *slash;
	while (rc == 0 && (slash = strrchr(path, '/')) != NULL &&
	       (size_t)(slash - path) > strlen(a->impl)) {
		*slash = '\0';
		if (rmdir(path) != 0)
			break;
	}
	free(path);
	return rc;
}

static const cdc_archive_ops file_ops = {
	.scheme = "file",
	.close = file_close,
	.put = file_put,
	.range = file_range,
	.view_open = file_view_open,
	.view_close = file_view_close,
	.locate = file_locate,
	.read_open = file_read_open,
	.expire = file_expire,
	.obj_put = file_obj_put,
	.obj_get = file_obj_get,
	.obj_list = file_obj_list,
	.obj_delete = file_obj_delete,
};

/* ------------------------------------------------------------ dispatch */

int cdc_archive_open(const char *spec, const cdc_log_opts *opts, cdc_archive **out,
		     char *err, size_t errlen)
{
	cdc_archive *a;
	int rc;
	if (strncmp(spec, "s3://", 5) == 0)
		return cdc_archive_s3_open(spec, opts, out, err, errlen);
	if (strncmp(spec, "file:", 5) != 0 || spec[5] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL,
				"archive '%s': expected file:DIR or s3://BUCKET/PREFIX", spec);
	rc = cdc_mkdirs(spec + 5, err, errlen);
	if (rc)
		return sdb_errwrap(err, errlen, rc, "archive");
	a = sdb_calloc(1, sizeof *a);
	a->ops = &file_ops;
	a->spec = sdb_strdup(spec);
	a->impl = sdb_strdup(spec + 5);
	*out = a;
	return 0;
}

void cdc_archive_close(cdc_archive *a)
{
	if (a == NULL)
		return;
	a->ops->close(a);
	free(a->spec);
	free(a);
}

const char *cdc_archive_scheme(const cdc_archive *a)
{
	return a->ops->scheme;
}

char *cdc_archive_dir(const cdc_archive *a, const char *shard)
{
	return a->ops == &file_ops ? file_dir(a, shard) : NULL;
}

int cdc_archive_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen)
{
	int rc = a->ops->put(a, shard, live_dir, first_offset, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive") : 0;
}

int cdc_archive_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen)
{
	return a->ops->range(a, shard, out, err, errlen);
}

char *cdc_archive_view_open(cdc_archive *a, const char *shard)
{
	return a->ops->view_open(a, shard);
}

void cdc_archive_view_close(cdc_archive *a, char *view)
{
	if (view)
		a->ops->view_close(a, view);
}

int cdc_archive_locate(cdc_archive *a, const char *shard, const char *view, uint64_t after_ts,
		       uint64_t *offset, char *err, size_t errlen)
{
	return a->ops->locate(a, shard, view, after_ts, offset, err, errlen);
}

int cdc_archive_expire(cdc_archive *a, const char *shard, uint64_t before_ts, size_t *removed,
		       char *err, size_t errlen)
{
	int rc = a->ops->expire(a, shard, before_ts, removed, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive retention") : 0;
}

int cdc_archive_obj_put(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen)
{
	int rc = a->ops->obj_put(a, key, path, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive %s: put %s", a->spec, key) : 0;
}

int cdc_archive_obj_get(cdc_archive *a, const char *key, const char *path, char *err,
			size_t errlen)
{
	int rc = a->ops->obj_get(a, key, path, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive %s: get %s", a->spec, key) : 0;
}

int cdc_archive_obj_list(cdc_archive *a, const char *prefix, char ***keys, size_t *n,
			 char *err, size_t errlen)
{
	int rc = a->ops->obj_list(a, prefix, keys, n, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive %s: list %s", a->spec, prefix) : 0;
}

int cdc_archive_obj_delete(cdc_archive *a, const char *key, char *err, size_t errlen)
{
	int rc = a->ops->obj_delete(a, key, err, errlen);
	return rc ? sdb_errwrap(err, errlen, rc, "archive %s: delete %s", a->spec, key) : 0;
}

int cdc_archive_retention_parse(const char *s, uint64_t *seconds)
{
	char *end;
	if (s == NULL || *s < '0' || *s > '9')
		return SDB_EINVAL;
	unsigned long long v = strtoull(s, &end, 10);
	uint64_t mul = *end == '\0' || strcmp(end, "s") == 0 ? 1
		       : strcmp(end, "m") == 0		     ? 60
		       : strcmp(end, "h") == 0		     ? 3600
		       : strcmp(end, "d") == 0		     ? 86400
							     : 0;
	if (mul == 0 || v > UINT32_MAX)
		return SDB_EINVAL;
	*seconds = (uint64_t)v * mul;
	return 0;
}

int cdc_archive_read_open(cdc_archive *a, const char *shard, const char *view,
			  uint64_t offset, cdc_segread **out, char *err, size_t errlen)
{
	return a->ops->read_open(a, shard, view, offset, out, err, errlen);
}

/* ------------------------------------------------------------ Kafka archiver */

struct cdc_archiver {
	cdc_log *log;
	char *shard;
	cdc_segwriter *sw;
	void *src; /* live source positioned at next, or NULL */
	uint64_t next;
	char *staging; /* object-store archive: the local segment directory the topic is
			  copied into; its closed segments are uploaded, then removed */
};

int cdc_archiver_open(cdc_log *log, const char *shard, cdc_archiver **out, char *err,
		      size_t errlen)
{
	cdc_range live, arch;
	uint64_t last_ts, first;
	int rc;
	if (log->archive == NULL)
		return sdb_errf(err, errlen, SDB_EINVAL, "archiver: no archive configured");
	rc = cdc_log_range(log, shard, &live, err, errlen);
	if (rc)
		return rc;
	first = live.first_offset;
	cdc_archiver *a = sdb_calloc(1, sizeof *a);
	char *dir;
	if (log->archive->ops == &file_ops) {
		dir = cdc_archive_dir(log->archive, shard);
	} else {
		/* An object store: stage into a fresh private directory from where the archive
		 * ends (what a previous archiver staged and did not upload is copied again
		 * from the broker). */
		rc = cdc_archive_range(log->archive, shard, &arch, err, errlen);
		if (rc) {
			free(a);
			return sdb_errwrap(err, errlen, rc, "archive");
		}
		if (arch.next_offset > arch.first_offset)
			first = arch.next_offset;
		a->staging = cdc_archive_view_open(log->archive, shard);
		dir = sdb_strdup(a->staging);
	}
	a->log = log;
	a->shard = sdb_strdup(shard);
	rc = cdc_segwriter_open(dir, log->opts.fsync, log->opts.segment_bytes, first, &a->sw,
				&a->next, &last_ts, err, errlen);
	free(dir);
	if (rc) {
		if (a->staging)
			cdc_archive_view_close(log->archive, a->staging);
		free(a->shard);
		free(a);
		return sdb_errwrap(err, errlen, rc, "archive");
	}
	*out = a;
	return 0;
}

/* Object-store archive: upload the closed segments of the staging directory, oldest
 * first, each removed only after its upload was confirmed. */
static int upload_staged(cdc_archiver *a, char *err, size_t errlen)
{
	cdc_seginfo *segs;
	size_t n;
	int rc = cdc_segdir_list(a->staging, &segs, &n, err, errlen);
	if (rc)
		return rc;
	for (size_t i = 0; rc == 0 && i + 1 < n; i++) {
		rc = cdc_archive_put(a->log->archive, a->shard, a->staging, segs[i].first_offset,
				     err, errlen);
		if (rc == 0)
			rc = cdc_segdir_remove(a->staging, segs[i].first_offset, err, errlen);
	}
	free(segs);
	return rc;
}

int cdc_archiver_step(cdc_archiver *a, size_t max, int timeout_ms, size_t *copied, char *err,
		      size_t errlen)
{
	cdc_event ev;
	int rc = 0;
	*copied = 0;
	if (a->src == NULL) {
		rc = a->log->be->src_open(a->log, a->shard, a->next, &a->src, err, errlen);
		if (rc)
			return rc;
	}
	while (*copied < max) {
		rc = a->log->be->src_next(a->src, &ev, *copied ? 0 : timeout_ms, err, errlen);
		if (rc <= 0)
			break;
		if (ev.offset != a->next) {
			rc = sdb_errf(err, errlen, SDB_ENOTFOUND,
				      "archive gap: offsets %" PRIu64 "..%" PRIu64
				      " left the log before they were archived",
				      a->next, ev.offset);
			break;
		}
		int rolled;
		rc = cdc_segwriter_append(a->sw, ev.offset, ev.ts, ev.data, ev.len, &rolled, err,
					  errlen);
		if (rc)
			break;
		a->next++;
		(*copied)++;
	}
	if (rc < 0) {
		a->log->be->src_close(a->src);
		a->src = NULL;
	}
	if (*copied > 0) {
		int frc = cdc_segwriter_flush(a->sw, err, errlen);
		if (rc >= 0)
			rc = frc;
	}
	if (rc >= 0 && a->staging)
		rc = upload_staged(a, err, errlen);
	return rc < 0 ? rc : 0;
}

uint64_t cdc_archiver_next(const cdc_archiver *a)
{
	return a->next;
}

void cdc_archiver_close(cdc_archiver *a)
{
	if (a == NULL)
		return;
	if (a->src)
		a->log->be->src_close(a->src);
	cdc_segwriter_close(a->sw);
	if (a->staging)
		cdc_archive_view_close(a->log->archive, a->staging);
	free(a->shard);
	free(a);
}
