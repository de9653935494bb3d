// Package testenv finds the services tests run against, and holds what every
// package's tests share.
//
// # Finding Redis, NATS and Kafka
//
// [Redis], [NATS], [Kafka] and [RealKafka] look for their server once per
// test binary, in this order:
//
//  1. the environment: REDIS_URL, NATS_URL, KAFKA_BROKERS (comma-separated);
//     a server the environment names must answer;
//  2. the local default, when it answers: redis://127.0.0.1:6379/0,
//     nats://127.0.0.1:4222, 127.0.0.1:9092 (as .ci/services.sh starts
//     them);
//  3. a container started with testcontainers-go, when a Docker engine
//     answers: Redis, NATS with JetStream, and one Apache Kafka node in
//     KRaft mode. Each is started once per test binary, shared by its
//     tests, and removed when the binary exits (a child process of the
//     binary removes them however it exits, so no container is left
//     behind even without Ryuk, the testcontainers reaper);
//  4. otherwise the test is skipped, or failed when
//     DEDUP_REQUIRE_SERVICES=1, with a message naming the missing service
//     and what each step found. ([Kafka] alone falls back to an in-process
//     kfake broker instead of skipping.)
//
// The variables of the container path:
//
//   - DEDUP_TEST_CONTAINERS: unset, containers are the third step above;
//     "only", Redis, NATS and Kafka come from containers whatever the
//     environment names or the local defaults answer (to test the
//     container path on a machine that has both), a container that cannot
//     be started fails the test, and the topologies containers do not
//     provide skip; "off", no container is ever started.
//   - DEDUP_REDIS_IMAGE, DEDUP_NATS_IMAGE, DEDUP_KAFKA_IMAGE: the images,
//     by default [DefaultRedisImage], [DefaultNATSImage] and
//     [DefaultKafkaImage]. Another image must take the same arguments:
//     redis-server's, nats-server's, and the official apache/kafka image's
//     KAFKA_* variables.
//   - DEDUP_TEST_CONTAINER_NETWORK=host: every container uses the host's
//     network, each server on free loopback ports of its own, instead of
//     Docker's default bridge network and mapped ports. CI sets it so that
//     all traffic stays on loopback.
//   - DOCKER_HOST and the other variables of testcontainers-go itself
//     (TESTCONTAINERS_RYUK_DISABLED=true where the Ryuk image cannot be
//     pulled).
//
// A started container's address is also set as REDIS_URL, NATS_URL or
// KAFKA_BROKERS for the rest of the test binary, so that examples and the
// binaries tests run, which read those, use the same server; and it is
// handed to a test binary that a test runs again as a child process
// (DEDUP_TESTENV_REDIS_CONTAINER and its like), which takes it instead of
// starting its own. Containers are labelled with the host and the pid of
// their test binary; a binary whose containers outlived it (its reaper
// killed too) has them removed by the next test binary that starts one,
// and what a reaper could not remove it writes to
// $TMPDIR/dedupworker-testenv-reaper.log.
//
// The Kafka container has the listeners of .ci/kafka.sh's single node, on
// ports of its own: PLAINTEXT, a CUT listener for [KafkaCut], and for
// [RealKafkaSecurity] SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)
// and SASL_SSL (SCRAM-SHA-256, with a certificate of a CA made for it).
//
// The multi-node topologies come from .ci/services.sh only: a Redis Cluster
// ([RedisCluster]: REDIS_CLUSTER_ADDRS or 127.0.0.1:7000-7002), a Sentinel
// deployment ([RedisSentinel]: REDIS_SENTINEL_ADDRS or
// 127.0.0.1:26390-26392) and the 3-node Kafka cluster ([KafkaCluster]:
// KAFKA_CLUSTER_BROKERS or 127.0.0.1:19092-19094). A test that needs one
// that is absent is skipped with a message naming it.
//
// # Shared helpers
//
// The package is also the one home of what every package's tests share:
// private redis-server processes ([NewRedisServer], [StartReplicatedRedis]),
// polling with a deadline ([Eventually], [EventuallyNil]), a logger into the
// test's log ([Logger]; DEDUP_TEST_LOG=debug shows every level), run-unique
// names ([RandID], [UniqueName]), free ports ([FreePort], [FreeAddr]), a
// test's own NATS connection and streams ([NATSConnect], [CreateStream],
// [NewNATSStream], [EachNATSServer]), Kafka topics, producing to exact
// partitions and reading offsets back ([CreateKafkaTopic], [ProduceKafka],
// [KafkaCommitted], [KafkaEnds], [ReadKafka]), and binaries run in the
// background ([StartProcess]).
package testenv
