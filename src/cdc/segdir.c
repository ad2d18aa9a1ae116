/* CDC segment files: format, sequential reads, the single writer, recovery, copies.
 * See segdir.h for the byte layout. */
#include "cdc/segdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/err.h"

/* ---------------------------------------------------------------- encoding */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t rec_sum(const uint8_t *hdr, const uint8_t *data, size_t len)
{
	XXH32_state_t *st = XXH32_createState();
	uint32_t h;
	if (st == NULL)
		abort();
	XXH32_reset(st, 0);
	XXH32_update(st, hdr, 24);
	XXH32_update(st, data, len);
	h = XXH32_digest(st);
	XXH32_freeState(st);
	return h;
}

static void rec_header(uint8_t *hdr, uint64_t offset, uint64_t ts, const uint8_t *data,
		       size_t len)
{
	put32(hdr, CDC_REC_MAGIC);
	put32(hdr + 4, (uint32_t)len);
	put64(hdr + 8, offset);
	put64(hdr + 16, ts);
	put32(hdr + 24, rec_sum(hdr, data, len));
	put32(hdr + 28, 0);
}

static char *seg_path(const char *dir, uint64_t first, const char *ext)
{
	return sdb_asprintf("%s/%020" PRIu64 ".%s", dir, first, ext);
}

/* pread exactly n bytes; returns bytes read (short at EOF) or -1. */
static ssize_t pread_full(int fd, void *buf, size_t n, uint64_t pos)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(pos + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static int write_full(int fd, const void *buf, size_t n)
{
	size_t done = 0;
	while (done < n) {
		ssize_t r = write(fd, (const char *)buf + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		done += (size_t)r;
	}
	return 0;
}

int cdc_mkdirs(const char *path, char *err, size_t errlen)
{
	char *p = sdb_strdup(path);
	int rc = 0;
	for (char *s = p + 1;; s++) {
		if (*s == '/' || *s == '\0') {
			char c = *s;
			*s = '\0';
			if (mkdir(p, 0755) != 0 && errno != EEXIST) {
				rc = sdb_errf(err, errlen, SDB_EIO, "mkdir %s: %s", p, strerror(errno));
				break;
			}
			*s = c;
			if (c == '\0')
				break;
		}
	}
	free(p);
	return rc;
}

static void fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
}

/* ---------------------------------------------------------------- listing */

static int cmp_seg(const void *a, const void *b)
{
	const cdc_seginfo *x = a, *y = b;
	return x->first_offset < y->first_offset ? -1 : x->first_offset > y->first_offset;
}

/* Fill ranges of s from its index. */
static int seg_stat(const char *dir, cdc_seginfo *s, char *err, size_t errlen)
{
	char *ip = seg_path(dir, s->first_offset, "idx");
	char *sp = seg_path(dir, s->first_offset, "seg");
	struct stat st;
	int rc = 0;
	int fd = open(ip, O_RDONLY);
	s->next_offset = s->first_offset;
	s->first_ts = s->last_ts = 0;
	s->bytes = stat(sp, &st) == 0 ? (uint64_t)st.st_size : 0;
	if (fd < 0) {
		if (errno != ENOENT)
			rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", ip, strerror(errno));
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "stat %s: %s", ip, strerror(errno));
		goto out_fd;
	}
	uint64_t n = (uint64_t)st.st_size / CDC_IDX_ENT;
	if (n > 0) {
		uint8_t e[CDC_IDX_ENT];
		if (pread_full(fd, e, sizeof e, 0) != (ssize_t)sizeof e)
			goto out_fd;
		s->first_ts = get64(e);
		if (pread_full(fd, e, sizeof e, (n - 1) * CDC_IDX_ENT) != (ssize_t)sizeof e)
			goto out_fd;
		s->last_ts = get64(e);
		s->next_offset = s->first_offset + n;
	}
out_fd:
	close(fd);
out:
	free(ip);
	free(sp);
	return rc;
}

