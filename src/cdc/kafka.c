/* The Kafka CDC log backend: kafka:BOOTSTRAP. One topic per shard
 * (CDC_TOPIC_PREFIX + shard id) with exactly one partition, so a shard's events keep
 * oplog order; the producer runs with enable.idempotence=true (acks=all, no reordering or
 * duplicates from its own retries); topics are created through the admin API. Message:
 * key = the oplog ts as 20 decimal digits (secs << 32 | inc; readable with kcat),
 * value = the oplog entry BSON, byte-identical. Offsets are Kafka offsets.
 *
 * Limits: locate (ts -> offset) scans the partition from its low watermark (O(events));
 * retention and archiving of Kafka ranges are left to the broker's own retention for now.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "cdc/log.h"
#include "cdc/publisher.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#define KAFKA_TIMEOUT_MS 10000

typedef struct kafka_log {
	char *bootstrap;
} kafka_log;

typedef struct kafka_writer {
	rd_kafka_t *rk;
	rd_kafka_topic_t *rkt;
	char *topic;
	rd_kafka_resp_err_t failed; /* first delivery error since the last flush */
} kafka_writer;

typedef struct kafka_src {
	rd_kafka_t *rk;
	char *topic;
	int at_eof; /* the broker said end of partition since the last message */
	rd_kafka_message_t *held; /* the last message returned */
} kafka_src;

static char *topic_of(const char *shard)
{
	return sdb_asprintf("%s%s", CDC_TOPIC_PREFIX, shard);
}

static rd_kafka_conf_t *base_conf(cdc_log *log)
{
	kafka_log *k = log->impl;
	rd_kafka_conf_t *c = rd_kafka_conf_new();
	char e[256];
	rd_kafka_conf_set(c, "bootstrap.servers", k->bootstrap, e, sizeof e);
	rd_kafka_conf_set(c, "log_level", "3", e, sizeof e);
	rd_kafka_conf_set(c, "message.max.bytes", "20000000", e, sizeof e);
	return c;
}

static int kafka_open(cdc_log *log, const char *arg, char *err, size_t errlen)
{
	kafka_log *k;
	if (arg[0] == '\0')
		return sdb_errf(err, errlen, SDB_EINVAL, "kafka: empty bootstrap server list");
	k = sdb_calloc(1, sizeof *k);
	k->bootstrap = sdb_strdup(arg);
	log->impl = k;
	return 0;
}

static void kafka_close(cdc_log *log)
{
	kafka_log *k = log->impl;
	free(k->bootstrap);
	free(k);
	log->impl = NULL;
}

/* A consumer assigned nowhere yet (no group: offsets are the caller's). */
static int new_consumer(cdc_log *log, rd_kafka_t **out, char *err, size_t errlen)
{
	rd_kafka_conf_t *c = base_conf(log);
	char e[256];
	rd_kafka_conf_set(c, "group.id", "stripedb-cdc-reader", e, sizeof e);
	rd_kafka_conf_set(c, "enable.auto.commit", "false", e, sizeof e);
	rd_kafka_conf_set(c, "enable.partition.eof", "true", e, sizeof e);
	rd_kafka_conf_set(c, "auto.offset.reset", "error", e, sizeof e);
	rd_kafka_conf_set(c, "fetch.message.max.bytes", "20000000", e, sizeof e);
	/* CDC consumers follow the head: answer fast rather than batch */
	rd_kafka_conf_set(c, "fetch.wait.max.ms", "20", e, sizeof e);
	rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, e, sizeof e);
	if (rk == NULL)
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka consumer: %s", e);
	rd_kafka_poll_set_consumer(rk);
	*out = rk;
	return 0;
}

static int assign_at(rd_kafka_t *rk, const char *topic, int64_t offset, char *err, size_t errlen)
{
	rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(l, topic, 0)->offset = offset;
	rd_kafka_resp_err_t r = rd_kafka_assign(rk, l);
	rd_kafka_topic_partition_list_destroy(l);
	if (r)
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka assign: %s", rd_kafka_err2str(r));
	return 0;
}

static int watermarks(rd_kafka_t *rk, const char *topic, int64_t *lo, int64_t *hi, char *err,
		      size_t errlen)
{
	rd_kafka_resp_err_t r =
		rd_kafka_query_watermark_offsets(rk, topic, 0, lo, hi, KAFKA_TIMEOUT_MS);
	if (r == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART ||
	    r == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION || r == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC) {
		*lo = *hi = 0;
		return 0;
	}
	if (r)
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka watermarks of %s: %s", topic,
				rd_kafka_err2str(r));
	return 0;
}

