package natssource_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/idempotency/memstore"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// A handler run by a Worker behind a JetStream durable consumer. It is
// registered WithoutDedup, so it runs at least once; leave that option out
// to make it effectively once.
// The example runs its own nats-server in-process.
func Example() {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: tempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		panic(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		if _, err := js.Publish(ctx, "orders.new", []byte("order "+id)); err != nil {
			panic(err)
		}
	}

	src, err := natssource.New(js, natssource.Config{Stream: "ORDERS", Consumer: "orders-worker"})
	if err != nil {
		panic(err)
	}
	var (
		mu   sync.Mutex
		got  []string
		done = make(chan struct{})
	)
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		panic(err)
	}
	err = w.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s from %s#%d", m.Payload, m.Origin.Topic, m.Origin.Offset))
		if len(got) == 3 {
			close(done)
		}
		return nil, nil
	}), dedupworker.WithoutDedup(), dedupworker.WithConcurrency(4))
	if err != nil {
		panic(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	result := make(chan error, 1)
	go func() { result <- w.Run(runCtx) }()
	<-done
	stop()
	fmt.Println("Run:", <-result)
	slices.Sort(got)
	for _, s := range got {
		fmt.Println(s)
	}
	// Output:
	// Run: <nil>
	// order a from ORDERS#1
	// order b from ORDERS#2
	// order c from ORDERS#3
}
