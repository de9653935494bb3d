package kafkasource_test

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/idempotency/memstore"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// A Worker consuming a topic through a Kafka consumer group. The handler is
// registered WithoutDedup, so every message is processed at least once;
// leave that option out to make it effectively once.
func ExampleSource() {
	// An in-process Kafka-protocol broker stands in for a real cluster.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "orders", BatchTimeout: time.Millisecond}
	err = w.WriteMessages(context.Background(),
		kafka.Message{Key: []byte("customer-1"), Value: []byte(`{"order":1}`)},
		kafka.Message{Key: []byte("customer-1"), Value: []byte(`{"order":2}`)},
		kafka.Message{Key: []byte("customer-2"), Value: []byte(`{"order":3}`)},
	)
	w.Close()
	if err != nil {
		panic(err)
	}

	src, err := kafkasource.New(kafkasource.Config{
		Brokers:        brokers,
		Topic:          "orders",
		GroupID:        "orders-example",
		SessionTimeout: time.Second,
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := 0
	worker, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		panic(err)
	}
	err = worker.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		fmt.Printf("%s %s (%s)\n", m.Key, m.Payload, m.Origin)
		if seen++; seen == 3 {
			cancel() // stop after the three messages: Run drains, commits and returns nil
		}
		return nil, nil
	}), dedupworker.WithoutDedup(), dedupworker.WithConcurrency(1))
	if err != nil {
		panic(err)
	}
	fmt.Println("run:", worker.Run(ctx))
	// Output:
	// customer-1 {"order":1} (kafka orders/0@0)
	// customer-1 {"order":2} (kafka orders/0@1)
	// customer-2 {"order":3} (kafka orders/0@2)
	// run: <nil>
}
