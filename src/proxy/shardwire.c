/* The proxy's own connections to a shard member. See proxy/shardwire.h. */
#include "proxy/shardwire.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <mongoc/mongoc.h>

#include "auth/cluster.h"
#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "wire/msg.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0"
#endif

#define WCONN_IDLE_MAX 64   /* idle connections kept per member (= SHARDCONN_MAX_INFLIGHT) */
#define WCONN_FIRST_READ 16384 /* bytes asked by a reply's first recv: most replies fit */

typedef struct wconn {
	int fd;
	int32_t request_id; /* the last requestID sent on this connection */
	struct wconn *next;
} wconn;

struct shardwire {
	char *host_and_port;
	char *host; /* without brackets */
	char *port;
	char *set_name; /* NULL: a standalone, no check */
	uint32_t server_id;
	int connect_timeout_ms;
	int socket_timeout_ms;
	pthread_mutex_t mu; /* idle, n_idle, retired */
	wconn *idle;
	size_t n_idle;
	bool retired; /* shardwire_retire: keep no idle connection */
};

static pthread_once_t metrics_once = PTHREAD_ONCE_INIT;
static sdb_counter *m_opened, *m_stale;

static void metrics_init(void)
{
	m_opened = sdb_metrics_counter("stripedb_proxy_shard_wire_connections_total",
				       "Connections the proxy opened to shard members for its own "
				       "shard client (handshake and authentication done).",
				       NULL);
	m_stale = sdb_metrics_counter("stripedb_proxy_shard_wire_stale_total",
				      "Idle own shard connections found closed by their member "
				      "before a command was sent on them (replaced, nothing sent).",
				      NULL);
}

shardwire *shardwire_new(const char *host_and_port, uint32_t server_id, int connect_timeout_ms,
			 int socket_timeout_ms, const char *set_name)
{
	shardwire *w = sdb_calloc(1, sizeof *w);
	const char *colon = strrchr(host_and_port, ':');

	pthread_once(&metrics_once, metrics_init);
	w->host_and_port = sdb_strdup(host_and_port);
	if (colon == NULL) { /* libmongoc always gives a port; be lenient */
		w->host = sdb_strdup(host_and_port);
		w->port = sdb_strdup("27017");
	} else {
		const char *h = host_and_port;
		size_t hl = (size_t)(colon - host_and_port);
		if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
			h++;
			hl -= 2;
		}
		w->host = sdb_strndup(h, hl);
		w->port = sdb_strdup(colon + 1);
	}
	w->set_name = set_name ? sdb_strdup(set_name) : NULL;
	w->server_id = server_id;
	/* the URI's values as libmongoc reads them: socketTimeoutMS=0 is no timeout (a
	 * zero SO_RCVTIMEO / SO_SNDTIMEO blocks forever); connectTimeoutMS=0 is its default */
	w->connect_timeout_ms = connect_timeout_ms > 0 ? connect_timeout_ms
							: (int)MONGOC_DEFAULT_CONNECTTIMEOUTMS;
	w->socket_timeout_ms = socket_timeout_ms >= 0 ? socket_timeout_ms
						       : (int)MONGOC_DEFAULT_SOCKETTIMEOUTMS;
	pthread_mutex_init(&w->mu, NULL);
	return w;
}

void shardwire_free(shardwire *w)
{
	wconn *c, *n;

	if (w == NULL)
		return;
	for (c = w->idle; c; c = n) {
		n = c->next;
		close(c->fd);
		free(c);
	}
	pthread_mutex_destroy(&w->mu);
	free(w->host_and_port);
	free(w->host);
	free(w->port);
	free(w->set_name);
	free(w);
}

static void conn_close(wconn *c);

void shardwire_retire(shardwire *w)
{
	wconn *c, *n;

	pthread_mutex_lock(&w->mu);
	w->retired = true;
	c = w->idle;
	w->idle = NULL;
	w->n_idle = 0;
	pthread_mutex_unlock(&w->mu);
	for (; c; c = n) {
		n = c->next;
		conn_close(c);
	}
}

uint32_t shardwire_server_id(const shardwire *w)
{
	return w->server_id;
}

const char *shardwire_host(const shardwire *w)
{
	return w->host_and_port;
}

static void conn_close(wconn *c)
{
	if (c) {
		close(c->fd);
		free(c);
	}
}

/* ---------- one message each way ---------- */

/* Write all of iov (n entries, modified). 0, or -1 with errno (EAGAIN: SO_SNDTIMEO).
 * MSG_NOSIGNAL: a connection the peer reset is an EPIPE here, never a SIGPIPE. */
