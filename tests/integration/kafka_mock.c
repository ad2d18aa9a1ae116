/* A Kafka protocol broker on loopback for the CDC tests: librdkafka's mock cluster
 * (rdkafka_mock.h). Usage: kafka_mock [BROKERS [TOPIC...]]: TOPICs are created with one
 * partition (librdkafka 2.0's mock broker does not serve CreateTopics). Prints the bootstrap servers
 * ("127.0.0.1:P,...") on one line on stdout, then serves until stdin closes or SIGTERM.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

static volatile sig_atomic_t done;

static void on_signal(int sig)
{
	(void)sig;
	done = 1;
}

int main(int argc, char **argv)
{
	int brokers = argc > 1 ? atoi(argv[1]) : 1;
	char errstr[256];
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	char buf[64];

	if (brokers < 1 || brokers > 9) {
		fprintf(stderr, "usage: kafka_mock [BROKERS 1..9]\n");
		return 2;
	}
	rd_kafka_conf_set(conf, "log_level", "3", errstr, sizeof errstr);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof errstr);
	if (rk == NULL) {
		fprintf(stderr, "kafka_mock: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, brokers);
	if (mc == NULL) {
		fprintf(stderr, "kafka_mock: cannot start the mock cluster\n");
		rd_kafka_destroy(rk);
		return 1;
	}
	for (int i = 2; i < argc; i++) {
		if (rd_kafka_mock_topic_create(mc, argv[i], 1, 1) != 0) {
			fprintf(stderr, "kafka_mock: cannot create topic %s\n", argv[i]);
			return 1;
		}
	}
	printf("%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	/* serve until stdin closes (the test process went away) or a signal */
	while (!done && read(0, buf, sizeof buf) > 0)
		;
	rd_kafka_mock_cluster_destroy(mc);
	rd_kafka_destroy(rk);
	return 0;
}
