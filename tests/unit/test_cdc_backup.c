/* Unit tests of the incomplete-backup rules of src/cdc/backup.c (issue #22): which
 * incomplete backup is certainly dead (cdc_backup_orphan_dead), and the scan, delete and
 * sweep of backups in a file: archive, at an injected "now". */

/* The module under test, compiled into this binary (statics included), not taken from
 * libstripedb.a: see UNIT_LDADD in Makefile.am. */
#include "../../src/cdc/backup.c"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdc/archive.h"
#include "cdc/backup.h"
#include "common/err.h"

#define HOUR (3600LL * 1000)
/* 2026-12-02T12:00:00.000Z */
#define NOW 1796212800000LL

static void test_orphan_dead_rules(void **state)
{
	(void)state;
	char old[40], young[40], newer[40];
	cdc_backup_id(NOW - 25 * HOUR, old, sizeof old);
	cdc_backup_id(NOW - 23 * HOUR, young, sizeof young);
	cdc_backup_id(NOW - 1 * HOUR, newer, sizeof newer);
	assert_string_equal(old, "20261201T110000.000Z");
	/* older than 24 h and than the newest committed backup: dead */
	assert_true(cdc_backup_orphan_dead(old, newer, NOW));
	/* younger than 24 h: kept, even with a newer committed backup */
	assert_false(cdc_backup_orphan_dead(young, newer, NOW));
	/* no committed backup, or none newer: kept, however old */
	assert_false(cdc_backup_orphan_dead(old, "", NOW));
	assert_false(cdc_backup_orphan_dead(old, old, NOW));
	char older[40];
	cdc_backup_id(NOW - 30 * HOUR, older, sizeof older);
	assert_false(cdc_backup_orphan_dead(old, older, NOW));
	/* the boundary: exactly 24 h is not older than 24 h */
	char edge[40];
	cdc_backup_id(NOW - CDC_BACKUP_ORPHAN_AGE_MS, edge, sizeof edge);
	assert_false(cdc_backup_orphan_dead(edge, newer, NOW));
	cdc_backup_id(NOW - CDC_BACKUP_ORPHAN_AGE_MS - 1, edge, sizeof edge);
	assert_true(cdc_backup_orphan_dead(edge, newer, NOW));
	/* not a backup id: never */
	assert_false(cdc_backup_orphan_dead("2019", newer, NOW));
	assert_false(cdc_backup_orphan_dead("0000000000000000000", newer, NOW));
	assert_false(cdc_backup_orphan_dead("20190101T000000.000X", newer, NOW));
	assert_false(cdc_backup_orphan_dead("2019010aT000000.000Z", newer, NOW));
}

static char root[] = "/tmp/sdb-test-backup-XXXXXX";

/* An object holding "x" as key in a. */
static void put(cdc_archive *a, const char *key)
{
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/src", root);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	fputs("x", f);
	fclose(f);
	assert_int_equal(cdc_archive_obj_put(a, key, path, err, sizeof err), 0);
	unlink(path);
}

static int exists(const char *key)
{
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/arch/%s", root, key);
	return stat(path, &st) == 0;
}

static void test_scan_sweep_delete(void **state)
{
	(void)state;
	char spec[300], err[512];
	cdc_archive *a;
	assert_non_null(mkdtemp(root));
	snprintf(spec, sizeof spec, "file:%s/arch", root);
	assert_int_equal(cdc_archive_open(spec, NULL, &a, err, sizeof err), 0);
	char c_old[40], o_dead[40], o_young[40], c_new[40], o_after[40];
	cdc_backup_id(NOW - 50 * HOUR, c_old, sizeof c_old);   /* committed */
	cdc_backup_id(NOW - 40 * HOUR, o_dead, sizeof o_dead); /* incomplete, dead */
	cdc_backup_id(NOW - 30 * HOUR, c_new, sizeof c_new);   /* committed, the newest */
	cdc_backup_id(NOW - 26 * HOUR, o_after, sizeof o_after); /* old, but after c_new */
	cdc_backup_id(NOW - 2 * HOUR, o_young, sizeof o_young); /* incomplete, young */
	const char *ids[] = {c_old, o_dead, c_new, o_after, o_young};
	int committed[] = {1, 0, 1, 0, 0};
	char key[256];
	for (int i = 0; i < 5; i++) {
		for (int d = 0; d < 2; d++) {
			snprintf(key, sizeof key, "backups/shard-a/%s/data-%05d.bson", ids[i], d);
			put(a, key);
		}
		if (committed[i]) {
			snprintf(key, sizeof key, "backups/shard-a/%s/manifest.json", ids[i]);
			put(a, key);
		}
	}
	/* another shard (whose name shard-a is a prefix of) is not part of shard-a */
	snprintf(key, sizeof key, "backups/shard-ab/%s/data-00000.bson", o_dead);
	put(a, key);

	cdc_backup_ent *e;
	size_t n;
	assert_int_equal(cdc_backup_scan(a, "shard-a", &e, &n, err, sizeof err), 0);
	assert_int_equal(n, 5);
	for (size_t i = 0; i < n; i++) {
		assert_string_equal(e[i].shard, "shard-a");
		assert_string_equal(e[i].id, ids[i]);
		assert_int_equal(e[i].committed, committed[i]);
		assert_int_equal(e[i].objects, committed[i] ? 3 : 2);
	}
	cdc_backup_ents_free(e, n);
	assert_int_equal(cdc_backup_scan(a, NULL, &e, &n, err, sizeof err), 0);
	assert_int_equal(n, 6);
	cdc_backup_ents_free(e, n);

	/* only o_dead goes: o_after is newer than the newest committed, o_young is young */
	size_t removed, kept;
	assert_int_equal(cdc_backup_sweep(a, "shard-a", NOW, &removed, &kept, err, sizeof err), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(kept, 2);
	snprintf(key, sizeof key, "backups/shard-a/%s/data-00000.bson", o_dead);
	assert_false(exists(key));
	snprintf(key, sizeof key, "backups/shard-ab/%s/data-00000.bson", o_dead);
	assert_true(exists(key));
	for (int i = 0; i < 5; i++) {
		snprintf(key, sizeof key, "backups/shard-a/%s/data-00001.bson", ids[i]);
		assert_int_equal(exists(key), i != 1);
	}
	/* a second sweep finds nothing more */
	assert_int_equal(cdc_backup_sweep(a, "shard-a", NOW, &removed, &kept, err, sizeof err), 0);
	assert_int_equal(removed, 0);
	assert_int_equal(kept, 2);

	/* delete by hand: a committed one (manifest and data), an incomplete one, a missing one */
	size_t d;
	assert_int_equal(cdc_backup_delete(a, "shard-a", c_old, &d, err, sizeof err), 0);
	assert_int_equal(d, 3);
	assert_int_equal(cdc_backup_delete(a, "shard-a", o_young, &d, err, sizeof err), 0);
	assert_int_equal(d, 2);
	assert_int_equal(cdc_backup_delete(a, "shard-a", o_young, &d, err, sizeof err), 0);
	assert_int_equal(d, 0);
	assert_int_equal(cdc_backup_scan(a, "shard-a", &e, &n, err, sizeof err), 0);
	assert_int_equal(n, 2);
	assert_string_equal(e[0].id, c_new);
	assert_string_equal(e[1].id, o_after);
	cdc_backup_ents_free(e, n);
	cdc_archive_close(a);
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_orphan_dead_rules),
		cmocka_unit_test(test_scan_sweep_delete),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