int cdc_segdir_list(const char *dir, cdc_seginfo **segs, size_t *n, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	size_t cap = 0;
	*segs = NULL;
	*n = 0;
	if (d == NULL) {
		if (errno == ENOENT)
			return 0;
		return sdb_errf(err, errlen, SDB_EIO, "opendir %s: %s", dir, strerror(errno));
	}
	while ((de = readdir(d)) != NULL) {
		size_t l = strlen(de->d_name);
		if (l != 24 || strcmp(de->d_name + 20, ".seg") != 0)
			continue;
		char *end;
		unsigned long long v = strtoull(de->d_name, &end, 10);
		if (end != de->d_name + 20)
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 16;
			*segs = sdb_realloc(*segs, cap * sizeof **segs);
		}
		memset(&(*segs)[*n], 0, sizeof **segs);
		(*segs)[(*n)++].first_offset = v;
	}
	closedir(d);
	if (*n > 1)
		sdb_qsort(*segs, *n, sizeof **segs, cmp_seg);
	for (size_t i = 0; i < *n; i++) {
		int rc = seg_stat(dir, &(*segs)[i], err, errlen);
		if (rc) {
			free(*segs);
			*segs = NULL;
			*n = 0;
			return rc;
		}
	}
	return 0;
}

int cdc_segdir_range(const char *dir, cdc_range *out, char *err, size_t errlen)
{
	cdc_seginfo *s;
	size_t n;
	int rc = cdc_segdir_list(dir, &s, &n, err, errlen);
	memset(out, 0, sizeof *out);
	if (rc)
		return rc;
	if (n > 0) {
		out->first_offset = s[0].first_offset;
		out->next_offset = s[n - 1].next_offset;
		for (size_t i = 0; i < n; i++)
			if (s[i].next_offset > s[i].first_offset) {
				out->first_ts = s[i].first_ts;
				break;
			}
		for (size_t i = n; i-- > 0;)
			if (s[i].next_offset > s[i].first_offset) {
				out->last_ts = s[i].last_ts;
				break;
			}
	}
	free(s);
	return 0;
}

int cdc_segdir_locate(const char *dir, uint64_t after_ts, uint64_t *offset, char *err,
		      size_t errlen)
{
	cdc_seginfo *s;
	size_t n;
	int rc = cdc_segdir_list(dir, &s, &n, err, errlen);
	if (rc)
		return rc;
	*offset = n ? s[n - 1].next_offset : 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i].next_offset == s[i].first_offset || s[i].last_ts <= after_ts)
			continue;
		/* binary search: first entry with ts > after_ts */
		char *ip = seg_path(dir, s[i].first_offset, "idx");
		int fd = open(ip, O_RDONLY);
		free(ip);
		if (fd < 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "open index: %s", strerror(errno));
			break;
		}
		uint64_t lo = 0, hi = s[i].next_offset - s[i].first_offset;
		while (lo < hi) {
			uint64_t mid = lo + (hi - lo) / 2;
			uint8_t e[CDC_IDX_ENT];
			if (pread_full(fd, e, sizeof e, mid * CDC_IDX_ENT) != (ssize_t)sizeof e) {
				rc = sdb_errf(err, errlen, SDB_EIO, "short index read");
				break;
			}
			if (get64(e) <= after_ts)
				lo = mid + 1;
			else
				hi = mid;
		}
		close(fd);
		*offset = s[i].first_offset + lo;
		break;
	}
	free(s);
	return rc;
}

/* ---------------------------------------------------------------- reading */

struct cdc_segread {
	char *dir;
	int fd;
	uint64_t seg_first; /* segment open in fd */
	uint64_t pos;       /* file position of the next record */
	uint64_t next;      /* offset of the next record */
	uint8_t *buf;
	size_t cap;
};

