/* One metadata Raft member on libraft's libuv backend. Contract in node.h; the
 * libraft 0.15 mitigations are listed in raft/README.md. */
#include "raft/node.h"

#include <errno.h>
#include <fcntl.h>
#include <raft/uv.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

struct sdb_node {
	uv_loop_t *loop;
	struct raft raft;
	struct raft_io io;
	struct raft_uv_transport transport;
	sdb_fsm *fsm; /* the metadata state machine, when sm is the default */
	sdb_node_sm sm;
	uint64_t id;
	char *raft_addr;
	void (*on_change)(void *data);
	void *data;
	uv_prepare_t prepare;
	/* libraft's own append, wrapped to abort on a failed disk write */
	int (*orig_append)(struct raft_io *io, struct raft_io_append *req,
			   const struct raft_entry entries[], unsigned n, raft_io_append_cb cb);
	/* libraft's own start and send, wrapped to log the InstallSnapshot messages it
	 * sends and those it drops on receipt (send_wrap, recv_wrap) */
	int (*orig_start)(struct raft_io *io, unsigned msecs, raft_io_tick_cb tick,
			  raft_io_recv_cb recv);
	raft_io_recv_cb orig_recv;
	int (*orig_send)(struct raft_io *io, struct raft_io_send *req,
			 const struct raft_message *message, raft_io_send_cb cb);
	/* libraft's own io close, wrapped so that its callback runs once (close_wrap) */
	void (*orig_close)(struct raft_io *io, raft_io_close_cb cb);
	raft_io_close_cb raft_io_closed; /* libraft's callback given to close_wrap */
	bool io_closed;			 /* it ran (io_closed_once) */
	uv_timer_t reap;		 /* frees libraft's io a loop iteration later (reap_cb) */
	uint64_t ready_term;   /* term whose barrier has been applied here as leader */
	uint64_t barrier_term; /* term whose barrier was proposed */
	/* last observed, to report changes */
	int last_state;
	uint64_t last_term, last_leader;
	bool last_ready;
	int closing;
	int pending_close; /* handles still closing */
	void (*close_cb)(void *arg);
	void *close_arg;
};

int sdb_node_errno(int rv)
{
	switch (rv) {
	case 0:
		return 0;
	case RAFT_NOTLEADER:
	case RAFT_LEADERSHIPLOST:
		return SDB_ENOTLEADER;
	case RAFT_SHUTDOWN:
	case RAFT_CANCELED:
		return SDB_ECANCELED;
	case RAFT_BADID:
	case RAFT_NOTFOUND:
	case RAFT_DUPLICATEID:
	case RAFT_DUPLICATEADDRESS:
	case RAFT_BADROLE:
	case RAFT_INVALID:
		return SDB_EINVAL;
	case RAFT_CANTCHANGE:
	case RAFT_BUSY:
		return SDB_EBUSY;
	case RAFT_NOCONNECTION:
		return SDB_EUNAVAILABLE;
	case RAFT_NOMEM:
		return SDB_ENOMEM;
	case RAFT_TOOBIG:
		return SDB_ETOOBIG;
	default:
		return SDB_EIO;
	}
}

int sdb_node_parse_members(const char *list, struct raft_configuration *conf, char *err,
			   size_t errlen)
{
	char *copy = sdb_strdup(list), *save = NULL, *tok;
	int rc = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *at = strchr(tok, '@'), *end = NULL;
		unsigned long long id;
		if (!at) {
			rc = sdb_errf(err, errlen, SDB_EINVAL, "member %s: expected ID@HOST:PORT", tok);
			break;
		}
		*at = '\0';
		errno = 0;
		id = strtoull(tok, &end, 10);
		if (errno || !end || *end || id == 0 || !strchr(at + 1, ':')) {
			rc = sdb_errf(err, errlen, SDB_EINVAL, "member %s@%s: bad id or address", tok,
				      at + 1);
			break;
		}
		if (raft_configuration_add(conf, id, at + 1, RAFT_VOTER) != 0) {
			rc = sdb_errf(err, errlen, SDB_EINVAL, "member %s@%s: duplicate id or address",
				      tok, at + 1);
			break;
		}
	}
	free(copy);
	if (rc == 0 && conf->n == 0)
		rc = sdb_errf(err, errlen, SDB_EINVAL, "empty member list");
	return rc;
}

/* ------------------------------------------------------- the metadata state machine */

