// Command watermill-relay is the Watermill peer of dedupbench's relay
// benchmark (bench/dedupbench/relay): a Watermill v1.5.1 router that forwards
// Kafka→Kafka or NATS JetStream→NATS JetStream through the in-memory
// Deduplicator middleware, keyed by the Idempotency-Key header. Its
// deduplication is per process, not distributed: a second replica does not
// see the first one's keys.
//
// It lives in a module of its own so that the product's go.mod never
// depends on Watermill. The benchmark builds it and runs it as a child
// process; it stops on SIGTERM or SIGINT.
//
//	go build -o /tmp/watermill-relay . && /tmp/watermill-relay -transport kafka -brokers 127.0.0.1:9092 -in in -out out -group g
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wmkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/nats-io/nats.go"
)

// keyHeader names the idempotency key, as the other contenders read it.
const keyHeader = "Idempotency-Key"

// partitionKeyHeader carries the input message's Kafka key; the output
// partition is chosen by its hash, as the other contenders' writers do.
const partitionKeyHeader = "Bench-Key"

type options struct {
	transport, brokers, natsURL, in, out, group string
	window                                      time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.transport, "transport", "kafka", "kafka or nats")
	flag.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	flag.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL")
	flag.StringVar(&o.in, "in", "", "input topic (Kafka) or subject (NATS, in an existing stream)")
	flag.StringVar(&o.out, "out", "", "output topic (Kafka) or subject (NATS, in an existing stream)")
	flag.StringVar(&o.group, "group", "", "Kafka consumer group, or the NATS durable and queue group")
	flag.DurationVar(&o.window, "window", 10*time.Minute, "how long the Deduplicator remembers a key")
	flag.Parse()
	if o.in == "" || o.out == "" || o.group == "" {
		log.Fatal("-in, -out and -group are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, o options) error {
	logger := watermill.NewStdLogger(false, false)
	sub, pub, err := pubsub(o, logger)
	if err != nil {
		return err
	}
	defer func() { _ = pub.Close() }()
	defer func() { _ = sub.Close() }()

	repo, err := middleware.NewMapExpiringKeyRepository(o.window)
	if err != nil {
		return err
	}
	dedup := &middleware.Deduplicator{
		KeyFactory: middleware.NewMessageHasherFromMetadataField(keyHeader),
		Repository: repo,
		Timeout:    time.Second,
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(dedup.Middleware)
	router.AddHandler("relay", o.in, sub, o.out, pub, func(m *message.Message) ([]*message.Message, error) {
		out := message.NewMessage(m.UUID, m.Payload)
		for k, v := range m.Metadata {
			out.Metadata.Set(k, v)
		}
		return []*message.Message{out}, nil
	})
	err = router.Run(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func pubsub(o options, logger watermill.LoggerAdapter) (message.Subscriber, message.Publisher, error) {
	switch o.transport {
	case "kafka":
		brokers := strings.Split(o.brokers, ",")
		sc := wmkafka.DefaultSaramaSubscriberConfig()
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		sc.Net.DialTimeout, sc.Net.ReadTimeout, sc.Net.WriteTimeout = 5*time.Second, 10*time.Second, 10*time.Second
		sub, err := wmkafka.NewSubscriber(wmkafka.SubscriberConfig{
			Brokers: brokers, Unmarshaler: wmkafka.DefaultMarshaler{}, OverwriteSaramaConfig: sc, ConsumerGroup: o.group,
		}, logger)
		if err != nil {
			return nil, nil, fmt.Errorf("kafka subscriber: %w", err)
		}
		pc := wmkafka.DefaultSaramaSyncPublisherConfig()
		pc.Producer.RequiredAcks = sarama.WaitForAll
		pc.Net.DialTimeout, pc.Net.ReadTimeout, pc.Net.WriteTimeout = 5*time.Second, 10*time.Second, 10*time.Second
		pub, err := wmkafka.NewPublisher(wmkafka.PublisherConfig{
			Brokers: brokers, OverwriteSaramaConfig: pc,
			Marshaler: wmkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
				return m.Metadata.Get(partitionKeyHeader), nil
			}),
		}, logger)
		if err != nil {
			_ = sub.Close()
			return nil, nil, fmt.Errorf("kafka publisher: %w", err)
		}
		return sub, pub, nil
	case "nats":
		opts := []nats.Option{nats.Timeout(5 * time.Second)}
		sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
			URL: o.natsURL, NatsOptions: opts, QueueGroupPrefix: o.group, SubscribersCount: 4,
			AckWaitTimeout: 30 * time.Second, CloseTimeout: 10 * time.Second, SubscribeTimeout: 10 * time.Second,
			Unmarshaler: &wmnats.NATSMarshaler{},
			JetStream: wmnats.JetStreamConfig{
				DurablePrefix:    o.group,
				SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit()},
			},
		}, logger)
		if err != nil {
			return nil, nil, fmt.Errorf("nats subscriber: %w", err)
		}
		pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
			URL: o.natsURL, NatsOptions: opts, Marshaler: &wmnats.NATSMarshaler{},
			JetStream: wmnats.JetStreamConfig{PublishOptions: []nats.PubOpt{nats.AckWait(10 * time.Second)}},
		}, logger)
		if err != nil {
			_ = sub.Close()
			return nil, nil, fmt.Errorf("nats publisher: %w", err)
		}
		return sub, pub, nil
	}
	return nil, nil, fmt.Errorf("-transport: %q is neither kafka nor nats", o.transport)
}
