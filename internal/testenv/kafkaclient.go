package testenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// Deadlines of the Kafka client helpers: producing waits for every
// replica's ack of a batch of thousands of messages; reading a partition
// waits for its messages up to its end offset.
const (
	kafkaProduceWithin = 60 * time.Second
	kafkaRequestWithin = 10 * time.Second
	kafkaReadWithin    = 20 * time.Second
)

// ProduceKafka writes msgs to topic, each to the partition its Partition
// field names (kafka.Writer ignores that field without a balancer that
// reads it), and waits up to 60s until every one is acknowledged by all
// in-sync replicas, failing t otherwise.
//
// The writer has a transport of its own: kafka-go's default transport
// answers a writer's metadata request from a cache per broker address,
// refreshed every few seconds, so a topic just created through another
// address (a test's proxy, another listener) is unknown to it until then.
// A fresh cache can still miss a topic whose creation has not reached the
// broker asked; the call then fails before it writes anything, and is
// tried again.
func ProduceKafka(t testing.TB, brokers []string, topic string, msgs []kafka.Message) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaProduceWithin)
	defer cancel()
	for {
		err := w.WriteMessages(ctx, msgs...)
		if err == nil {
			return
		}
		// The topic's metadata lookup failed: WriteMessages wrote nothing.
		if errors.Is(err, kafka.UnknownTopicOrPartition) && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		t.Fatalf("testenv: producing %d messages to %s: %v", len(msgs), topic, err)
	}
}

// KafkaCommitted returns group's committed offset of each of topic's
// partitions 0 to partitions-1: -1 where the group committed none, as
// Apache Kafka answers (kfake leaves such a partition out). A failed request is reported
// with t.Errorf, not Fatalf, and returns nil, so that a goroutine of the
// test watching the commits may call it.
func KafkaCommitted(t testing.TB, brokers []string, group, topic string, partitions int) map[int]int64 {
	t.Helper()
	out, err := KafkaCommittedErr(brokers, group, topic, partitions)
	if err != nil {
		t.Errorf("testenv: %v", err)
		return nil
	}
	return out
}

// KafkaCommittedErr is KafkaCommitted with the request's error returned
// rather than reported: for a test that polls the commits while it kills
// brokers, where a request may meet the group's coordinator as it moves.
func KafkaCommittedErr(brokers []string, group, topic string, partitions int) (map[int]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), kafkaRequestWithin)
	defer cancel()
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: kafkaRequestWithin}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return nil, fmt.Errorf("fetching the offsets group %s committed on %s: %w", group, topic, err)
	}
	out := make(map[int]int64, partitions)
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}

// KafkaEnds returns the log-end offset of each of topic's partitions 0 to
// partitions-1.
func KafkaEnds(t testing.TB, brokers []string, topic string, partitions int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaRequestWithin)
	defer cancel()
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for p := range partitions {
		req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: kafkaRequestWithin}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		t.Fatalf("testenv: listing the end offsets of %s: %v", topic, err)
	}
	out := make(map[int]int64, partitions)
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = p.LastOffset
	}
	return out
}

// ReadKafka reads every message of topic's partitions 0 to partitions-1
// from the start up to the end offset KafkaEnds finds first, partition by
// partition, in offset order, waiting up to 20s for each partition.
func ReadKafka(t testing.TB, brokers []string, topic string, partitions int) []kafka.Message {
	t.Helper()
	ends := KafkaEnds(t, brokers, topic, partitions)
	var out []kafka.Message
	for p := range partitions {
		if ends[p] == 0 {
			continue
		}
		out = append(out, readPartition(t, brokers, topic, p, ends[p])...)
	}
	return out
}

// readPartition reads partition p of topic up to offset end.
func readPartition(t testing.TB, brokers []string, topic string, p int, end int64) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), kafkaReadWithin)
	defer cancel()
	var out []kafka.Message
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			t.Fatalf("testenv: reading %s/%d up to offset %d (%d messages read): %v", topic, p, end, len(out), err)
		}
		out = append(out, m)
		if m.Offset+1 >= end {
			return out
		}
	}
}