static void meta_bind(void *impl, struct raft *r) { sdb_fsm_bind(impl, r); }
static bson_t *meta_take_result(void *impl) { return sdb_fsm_take_result(impl); }
static uint64_t meta_last_applied(void *impl) { return sdb_fsm_last_applied(impl); }
static void meta_close(void *impl) { sdb_fsm_close(impl); }

/* ------------------------------------------------------- failed-append abort */

/* The member whose uv backend io is (the wrappers below replace its functions). */
static sdb_node *node_of_io(struct raft_io *io)
{
	return (sdb_node *)((char *)io - offsetof(sdb_node, io));
}

struct append_ctx {
	void *data;
	raft_io_append_cb cb;
	sdb_node *n;
};

static void append_done(struct raft_io_append *req, int status)
{
	struct append_ctx *ctx = req->data;
	raft_io_append_cb cb = ctx->cb;
	sdb_node *n = ctx->n;
	req->data = ctx->data;
	free(ctx);
	if (status != 0 && status != RAFT_CANCELED && !n->closing) {
		/* libraft 0.15 keeps a leader in office after a failed write and may then
		 * count an entry it does not have on disk. Continuing is unsafe: stop now
		 * and let a restart reload the log from disk. */
		sdb_error("raft: log append failed, aborting", "status=%d err=\"%s\" io=\"%s\"", status,
			  raft_strerror(status), n->io.errmsg);
		abort();
	}
	cb(req, status);
}

static int append_wrap(struct raft_io *io, struct raft_io_append *req,
		       const struct raft_entry entries[], unsigned n_entries, raft_io_append_cb cb)
{
	sdb_node *n = node_of_io(io);
	struct append_ctx *ctx = sdb_malloc(sizeof *ctx);
	int rv;
	ctx->data = req->data;
	ctx->cb = cb;
	ctx->n = n;
	req->data = ctx;
	rv = n->orig_append(io, req, entries, n_entries, append_done);
	if (rv != 0) {
		req->data = ctx->data;
		free(ctx);
		if (!n->closing) {
			sdb_error("raft: log append could not start, aborting", "status=%d err=\"%s\"",
				  rv, io->errmsg);
			abort();
		}
	}
	return rv;
}

/* ------------------------------------------------------- InstallSnapshot logging */

/* libraft 0.15 says nothing when a leader sends a snapshot, and drops an InstallSnapshot
 * silently when it arrives while the member is writing a snapshot of its own or
 * installing another (replicationInstallSnapshot returns RAFT_BUSY, recv.c frees the
 * message: "the leader will eventually retry", which it does only after its
 * install-snapshot timeout). Both are logged here, where the message passes. */
static void recv_wrap(struct raft_io *io, struct raft_message *m)
{
	sdb_node *n = node_of_io(io);
	struct raft *r = &n->raft;
	/* libraft checks the term first: an older leader's snapshot is refused, with an
	 * answer; a current or newer one meets the busy check */
	if (m->type == RAFT_IO_INSTALL_SNAPSHOT && m->install_snapshot.term >= r->current_term) {
		if (r->snapshot.pending.term != 0)
			sdb_warn("raft: snapshot from the leader dropped: this member is writing "
				 "a snapshot of its own; the leader sends it again after its "
				 "install-snapshot timeout",
				 "from=%llu last_index=%llu term=%llu own_snapshot_index=%llu",
				 (unsigned long long)m->server_id,
				 (unsigned long long)m->install_snapshot.last_index,
				 (unsigned long long)m->install_snapshot.term,
				 (unsigned long long)r->snapshot.pending.index);
		else if (r->snapshot.put.data != NULL)
			sdb_info("raft: snapshot from the leader ignored: this member is installing "
				 "one already",
				 "from=%llu last_index=%llu term=%llu", (unsigned long long)m->server_id,
				 (unsigned long long)m->install_snapshot.last_index,
				 (unsigned long long)m->install_snapshot.term);
	}
	n->orig_recv(io, m);
}

static int start_wrap(struct raft_io *io, unsigned msecs, raft_io_tick_cb tick,
		      raft_io_recv_cb recv)
{
	sdb_node *n = node_of_io(io);
	n->orig_recv = recv;
	return n->orig_start(io, msecs, tick, recv_wrap);
}

static int send_wrap(struct raft_io *io, struct raft_io_send *req,
		     const struct raft_message *m, raft_io_send_cb cb)
{
	sdb_node *n = node_of_io(io);
	int rv = n->orig_send(io, req, m, cb);
	if (m->type == RAFT_IO_INSTALL_SNAPSHOT)
		sdb_info("raft: sending a snapshot to a member", "to=%llu last_index=%llu "
			 "term=%llu status=%d", (unsigned long long)m->server_id,
			 (unsigned long long)m->install_snapshot.last_index,
			 (unsigned long long)m->install_snapshot.term, rv);
	return rv;
}