/* Position of record `offset` in segment seg (offset may be seg's next_offset). */
static int seg_pos(const char *dir, const cdc_seginfo *seg, uint64_t offset, uint64_t *pos,
		   char *err, size_t errlen)
{
	char *ip = seg_path(dir, seg->first_offset, "idx");
	int fd = open(ip, O_RDONLY);
	int rc = 0;
	uint8_t e[CDC_IDX_ENT];
	free(ip);
	*pos = 0;
	if (offset == seg->first_offset)
		goto out;
	if (fd < 0)
		return sdb_errf(err, errlen, SDB_EIO, "open index: %s", strerror(errno));
	uint64_t i = offset - seg->first_offset;
	if (offset == seg->next_offset)
		i--;
	if (pread_full(fd, e, sizeof e, i * CDC_IDX_ENT) != (ssize_t)sizeof e) {
		rc = sdb_errf(err, errlen, SDB_EIO, "short index read");
		goto out;
	}
	*pos = get64(e + 16);
	if (offset == seg->next_offset) {
		/* skip that last record */
		char *sp = seg_path(dir, seg->first_offset, "seg");
		int sfd = open(sp, O_RDONLY);
		uint8_t h[CDC_REC_HDR];
		free(sp);
		if (sfd < 0 || pread_full(sfd, h, sizeof h, *pos) != (ssize_t)sizeof h) {
			rc = sdb_errf(err, errlen, SDB_EIO, "segment shorter than its index");
			if (sfd >= 0)
				close(sfd);
			goto out;
		}
		close(sfd);
		*pos += CDC_REC_HDR + get32(h + 4);
	}
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

static int segread_switch(cdc_segread *r, uint64_t first, uint64_t pos, char *err, size_t errlen)
{
	char *sp = seg_path(r->dir, first, "seg");
	int fd = open(sp, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		free(sp);
		if (e == ENOENT)
			return sdb_errf(err, errlen, SDB_ENOTFOUND, "segment %" PRIu64 " is gone",
					first);
		return sdb_errf(err, errlen, SDB_EIO, "open segment: %s", strerror(e));
	}
	free(sp);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = fd;
	r->seg_first = first;
	r->pos = pos;
	return 0;
}

int cdc_segread_open(const char *dir, uint64_t offset, cdc_segread **out, char *err,
		     size_t errlen)
{
	cdc_seginfo *s;
	size_t n;
	int rc = cdc_segdir_list(dir, &s, &n, err, errlen);
	cdc_segread *r;
	if (rc)
		return rc;
	size_t i = 0;
	for (; i < n; i++)
		if (offset >= s[i].first_offset &&
		    (offset < s[i].next_offset || (i == n - 1 && offset == s[i].next_offset)))
			break;
	if (i == n) {
		rc = sdb_errf(err, errlen, SDB_ENOTFOUND, "offset %" PRIu64 " is not in %s", offset,
			      dir);
		free(s);
		return rc;
	}
	r = sdb_calloc(1, sizeof *r);
	r->dir = sdb_strdup(dir);
	r->fd = -1;
	r->next = offset;
	uint64_t pos;
	rc = seg_pos(dir, &s[i], offset, &pos, err, errlen);
	if (rc == 0)
		rc = segread_switch(r, s[i].first_offset, pos, err, errlen);
	free(s);
	if (rc) {
		cdc_segread_close(r);
		return rc;
	}
	*out = r;
	return 0;
}

/* Is the segment r reads closed (a later segment exists)? */
static int segread_closed(cdc_segread *r)
{
	cdc_seginfo *s;
	size_t n;
	char e[8];
	int closed = 0;
	if (cdc_segdir_list(r->dir, &s, &n, e, sizeof e) != 0)
		return 0;
	closed = n > 0 && s[n - 1].first_offset > r->seg_first;
	free(s);
	return closed;
}

int cdc_segread_next(cdc_segread *r, cdc_event *ev, char *err, size_t errlen)
{
	for (;;) {
		uint8_t h[CDC_REC_HDR];
		ssize_t got = pread_full(r->fd, h, sizeof h, r->pos);
		if (got < 0)
			return sdb_errf(err, errlen, SDB_EIO, "read segment: %s", strerror(errno));
		if (got < (ssize_t)sizeof h) {
			/* end of this segment: the next one starts at r->next when closed. An
			 * empty segment (r->next == its first offset: a log never written, or just
			 * rolled) has no successor yet: switching "to" r->next would reopen this
			 * very file forever (a migration of an empty chunk on an idle donor spun
			 * here: test_migrate_an_empty_chunk_of_an_idle_donor) */
			if (got == 0 && r->next != r->seg_first) {
				int rc = segread_switch(r, r->next, 0, err, errlen);
				if (rc == 0)
					continue;
				if (rc != SDB_ENOTFOUND)
					return rc;
			}
			return 0;
		}
		uint32_t len = get32(h + 4);
		int bad = get32(h) != CDC_REC_MAGIC || len > CDC_MAX_EVENT ||
			  get64(h + 8) != r->next;
		if (!bad) {
			if (len > r->cap) {
				r->buf = sdb_realloc(r->buf, len);
				r->cap = len;
			}
			got = pread_full(r->fd, r->buf, len, r->pos + CDC_REC_HDR);
			if (got < 0)
				return sdb_errf(err, errlen, SDB_EIO, "read segment: %s",
						strerror(errno));
			if (got < (ssize_t)len)
				return 0; /* being written */
			bad = rec_sum(h, r->buf, len) != get32(h + 24);
		}
		if (bad) {
			if (segread_closed(r))
				return sdb_errf(err, errlen, SDB_ECORRUPT,
						"damaged record at offset %" PRIu64 " (segment %" PRIu64
						", byte %" PRIu64 ")",
						r->next, r->seg_first, r->pos);
			return 0; /* the open segment's tail: incomplete or about to be cut */
		}
		ev->offset = r->next;
		ev->ts = get64(h + 16);
		ev->data = r->buf;
		ev->len = len;
		r->pos += CDC_REC_HDR + len;
		r->next++;
		return 1;
	}
}

void cdc_segread_close(cdc_segread *r)
{
	if (r == NULL)
		return;
	if (r->fd >= 0)
		close(r->fd);
	free(r->dir);
	free(r->buf);
	free(r);
}

/* ---------------------------------------------------------------- writing */

struct cdc_segwriter {
	char *dir;
	int lock_fd;
	int seg_fd, idx_fd;
	uint64_t seg_first;
	uint64_t seg_bytes; /* size of the open segment */
	uint64_t next;
	uint64_t last_ts;
	uint64_t segment_bytes;
	cdc_fsync_policy fsync;
	int dirty;
};

static int open_seg_files(cdc_segwriter *w, uint64_t first, int create, char *err, size_t errlen)
{
	char *sp = seg_path(w->dir, first, "seg");
	char *ip = seg_path(w->dir, first, "idx");
	int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
	int rc = 0;
	w->seg_fd = open(sp, flags, 0644);
	if (w->seg_fd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", sp, strerror(errno));
		goto out;
	}
	w->idx_fd = open(ip, O_RDWR | O_CREAT | O_CLOEXEC | (create ? O_TRUNC : 0), 0644);
	if (w->idx_fd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", ip, strerror(errno));
		close(w->seg_fd);
		w->seg_fd = -1;
		goto out;
	}
	w->seg_first = first;
	if (create)
		fsync_dir(w->dir);
out:
	free(sp);
	free(ip);
	return rc;
}

/* Scan the open (last) segment, cut a torn tail, rebuild its index. */
static int recover_last(cdc_segwriter *w, char *err, size_t errlen)
{
	uint64_t pos = 0, off = w->seg_first;
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rc = 0;
	if (ftruncate(w->idx_fd, 0) != 0)
		return sdb_errf(err, errlen, SDB_EIO, "truncate index: %s", strerror(errno));
	for (;;) {
		uint8_t h[CDC_REC_HDR], e[CDC_IDX_ENT];
		if (pread_full(w->seg_fd, h, sizeof h, pos) != (ssize_t)sizeof h)
			break;
		uint32_t len = get32(h + 4);
		if (get32(h) != CDC_REC_MAGIC || len > CDC_MAX_EVENT || get64(h + 8) != off)
			break;
		if (len > cap) {
			buf = sdb_realloc(buf, len);
			cap = len;
		}
		if (pread_full(w->seg_fd, buf, len, pos + CDC_REC_HDR) != (ssize_t)len ||
		    rec_sum(h, buf, len) != get32(h + 24))
			break;
		put64(e, get64(h + 16));
		put64(e + 8, off);
		put64(e + 16, pos);
		if (pwrite(w->idx_fd, e, sizeof e, (off_t)((off - w->seg_first) * CDC_IDX_ENT)) !=
		    (ssize_t)sizeof e) {
			rc = sdb_errf(err, errlen, SDB_EIO, "write index: %s", strerror(errno));
			goto out;
		}
		w->last_ts = get64(h + 16);
		pos += CDC_REC_HDR + len;
		off++;
	}
	struct stat st;
	if (fstat(w->seg_fd, &st) == 0 && (uint64_t)st.st_size > pos) {
		if (ftruncate(w->seg_fd, (off_t)pos) != 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "truncate torn tail: %s", strerror(errno));
			goto out;
		}
		(void)fsync(w->seg_fd);
	}
	(void)fsync(w->idx_fd);
	w->seg_bytes = pos;
	w->next = off;
	if (lseek(w->seg_fd, (off_t)pos, SEEK_SET) < 0 ||
	    lseek(w->idx_fd, (off_t)((off - w->seg_first) * CDC_IDX_ENT), SEEK_SET) < 0)
		rc = sdb_errf(err, errlen, SDB_EIO, "seek: %s", strerror(errno));
out:
	free(buf);
	return rc;
}

