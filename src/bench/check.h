/* The history checker of `stripedb bench` and `stripedb demo` (a C counterpart of
 * tests/integration/checker.py, specialised to bench's histories).
 *
 * Model: every key is written by one thread, one operation at a time; each write sets the
 * document's field `v` to the key's next version (insert: 1), so a key is a register whose
 * writes carry increasing, unique values. Operation outcomes: ok (acknowledged), fail (a
 * definite error: not applied), unknown (network error or a routing error the proxy gave
 * up on: may or may not have been applied). Violations:
 *   - a read [t0, t1] that saw a value older than a write acknowledged before t0 (a stale
 *     read, e.g. served by a shard after the traffic switch), a value of no write that
 *     started before t1, or the value of a failed write;
 *   - an acknowledged update that matched no document although an earlier insert of the
 *     key was acknowledged (a lost document);
 *   - a final document whose v is not the last acknowledged value or the value of an
 *     unknown write after it; a missing final document whose insert was acknowledged; a
 *     document of no key in the history (a duplicate or a resurrected document).
 */
#ifndef SDB_BENCH_CHECK_H
#define SDB_BENCH_CHECK_H

#include <mongoc/mongoc.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/bench.h"

enum { BENCH_EV_INSERT = 0, BENCH_EV_UPDATE = 1, BENCH_EV_READ = 2 };
enum { BENCH_OK = 0, BENCH_FAIL = 1, BENCH_UNKNOWN = 2 };

/* One operation of the history. t0/t1: ns since the run's start (monotonic). */
typedef struct bench_ev {
	int64_t key;
	int64_t value; /* written version; for a read the version seen (0 = absent) */
	uint64_t t0, t1;
	int32_t n;     /* an update's matched count */
	uint8_t op;    /* BENCH_EV_* */
	uint8_t outcome;
} bench_ev;

/* The document id of key (bench.c), and back (-1 when id is not one of the workload's). */
void bench_key_id(const bench *b, int64_t key, char *buf, size_t n);
int64_t bench_key_parse(const bench *b, const char *id);

/* Check ev[0..n) (reordered in place) against the documents in c (read with a find of
 * {_id, v}); keys are in [0, maxkeys). Fills *v. Errors: SDB_EIO when the final read
 * failed (message in err). */
int bench_check_run(const bench *b, mongoc_collection_t *c, bench_ev *ev, size_t n,
		    int64_t maxkeys, bench_verdict *v, char *err, size_t errlen);

/* The same check with the final state given as an array: final[k] = v of key k's
 * document, 0 when absent, -1 for a document whose v is not a number; extra = number of
 * documents of unknown ids. For the unit test. */
void bench_check_history(bench_ev *ev, size_t n, const int64_t *final, int64_t maxkeys,
			 int64_t extra, bench_verdict *v);

#endif