/* ------------------------------------------------------- leadership barrier */

struct barrier_req {
	struct raft_barrier req;
	sdb_node *n;
	uint64_t term;
	sdb_node_done_cb cb; /* NULL for the election barrier */
	void *arg;
};

static void barrier_done(struct raft_barrier *req, int status)
{
	struct barrier_req *b = req->data;
	sdb_node *n = b->n;
	if (b->cb) {
		int rc = sdb_node_errno(status);
		if (rc == 0 && (raft_state(&n->raft) != RAFT_LEADER || n->raft.current_term != b->term))
			rc = SDB_ENOTLEADER;
		b->cb(b->arg, rc);
	} else if (status == 0 && raft_state(&n->raft) == RAFT_LEADER &&
		   n->raft.current_term == b->term) {
		n->ready_term = b->term;
		sdb_info("raft: leader ready", "term=%llu applied=%llu",
			 (unsigned long long)b->term, (unsigned long long)raft_last_applied(&n->raft));
	} else if (status == RAFT_IOERR && !n->closing) {
		sdb_error("raft: barrier failed with an I/O error, aborting", "err=\"%s\"",
			  raft_errmsg(&n->raft));
		abort();
	} else if (n->barrier_term == b->term) {
		n->barrier_term = 0; /* try again if still leader */
	}
	free(b);
}

bool sdb_node_ready(sdb_node *n)
{
	return !n->closing && raft_state(&n->raft) == RAFT_LEADER &&
	       n->ready_term == n->raft.current_term;
}

static void prepare_cb(uv_prepare_t *h)
{
	sdb_node *n = h->data;
	int state;
	uint64_t term;
	raft_id leader = 0;
	const char *addr = NULL;
	bool ready;

	if (n->closing)
		return;
	state = raft_state(&n->raft);
	term = n->raft.current_term;
	if (state == RAFT_UNAVAILABLE) {
		/* libraft 0.15 converts to unavailable after an I/O error it cannot handle
		 * (e.g. persisting the term or vote) and then stays silent forever: stop the
		 * process so a supervisor restarts it from disk. */
		sdb_error("raft: became unavailable, aborting", "err=\"%s\" io=\"%s\"",
			  raft_errmsg(&n->raft), n->io.errmsg);
		abort();
	}
	if (state == RAFT_LEADER && n->ready_term != term && n->barrier_term != term) {
		struct barrier_req *b = sdb_calloc(1, sizeof *b);
		b->n = n;
		b->term = term;
		b->req.data = b;
		if (raft_barrier(&n->raft, &b->req, barrier_done) == 0) {
			n->barrier_term = term;
		} else {
			free(b);
		}
	}
	raft_leader(&n->raft, &leader, &addr);
	ready = sdb_node_ready(n);
	if (state != n->last_state || term != n->last_term || leader != n->last_leader ||
	    ready != n->last_ready) {
		sdb_info("raft: state", "state=%s term=%llu leader=%llu ready=%d",
			 state == RAFT_LEADER      ? "leader"
			 : state == RAFT_FOLLOWER  ? "follower"
			 : state == RAFT_CANDIDATE ? "candidate"
						   : "unavailable",
			 (unsigned long long)term, (unsigned long long)leader, ready);
		n->last_state = state;
		n->last_term = term;
		n->last_leader = leader;
		n->last_ready = ready;
		if (n->on_change)
			n->on_change(n->data);
	}
}

/* ------------------------------------------------------- start/close */

static void transport_free(sdb_node *n)
{
	sdb_transport_close(&n->transport);
}

/* sdb_transport_opts.peer_ok: which incoming Raft connections reach libraft (the
 * preamble's server id; every accepted plaintext connection's messages are validated
 * by msgcheck.c whatever this says).
 * - A peer claiming this member's own id is refused: a member never connects to itself,
 *   so that is another cluster's node (ids 1, 2, 3 are everywhere).
 * - The sole voter of a non-empty configuration refuses ids not in it: its configuration
 *   changes only through itself, so a leader it does not know cannot be of its set (a
 *   stray one-member set's heartbeat deposed it and aborted its transactions:
 *   test_shard_txn). It does not compare addresses: a member added under one address
 *   string may announce another (0.0.0.0, a proxy, another spelling) until it has
 *   received its configuration.
 * - Every other member accepts any id, as libraft does: a member that lagged behind
 *   configuration changes (paused or partitioned while a new member was added and then
 *   became leader) can only learn the newer configuration from that new leader, so
 *   refusing ids it does not know would cut it off for good (review of the change). */
