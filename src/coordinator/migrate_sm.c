/* Helpers of the migration runner (see migrate.h). The state table itself is
 * raft/migstate.c. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "coordinator/migrate.h"

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

int64_t migrate_percentile(int64_t *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	sdb_qsort(v, n, sizeof *v, cmp_i64);
	/* nearest rank: ceil(p/100 * n), at least 1 */
	double r = p / 100.0 * (double)n;
	size_t k = (size_t)r;
	if ((double)k < r)
		k++;
	if (k < 1)
		k = 1;
	if (k > n)
		k = n;
	return v[k - 1];
}
