/* The CDC archive: closed segments of every shard's log kept in object storage after the
 * log's retention drops them (DESIGN.md §7). Backend `file:DIR` (a directory, e.g. a
 * mounted bucket); the layout is the segment directory of segdir.h under DIR/<shard>/, so
 * archived events are read with the same code as the live embedded log.
 */
#ifndef SDB_CDC_ARCHIVE_H
#define SDB_CDC_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

#include "cdc/log.h"

/* Open "file:DIR" (DIR created when missing). Errors: SDB_EINVAL (other scheme),
 * SDB_EIO. Free with cdc_archive_close. */
int cdc_archive_open(const char *spec, cdc_archive **out, char *err, size_t errlen);
void cdc_archive_close(cdc_archive *a);

/* Directory holding shard's archived segments (heap string, caller frees). */
char *cdc_archive_dir(const cdc_archive *a, const char *shard);

/* Copy the closed segment first_offset of live_dir into the archive, durably, before the
 * caller deletes it. Idempotent. Errors: SDB_EIO. */
int cdc_archive_put(cdc_archive *a, const char *shard, const char *live_dir,
		    uint64_t first_offset, char *err, size_t errlen);

/* Offsets and ts the archive holds for shard (all 0 when nothing). Errors: SDB_EIO. */
int cdc_archive_range(cdc_archive *a, const char *shard, cdc_range *out, char *err,
		      size_t errlen);

#endif