static uint64_t msg_ts(const rd_kafka_message_t *m)
{
	char buf[24];
	if (m->key == NULL || m->key_len == 0 || m->key_len >= sizeof buf)
		return 0;
	memcpy(buf, m->key, m->key_len);
	buf[m->key_len] = '\0';
	return strtoull(buf, NULL, 10);
}

/* Poll the next message of an assigned consumer: 1 message (*out, destroy it), 0 timeout,
 * 2 end of partition, or an error. */
static int poll_msg(rd_kafka_t *rk, int timeout_ms, rd_kafka_message_t **out, char *err,
		    size_t errlen)
{
	rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, timeout_ms);
	*out = NULL;
	if (m == NULL)
		return 0;
	if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
		rd_kafka_message_destroy(m);
		return 2;
	}
	if (m->err) {
		int rc = m->err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE ? SDB_ENOTFOUND
									  : SDB_EUNAVAILABLE;
		sdb_errf(err, errlen, rc, "kafka: %s", rd_kafka_message_errstr(m));
		rd_kafka_message_destroy(m);
		return rc;
	}
	if (m->len > CDC_MAX_EVENT) {
		rd_kafka_message_destroy(m);
		return sdb_errf(err, errlen, SDB_ECORRUPT, "kafka message of %zu bytes", m->len);
	}
	*out = m;
	return 1;
}

/* ts of the message at offset (0 on a miss). */
static int ts_at(cdc_log *log, const char *topic, int64_t offset, uint64_t *ts, char *err,
		 size_t errlen)
{
	rd_kafka_t *rk;
	rd_kafka_message_t *m = NULL;
	int rc = new_consumer(log, &rk, err, errlen);
	*ts = 0;
	if (rc)
		return rc;
	rc = assign_at(rk, topic, offset, err, errlen);
	for (int tries = 0; rc == 0 && tries < 50; tries++) {
		rc = poll_msg(rk, 200, &m, err, errlen);
		if (rc == 1) {
			*ts = msg_ts(m);
			rd_kafka_message_destroy(m);
			rc = 0;
			break;
		}
		if (rc == 2)
			rc = 0;
	}
	rd_kafka_destroy(rk);
	return rc;
}

/* 1 when the broker knows topic (with at least one partition), 0 when not, or an error. */
static int topic_exists(rd_kafka_t *rk, const char *topic, char *err, size_t errlen)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
	rd_kafka_resp_err_t r = rd_kafka_metadata(rk, 0, rkt, &md, KAFKA_TIMEOUT_MS);
	int rc;
	if (r) {
		rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka metadata of %s: %s", topic,
			      rd_kafka_err2str(r));
	} else {
		rc = md->topic_cnt == 1 && md->topics[0].err == 0 &&
		     md->topics[0].partition_cnt >= 1;
		rd_kafka_metadata_destroy(md);
	}
	rd_kafka_topic_destroy(rkt);
	return rc;
}

static int create_topic(rd_kafka_t *rk, const char *topic, char *err, size_t errlen)
{
	char e[256];
	int rc = topic_exists(rk, topic, err, errlen);
	if (rc != 0)
		return rc < 0 ? rc : 0;
	rd_kafka_NewTopic_t *nt = rd_kafka_NewTopic_new(topic, 1, -1, e, sizeof e);
	if (nt == NULL)
		return sdb_errf(err, errlen, SDB_EINVAL, "kafka topic %s: %s", topic, e);
	rd_kafka_NewTopic_set_config(nt, "max.message.bytes", "20000000");
	rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
	rd_kafka_AdminOptions_t *o = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS);
	rd_kafka_AdminOptions_set_request_timeout(o, 3000, e, sizeof e);
	rd_kafka_AdminOptions_set_operation_timeout(o, 3000, e, sizeof e);
	rd_kafka_CreateTopics(rk, &nt, 1, o, q);
	rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 5000);
	if (ev == NULL || rd_kafka_event_error(ev) == RD_KAFKA_RESP_ERR__TIMED_OUT ||
	    rd_kafka_event_error(ev) == RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE) {
		/* brokers without the admin API or a controller (librdkafka 2.0's mock cluster):
		 * go on with a pre-created or auto-created topic */
		sdb_warn("kafka: CreateTopics not answered; relying on an existing or auto-created "
			 "topic", "topic=%s", topic);
	} else if (rd_kafka_event_error(ev)) {
		rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka: create topic %s: %s", topic,
			      rd_kafka_event_error_string(ev));
	} else {
		size_t n = 0;
		const rd_kafka_CreateTopics_result_t *res = rd_kafka_event_CreateTopics_result(ev);
		const rd_kafka_topic_result_t **tr = rd_kafka_CreateTopics_result_topics(res, &n);
		for (size_t i = 0; i < n; i++) {
			rd_kafka_resp_err_t te = rd_kafka_topic_result_error(tr[i]);
			if (te && te != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
				rc = sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka: create topic %s: %s",
					      topic, rd_kafka_topic_result_error_string(tr[i]));
		}
	}
	if (ev)
		rd_kafka_event_destroy(ev);
	rd_kafka_AdminOptions_destroy(o);
	rd_kafka_queue_destroy(q);
	rd_kafka_NewTopic_destroy(nt);
	return rc;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	kafka_writer *w = opaque;
	(void)rk;
	if (m->err && w->failed == 0)
		w->failed = m->err;
}

