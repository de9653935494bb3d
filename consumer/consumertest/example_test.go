package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
)

// settle is the code under test: it dead-letters an empty message, retries
// a first attempt a second later, and acks the rest.
func settle(ctx context.Context, d consumer.Delivery) {
	switch {
	case len(d.Message().Payload) == 0:
		if err := d.DeadLetter(ctx, consumer.DeadLetter{Reason: "permanent_error"}); err != nil && !errors.Is(err, consumer.ErrNoDeadLetter) {
			_ = d.Nak(ctx, time.Minute)
			return
		}
		_ = d.Ack(ctx)
	case d.Attempt() == 1:
		_ = d.Nak(ctx, time.Second)
	default:
		_ = d.Ack(ctx)
	}
}

func ExampleDelivery() {
	ctx := context.Background()

	first := consumertest.NewDelivery(consumertest.NewMessage("order-1", `{"id":1}`), 1)
	settle(ctx, first)
	st, n := first.Settled()
	fmt.Println(st, n, first.NakDelay())

	second := consumertest.NewDelivery(first.Message(), 2)
	settle(ctx, second)
	fmt.Println(second.Settled())

	empty := consumertest.NewDelivery(consumertest.NewMessage("order-2", ""), 1)
	settle(ctx, empty)
	st, _ = empty.Settled()
	fmt.Println(st, empty.DeadLetterInfo().Reason)

	// A broker that refuses the dead letter: the message is retried.
	refused := consumertest.NewDelivery(consumertest.NewMessage("order-3", ""), 1).
		FailWith(consumertest.Errors{DeadLetter: errors.New("broker down")})
	settle(ctx, refused)
	st, _ = refused.Settled()
	fmt.Println(st, refused.DeadLetterInfo() == nil)
	// Output:
	// nakked 1 1s
	// acked 1
	// dead_lettered permanent_error
	// nakked true
}
