package consumertest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
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

// batchRunner records the runs it is given and settles each delivery with
// settle.
type batchRunner struct {
	processorFunc
	runs []string
}

func (r *batchRunner) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	var run []string
	for _, d := range ds {
		run = append(run, fmt.Sprintf("%s#%d", d.Message().Payload, d.Attempt()))
		r.processorFunc(ctx, d)
	}
	r.runs = append(r.runs, strings.Join(run, " "))
}

// InRuns hands contiguous runs to ProcessBatch, and delivers a run's nakked
// messages again as a run of their own before the next messages.
func TestSourceInRuns(t *testing.T) {
	var msgs []*consumer.Message
	for _, p := range []string{"a", "b", "c", "d", "e"} {
		msgs = append(msgs, consumertest.NewMessage(p, p))
	}
	r := &batchRunner{processorFunc: func(ctx context.Context, d consumer.Delivery) {
		if p := string(d.Message().Payload); (p == "b" || p == "c") && d.Attempt() == 1 {
			_ = d.Nak(ctx, time.Millisecond)
			return
		}
		_ = d.Ack(ctx)
	}}
	src := consumertest.NewSource(msgs...).InRuns(3)
	if err := src.Consume(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(r.runs, " | "), "a#1 b#1 c#1 | b#2 c#2 | d#1 e#1"; got != want {
		t.Fatalf("runs %q, want %q", got, want)
	}
	if n := len(src.Deliveries()); n != 7 {
		t.Fatalf("%d deliveries recorded, want 7", n)
	}
	for _, d := range src.Deliveries()[5:] {
		d.ExpectAcked(t)
	}
}

// Each Expect method passes on its own settlement and fails on every other,
// naming what happened.
func TestExpectations(t *testing.T) {
	ctx := context.Background()
	newD := func() *consumertest.Delivery {
		return consumertest.NewDelivery(consumertest.NewMessage("k", "p"), 1)
	}
	acked, nakked, dead, twice, none := newD(), newD(), newD(), newD(), newD()
	_ = acked.Ack(ctx)
	_ = nakked.Nak(ctx, 3*time.Second)
	_ = dead.DeadLetter(ctx, consumer.DeadLetter{Reason: "missing_key"})
	_ = dead.Ack(ctx)
	_ = twice.Ack(ctx)
	_ = twice.Ack(ctx)
	expect := map[string]func(testing.TB, *consumertest.Delivery){
		"acked":         func(t testing.TB, d *consumertest.Delivery) { d.ExpectAcked(t) },
		"nakked":        func(t testing.TB, d *consumertest.Delivery) { d.ExpectNakked(t) },
		"dead_lettered": func(t testing.TB, d *consumertest.Delivery) { d.ExpectDeadLettered(t) },
		"unsettled":     func(t testing.TB, d *consumertest.Delivery) { d.ExpectUnsettled(t) },
	}
	deliveries := map[string]*consumertest.Delivery{"acked": acked, "nakked": nakked, "dead_lettered": dead, "unsettled": none, "acked twice": twice}
	for dname, d := range deliveries {
		for ename, e := range expect {
			r := &recorder{TB: t}
			runFatal(func() { e(r, d) })
			if want := dname == ename; r.failed == want {
				t.Errorf("Expect %s on a delivery %s: failed=%v (%s)", ename, dname, r.failed, r.msg)
			}
			if r.failed && !strings.Contains(r.msg, "want "+ename) {
				t.Errorf("Expect %s on a delivery %s: message %q does not say what was wanted", ename, dname, r.msg)
			}
		}
	}
	if got := nakked.ExpectNakked(t); got != 3*time.Second {
		t.Errorf("ExpectNakked returned %s, want 3s", got)
	}
	if got := dead.ExpectDeadLettered(t); got.Reason != "missing_key" {
		t.Errorf("ExpectDeadLettered returned %+v, want reason missing_key", got)
	}
}

// A call made to fail returns its error and records nothing.
func TestFailWith(t *testing.T) {
	ctx := context.Background()
	errAck, errNak, errHB := errors.New("ack refused"), errors.New("nak refused"), errors.New("heartbeat refused")
	d := consumertest.NewDelivery(consumertest.NewMessage("k", "p"), 1).FailWith(consumertest.Errors{
		Ack: errAck, Nak: errNak, Heartbeat: errHB, DeadLetter: consumer.ErrNoDeadLetter,
	})
	if err := d.DeadLetter(ctx, consumer.DeadLetter{Reason: "x"}); !errors.Is(err, consumer.ErrNoDeadLetter) {
		t.Fatalf("DeadLetter: %v", err)
	}
	if err := d.Heartbeat(ctx); !errors.Is(err, errHB) {
		t.Fatalf("Heartbeat: %v", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, errAck) {
		t.Fatalf("Ack: %v", err)
	}
	if err := d.Nak(ctx, time.Second); !errors.Is(err, errNak) {
		t.Fatalf("Nak: %v", err)
	}
	d.ExpectUnsettled(t)
	if d.DeadLetterInfo() != nil || d.Heartbeats() != 0 {
		t.Fatalf("failed calls recorded: dead letter %+v, heartbeats %d", d.DeadLetterInfo(), d.Heartbeats())
	}
	d.FailWith(consumertest.Errors{})
	_ = d.Ack(ctx)
	d.ExpectAcked(t)
}

// recorder is a testing.TB whose Fatalf records the failure and ends the
// goroutine, the way testing.T's does, without failing the real test.
type recorder struct {
	testing.TB
	failed bool
	msg    string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFatal runs f on a goroutine of its own, so that a recorder's Fatalf ends
// only f, and waits for it.
func runFatal(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}