static void kafka_writer_close(void *wp);

static int kafka_writer_open(cdc_log *log, const char *shard, void **out, uint64_t *next_offset,
			     uint64_t *last_ts, char *err, size_t errlen)
{
	kafka_writer *w = sdb_calloc(1, sizeof *w);
	rd_kafka_conf_t *c = base_conf(log);
	char e[256];
	int64_t lo = 0, hi = 0;
	int rc = 0;
	w->topic = topic_of(shard);
	rd_kafka_conf_set(c, "enable.idempotence", "true", e, sizeof e);
	/* topics are created explicitly with one partition, never by a metadata request */
	rd_kafka_conf_set(c, "allow.auto.create.topics", "false", e, sizeof e);
	rd_kafka_conf_set(c, "linger.ms", "2", e, sizeof e);
	rd_kafka_conf_set_opaque(c, w);
	rd_kafka_conf_set_dr_msg_cb(c, on_delivery);
	w->rk = rd_kafka_new(RD_KAFKA_PRODUCER, c, e, sizeof e);
	if (w->rk == NULL) {
		free(w->topic);
		free(w);
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka producer: %s", e);
	}
	rc = create_topic(w->rk, w->topic, err, errlen);
	if (rc == 0)
		rc = watermarks(w->rk, w->topic, &lo, &hi, err, errlen);
	*last_ts = 0;
	if (rc == 0 && hi > lo)
		rc = ts_at(log, w->topic, hi - 1, last_ts, err, errlen);
	if (rc) {
		kafka_writer_close(w);
		return rc;
	}
	w->rkt = rd_kafka_topic_new(w->rk, w->topic, NULL);
	*next_offset = (uint64_t)hi;
	*out = w;
	return 0;
}

static int kafka_append(void *wp, uint64_t offset, uint64_t ts, const uint8_t *data, size_t len,
			char *err, size_t errlen)
{
	kafka_writer *w = wp;
	char key[24];
	int n = snprintf(key, sizeof key, "%020" PRIu64, ts);
	(void)offset;
	for (;;) {
		if (rd_kafka_produce(w->rkt, 0, RD_KAFKA_MSG_F_COPY, (void *)data, len, key,
				     (size_t)n, NULL) == 0)
			break;
		rd_kafka_resp_err_t r = rd_kafka_last_error();
		if (r != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka produce: %s",
					rd_kafka_err2str(r));
		rd_kafka_poll(w->rk, 10);
	}
	rd_kafka_poll(w->rk, 0);
	if (w->failed)
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka delivery: %s",
				rd_kafka_err2str(w->failed));
	return 0;
}

static int kafka_flush(void *wp, char *err, size_t errlen)
{
	kafka_writer *w = wp;
	rd_kafka_resp_err_t r = rd_kafka_flush(w->rk, 30000);
	if (r == RD_KAFKA_RESP_ERR__TIMED_OUT)
		return sdb_errf(err, errlen, SDB_ETIMEOUT, "kafka flush timed out");
	if (w->failed) {
		r = w->failed;
		w->failed = 0;
		return sdb_errf(err, errlen, SDB_EUNAVAILABLE, "kafka delivery: %s",
				rd_kafka_err2str(r));
	}
	return 0;
}

static void kafka_writer_close(void *wp)
{
	kafka_writer *w = wp;
	if (w->rk)
		rd_kafka_flush(w->rk, 5000);
	if (w->rkt)
		rd_kafka_topic_destroy(w->rkt);
	if (w->rk)
		rd_kafka_destroy(w->rk);
	free(w->topic);
	free(w);
}

