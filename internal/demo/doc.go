// Package demo is `dedupworker demo`: it starts an in-process
// NATS JetStream server and an in-process Kafka-protocol broker, finds or
// starts a Redis, publishes messages with duplicates and forced redeliveries
// on both transports, runs the same worker `dedupworker run` runs (a forward
// relay per transport), and reports handler runs against unique keys.
package demo
