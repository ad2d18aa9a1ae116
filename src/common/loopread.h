/* Which finds a shard runs on its event loop thread (issue #19), shared by the shard
 * (shard/commands.c read_inline_candidate: a worker runs the others) and the proxy
 * (proxy/forwarder.c: only finds a shard runs there go together on one connection, since a
 * shard runs a connection's messages one at a time and a worker's would hold the ones
 * sent after it). A plan bounds the documents a find reads, not the work per document: a
 * filter or projection whose cost only the server's limits bound runs on a worker.
 * Depends on libbson only. */
#ifndef SDB_COMMON_LOOPREAD_H
#define SDB_COMMON_LOOPREAD_H

#include <bson/bson.h>
#include <stdbool.h>

/* The largest find command a shard tries on its loop thread (bytes of its BSON): parsing
 * and planning it there, before the plan says whether it is a point read, costs time in
 * proportion to its size (a filter {_id: {$in: [900,000 ids]}}, 12 MB, held the loop
 * thread 2-7 s before it went to a worker). A point read's command is a few hundred. */
#define SDB_LOOP_READ_MAX_CMD_BYTES 4096u

/* Does the query filter at it (an iterator on a document, or on an array of a
 * $and/$or/$nor, not yet advanced) hold an operator whose cost per document has no bound
 * but the server's (an aggregation expression: $expr; JavaScript: $where, $function)?
 * Walks every nested document; advances it to the end. */
bool sdb_filter_has_expr(bson_iter_t *it);

/* Is the find projection at it (an iterator on the projection document, not yet
 * advanced) made only of inclusions and exclusions (numbers, bools), nested
 * sub-projections of those, $slice and expression-free $elemMatch? Anything else (an
 * aggregation expression, $meta, a literal) is evaluated per document at a cost the
 * projection alone bounds; an empty sub-document is refused here (the find answers
 * its error). Advances it. */
bool sdb_projection_plain(bson_iter_t *it);

#endif