static bool node_peer_ok(uint64_t id, const char *address, void *arg, const char **why)
{
	sdb_node *n = arg;
	const struct raft_configuration *c = &n->raft.configuration;
	unsigned voters = 0;
	bool self_voter = false, known = false;

	(void)address;
	if (id == n->id) {
		*why = "raft peer claims this member's own server id";
		return false;
	}
	for (unsigned i = 0; i < c->n; i++) {
		if (c->servers[i].id == id)
			known = true;
		if (c->servers[i].role == RAFT_VOTER) {
			voters++;
			if (c->servers[i].id == n->id)
				self_voter = true;
		}
	}
	if (voters == 1 && self_voter && !known) {
		*why = "raft peer's server id is not in the configuration of this sole voter";
		return false;
	}
	return true;
}

/* sdb_transport_opts.announce: this member's address in the configuration (what its peers
 * check and answer to: it differs from --raft-listen behind a proxy), or NULL when not
 * a member yet (the listen address then). */
static const char *node_announce(void *arg)
{
	sdb_node *n = arg;
	const struct raft_configuration *c = &n->raft.configuration;
	for (unsigned i = 0; i < c->n; i++)
		if (c->servers[i].id == n->id)
			return c->servers[i].address;
	return NULL;
}

static void raft_closed(struct raft *r);
static void close_wrap(struct raft_io *io, raft_io_close_cb cb);

static int mkdir_p(const char *path)
{
	char buf[4096];
	size_t len = strlen(path);
	if (len == 0 || len >= sizeof buf)
		return -1;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			if (mkdir(buf, 0700) != 0 && errno != EEXIST)
				return -1;
			*p = '/';
		}
	}
	if (mkdir(buf, 0700) != 0 && errno != EEXIST)
		return -1;
	return 0;
}