static int kafka_range(cdc_log *log, const char *shard, cdc_range *out, char *err, size_t errlen)
{
	rd_kafka_t *rk;
	char *topic = topic_of(shard);
	int64_t lo = 0, hi = 0;
	int rc = new_consumer(log, &rk, err, errlen);
	memset(out, 0, sizeof *out);
	if (rc)
		goto out;
	rc = watermarks(rk, topic, &lo, &hi, err, errlen);
	rd_kafka_destroy(rk);
	if (rc)
		goto out;
	out->first_offset = (uint64_t)lo;
	out->next_offset = (uint64_t)hi;
	if (hi > lo) {
		rc = ts_at(log, topic, lo, &out->first_ts, err, errlen);
		if (rc == 0)
			rc = ts_at(log, topic, hi - 1, &out->last_ts, err, errlen);
	}
out:
	free(topic);
	return rc;
}

static int kafka_src_open(cdc_log *log, const char *shard, uint64_t offset, void **out,
			  char *err, size_t errlen)
{
	kafka_src *s = sdb_calloc(1, sizeof *s);
	int rc = new_consumer(log, &s->rk, err, errlen);
	s->topic = topic_of(shard);
	if (rc == 0)
		rc = assign_at(s->rk, s->topic, (int64_t)offset, err, errlen);
	if (rc) {
		if (s->rk)
			rd_kafka_destroy(s->rk);
		free(s->topic);
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static int kafka_src_next(void *sp, cdc_event *ev, int timeout_ms, char *err, size_t errlen)
{
	kafka_src *s = sp;
	rd_kafka_message_t *m;
	if (s->held) {
		rd_kafka_message_destroy(s->held);
		s->held = NULL;
	}
	/* "nothing there yet" is only known once the broker said end of partition: until
	 * then wait for a fetch (bounded) even when timeout_ms is 0 */
	int64_t deadline = (int64_t)sdb_mono_ms() + (s->at_eof ? timeout_ms : KAFKA_TIMEOUT_MS);
	int rc;
	for (;;) {
		int64_t left = deadline - (int64_t)sdb_mono_ms();
		rc = poll_msg(s->rk, left > 0 ? (int)(left < 100 ? left : 100) : 0, &m, err,
			      errlen);
		if (rc == 2) {
			s->at_eof = 1;
			int64_t d2 = (int64_t)sdb_mono_ms() + timeout_ms;
			if (d2 < deadline)
				deadline = d2;
		}
		if (rc == 1 || rc < 0 || (int64_t)sdb_mono_ms() >= deadline)
			break;
	}
	if (rc != 1)
		return rc < 0 ? rc : 0;
	s->at_eof = 0;
	s->held = m;
	ev->offset = (uint64_t)m->offset;
	ev->ts = msg_ts(m);
	ev->data = m->payload;
	ev->len = m->len;
	return 1;
}

static void kafka_src_close(void *sp)
{
	kafka_src *s = sp;
	if (s->held)
		rd_kafka_message_destroy(s->held);
	rd_kafka_consumer_close(s->rk);
	rd_kafka_destroy(s->rk);
	free(s->topic);
	free(s);
}

static int kafka_locate(cdc_log *log, const char *shard, uint64_t after_ts, uint64_t *offset,
			char *err, size_t errlen)
{
	cdc_range g;
	void *src;
	cdc_event ev;
	int rc = kafka_range(log, shard, &g, err, errlen);
	if (rc)
		return rc;
	*offset = g.next_offset;
	if (g.next_offset == g.first_offset || g.last_ts <= after_ts)
		return 0;
	if (g.first_ts > after_ts) {
		*offset = g.first_offset;
		return 0;
	}
	rc = kafka_src_open(log, shard, g.first_offset, &src, err, errlen);
	if (rc)
		return rc;
	while ((rc = kafka_src_next(src, &ev, 2000, err, errlen)) == 1) {
		if (ev.ts > after_ts) {
			*offset = ev.offset;
			break;
		}
	}
	kafka_src_close(src);
	return rc < 0 ? rc : 0;
}

const cdc_backend cdc_backend_kafka = {
	.name = "kafka",
	.open = kafka_open,
	.close = kafka_close,
	.writer_open = kafka_writer_open,
	.append = kafka_append,
	.flush = kafka_flush,
	.writer_close = kafka_writer_close,
	.range = kafka_range,
	.locate = kafka_locate,
	.src_open = kafka_src_open,
	.src_next = kafka_src_next,
	.src_close = kafka_src_close,
};
