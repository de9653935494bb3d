package dedupworker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency/memstore"
)

// An order delivered twice is shipped once: the redelivery is acked with the
// stored result. The in-memory store and source stand in for Redis and a
// broker, as they would in a test of the handler.
func Example() {
	store := memstore.New(memstore.Options{})
	src := consumertest.NewSource(
		consumertest.NewMessage("order-1", `{"sku":"A"}`),
		consumertest.NewMessage("order-2", `{"sku":"B"}`),
		consumertest.NewMessage("order-1", `{"sku":"A"}`), // a redelivery
	)
	w, err := dedupworker.NewWorker(store, dedupworker.Config{})
	if err != nil {
		panic(err)
	}
	ship := dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		claim, _ := dedupworker.ClaimOf(ctx)
		fmt.Printf("shipping %s (attempt %d)\n", claim.Key, claim.Attempt)
		return []byte("shipped"), nil
	})
	if err := w.Handle("orders", src, ship); err != nil {
		panic(err)
	}
	if err := w.Run(context.Background()); err != nil {
		panic(err)
	}
	for _, d := range src.Deliveries() {
		st, _ := d.Settled()
		fmt.Println(d.Message().Header.Get("Idempotency-Key"), st)
	}
	// Output:
	// shipping order-1 (attempt 1)
	// shipping order-2 (attempt 1)
	// order-1 acked
	// order-2 acked
	// order-1 acked
}

// A handler error retries the message with the backoff; Permanent
// dead-letters it at once.
func Example_failures() {
	store := memstore.New(memstore.Options{})
	src := consumertest.NewSource(consumertest.NewMessage("bad-1", "not json"))
	w, _ := dedupworker.NewWorker(store, dedupworker.Config{})
	_ = w.Handle("orders", src, dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		return nil, dedupworker.Permanent(errors.New("cannot parse the order"))
	}))
	_ = w.Run(context.Background())
	d := src.Deliveries()[0]
	st, _ := d.Settled()
	fmt.Println(st, d.DeadLetterInfo().Reason)
	// Output:
	// dead_lettered permanent_error
}

// A batch handler does the work for a run of messages in one call, such as
// one write to a downstream system, and fills a Result per message; each
// message then completes, retries or dead-letters on its own. The
// redelivered order-1 is acked with its stored result and is not in the
// second run.
func ExampleBatchFunc() {
	store := memstore.New(memstore.Options{})
	src := consumertest.NewSource(
		consumertest.NewMessage("order-1", `{"sku":"A"}`),
		consumertest.NewMessage("order-2", `{"sku":"B"}`),
		consumertest.NewMessage("order-1", `{"sku":"A"}`), // a redelivery
		consumertest.NewMessage("order-3", `{"sku":"C"}`),
	).InRuns(2)
	w, err := dedupworker.NewWorker(store, dedupworker.Config{})
	if err != nil {
		panic(err)
	}
	ship := dedupworker.BatchFunc(func(ctx context.Context, msgs []*dedupworker.Message, results []dedupworker.Result) {
		var keys []string
		for i := range msgs {
			claim, _ := dedupworker.ClaimOf(dedupworker.MessageContext(ctx, i))
			keys = append(keys, claim.Key)
			results[i].Value = []byte("shipped")
		}
		fmt.Println("shipping", strings.Join(keys, ", "))
	})
	if err := w.Handle("orders", src, ship); err != nil {
		panic(err)
	}
	if err := w.Run(context.Background()); err != nil {
		panic(err)
	}
	for _, d := range src.Deliveries() {
		st, _ := d.Settled()
		fmt.Println(d.Message().Header.Get("Idempotency-Key"), st)
	}
	// Output:
	// shipping order-1, order-2
	// shipping order-3
	// order-1 acked
	// order-2 acked
	// order-1 acked
	// order-3 acked
}

// A handler chooses the fate of a failed message with the error it returns:
// Permanent dead-letters it, RetryAfter retries it after a delay, and any
// other error retries it with the backoff.
func ExampleHandlerFunc() {
	h := dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
		if len(m.Payload) == 0 {
			// Retrying cannot fix an empty order: dead-letter it.
			return nil, dedupworker.Permanent(errors.New("empty order"))
		}
		return []byte("accepted"), nil
	})
	res, err := h.Handle(context.Background(), &dedupworker.Message{Payload: []byte(`{"id":1}`)})
	fmt.Println(string(res), err)
	_, err = h.Handle(context.Background(), &dedupworker.Message{})
	fmt.Println(errors.As(err, new(*dedupworker.PermanentError)))
	// Output:
	// accepted <nil>
	// true
}