int sdb_node_start(uv_loop_t *loop, const sdb_node_opts *opts, sdb_node **out, char *err,
		   size_t errlen)
{
	sdb_node *n;
	char *raft_dir = NULL, *db_path = NULL;
	struct raft_configuration conf;
	int rv, rc;

	if (opts->id == 0 || !opts->data_dir || !opts->raft_addr)
		return sdb_errf(err, errlen, SDB_EINVAL,
				"a Raft member needs --node-id (> 0), --data-dir and --raft-listen");
	n = sdb_calloc(1, sizeof *n);
	n->loop = loop;
	n->id = opts->id;
	n->raft_addr = sdb_strdup(opts->raft_addr);
	n->on_change = opts->on_change;
	n->data = opts->data;
	n->last_state = -1;
	raft_dir = sdb_asprintf("%s/raft", opts->data_dir);
	db_path = sdb_asprintf("%s/meta.db", opts->data_dir);
	if (mkdir_p(raft_dir) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "create %s: %s", raft_dir, strerror(errno));
		goto err;
	}
	if (opts->sm) {
		n->sm = *opts->sm;
	} else {
		rc = sdb_fsm_open(db_path, &n->fsm, err, errlen);
		if (rc != 0)
			goto err;
		n->sm = (sdb_node_sm){.fsm = sdb_fsm_raft(n->fsm),
				      .impl = n->fsm,
				      .bind = meta_bind,
				      .take_result = meta_take_result,
				      .last_applied = meta_last_applied,
				      .close = meta_close};
	}
	{
		/* our transport in every mode: libraft 0.15's own TCP transport hands any
		 * peer's bytes to a decoder that trusts them (raft/msgcheck.h) */
		sdb_transport_opts to = {.plaintext = true};
		if (opts->transport)
			to = *opts->transport;
		to.peer_ok = node_peer_ok;
		to.peer_arg = n;
		to.announce = node_announce;
		rv = sdb_transport_init(&n->transport, loop, &to);
	}
	if (rv != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "raft transport: %s", raft_strerror(rv));
		goto err_fsm;
	}
	if ((rv = raft_uv_init(&n->io, loop, raft_dir, &n->transport)) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "raft io %s: %s", raft_dir, n->io.errmsg);
		goto err_transport;
	}
	raft_uv_set_connect_retry_delay(&n->io, 100);
	n->orig_append = n->io.append;
	n->io.append = append_wrap;
	n->orig_start = n->io.start;
	n->io.start = start_wrap;
	n->orig_send = n->io.send;
	n->io.send = send_wrap;
	n->orig_close = n->io.close;
	n->io.close = close_wrap;
	if ((rv = raft_init(&n->raft, &n->io, n->sm.fsm, n->id, n->raft_addr)) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "raft init: %s", raft_errmsg(&n->raft));
		goto err_io;
	}
	n->raft.data = n;
	if (n->sm.bind)
		n->sm.bind(n->sm.impl, &n->raft);
	{
		unsigned et = opts->election_timeout_ms ? opts->election_timeout_ms : 1000;
		unsigned th = opts->snapshot_threshold ? opts->snapshot_threshold : 1024;
		raft_set_election_timeout(&n->raft, et);
		raft_set_heartbeat_timeout(&n->raft, et / 10 ? et / 10 : 1);
		raft_set_snapshot_threshold(&n->raft, th);
		raft_set_snapshot_trailing(&n->raft, th / 4 ? th / 4 : 1);
		raft_set_pre_vote(&n->raft, true);
		/* How long a leader waits for the answer to an InstallSnapshot before it sends
		 * the snapshot again (libraft's default is 30 s; the shard had set 30 min).
		 * libraft 0.15 drops, with no answer, an InstallSnapshot that reaches a member
		 * while the member writes a snapshot of its own (RAFT_BUSY), which a member
		 * catching up does as it applies the leader's backlog; until this timeout the
		 * leader sends that member nothing but heartbeats, and it stays behind
		 * (test_shard_partition.py test_deposed_primary_catches_up_from_a_compacted_log).
		 * A short timeout costs no second copy: libraft resends only to a member it heard
		 * from within the last election timeout (it clears that mark every election
		 * timeout), and a member receiving or restoring a snapshot (the shard's
		 * shard.db copy, metadata's restore_image) does so on its loop and answers nothing
		 * until done, so SDB_NODE_SNAPSHOT_RESEND_ELECTIONS (>= 2) election timeouts of
		 * silence separate a resend from a copy in progress. */
		raft_set_install_snapshot_timeout(&n->raft,
						  SDB_NODE_SNAPSHOT_RESEND_ELECTIONS * et);
	}
	if (opts->bootstrap && *opts->bootstrap) {
		bool member = false;
		raft_configuration_init(&conf);
		rc = sdb_node_parse_members(opts->bootstrap, &conf, err, errlen);
		if (rc != 0) {
			raft_configuration_close(&conf);
			goto err_raft;
		}
		for (unsigned i = 0; i < conf.n; i++)
			member |= conf.servers[i].id == n->id;
		if (member) {
			rv = raft_bootstrap(&n->raft, &conf);
			if (rv == 0) {
				sdb_info("raft: bootstrapped", "members=%u", conf.n);
				if (opts->bootstrap_marker) {
					int fd = open(opts->bootstrap_marker,
						      O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
					if (fd < 0 || fsync(fd) != 0)
						sdb_warn("raft: bootstrap marker not written",
							 "path=%s err=\"%s\"", opts->bootstrap_marker,
							 strerror(errno));
					if (fd >= 0)
						close(fd);
				}
			}
			else if (rv != RAFT_CANTBOOTSTRAP) {
				raft_configuration_close(&conf);
				rc = sdb_errf(err, errlen, SDB_EIO, "raft bootstrap: %s",
					      raft_errmsg(&n->raft));
				goto err_raft;
			}
		}
		raft_configuration_close(&conf);
	}
	if ((rv = raft_start(&n->raft)) != 0) {
		rc = sdb_errf(err, errlen, SDB_EIO, "raft start on %s: %s%s%s", n->raft_addr,
			      raft_strerror(rv), raft_errmsg(&n->raft)[0] ? ": " : "",
			      raft_errmsg(&n->raft));
		goto err_raft;
	}
	uv_prepare_init(loop, &n->prepare);
	n->prepare.data = n;
	uv_prepare_start(&n->prepare, prepare_cb);
	free(raft_dir);
	free(db_path);
	*out = n;
	return 0;

err_raft:
	/* raft_close completes on the loop: the caller's loop run frees the rest
	 * (raft_closed -> node_finish). */
	n->closing = 1;
	n->pending_close = 1;
	raft_close(&n->raft, raft_closed);
	free(raft_dir);
	free(db_path);
	return rc;
err_io:
	raft_uv_close(&n->io);
err_transport:
	transport_free(n);
err_fsm:
	if (n->sm.close)
		n->sm.close(n->sm.impl);
err:
	free(raft_dir);
	free(db_path);
	free(n->raft_addr);
	free(n);
	return rc;
}