int cdc_segwriter_open(const char *dir, cdc_fsync_policy fsync, uint64_t segment_bytes,
		       uint64_t first_if_empty, cdc_segwriter **out, uint64_t *next_offset,
		       uint64_t *last_ts, char *err, size_t errlen)
{
	cdc_segwriter *w;
	cdc_seginfo *s = NULL;
	size_t n = 0;
	int rc = cdc_mkdirs(dir, err, errlen);
	if (rc)
		return rc;
	w = sdb_calloc(1, sizeof *w);
	w->dir = sdb_strdup(dir);
	w->seg_fd = w->idx_fd = -1;
	w->fsync = fsync;
	w->segment_bytes = segment_bytes ? segment_bytes : 64u << 20;
	char *lp = sdb_asprintf("%s/LOCK", dir);
	w->lock_fd = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	free(lp);
	if (w->lock_fd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s/LOCK: %s", dir, strerror(errno));
		goto fail;
	}
	if (flock(w->lock_fd, LOCK_EX | LOCK_NB) != 0) {
		rc = errno == EWOULDBLOCK
			     ? sdb_errf(err, errlen, SDB_EBUSY,
					"%s is locked by another writer", dir)
			     : sdb_errf(err, errlen, SDB_EIO, "flock: %s", strerror(errno));
		goto fail;
	}
	rc = cdc_segdir_list(dir, &s, &n, err, errlen);
	if (rc)
		goto fail;
	if (n == 0) {
		rc = open_seg_files(w, first_if_empty, 1, err, errlen);
		if (rc)
			goto fail;
		w->next = first_if_empty;
	} else {
		rc = open_seg_files(w, s[n - 1].first_offset, 0, err, errlen);
		if (rc)
			goto fail;
		/* ts of the event before this segment, in case it is empty */
		for (size_t i = n - 1; i-- > 0;)
			if (s[i].next_offset > s[i].first_offset) {
				w->last_ts = s[i].last_ts;
				break;
			}
		rc = recover_last(w, err, errlen);
		if (rc)
			goto fail;
	}
	free(s);
	*next_offset = w->next;
	*last_ts = w->last_ts;
	*out = w;
	return 0;
fail:
	free(s);
	cdc_segwriter_close(w);
	return rc;
}

