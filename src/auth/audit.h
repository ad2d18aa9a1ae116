/* Audit log of authentication failures and authorization denials (issue #10).
 *
 * Each event is one structured log line at WARN level with msg "audit" (so operators can
 * route it: journald MESSAGE=audit, or grep), and a Prometheus counter
 * stripedb_auth_audit_events_total{event="..."}. Never logs a password, proof or payload.
 * Thread-safe.
 */
#ifndef SDB_AUTH_AUDIT_H
#define SDB_AUTH_AUDIT_H

typedef enum {
	AUTH_AUDIT_AUTH_FAILED = 0, /* wrong password, unknown user, bad SCRAM message */
	AUTH_AUDIT_RATE_LIMITED,    /* authentication refused by the brute-force limit */
	AUTH_AUDIT_DENIED,          /* command refused: Unauthorized (13) */
	AUTH_AUDIT_UNAUTHENTICATED, /* command before authentication */
	AUTH_AUDIT__COUNT
} auth_audit_event;

/* Name of the event ("authFailed", "rateLimited", "denied", "unauthenticated"). */
const char *auth_audit_name(auth_audit_event ev);

/* Record one event. Any string may be NULL (logged as "-"). user: the claimed user name;
 * tenant: the authenticated tenant; peer: "HOST:PORT"; what: the command and namespace or
 * the reason. */
void auth_audit(auth_audit_event ev, const char *user, const char *tenant, const char *peer,
		const char *what);

#endif
