/* Audit log. See auth/audit.h. */
#include "auth/audit.h"

#include <stdatomic.h>

#include "common/log.h"
#include "common/metrics.h"

static const char *const names[AUTH_AUDIT__COUNT] = {"authFailed", "rateLimited", "denied",
						     "unauthenticated"};
static const char *const labels[AUTH_AUDIT__COUNT] = {
	"event=\"authFailed\"", "event=\"rateLimited\"", "event=\"denied\"",
	"event=\"unauthenticated\""};
static _Atomic(sdb_counter *) counters[AUTH_AUDIT__COUNT];

const char *auth_audit_name(auth_audit_event ev)
{
	return (unsigned)ev < AUTH_AUDIT__COUNT ? names[ev] : "unknown";
}

void auth_audit(auth_audit_event ev, const char *user, const char *tenant, const char *peer,
		const char *what)
{
	sdb_counter *c;

	if ((unsigned)ev >= AUTH_AUDIT__COUNT)
		return;
	c = atomic_load(&counters[ev]);
	if (!c) {
		/* sdb_metrics_counter returns the same series for the same name and labels */
		c = sdb_metrics_counter("stripedb_auth_audit_events_total",
					"Authentication failures and authorization denials.",
					labels[ev]);
		atomic_store(&counters[ev], c);
	}
	if (c)
		sdb_counter_inc(c);
	sdb_warn("audit", "event=%s user=\"%s\" tenant=\"%s\" peer=%s what=\"%s\"", names[ev],
		 user ? user : "-", tenant ? tenant : "-", peer ? peer : "-", what ? what : "-");
}
