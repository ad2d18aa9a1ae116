/* Snapshot installation for shard replica sets (issue #15): a member that fell behind
 * the set's compacted Raft log copies a consistent shard.db from another member, with
 * bounded memory on both sides. Contract in snapfile.h. */
#include "shard/snapfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mongoc/mongoc.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "shard/util.h"

#define SNAP_CHUNK (8u * 1024 * 1024)
#define SNAP_MAX_AGE_S (30 * 60)

static const char *data_dir(shard *sh)
{
	return sdb_config_get(sh->role->cfg, SDB_OPT_data_dir);
}

static void sha256(const void *data, size_t len, uint8_t out[32])
{
	unsigned int n = 32;
	EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

/* Remove copies left by transfers that never closed (older than SNAP_MAX_AGE_S). */
static void reap_old(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	time_t now = time(NULL);
	if (!d)
		return;
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		char *p;
		if (strncmp(e->d_name, "out-", 4) != 0)
			continue;
		p = sdb_asprintf("%s/%s", dir, e->d_name);
		if (stat(p, &st) == 0 && now - st.st_mtime > SNAP_MAX_AGE_S)
			unlink(p);
		free(p);
	}
	closedir(d);
}

/* An id is 16 hex digits: nothing else reaches a path. */
static bool valid_id(const char *id)
{
	if (!id || strlen(id) != 16)
		return false;
	for (const char *p = id; *p; p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return true;
}

void shard_cmd_snapshot_file(shard_ctx *x)
{
	bson_iter_t it;
	const char *verb = NULL, *id = NULL;
	int64_t offset = 0, length = SNAP_CHUNK;
	char *dir = sdb_asprintf("%s/snapshots", data_dir(x->sh));

	if (bson_iter_init(&it, x->cmd) && bson_iter_next(&it) && BSON_ITER_HOLDS_UTF8(&it))
		verb = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, x->cmd, "id") && BSON_ITER_HOLDS_UTF8(&it))
		id = bson_iter_utf8(&it, NULL);
	if (bson_iter_init_find(&it, x->cmd, "offset") &&
	    !util_get_int(x, "stripedbSnapshotFile", &it, 0, INT64_MAX, &offset))
		goto out;
	if (bson_iter_init_find(&it, x->cmd, "length") &&
	    !util_get_int(x, "stripedbSnapshotFile", &it, 1, SNAP_CHUNK, &length))
		goto out;
	if (verb && strcmp(verb, "open") == 0) {
		uint8_t rnd[8];
		char hex[17];
		uint64_t applied = 0;
		struct stat st;
		if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
			shard_fail(x, WIRE_ERR_INTERNAL, "no randomness for a snapshot id");
			goto out;
		}
		for (int i = 0; i < 8; i++)
			snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
		if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
			shard_fail(x, WIRE_ERR_INTERNAL, "mkdir %s: %s", dir, strerror(errno));
			goto out;
		}
		reap_old(dir);
		char *path = sdb_asprintf("%s/out-%s.db", dir, hex);
		/* the receiver's page size (pageSize, sent since 8 KiB pages); without it the
		 * receiver is of a release of 4 KiB pages that installs no other size */
		int64_t page_size = 4096;
		bson_iter_t pit;
		if (bson_iter_init_find(&pit, x->cmd, "pageSize") &&
		    !util_get_int(x, "stripedbSnapshotFile", &pit, 512, 65536, &page_size)) {
			free(path);
			goto out;
		}
		if (page_size & (page_size - 1)) {
			free(path);
			shard_fail(x, WIRE_ERR_BAD_VALUE,
				   "stripedbSnapshotFile pageSize must be a power of two");
			goto out;
		}
		int rc = sdb_store_copy_to(x->conn, path, (int)page_size, &applied, x->err,
					   sizeof x->err);
		if (rc || stat(path, &st) != 0) {
			free(path);
			shard_fail(x, WIRE_ERR_INTERNAL, "snapshot copy: %s", x->err);
			goto out;
		}
		free(path);
		bson_t *reply = bson_new();
		BSON_APPEND_UTF8(reply, "id", hex);
		BSON_APPEND_INT64(reply, "size", (int64_t)st.st_size);
		BSON_APPEND_INT64(reply, "applied", (int64_t)applied);
		sdb_info("shard: snapshot copy ready for a member", "id=%s bytes=%lld applied=%llu",
			 hex, (long long)st.st_size, (unsigned long long)applied);
		wire_req_reply(x->req, reply);
	} else if (verb && strcmp(verb, "read") == 0 && valid_id(id)) {
		char *path = sdb_asprintf("%s/out-%s.db", dir, id);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		free(path);
		if (fd < 0) {
			shard_fail(x, WIRE_ERR_NAMESPACE_NOT_FOUND, "no snapshot copy %s", id);
			goto out;
		}
		uint8_t *buf = sdb_malloc((size_t)length);
		ssize_t n = pread(fd, buf, (size_t)length, (off_t)offset);
		close(fd);
		if (n < 0) {
			free(buf);
			shard_fail(x, WIRE_ERR_INTERNAL, "read snapshot copy: %s", strerror(errno));
			goto out;
		}
		uint8_t sum[32];
		sha256(buf, (size_t)n, sum);
		bson_t *reply = bson_new();
		bson_append_binary(reply, "data", -1, BSON_SUBTYPE_BINARY, buf, (uint32_t)n);
		bson_append_binary(reply, "sha256", -1, BSON_SUBTYPE_BINARY, sum, 32);
		free(buf);
		wire_req_reply(x->req, reply);
	} else if (verb && strcmp(verb, "close") == 0 && valid_id(id)) {
		char *path = sdb_asprintf("%s/out-%s.db", dir, id);
		unlink(path);
		free(path);
		wire_req_reply(x->req, NULL);
	} else {
		shard_fail(x, WIRE_ERR_BAD_VALUE,
			   "stripedbSnapshotFile must be \"open\", or \"read\"/\"close\" with the id "
			   "an open returned");
	}
