package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// tsHeader carries a latency message's publish time (unix ns); every
// contender copies headers to its output.
const tsHeader = "Bench-Ts"

// keyHeader is the header every contender takes the idempotency key from.
const keyHeader = "Idempotency-Key"

// partitionKeyHeader repeats the Kafka key as a header for the Watermill
// peer, whose subscriber does not pass the key on.
const partitionKeyHeader = "Bench-Key"

// kafkaAdmin creates and deletes the benchmark's topics.
type kafkaAdmin struct{ brokers []string }

func (k kafkaAdmin) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(k.brokers...), Timeout: 10 * time.Second}
}

func (k kafkaAdmin) create(ctx context.Context, partitions int, topics ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := &kafka.CreateTopicsRequest{}
	for _, t := range topics {
		req.Topics = append(req.Topics, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1})
	}
	resp, err := k.client().CreateTopics(ctx, req)
	if err != nil {
		return fmt.Errorf("kafka create topics: %w", err)
	}
	for _, t := range topics {
		if err := resp.Errors[t]; err != nil {
			return fmt.Errorf("kafka create topic %s: %w", t, err)
		}
	}
	for _, t := range topics {
		if err := k.waitLeaders(ctx, t, partitions); err != nil {
			return err
		}
	}
	return nil
}

func (k kafkaAdmin) waitLeaders(ctx context.Context, topic string, partitions int) error {
	var last error
	for {
		md, err := k.client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Host != ""
			}
			if ready {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka topic %s has no leaders (last error %v): %w", topic, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (k kafkaAdmin) delete(topics ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := k.client().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("kafka delete topics %v: %w", topics, err)
	}
	var errs []error
	for t, e := range resp.Errors {
		if e != nil {
			errs = append(errs, fmt.Errorf("kafka delete topic %s: %w", t, e))
		}
	}
	return errors.Join(errs...)
}

// producer returns a client that writes to topic, each record to the
// partition it names, acknowledged by every in-sync replica, without
// lingering (a latency message goes out when it is produced).
func (k kafkaAdmin) producer(topic string) (*kgo.Client, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(k.brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0), kgo.ProduceRequestTimeout(10*time.Second), kgo.RecordDeliveryTimeout(30*time.Second),
		kgo.DialTimeout(5*time.Second), kgo.MaxBufferedRecords(100000),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka producer: %w", err)
	}
	return cl, nil
}

func kafkaRecord(in input, ts time.Time) *kgo.Record {
	k := partitionKey(in.Part)
	r := &kgo.Record{Partition: int32(in.Part), Key: []byte(k), Value: payload(in), Headers: []kgo.RecordHeader{
		{Key: keyHeader, Value: []byte(in.Key)},
		{Key: partitionKeyHeader, Value: []byte(k)},
	}}
	if !ts.IsZero() {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: tsHeader, Value: []byte(strconv.FormatInt(ts.UnixNano(), 10))})
	}
	return r
}

// produceAll produces records as send says and returns the first error of
// any of them once all are acknowledged.
func (k kafkaAdmin) produceAll(ctx context.Context, topic string, send func(produce func(*kgo.Record)) error) error {
	cl, err := k.producer(topic)
	if err != nil {
		return err
	}
	defer cl.Close()
	var mu sync.Mutex
	var perr error
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			mu.Lock()
			perr = errors.Join(perr, err)
			mu.Unlock()
		}
	}
	err = send(func(r *kgo.Record) { cl.Produce(ctx, r, promise) })
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	ferr := cl.Flush(fctx)
	mu.Lock()
	defer mu.Unlock()
	if err := errors.Join(err, ferr, perr); err != nil {
		return fmt.Errorf("kafka produce to %s: %w", topic, err)
	}
	return nil
}

// publishBacklog writes plan to topic before the relay starts.
func (k kafkaAdmin) publishBacklog(ctx context.Context, topic string, plan []input) error {
	return k.produceAll(ctx, topic, func(produce func(*kgo.Record)) error {
		for _, in := range plan {
			produce(kafkaRecord(in, time.Time{}))
		}
		return nil
	})
}

// publishPaced writes plan at rate messages per second, each stamped with
// its publish time, and returns the rate it achieved.
func (k kafkaAdmin) publishPaced(ctx context.Context, topic string, plan []input, rate float64) (float64, error) {
	var achieved float64
	err := k.produceAll(ctx, topic, func(produce func(*kgo.Record)) error {
		var err error
		achieved, err = pace(ctx, len(plan), rate, func(from, to int) error {
			now := time.Now()
			for _, in := range plan[from:to] {
				produce(kafkaRecord(in, now))
			}
			return nil
		})
		return err
	})
	return achieved, err
}

// pace calls send for the messages due so far, every millisecond, so that
// n messages go out at rate per second; it returns the rate achieved.
func pace(ctx context.Context, n int, rate float64, send func(from, to int) error) (float64, error) {
	start := time.Now()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	sent := 0
	for sent < n {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case now := <-t.C:
			due := min(n, int(now.Sub(start).Seconds()*rate)+1)
			if due > sent {
				if err := send(sent, due); err != nil {
					return 0, err
				}
				sent = due
			}
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// readKafkaOutput reads every partition of topic from its first offset into
// rec until the returned function is called, which stops the reader and
// waits for it. It uses franz-go, a client none of the contenders uses.
func readKafkaOutput(ctx context.Context, brokers []string, topic string, partitions int, rec *recorder) (func(), error) {
	offsets := map[int32]kgo.Offset{}
	for p := range partitions {
		offsets[int32(p)] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond), kgo.DialTimeout(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("kafka output reader: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return
			}
			now := time.Now()
			fs.EachRecord(func(r *kgo.Record) {
				var ts string
				for _, h := range r.Headers {
					if h.Key == tsHeader {
						ts = string(h.Value)
					}
				}
				rec.add(int(r.Partition), r.Value, ts, now)
			})
		}
	}()
	return func() { cancel(); <-done; cl.Close() }, nil
}

// brokerAddrs returns the host:port of every broker the cluster's metadata
// lists: those that lead the benchmark's partitions, whatever -kafka names.
func (k kafkaAdmin) brokerAddrs(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := k.client().Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, fmt.Errorf("kafka metadata: %w", err)
	}
	out := make([]string, 0, len(md.Brokers))
	for _, br := range md.Brokers {
		out = append(out, net.JoinHostPort(br.Host, strconv.Itoa(br.Port)))
	}
	return out, nil
}