static void node_finish(sdb_node *n)
{
	if (--n->pending_close > 0)
		return;
	void (*cb)(void *) = n->close_cb;
	void *arg = n->close_arg;
	if (n->sm.close)
		n->sm.close(n->sm.impl);
	free(n->raft_addr);
	free(n);
	if (cb)
		cb(arg);
}

/* libraft 0.15's io close callback may come twice. Its uvMaybeFireCloseCb calls it once
 * nothing it counts is open, but it does not count the writer of a segment being
 * finalized: when the finalize (on the thread pool) ends before the writer's handles are
 * closed (a loaded machine, a close begun in a close callback), it is called there, and
 * again from the writer's close callback, later in the same loop iteration. Pass
 * libraft's callback (which frees its log and calls raft_closed) on only once; the io
 * stays allocated until reap_cb, so the second call reads live memory. */
static void io_closed_once(struct raft_io *io)
{
	sdb_node *n = node_of_io(io);
	if (n->io_closed)
		return;
	n->io_closed = true;
	n->raft_io_closed(io);
}

static void close_wrap(struct raft_io *io, raft_io_close_cb cb)
{
	sdb_node *n = node_of_io(io);
	n->raft_io_closed = cb;
	n->orig_close(io, io_closed_once);
}

static void reap_closed(uv_handle_t *h)
{
	node_finish(h->data);
}

/* The loop iteration after raft_closed's: libraft has nothing pending any more, so free
 * its io. libraft closes a finalized segment's writer handles when it queues the
 * finalize; their callbacks run in the first closing phase after that, and the first
 * io close call needs the finalize's completion, which the loop polls no earlier than
 * the first poll phase after it. So the writer callbacks run at the latest in the
 * closing phase of the iteration of raft_closed (called from a close or work callback,
 * never from a timer), before this 0 ms timer's. */
static void reap_cb(uv_timer_t *t)
{
	sdb_node *n = t->data;
	raft_uv_close(&n->io);
	transport_free(n);
	uv_close((uv_handle_t *)t, reap_closed);
}

static void raft_closed(struct raft *r)
{
	sdb_node *n = r->data;
	/* not raft_uv_close here: libraft may still call the io's close callback
	 * (io_closed_once) in this loop iteration */
	uv_timer_init(n->loop, &n->reap);
	n->reap.data = n;
	uv_timer_start(&n->reap, reap_cb, 0, 0);
}

static void prepare_closed(uv_handle_t *h)
{
	node_finish(h->data);
}

void sdb_node_close(sdb_node *n, void (*cb)(void *arg), void *arg)
{
	n->closing = 1;
	n->close_cb = cb;
	n->close_arg = arg;
	n->pending_close = 2;
	uv_prepare_stop(&n->prepare);
	uv_close((uv_handle_t *)&n->prepare, prepare_closed);
	raft_close(&n->raft, raft_closed);
}

struct raft *sdb_node_raft(sdb_node *n) { return &n->raft; }
sdb_fsm *sdb_node_fsm(sdb_node *n) { return n->fsm; }
uint64_t sdb_node_id(const sdb_node *n) { return n->id; }
uint64_t sdb_node_term(sdb_node *n) { return n->raft.current_term; }

void sdb_node_leader(sdb_node *n, uint64_t *id, const char **addr)
{
	raft_id lid = 0;
	const char *a = NULL;
	raft_leader(&n->raft, &lid, &a);
	*id = lid;
	*addr = a;
}

/* ------------------------------------------------------- proposals */

struct prop {
	struct raft_apply req;
	sdb_node *n;
	sdb_node_apply_cb cb;
	void *arg;
};

static void prop_done(struct raft_apply *req, int status, void *result)
{
	struct prop *p = req->data;
	bson_t *res = NULL;
	int rc = sdb_node_errno(status);
	(void)result; /* results travel through sdb_fsm_take_result() */
	if (status == RAFT_IOERR && !p->n->closing) {
		sdb_error("raft: apply failed with an I/O error, aborting", "err=\"%s\"",
			  raft_errmsg(&p->n->raft));
		abort();
	}
	if (rc == 0) {
		res = p->n->sm.take_result(p->n->sm.impl);
		if (!res || p->n->sm.last_applied(p->n->sm.impl) != req->index) {
			if (res)
				bson_destroy(res);
			res = bson_new();
			BSON_APPEND_DOUBLE(res, "ok", 1.0);
		}
	}
	p->cb(p->arg, rc, res);
	free(p);
}