static int write_all(int fd, struct iovec *iov, int n)
{
	while (n > 0) {
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
		ssize_t k = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		while (n > 0 && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

/* Send cmd as an OP_MSG (flagBits 0, one kind-0 section) with the connection's next
 * requestID: the 21-byte prefix and the document's own bytes in one writev, no copy.
 * 0, or -1 with errno (nothing of a complete message reached the peer). */
static int send_cmd(wconn *c, const bson_t *cmd)
{
	uint8_t pre[WIRE_MSG_PREFIX_LEN];
	uint32_t blen = wire_bson_len(cmd);
	struct iovec iov[2];

	c->request_id = c->request_id == INT32_MAX ? 1 : c->request_id + 1;
	wire_msg_encode_msg_prefix(pre, c->request_id, 0, 0, blen);
	iov[0].iov_base = pre;
	iov[0].iov_len = sizeof pre;
	iov[1].iov_base = (void *)bson_get_data(cmd);
	iov[1].iov_len = blen;
	return write_all(c->fd, iov, 2);
}

/* Read n bytes into buf. 0; -1 with errno (EAGAIN: SO_RCVTIMEO), or 0-byte EOF as -1 with
 * errno ECONNRESET. */
static int read_all(int fd, uint8_t *buf, size_t n)
{
	while (n > 0) {
		ssize_t k = recv(fd, buf, n, MSG_WAITALL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = ECONNRESET;
			return -1;
		}
		buf += k;
		n -= (size_t)k;
	}
	return 0;
}

int shardwire_parse_reply(const uint8_t *msg, size_t len, int32_t request_id, bson_t *reply,
			  char *err, size_t errlen)
{
	wire_msg m;
	int code = 0;
	char perr[128];

	if (wire_msg_parse(msg, len, &m, &code, perr, sizeof perr) != 0) {
		snprintf(err, errlen, "malformed answer: %s", perr);
		return -1;
	}
	if (m.hdr.op_code != WIRE_OP_MSG || m.hdr.response_to != request_id || m.more_to_come ||
	    m.n_seqs != 0) {
		snprintf(err, errlen, "unexpected answer (opCode %d, responseTo %d, request %d)",
			 (int)m.hdr.op_code, (int)m.hdr.response_to, (int)request_id);
		return -1;
	}
	bson_concat(reply, &m.body);
	return 0;
}

/* The rest of a large plain answer (wire_msg_prefix_is_plain) of len bytes, got of them in
 * first: its document is read straight into reply (empty), not into a buffer of the
 * message and copied (a scan's batch through a proxy: that copy was 3% of the proxy's CPU
 * under YCSB E, issue #19). Checks what wire_msg_parse would (one document filling the
 * message, at most maxBsonObjectSize, well formed). 0, or -1 with a message in err (reply
 * then empty). */
static int recv_into(wconn *c, const uint8_t *first, size_t got, size_t len, bson_t *reply,
		     char *err, size_t errlen)
{
	size_t blen = len - WIRE_MSG_PREFIX_LEN, have = got - WIRE_MSG_PREFIX_LEN;
	uint8_t *b = bson_reserve_buffer(reply, (uint32_t)blen);
	char why[160];

	if (b == NULL) {
		snprintf(err, errlen, "answer of %zu bytes: out of memory", len);
		return -1;
	}
	memcpy(b, first + WIRE_MSG_PREFIX_LEN, have);
	if (read_all(c->fd, b + have, blen - have) != 0) {
		snprintf(err, errlen, "%s", errno == EAGAIN ? "socket timeout" : strerror(errno));
		bson_reinit(reply);
		return -1;
	}
	if (wire_msg_check_doc(b, blen, why, sizeof why) != 0) {
		snprintf(err, errlen, "malformed answer: %s", why);
		bson_reinit(reply);
		return -1;
	}
	return 0;
}

/* Read the answer to the last request of c into reply (initialised by the caller: its
 * body is appended). 0, or -1 with a message in err (the connection is then unusable). */
static int recv_reply(wconn *c, bson_t *reply, char *err, size_t errlen)
{
	uint8_t first[WCONN_FIRST_READ], *buf = first;
	size_t got = 0;
	int32_t len;
	int rc = -1;

	while (got < WIRE_MSG_HEADER_LEN) {
		ssize_t k = recv(c->fd, first + got, sizeof first - got, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			snprintf(err, errlen, "%s", k == 0 ? "connection closed by the shard"
						      : errno == EAGAIN ? "socket timeout"
									: strerror(errno));
			return -1;
		}
		got += (size_t)k;
	}
	len = wire_msg_peek_length(first);
	if (!wire_msg_length_ok(len) || (size_t)len < got) {
		snprintf(err, errlen, "bad answer length %d", (int)len);
		return -1;
	}
	if ((size_t)len > got) {
		if ((size_t)len > sizeof first && got >= WIRE_MSG_PREFIX_LEN && bson_empty(reply) &&
		    wire_msg_prefix_is_plain(first, c->request_id))
			return recv_into(c, first, got, (size_t)len, reply, err, errlen);
		if ((size_t)len > sizeof first) {
			buf = sdb_malloc((size_t)len);
			memcpy(buf, first, got);
		}
		if (read_all(c->fd, buf + got, (size_t)len - got) != 0) {
			snprintf(err, errlen, "%s",
				 errno == EAGAIN ? "socket timeout" : strerror(errno));
			goto out;
		}
	}
	rc = shardwire_parse_reply(buf, (size_t)len, c->request_id, reply, err, errlen);
out:
	if (buf != first)
		free(buf);
	return rc;
}

/* ---------- opening a connection ---------- */

/* auth_cluster_authenticate's transport: one command on the connection being opened. */
static int run_on(void *arg, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	wconn *c = arg;

	bson_init(reply);
	if (send_cmd(c, cmd) != 0)
		return sdb_errf(err, errlen, SDB_EIO, "send: %s", strerror(errno));
	if (recv_reply(c, reply, err, errlen) != 0)
		return SDB_EIO;
	return 0;
}

static void set_timeouts(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
	int one = 1;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A TCP connection to one address within timeout_ms: the fd (blocking), or -1 (errno). */
static int connect_one(const struct addrinfo *ai, int timeout_ms)
{
	int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			ai->ai_protocol);
	int soerr = 0;
	socklen_t sl = sizeof soerr;

	if (fd < 0)
		return -1;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		int k;
		if (errno != EINPROGRESS)
			goto fail;
		do
			k = poll(&p, 1, timeout_ms);
		while (k < 0 && errno == EINTR);
		if (k == 0) {
			errno = ETIMEDOUT;
			goto fail;
		}
		if (k < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
			goto fail;
		if (soerr != 0) {
			errno = soerr;
			goto fail;
		}
	}
	{
		/* blocking from here: every read and write is bounded by the timeouts */
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
			goto fail;
	}
	return fd;
fail: {
	int e = errno;
	close(fd);
	errno = e;
	return -1;
}
}

/* Open, greet and authenticate a connection to w's member: the connection, or NULL with a
 * message in err (nothing of any command was sent). */
static wconn *conn_open(shardwire *w, char *err, size_t errlen)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL,
			*ai;
	wconn *c;
	bson_t hello, reply, client, app, drv, os;
	bson_iter_t it;
	int fd = -1, e = 0, g;
	char aerr[256];

	if ((g = getaddrinfo(w->host, w->port, &hints, &res)) != 0) {
		snprintf(err, errlen, "cannot resolve %s: %s", w->host_and_port, gai_strerror(g));
		return NULL;
	}
	for (ai = res; ai && fd < 0; ai = ai->ai_next)
		if ((fd = connect_one(ai, w->connect_timeout_ms)) < 0)
			e = errno;
	freeaddrinfo(res);
	if (fd < 0) {
		snprintf(err, errlen, "cannot connect to %s: %s", w->host_and_port,
			 strerror(e ? e : ECONNREFUSED));
		return NULL;
	}
	/* the handshake and the authentication are bounded by connectTimeoutMS, as a
	 * driver's (CMAP spec: establishing a connection), so a member that accepts
	 * connections and answers nothing (a stopped process) costs that, not the socket
	 * timeout; commands get socketTimeoutMS after */
	set_timeouts(fd, w->connect_timeout_ms);
	c = sdb_calloc(1, sizeof *c);
	c->fd = fd;
	/* the handshake (MongoDB handshake spec): hello with the client metadata */
	bson_init(&hello);
	BSON_APPEND_INT32(&hello, "hello", 1);
	BSON_APPEND_DOCUMENT_BEGIN(&hello, "client", &client);
	BSON_APPEND_DOCUMENT_BEGIN(&client, "application", &app);
	BSON_APPEND_UTF8(&app, "name", "stripedb-proxy");
	bson_append_document_end(&client, &app);
	BSON_APPEND_DOCUMENT_BEGIN(&client, "driver", &drv);
	BSON_APPEND_UTF8(&drv, "name", "stripedb");
	BSON_APPEND_UTF8(&drv, "version", PACKAGE_VERSION);
	bson_append_document_end(&client, &drv);
	BSON_APPEND_DOCUMENT_BEGIN(&client, "os", &os);
	BSON_APPEND_UTF8(&os, "type", "Linux");
	bson_append_document_end(&client, &os);
	bson_append_document_end(&hello, &client);
	BSON_APPEND_UTF8(&hello, "$db", "admin");
	g = run_on(c, &hello, &reply, aerr, sizeof aerr);
	bson_destroy(&hello);
	if (g == 0 && !(bson_iter_init_find(&it, &reply, "ok") && bson_iter_as_bool(&it))) {
		snprintf(aerr, sizeof aerr, "hello refused");
		g = SDB_EPROTO;
	}
	if (g == 0 && w->set_name) {
		/* the member libmongoc knew, not whatever listens on its address now */
		const char *set = bson_iter_init_find(&it, &reply, "setName") &&
					  BSON_ITER_HOLDS_UTF8(&it)
				  ? bson_iter_utf8(&it, NULL)
				  : "";
		if (strcmp(set, w->set_name) != 0) {
			snprintf(aerr, sizeof aerr, "a member of replica set '%.60s', not '%.60s'",
				 set, w->set_name);
			g = SDB_EPROTO;
		}
	}
	bson_destroy(&reply);
	if (g == 0)
		g = auth_cluster_authenticate(run_on, c, aerr, sizeof aerr);
	if (g != 0) {
		snprintf(err, errlen, "%s: %.200s", w->host_and_port, aerr);
		conn_close(c);
		return NULL;
	}
	set_timeouts(fd, w->socket_timeout_ms);
	sdb_counter_inc(m_opened);
	return c;
}

/* An idle connection the member has not closed, or NULL when none is left. An idle
 * connection has nothing to read: a FIN (0), an RST (an error) or stray bytes all mean it
 * cannot carry a request any more. */
static wconn *conn_take_idle(shardwire *w)
{
	wconn *c;
	uint8_t b;

	for (;;) {
		pthread_mutex_lock(&w->mu);
		c = w->idle;
		if (c) {
			w->idle = c->next;
			w->n_idle--;
		}
		pthread_mutex_unlock(&w->mu);
		if (c == NULL)
			return NULL;
		if (recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
		    (errno == EAGAIN || errno == EWOULDBLOCK))
			return c;
		sdb_counter_inc(m_stale);
		conn_close(c);
	}
}

static void conn_give_back(shardwire *w, wconn *c)
{
	pthread_mutex_lock(&w->mu);
	if (!w->retired && w->n_idle < WCONN_IDLE_MAX) {
		c->next = w->idle;
		w->idle = c;
		w->n_idle++;
		c = NULL;
	}
	pthread_mutex_unlock(&w->mu);
	conn_close(c);
}

int shardwire_command(shardwire *w, const bson_t *cmd, bson_t *reply, char *err, size_t errlen)
{
	wconn *c = conn_take_idle(w);
	char why[256];

	bson_init(reply);
	if (c == NULL && (c = conn_open(w, why, sizeof why)) == NULL) {
		snprintf(err, errlen, "%s", why);
		return SHARDWIRE_UNSENT;
	}
	if (send_cmd(c, cmd) != 0) {
		snprintf(err, errlen, "send to %s: %s", w->host_and_port,
			 errno == EAGAIN ? "socket timeout" : strerror(errno));
		conn_close(c);
		return SHARDWIRE_UNSENT;
	}
	if (recv_reply(c, reply, why, sizeof why) != 0) {
		snprintf(err, errlen, "%s: %.200s", w->host_and_port, why);
		conn_close(c);
		bson_reinit(reply);
		return SHARDWIRE_UNKNOWN;
	}
	conn_give_back(w, c);
	return SHARDWIRE_OK;
}

int shardwire_take_idle_fd(shardwire *w, int32_t *request_id)
{
	wconn *c = conn_take_idle(w);
	int fd;

	if (c == NULL)
		return -1;
	fd = c->fd;
	*request_id = c->request_id;
	free(c);
	return fd;
}

void shardwire_count_stale(void)
{
	pthread_once(&metrics_once, metrics_init);
	sdb_counter_inc(m_stale);
}

int shardwire_socket_timeout_ms(const shardwire *w)
{
	return w->socket_timeout_ms;
}

bool shardwire_retired(shardwire *w)
{
	bool r;

	pthread_mutex_lock(&w->mu);
	r = w->retired;
	pthread_mutex_unlock(&w->mu);
	return r;
}