static int roll(cdc_segwriter *w, char *err, size_t errlen)
{
	if (w->fsync != CDC_FSYNC_NEVER && (fsync(w->seg_fd) != 0 || fsync(w->idx_fd) != 0))
		return sdb_errf(err, errlen, SDB_EIO, "fsync segment: %s", strerror(errno));
	close(w->seg_fd);
	close(w->idx_fd);
	w->seg_fd = w->idx_fd = -1;
	w->seg_bytes = 0;
	w->dirty = 0;
	return open_seg_files(w, w->next, 1, err, errlen);
}

int cdc_segwriter_append(cdc_segwriter *w, uint64_t offset, uint64_t ts, const uint8_t *data,
			 size_t len, int *rolled, char *err, size_t errlen)
{
	uint8_t h[CDC_REC_HDR], e[CDC_IDX_ENT];
	int rc;
	*rolled = 0;
	if (offset != w->next)
		return sdb_errf(err, errlen, SDB_EINVAL, "append at offset %" PRIu64 ", expected %" PRIu64,
				offset, w->next);
	if (len > CDC_MAX_EVENT)
		return sdb_errf(err, errlen, SDB_ETOOBIG, "event of %zu bytes", len);
	if (w->seg_bytes >= w->segment_bytes && w->next > w->seg_first) {
		rc = roll(w, err, errlen);
		if (rc)
			return rc;
		*rolled = 1;
	}
	rec_header(h, offset, ts, data, len);
	struct iovec iov[2] = {{h, sizeof h}, {(void *)data, len}};
	size_t want = sizeof h + len, done = 0;
	while (done < want) {
		ssize_t r = pwritev(w->seg_fd, iov, 2, (off_t)(w->seg_bytes + done));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return sdb_errf(err, errlen, SDB_EIO, "write segment: %s", strerror(errno));
		done += (size_t)r;
		/* advance the iovecs past what was written */
		size_t skip = (size_t)r;
		for (int i = 0; i < 2; i++) {
			size_t k = skip < iov[i].iov_len ? skip : iov[i].iov_len;
			iov[i].iov_base = (char *)iov[i].iov_base + k;
			iov[i].iov_len -= k;
			skip -= k;
		}
	}
	put64(e, ts);
	put64(e + 8, offset);
	put64(e + 16, w->seg_bytes);
	if (pwrite(w->idx_fd, e, sizeof e, (off_t)((offset - w->seg_first) * CDC_IDX_ENT)) !=
	    (ssize_t)sizeof e)
		return sdb_errf(err, errlen, SDB_EIO, "write index: %s", strerror(errno));
	w->seg_bytes += want;
	w->next++;
	w->last_ts = ts;
	w->dirty = 1;
	return 0;
}

