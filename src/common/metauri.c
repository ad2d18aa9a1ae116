/* The metadata service's connection string (see metauri.h). */
#include <stdio.h>

#include "common/alloc.h"
#include "common/metauri.h"

/* Append "&NAME=MS" to the n-byte opts buffer at *o when ms > 0. */
static void opt(char *buf, size_t n, size_t *o, const char *name, int ms)
{
	int w;

	if (ms <= 0 || *o >= n)
		return;
	w = snprintf(buf + *o, n - *o, "&%s=%d", name, ms);
	if (w > 0)
		*o += (size_t)w;
}

char *sdb_meta_uri(const char *hosts, bool direct, int server_selection_ms, int connect_ms,
		   int socket_ms)
{
	char opts[160];
	size_t o = 0;

	opt(opts, sizeof opts, &o, "serverSelectionTimeoutMS", server_selection_ms);
	opt(opts, sizeof opts, &o, "connectTimeoutMS", connect_ms);
	opt(opts, sizeof opts, &o, "socketTimeoutMS", socket_ms);
	opts[o < sizeof opts ? o : sizeof opts - 1] = '\0';
	return sdb_asprintf("mongodb://%s/?%s%s", hosts,
			    direct ? "directConnection=true" : "replicaSet=" SDB_META_REPLICA_SET,
			    opts);
}