int sdb_node_propose(sdb_node *n, const char *op, const bson_t *args, sdb_node_apply_cb cb,
		     void *arg)
{
	bson_t cmd = BSON_INITIALIZER;
	struct raft_buffer buf;
	struct prop *p;
	int rv;

	if (!sdb_node_ready(n))
		return SDB_ENOTLEADER;
	BSON_APPEND_UTF8(&cmd, "op", op);
	/* Wall clock on purpose: lease expiry must mean the same instant on every member
	 * and across leader changes; it is read once, on the leader, and stamped into the
	 * command (DESIGN.md: epoch ms where the protocol demands it). */
	BSON_APPEND_INT64(&cmd, "ts", sdb_wall_ms());
	BSON_APPEND_DOCUMENT(&cmd, "args", args);
	/* libraft's disk format lays entries out back to back assuming every entry's
	 * length is a multiple of 8 (uv_encoding.c): pad with zeros; the fsm reads the
	 * document's own length. */
	buf.len = (cmd.len + 7u) & ~(size_t)7u;
	buf.base = raft_calloc(1, buf.len);
	if (!buf.base) {
		bson_destroy(&cmd);
		return SDB_ENOMEM;
	}
	memcpy(buf.base, bson_get_data(&cmd), cmd.len);
	bson_destroy(&cmd);
	p = sdb_calloc(1, sizeof *p);
	p->n = n;
	p->cb = cb;
	p->arg = arg;
	p->req.data = p;
	rv = raft_apply(&n->raft, &p->req, &buf, 1, prop_done);
	if (rv != 0) {
		raft_free(buf.base);
		free(p);
		return sdb_node_errno(rv);
	}
	return 0;
}

int sdb_node_barrier(sdb_node *n, sdb_node_done_cb cb, void *arg)
{
	struct barrier_req *b;
	int rv;
	if (!sdb_node_ready(n))
		return SDB_ENOTLEADER;
	b = sdb_calloc(1, sizeof *b);
	b->n = n;
	b->term = n->raft.current_term;
	b->cb = cb;
	b->arg = arg;
	b->req.data = b;
	rv = raft_barrier(&n->raft, &b->req, barrier_done);
	if (rv != 0) {
		free(b);
		return sdb_node_errno(rv);
	}
	return 0;
}

/* ------------------------------------------------------- membership */

struct change_req {
	struct raft_change req;
	struct raft_transfer xfer;
	sdb_node *n;
	uint64_t id;
	sdb_node_done_cb cb;
	void *arg;
};

/* A membership change request of node n about server id: cb(arg, status) runs once when
 * it ends. Both raft handles' data point back at it. The caller hands it to raft and then
 * to change_started; the done callback frees it. Never NULL (sdb_calloc aborts). */
static struct change_req *change_new(sdb_node *n, uint64_t id, sdb_node_done_cb cb, void *arg)
{
	struct change_req *c = sdb_calloc(1, sizeof *c);
	c->n = n;
	c->id = id;
	c->cb = cb;
	c->arg = arg;
	c->req.data = c;
	c->xfer.data = c;
	return c;
}

/* The result of handing c to raft (rv: raft's return code): 0 when it started (its done
 * callback frees c), else frees c (no callback fires) and returns sdb_node_errno(rv). */
static int change_started(struct change_req *c, int rv)
{
	if (rv != 0) {
		free(c);
		return sdb_node_errno(rv);
	}
	return 0;
}

static void assign_done(struct raft_change *req, int status)
{
	struct change_req *c = req->data;
	c->cb(c->arg, sdb_node_errno(status));
	free(c);
}

static void add_done(struct raft_change *req, int status)
{
	struct change_req *c = req->data;
	int rv;
	if (status != 0) {
		c->cb(c->arg, sdb_node_errno(status));
		free(c);
		return;
	}
	rv = raft_assign(&c->n->raft, &c->req, c->id, RAFT_VOTER, assign_done);
	if (rv != 0) {
		c->cb(c->arg, sdb_node_errno(rv));
		free(c);
	}
}

int sdb_node_add(sdb_node *n, uint64_t id, const char *raft_addr, sdb_node_done_cb cb,
		 void *arg)
{
	struct change_req *c;
	if (!sdb_node_ready(n))
		return SDB_ENOTLEADER;
	c = change_new(n, id, cb, arg);
	return change_started(c, raft_add(&n->raft, &c->req, id, raft_addr, add_done));
}

int sdb_node_remove(sdb_node *n, uint64_t id, sdb_node_done_cb cb, void *arg)
{
	struct change_req *c;
	if (!sdb_node_ready(n))
		return SDB_ENOTLEADER;
	c = change_new(n, id, cb, arg);
	return change_started(c, raft_remove(&n->raft, &c->req, id, assign_done));
}

