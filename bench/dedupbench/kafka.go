package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/bench/dedupbench/internal/benchutil"
	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

const kafkaPartitions = 8

type kafkaTransport struct {
	brokers    []string
	batch      int
	unfinished int
	fetchBytes int
	ordering   string
	soak       bool
	cluster    *kfake.Cluster // the in-process broker, or nil
}

func startKafka(b *bench) ([]string, *kfake.Cluster, error) {
	if b.o.kafka != "" {
		return benchutil.SplitList(b.o.kafka), nil, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("starting kfake: %w", err)
	}
	b.fixups = append(b.fixups, c.Close)
	return c.ListenAddrs(), c, nil
}

func newKafka(_ context.Context, b *bench) (*kafkaTransport, error) {
	brokers, cluster, err := startKafka(b)
	if err != nil {
		return nil, err
	}
	return &kafkaTransport{brokers: brokers, batch: b.o.batch, unfinished: b.o.kafkaUnfinished, fetchBytes: b.o.kafkaFetchBytes, ordering: b.o.kafkaOrdering, soak: b.o.soak > 0, cluster: cluster}, nil
}

func (t *kafkaTransport) name() string { return "kafka" }

func topic(id string) string { return "dedupbench-" + id }

func (t *kafkaTransport) client() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(t.brokers...), Timeout: 10 * time.Second}
}

func (t *kafkaTransport) create(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cl := t.client()
	name := topic(id)
	tc := kafka.TopicConfig{Topic: name, NumPartitions: kafkaPartitions, ReplicationFactor: 1}
	if t.soak {
		// Bounded broker memory over a soak (kfake applies it on
		// ApplyRetention, which the soak calls).
		tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: "60000"}}
	}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err != nil {
		return err
	}
	if err := resp.Errors[name]; err != nil {
		return err
	}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{name}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == kafkaPartitions {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s has no leaders: %v", name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (t *kafkaTransport) destroy(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = t.client().DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic(id)}})
}

func (t *kafkaTransport) publish(ctx context.Context, id string, keys []string, rate float64) error {
	w := &kafka.Writer{
		Addr: kafka.TCP(t.brokers...), Topic: topic(id), Balancer: &kafka.RoundRobin{},
		BatchSize: 1000, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireOne,
		WriteTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
	}
	defer func() { _ = w.Close() }()
	msgs := make([]kafka.Message, 0, 1000)
	return pace(ctx, len(keys), rate, func(lo, hi int) error {
		for lo < hi {
			end := min(hi, lo+1000)
			msgs = msgs[:0]
			for _, k := range keys[lo:end] {
				m := kafka.Message{Value: payload(k), Headers: []kafka.Header{{Key: keyHeader, Value: []byte(k)}}}
				if rate > 0 {
					m.Headers = append(m.Headers, kafka.Header{Key: tsHeader, Value: []byte(strconv.FormatInt(time.Now().UnixNano(), 10))})
				}
				msgs = append(msgs, m)
			}
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := w.WriteMessages(wctx, msgs...)
			cancel()
			if err != nil {
				return err
			}
			lo = end
		}
		return nil
	})
}

func (t *kafkaTransport) reader(id string) *kafka.Reader {
	return kafka.NewReader(kafka.ReaderConfig{
		Brokers: t.brokers, GroupID: topic(id) + "-plain", Topic: topic(id),
		MaxWait: 100 * time.Millisecond, CommitInterval: time.Second,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		StartOffset: kafka.FirstOffset,
	})
}

func header(hs []kafka.Header, name string) string {
	for _, h := range hs {
		if strings.EqualFold(h.Key, name) {
			return string(h.Value)
		}
	}
	return ""
}

// raw is a kafka-go group Reader: fetch, then commit (every second).
func (t *kafkaTransport) raw(ctx context.Context, id string, p *progress) (func() error, error) {
	return t.loop(ctx, id, func(ctx context.Context, r *kafka.Reader, m kafka.Message) {
		_ = r.CommitMessages(ctx, m)
		p.done(header(m.Headers, tsHeader))
	})
}

// feed hands each fetched message to the naive goroutines; their ack is
// the reader's commit (every second).
func (t *kafkaTransport) feed(ctx context.Context, id string, jobs chan<- job) (func() error, error) {
	return t.loop(ctx, id, func(ctx context.Context, r *kafka.Reader, m kafka.Message) {
		j := job{key: header(m.Headers, keyHeader), payload: m.Value, ts: header(m.Headers, tsHeader),
			ack: func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_ = r.CommitMessages(cctx, m)
				cancel()
			}}
		select {
		case jobs <- j:
		case <-ctx.Done():
		}
	})
}

func (t *kafkaTransport) loop(ctx context.Context, id string, each func(context.Context, *kafka.Reader, kafka.Message)) (func() error, error) {
	r := t.reader(id)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	var ferr error
	wg.Go(func() {
		for {
			m, err := r.FetchMessage(lctx)
			if err != nil {
				if lctx.Err() == nil {
					ferr = err
				}
				return
			}
			each(lctx, r, m)
		}
	})
	return func() error {
		cancel()
		wg.Wait()
		err := r.Close()
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return errors.Join(ferr, err)
	}, nil
}

func (t *kafkaTransport) source(id string, concurrency int) (consumer.Source, error) {
	return kafkasource.New(kafkasource.Config{
		Brokers: t.brokers, Topic: topic(id), GroupID: topic(id) + "-dedup",
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 100 * time.Millisecond,
		MaxWait: 100 * time.Millisecond, BatchSize: t.batch, Ordering: t.ordering,
		MaxUnfinished: t.unfinished, FetchMaxBytes: t.fetchBytes,
	})
}

// serveKfake runs a kfake broker on addr (loopback only) until ctx ends, so
// that a measurement with --kafka counts the broker's CPU and memory in
// another process.
func serveKfake(ctx context.Context, addr string) error {
	if !isLoopback(addr) {
		return fmt.Errorf("--serve-kfake: %s is not a loopback address", addr)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(p), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("kfake listening on", strings.Join(c.ListenAddrs(), ","))
	<-ctx.Done()
	return nil
}
