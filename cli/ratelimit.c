/* `stripedb ctl ratelimit peers` (issue #23): the rate-limit peer ring as the metadata
 * service holds it.
 *
 *   stripedb ctl [--json] ratelimit peers
 *
 * One line per registered member, in ring order (ascending address, the order every
 * member sorts its ring in): address, kind (ratelimit or proxy), state and the lease time
 * left. State: `live` while the lease runs; `expired` once the lease time has passed
 * by this machine's clock but the leader has not committed the removal yet (the member
 * is still in every ring until then). The first line gives the membership version every
 * member's ring is built from. --json prints the metadata's answer
 * ({version, peers: [{addr, kind, expiresMS, registeredMS, state, leaseLeftMS}]}).
 * A member's own view of its ring: GET /debug/ratelimit/peers on its HTTP address.
 */
#include <mongoc/mongoc.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/clock.h"

int cli_ratelimit_cmd(cli_ctx *ctx, int argc, char **argv);

static int peers(cli_ctx *ctx)
{
	mongoc_client_t *c = cli_meta_client(ctx);
	bson_t cmd = BSON_INITIALIZER, reply, out = BSON_INITIALIZER, arr;
	bson_error_t e;
	bson_iter_t it, list, doc;
	int64_t version = 0, now = sdb_wall_ms(); /* leases are epoch ms */
	int n = 0, rc = 0;

	if (c == NULL)
		return 1;
	BSON_APPEND_INT32(&cmd, "listRatelimitPeers", 1);
	if (!mongoc_client_command_simple(c, "admin", &cmd, NULL, &reply, &e)) {
		fprintf(stderr, "stripedb ctl: listRatelimitPeers: %s\n", e.message);
		rc = 1;
		goto done;
	}
	if (bson_iter_init_find(&it, &reply, "version") && BSON_ITER_HOLDS_NUMBER(&it))
		version = bson_iter_as_int64(&it);
	BSON_APPEND_INT64(&out, "version", version);
	bson_append_array_begin(&out, "peers", -1, &arr);
	if (!ctx->json)
		printf("ring version %lld\n", (long long)version);
	if (bson_iter_init_find(&it, &reply, "peers") && BSON_ITER_HOLDS_ARRAY(&it) &&
	    bson_iter_recurse(&it, &list)) {
		while (bson_iter_next(&list)) {
			const char *addr = "", *kind = "";
			int64_t exp = 0, reg = 0, left;
			char key[16];
			bson_t d;
			if (!BSON_ITER_HOLDS_DOCUMENT(&list) || !bson_iter_recurse(&list, &doc))
				continue;
			while (bson_iter_next(&doc)) {
				const char *k = bson_iter_key(&doc);
				if (strcmp(k, "addr") == 0 && BSON_ITER_HOLDS_UTF8(&doc))
					addr = bson_iter_utf8(&doc, NULL);
				else if (strcmp(k, "kind") == 0 && BSON_ITER_HOLDS_UTF8(&doc))
					kind = bson_iter_utf8(&doc, NULL);
				else if (strcmp(k, "expiresMS") == 0)
					exp = bson_iter_as_int64(&doc);
				else if (strcmp(k, "registeredMS") == 0)
					reg = bson_iter_as_int64(&doc);
			}
			left = exp - now;
			snprintf(key, sizeof key, "%d", n++);
			bson_append_document_begin(&arr, key, -1, &d);
			BSON_APPEND_UTF8(&d, "addr", addr);
			BSON_APPEND_UTF8(&d, "kind", kind);
			BSON_APPEND_INT64(&d, "expiresMS", exp);
			BSON_APPEND_INT64(&d, "registeredMS", reg);
			BSON_APPEND_UTF8(&d, "state", left > 0 ? "live" : "expired");
			BSON_APPEND_INT64(&d, "leaseLeftMS", left > 0 ? left : 0);
			bson_append_document_end(&arr, &d);
			if (!ctx->json)
				printf("%-24s %-9s %-7s lease %lld ms\n", addr, kind,
				       left > 0 ? "live" : "expired", (long long)(left > 0 ? left : 0));
		}
	}
	bson_append_array_end(&out, &arr);
	if (ctx->json) {
		char *j = bson_as_relaxed_extended_json(&out, NULL);
		printf("%s\n", j);
		bson_free(j);
	} else if (n == 0) {
		printf("(no registered peers)\n");
	}
done:
	bson_destroy(&out);
	bson_destroy(&reply);
	bson_destroy(&cmd);
	mongoc_client_destroy(c);
	return rc;
}

int cli_ratelimit_cmd(cli_ctx *ctx, int argc, char **argv)
{
	if (argc == 1 && strcmp(argv[0], "peers") == 0)
		return peers(ctx);
	fprintf(stderr, "stripedb ctl: usage: stripedb ctl [--json] ratelimit peers\n");
	return 2;
}