static void transfer_done(struct raft_transfer *req)
{
	struct change_req *c = req->data;
	raft_id lid = 0;
	const char *addr = NULL;
	raft_leader(&c->n->raft, &lid, &addr);
	int ok = lid != 0 && lid != c->n->id && (c->id == 0 || lid == c->id);
	c->cb(c->arg, ok ? 0 : SDB_ETIMEOUT);
	free(c);
}

int sdb_node_transfer(sdb_node *n, uint64_t id, sdb_node_done_cb cb, void *arg)
{
	struct change_req *c;
	if (raft_state(&n->raft) != RAFT_LEADER)
		return SDB_ENOTLEADER;
	c = change_new(n, id, cb, arg);
	return change_started(c, raft_transfer(&n->raft, &c->xfer, id, transfer_done));
}

void sdb_node_append_election_id(sdb_node *n, bson_t *out)
{
	uint8_t eid[12] = {0x7f, 0xff, 0xff, 0xff};
	uint64_t term = n->raft.current_term;
	bson_oid_t oid;
	for (int i = 0; i < 8; i++)
		eid[4 + i] = (uint8_t)(term >> (56 - 8 * i));
	bson_oid_init_from_data(&oid, eid);
	BSON_APPEND_OID(out, "electionId", &oid);
}

void sdb_hello_set_writable(const bson_t *cmd, bson_t *reply, bool writable)
{
	bson_t tmp;
	bson_iter_t it;
	bool legacy = true;
	if (bson_iter_init(&it, cmd) && bson_iter_next(&it))
		legacy = strcmp(bson_iter_key(&it), "hello") != 0;
	bson_init(&tmp);
	bson_copy_to_excluding_noinit(reply, &tmp, "isWritablePrimary", "ismaster", NULL);
	bson_reinit(reply);
	bson_concat(reply, &tmp);
	bson_destroy(&tmp);
	BSON_APPEND_BOOL(reply, legacy ? "ismaster" : "isWritablePrimary", writable);
}

void sdb_node_hello(sdb_node *n, const bson_t *cmd, bson_t *reply, const sdb_node_hello_info *h)
{
	const struct raft_configuration *c = &n->raft.configuration;
	bson_t hosts;
	unsigned k = 0;
	char key[16];
	uint64_t lid = 0;
	const char *la = NULL;

	sdb_hello_set_writable(cmd, reply, h->ready);
	BSON_APPEND_BOOL(reply, "secondary", h->secondary);
	BSON_APPEND_UTF8(reply, "setName", h->set_name);
	BSON_APPEND_INT32(reply, "setVersion", h->set_version);
	bson_append_array_begin(reply, "hosts", -1, &hosts);
	for (unsigned i = 0; i < c->n; i++) {
		const char *w = c->servers[i].role == RAFT_VOTER ? h->wire(h->ctx, c->servers[i].id)
								   : NULL;
		if (!w)
			continue;
		snprintf(key, sizeof key, "%u", k++);
		BSON_APPEND_UTF8(&hosts, key, w);
	}
	bson_append_array_end(reply, &hosts);
	BSON_APPEND_UTF8(reply, "me", h->me);
	sdb_node_leader(n, &lid, &la);
	if (lid && (lid != n->id || h->ready)) {
		const char *lw = h->wire(h->ctx, lid);
		if (lw)
			BSON_APPEND_UTF8(reply, "primary", lw);
	}
	if (h->ready)
		sdb_node_append_election_id(n, reply);
}

void sdb_node_append_config(sdb_node *n, bson_t *out, const char *key)
{
	bson_t arr, d;
	char k[16];
	const struct raft_configuration *c = &n->raft.configuration;
	bson_append_array_begin(out, key, -1, &arr);
	for (unsigned i = 0; i < c->n; i++) {
		snprintf(k, sizeof k, "%u", i);
		bson_append_document_begin(&arr, k, -1, &d);
		BSON_APPEND_INT64(&d, "id", (int64_t)c->servers[i].id);
		BSON_APPEND_UTF8(&d, "raft", c->servers[i].address);
		BSON_APPEND_UTF8(&d, "role",
				 c->servers[i].role == RAFT_VOTER     ? "voter"
				 : c->servers[i].role == RAFT_STANDBY ? "standby"
								      : "spare");
		bson_append_document_end(&arr, &d);
	}
	bson_append_array_end(out, &arr);
}
