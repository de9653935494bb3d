// Package kafkasource is dedupworker's Kafka transport: a [Source] that
// consumes one topic as a member of a consumer group, over
// github.com/segmentio/kafka-go. Library users hand it to the worker with
// their handler; the dedupworker binary builds one from a config's
// source.kafka block.
//
//	src, err := kafkasource.New(kafkasource.Config{
//		Brokers: []string{"127.0.0.1:9092"},
//		Topic:   "orders",
//		GroupID: "orders-dedup",
//	})
//
// # Order and concurrency
//
// Partitions run in parallel. Inside a partition messages run in offset
// order ([OrderingPartition]), or with [OrderingKey] distinct message keys
// run in parallel, each key in offset order. Each fetched batch (up to
// [Config.BatchSize] messages) is shown to [consumer.Runner.Prepare] once
// before it runs, so the deduplication engine claims it in one Redis round
// trip. [Config.FetchBufferBytes] bounds in bytes the fetched messages not
// yet finished, across partitions.
//
// # Retries, dead letters and commits
//
// Kafka cannot redeliver one message, so a Nak is a retry in place: the
// partition (or the key) waits the delay and runs the message again. A dead
// letter is produced to [Config.DeadLetterTopic] with its key, payload and
// headers plus the dead-letter headers, and waits for all in-sync replicas.
// The committed offset of a partition is its lowest unfinished offset, so a
// crash never skips a message; what ran but was not committed is delivered
// again and acked as a duplicate. Offsets are committed every
// [Config.CommitInterval], when a partition is revoked and when the source
// stops. Under [IsolationReadCommitted] (the default) records of aborted
// transactions are never handed on.
//
// # Rebalances and shutdown
//
// When a generation ends, deliveries fetched but not started are cancelled
// with [ErrStopping] (their claims released), running ones may finish for up
// to [Config.RevokeTimeout] and are then cancelled with [ErrRevoked], and
// what finished is committed before the group moves on. When Consume's
// context ends, the member stops fetching, lets running deliveries finish,
// commits and leaves the group. kafka-go has no cooperative rebalancing:
// every rebalance revokes all partitions of every member. Why the source is
// built on kafka-go's ConsumerGroup, reads fetch responses itself and
// heartbeats between generations is in docs/DECISIONS.md.
package kafkasource