int cdc_segwriter_flush(cdc_segwriter *w, char *err, size_t errlen)
{
	if (w->dirty && w->fsync == CDC_FSYNC_BATCH && fdatasync(w->seg_fd) != 0)
		return sdb_errf(err, errlen, SDB_EIO, "fsync segment: %s", strerror(errno));
	w->dirty = 0;
	return 0;
}

void cdc_segwriter_close(cdc_segwriter *w)
{
	if (w == NULL)
		return;
	if (w->seg_fd >= 0) {
		if (w->fsync != CDC_FSYNC_NEVER)
			(void)fsync(w->seg_fd);
		close(w->seg_fd);
	}
	if (w->idx_fd >= 0)
		close(w->idx_fd);
	if (w->lock_fd >= 0)
		close(w->lock_fd); /* releases the flock */
	free(w->dir);
	free(w);
}

/* ---------------------------------------------------------------- copy, remove */

static int copy_file(const char *src, const char *dst, char *err, size_t errlen)
{
	char *tmp = sdb_asprintf("%s.tmp", dst);
	int in = open(src, O_RDONLY | O_CLOEXEC);
	int outfd = -1, rc = 0;
	char *buf = NULL;
	if (in < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", src, strerror(errno));
		goto out;
	}
	outfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (outfd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", tmp, strerror(errno));
		goto out;
	}
	buf = sdb_malloc(1 << 20);
	for (;;) {
		ssize_t r = read(in, buf, 1 << 20);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "read %s: %s", src, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		if (write_full(outfd, buf, (size_t)r) != 0) {
			rc = sdb_errf(err, errlen, SDB_EIO, "write %s: %s", tmp, strerror(errno));
			goto out;
		}
	}
	if (fsync(outfd) != 0 || rename(tmp, dst) != 0)
		rc = sdb_errf(err, errlen, SDB_EIO, "commit %s: %s", dst, strerror(errno));
out:
	free(buf);
	if (in >= 0)
		close(in);
	if (outfd >= 0)
		close(outfd);
	free(tmp);
	return rc;
}

int cdc_segdir_copy(const char *src_dir, const char *dst_dir, uint64_t first_offset, char *err,
		    size_t errlen)
{
	int rc = cdc_mkdirs(dst_dir, err, errlen);
	/* the index first: a .seg without .idx is never listed with a wrong range */
	const char *ext[2] = {"idx", "seg"};
	for (int i = 0; rc == 0 && i < 2; i++) {
		char *s = seg_path(src_dir, first_offset, ext[i]);
		char *d = seg_path(dst_dir, first_offset, ext[i]);
		rc = copy_file(s, d, err, errlen);
		free(s);
		free(d);
	}
	if (rc == 0)
		fsync_dir(dst_dir);
	return rc;
}

int cdc_segdir_remove(const char *dir, uint64_t first_offset, char *err, size_t errlen)
{
	char *s = seg_path(dir, first_offset, "seg");
	char *i = seg_path(dir, first_offset, "idx");
	int rc = 0;
	/* the .seg first: listing goes by .seg names */
	if (unlink(s) != 0 && errno != ENOENT)
		rc = sdb_errf(err, errlen, SDB_EIO, "unlink %s: %s", s, strerror(errno));
	if (rc == 0 && unlink(i) != 0 && errno != ENOENT)
		rc = sdb_errf(err, errlen, SDB_EIO, "unlink %s: %s", i, strerror(errno));
	free(s);
	free(i);
	if (rc == 0)
		fsync_dir(dir);
	return rc;
}
