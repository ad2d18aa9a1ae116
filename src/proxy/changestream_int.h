/* The proxy's change streams (changestream.c), shared with the parsing of a client's
 * $changeStream stage and the stages after it (changestream_spec.c): the per-shard stream
 * and the merged stream's state. Internal to those two files. */
#ifndef SDB_PROXY_CHANGESTREAM_INT_H
#define SDB_PROXY_CHANGESTREAM_INT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/bsonget.h"
#include "common/changestream.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "proxy/cswait.h"
#include "proxy/exec.h"
#include "proxy/proxy.h"
#include "proxy/txnroute.h"

#define CS_SHARD_BATCH 1000
#define CS_DEFAULT_AWAIT_MS 1000 /* MongoDB's await of a tailable awaitData getMore */
#define CS_NOTE_AWAIT_MS 200	 /* a holdout's getMore await while an event waits */
#define CS_MAX_BATCH_BYTES (8 * 1024 * 1024)
#define ERR_CS_FATAL 280
#define ERR_CS_HISTORY_LOST 286
#define ERR_NOT_IN_TXN 263
#define ERR_CLIENT_DISCONNECT 279

enum { CS_COLL, CS_DB, CS_CLUSTER };

/* One shard's stream. */
typedef struct cs_shard {
	char *id;
	uint32_t sid;
	int64_t cursor_id; /* 0: not open (to open at the next round) */
	bool opened;	   /* opened once (then reopened after pbrt) */
	bool added;	   /* found after the stream was opened: opened at the merged position */
	bool gone;	   /* no longer in the shard list: holds nothing back */
	bson_t **ev;	   /* buffered events (owned), ev[pos..n) */
	sdb_cs_token *tok; /* their tokens */
	size_t n, pos, cap;
	sdb_cs_token pbrt;
	bool have_pbrt;
	uint64_t noted_ts; /* appendOplogNote sent with this maxClusterTime */
	/* the watchers' move number (px_cswait_seq) read before the last round that asked
	 * this shard, or that found it had not moved for the stream: every move of it up to
	 * there is covered (cswait.h) */
	uint64_t asked_seq;
	/* the move number read before the last round that asked it: its PBRT is as of then
	 * (an await's end asks it again when it moved since, CS_ASK_REFRESH) */
	uint64_t pbrt_seq;
	bool more; /* its last batch had events: there may be more (asked again) */
	uint64_t ended_ms; /* monotonic ms when it answered a cursor id 0 (reopened 100 ms
			    * later, not in a loop) */
	/* the last call's result (fan-out unit) */
	int status;
	bson_t err_reply; /* always initialised */
	char neterr[256];
} cs_shard;

struct px_cs {
	int level;
	char *db;	    /* where the shard aggregates run (admin for the cluster) */
	char *coll;	    /* collection stream: the collection, else NULL */
	char *gm_coll;	    /* getMore's collection: coll or "$cmd.aggregate" */
	bson_t spec;	    /* $changeStream for the shards, without the resume fields */
	bson_t start;	    /* the client's resume fields ({resumeAfter: ...}), maybe empty */
	bool update_lookup; /* fullDocument: "updateLookup" */
	sdb_pipeline *pl;   /* the stages after $changeStream, or NULL */
	cs_shard *sh;
	size_t nsh;
	sdb_cs_token pos; /* merged position: the client's PBRT */
	bool have_pos;
	/* a stream opened without a start point: every shard starts at its own present, so
	 * the stream starts at the newest of their first PBRTs and a lagging shard's events at
	 * or below it are dropped (they predate the start; a resume after a later token would
	 * not see them either) */
	sdb_cs_token floor;
	bool have_floor;
	bool invalidated; /* the invalidate was returned: the cursor ends */
	/* a getMore parked with the cursor (cswait.h): its request (compared, never
	 * dereferenced) and its await's end (monotonic ms), kept for its next run */
	const wire_req *park_req;
	uint64_t park_deadline;
	/* the watchers' move number read before the current round (each shard asked, or
	 * found unmoved, gets it as its asked_seq) and when the last round started */
	uint64_t round_seq;
	uint64_t round_ms;
};


/* A high-water-mark token at ts (a position without an event). */
static inline void cs_hwm_token(sdb_cs_token *t, uint64_t ts)
{
	memset(t, 0, sizeof *t);
	t->ts = ts;
	t->kind = SDB_CS_HWM;
}

/* Parse the client's $changeStream spec (the stage's argument at specit) into cs: the spec
 * for the shards, the start fields, the options; *cluster is true for a whole-deployment
 * stream (allChangesForCluster). Returns: 0, or the code of the error answered on c. */
int cs_parse_spec(ctx *c, px_cs *cs, const bson_iter_t *specit, bool *cluster);

/* Parse the stages after $changeStream (stages: the client's pipeline without its first
 * stage) into cs->pl. Returns: 0, or the code of the error answered on c. */
int cs_parse_stages(ctx *c, px_cs *cs, const bson_t *stages);

#endif
