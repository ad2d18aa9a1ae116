/* Benchmark of the CDC archive's S3 client (issue #22): upload and download of one file
 * through src/cdc/s3.c (SigV4 by libcurl, SHA-256 of the file, multipart in 8 MiB parts,
 * checksum verified on read), to compare with curl(1) moving the same bytes (see
 * tests/bench/s3_archive_bench.sh, which runs both against radosgw). Never in make check.
 *
 *   s3_archive_bench ENDPOINT BUCKET FILE ROUNDS
 *
 * Credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. Prints one line per
 * direction: "stripedb-s3 put|get BYTES bytes ROUNDS rounds SECONDS s MiB/s".
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cdc/s3.h"
#include "common/clock.h"

int main(int argc, char **argv)
{
	char err[1024];
	cdc_s3 *s;
	struct stat st;
	if (argc != 5) {
		fprintf(stderr, "usage: s3_archive_bench ENDPOINT BUCKET FILE ROUNDS\n");
		return 2;
	}
	int rounds = atoi(argv[4]);
	if (stat(argv[3], &st) != 0 || rounds < 1) {
		fprintf(stderr, "s3_archive_bench: %s: no such file or bad ROUNDS\n", argv[3]);
		return 2;
	}
	cdc_s3_conf conf = {.endpoint = argv[1]};
	if (cdc_s3_open(argv[2], &conf, &s, err, sizeof err) != 0) {
		fprintf(stderr, "s3_archive_bench: %s\n", err);
		return 1;
	}
	const char *what[2] = {"put", "get"};
	for (int dir = 0; dir < 2; dir++) {
		uint64_t t0 = sdb_mono_ns();
		for (int i = 0; i < rounds; i++) {
			char key[64], *out = NULL;
			snprintf(key, sizeof key, "bench/obj-%d", i);
			int rc;
			if (dir == 0) {
				rc = cdc_s3_put_file(s, key, argv[3], err, sizeof err);
			} else {
				size_t n = snprintf(NULL, 0, "%s.back", argv[3]) + 1;
				out = malloc(n);
				snprintf(out, n, "%s.back", argv[3]);
				rc = cdc_s3_get_file(s, key, out, err, sizeof err);
				remove(out);
				free(out);
			}
			if (rc != 0) {
				fprintf(stderr, "s3_archive_bench: %s\n", err);
				cdc_s3_close(s);
				return 1;
			}
		}
		double secs = (double)(sdb_mono_ns() - t0) / 1e9;
		printf("stripedb-s3 %s %lld bytes %d rounds %.3f s %.1f MiB/s\n", what[dir],
		       (long long)st.st_size, rounds, secs,
		       (double)st.st_size * rounds / secs / (1024.0 * 1024.0));
	}
	cdc_s3_close(s);
	return 0;
}
