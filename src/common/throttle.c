/* The import throttle rule; see throttle.h. */
#include "common/throttle.h"

int64_t sdb_import_backoff_ms(int64_t took_us, int64_t limit_ms)
{
	if (limit_ms <= 0 || took_us <= limit_ms * 1000)
		return 0;
	return took_us / 1000;
}
