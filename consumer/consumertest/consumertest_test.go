package consumertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
)

func TestDeliveryRecordsFirstSettlement(t *testing.T) {
	ctx := context.Background()
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "p"), 2)
	if st, n := d.Settled(); st != consumertest.Unsettled || n != 0 {
		t.Fatalf("new delivery: %s after %d settlements", st, n)
	}
	_ = d.Nak(ctx, time.Second)
	_ = d.Ack(ctx)
	select {
	case <-d.Done():
	default:
		t.Fatal("Done not closed after a Nak")
	}
	if st, n := d.Settled(); st != consumertest.Nakked || n != 2 || d.NakDelay() != time.Second || d.Attempt() != 2 {
		t.Fatalf("settled %s %d times, nak delay %s, attempt %d; want nakked, 2, 1s, 2", st, n, d.NakDelay(), d.Attempt())
	}
}

func TestDeadLetterThenAck(t *testing.T) {
	ctx := context.Background()
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "p"), 1)
	_ = d.DeadLetter(ctx, consumer.DeadLetter{Reason: "max_attempts"})
	_ = d.Heartbeat(ctx)
	_ = d.Ack(ctx)
	if st, _ := d.Settled(); st != consumertest.DeadLettered || d.DeadLetterInfo().Reason != "max_attempts" || d.Heartbeats() != 1 {
		t.Fatalf("settled %s, dead letter %+v, heartbeats %d", st, d.DeadLetterInfo(), d.Heartbeats())
	}
}

// processorFunc is a consumer.Runner that runs f for every delivery.
type processorFunc func(ctx context.Context, d consumer.Delivery)

func (f processorFunc) Name() string                                     { return "t" }
func (f processorFunc) Concurrency() int                                 { return 1 }
func (f processorFunc) Batching() bool                                   { return false }
func (f processorFunc) Prepare(context.Context, []consumer.Delivery)     {}
func (f processorFunc) Process(ctx context.Context, d consumer.Delivery) { f(ctx, d) }
func (f processorFunc) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	for _, d := range ds {
		f(ctx, d)
	}
}

// A nakked message comes again with the next attempt after its delay; an
// unsettled one is an error naming it.
func TestSourceRedeliversNakked(t *testing.T) {
	src := consumertest.NewSource(consumertest.NewMessage("a", "pa"), consumertest.NewMessage("b", "pb"))
	err := src.Consume(t.Context(), processorFunc(func(ctx context.Context, d consumer.Delivery) {
		if string(d.Message().Payload) == "pa" && d.Attempt() == 1 {
			_ = d.Nak(ctx, 10*time.Millisecond)
			return
		}
		_ = d.Ack(ctx)
	}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range src.Deliveries() {
		st, _ := d.Settled()
		got = append(got, string(d.Message().Payload)+"#"+string(rune('0'+d.Attempt()))+":"+string(st))
	}
	want := []string{"pa#1:nakked", "pa#2:acked", "pb#1:acked"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("deliveries %v, want %v", got, want)
	}
	err = consumertest.NewSource(consumertest.NewMessage("c", "pc")).Consume(t.Context(), processorFunc(func(context.Context, consumer.Delivery) {}))
	if err == nil {
		t.Fatal("a processor that settles nothing: no error")
	}
}