out:
	free(dir);
}

/* ------------------------------------------------------------------ the receiving side */

static bool run(mongoc_client_t *c, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	bson_error_t e;
	if (mongoc_client_command_simple(c, "admin", cmd, NULL, reply, &e))
		return true;
	sdb_errf(err, errlen, SDB_EIO, "%s", e.message);
	return false;
}

int shard_snapshot_fetch(shard *sh, sdb_store_conn *conn, const char *source,
			 uint64_t need_applied, uint64_t *applied, char *err, size_t errlen)
{
	char *uri = sdb_asprintf("mongodb://%s/?directConnection=true&connectTimeoutMS=2000&"
				 "serverSelectionTimeoutMS=5000&socketTimeoutMS=600000",
				 source);
	mongoc_client_t *c = auth_cluster_client_new(uri);
	char *dir = sdb_asprintf("%s/snapshots", data_dir(sh));
	char *path = sdb_asprintf("%s/in.db", dir);
	bson_t cmd, reply;
	bson_iter_t it;
	char id[17] = "";
	int64_t size = 0, got = 0;
	uint64_t src_applied = 0;
	int fd = -1, rc = SDB_EIO;
	double t0 = (double)sdb_mono_ms();

	free(uri);
	if (!c) {
		rc = sdb_errf(err, errlen, SDB_EIO, "snapshot: no client for %s", source);
		goto out;
	}
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		rc = sdb_errf(err, errlen, SDB_EIO, "mkdir %s: %s", dir, strerror(errno));
		goto out;
	}
	bson_init(&cmd);
	BSON_APPEND_UTF8(&cmd, "stripedbSnapshotFile", "open");
	/* the copy at this store's page size (a sender of before 8 KiB pages ignores it and
	 * sends its own: sdb_store_replace_from converts then) */
	int my_page = sdb_store_page_size(conn);
	if (my_page > 0)
		BSON_APPEND_INT32(&cmd, "pageSize", my_page);
	bool ok = run(c, &cmd, &reply, err, errlen);
	bson_destroy(&cmd);
	if (ok && bson_iter_init_find(&it, &reply, "id") && BSON_ITER_HOLDS_UTF8(&it))
		snprintf(id, sizeof id, "%s", bson_iter_utf8(&it, NULL));
	if (ok && bson_iter_init_find(&it, &reply, "size"))
		size = bson_iter_as_int64(&it);
	if (ok && bson_iter_init_find(&it, &reply, "applied"))
		src_applied = (uint64_t)bson_iter_as_int64(&it);
	bson_destroy(&reply);
	if (!ok)
		goto out;
	if (!id[0] || size <= 0 || src_applied < need_applied) {
		rc = sdb_errf(err, errlen, SDB_EIO,
			      "snapshot from %s is not usable (size %lld, applied %llu, need %llu)",
			      source, (long long)size, (unsigned long long)src_applied,
			      (unsigned long long)need_applied);
		goto close_remote;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "open %s: %s", path, strerror(errno));
		goto close_remote;
	}
	while (got < size) {
		const uint8_t *data = NULL, *sum = NULL;
		uint32_t len = 0, slen = 0;
		bson_subtype_t st;
		uint8_t mine[32];
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "stripedbSnapshotFile", "read");
		BSON_APPEND_UTF8(&cmd, "id", id);
		BSON_APPEND_INT64(&cmd, "offset", got);
		BSON_APPEND_INT64(&cmd, "length", SNAP_CHUNK);
		ok = run(c, &cmd, &reply, err, errlen);
		bson_destroy(&cmd);
		if (ok && bson_iter_init_find(&it, &reply, "data") && BSON_ITER_HOLDS_BINARY(&it))
			bson_iter_binary(&it, &st, &len, &data);
		if (ok && bson_iter_init_find(&it, &reply, "sha256") && BSON_ITER_HOLDS_BINARY(&it))
			bson_iter_binary(&it, &st, &slen, &sum);
		if (ok && data && len > 0 && sum && slen == 32) {
			sha256(data, len, mine);
			if (memcmp(mine, sum, 32) != 0) {
				ok = false;
				sdb_errf(err, errlen, SDB_ECORRUPT,
					 "snapshot chunk at %lld from %s: checksum mismatch",
					 (long long)got, source);
			} else if (write(fd, data, len) != (ssize_t)len) {
				ok = false;
				sdb_errf(err, errlen, SDB_EIO, "write %s: %s", path, strerror(errno));
			}
		} else if (ok) {
			ok = false;
			sdb_errf(err, errlen, SDB_EIO, "snapshot from %s ended at %lld of %lld bytes",
				 source, (long long)got, (long long)size);
		}
		bson_destroy(&reply);
		if (!ok)
			goto close_remote;
		got += len;
	}
	if (fsync(fd) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "fsync %s: %s", path, strerror(errno));
		goto close_remote;
	}
	close(fd);
	fd = -1;
	rc = sdb_store_replace_from(conn, path, applied, err, errlen);
	if (rc == 0)
		sdb_info("shard: installed a snapshot from another member",
			 "source=%s bytes=%lld applied=%llu ms=%.0f", source, (long long)size,
			 (unsigned long long)*applied, (double)sdb_mono_ms() - t0);
close_remote:
	if (id[0]) {
		bson_init(&cmd);
		BSON_APPEND_UTF8(&cmd, "stripedbSnapshotFile", "close");
		BSON_APPEND_UTF8(&cmd, "id", id);
		char e2[64];
		if (run(c, &cmd, &reply, e2, sizeof e2))
			bson_destroy(&reply);
		else
			bson_destroy(&reply);
		bson_destroy(&cmd);
	}
out:
	if (fd >= 0)
		close(fd);
	unlink(path);
	if (c)
		mongoc_client_destroy(c);
	free(path);
	free(dir);
	return rc;
}
