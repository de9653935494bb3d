// Package testenv finds the services tests run against (SPEC §10): from the
// environment (REDIS_URL, NATS_URL, KAFKA_BROKERS), then local defaults, then
// in-process servers. A service that cannot be found skips the test, or fails
// it when DEDUP_REQUIRE_SERVICES=1.
//
// It is also the one home of what every package's tests share: private
// redis-server processes (NewRedisServer, StartReplicatedRedis), polling
// with a deadline (Eventually, EventuallyNil), a logger into the test's log
// (Logger; DEDUP_TEST_LOG=debug shows every level), run-unique names
// (RandID, UniqueName), free ports (FreePort, FreeAddr), a test's own NATS
// connection and streams (NATSConnect, CreateStream, NewNATSStream,
// EachNATSServer), Kafka topics, producing to exact partitions and reading
// offsets back (CreateKafkaTopic, ProduceKafka, KafkaCommitted, KafkaEnds,
// ReadKafka), and binaries run in the background (StartProcess).
package testenv
