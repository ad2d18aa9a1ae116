/* The one builder of the MongoDB connection string every role and ctl uses to reach the
 * metadata service (a Raft group that answers as the replica set "stripedb-meta",
 * DESIGN.md §3). URI options: MongoDB's Connection String spec
 * (https://www.mongodb.com/docs/manual/reference/connection-string/). */
#ifndef SDB_COMMON_METAURI_H
#define SDB_COMMON_METAURI_H

#include <stdbool.h>

/* The replica-set name the metadata members report in hello. */
#define SDB_META_REPLICA_SET "stripedb-meta"

/* "mongodb://HOSTS/?replicaSet=stripedb-meta&..." for hosts "H:P[,H:P...]" (the --metadata
 * seeds), or "?directConnection=true&..." when direct (one member, e.g. to ask each seed
 * on its own). The timeouts are milliseconds; 0 leaves the option out (libmongoc's
 * default). Returns a heap string the caller frees; never NULL. Whether hosts parse is
 * libmongoc's to say when the URI is used. */
char *sdb_meta_uri(const char *hosts, bool direct, int server_selection_ms, int connect_ms,
		   int socket_ms);

#endif
