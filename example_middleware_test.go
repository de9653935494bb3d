package dedupworker_test

import (
	"context"
	"fmt"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency/memstore"
)

// A logging middleware sees each run of the handler with its claim; the
// redelivery is answered from the store and never reaches it.
func ExampleWithMiddleware() {
	logRuns := func(next dedupworker.Handler) dedupworker.Handler {
		return dedupworker.HandlerFunc(func(ctx context.Context, m *dedupworker.Message) ([]byte, error) {
			claim, _ := dedupworker.ClaimOf(ctx)
			res, err := next.Handle(ctx, m)
			fmt.Printf("ran %s: %s %v\n", claim.Key, res, err)
			return res, err
		})
	}
	src := consumertest.NewSource(
		consumertest.NewMessage("order-1", `{"sku":"A"}`),
		consumertest.NewMessage("order-1", `{"sku":"A"}`), // a redelivery
	)
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		panic(err)
	}
	ship := dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) {
		return []byte("shipped"), nil
	})
	if err := w.Handle("orders", src, ship, dedupworker.WithMiddleware(logRuns)); err != nil {
		panic(err)
	}
	if err := w.Run(context.Background()); err != nil {
		panic(err)
	}
	for _, d := range src.Deliveries() {
		st, _ := d.Settled()
		fmt.Println(st)
	}
	// Output:
	// ran order-1: shipped <nil>
	// acked
	// acked
}
