package dedupworker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"
	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/memstore"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// outcomes is a consumer.HookOutcome counting outcomes.
type outcomes struct {
	mu sync.Mutex
	n  map[consumer.Outcome]int
}

func (o *outcomes) OnOutcome(_, _ string, oc consumer.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[oc]++
}

// The one hooks list of Config sees the engine's outcomes (a duplicate is
// decided by the engine, not the worker).
func TestHooksSeeEngineOutcomes(t *testing.T) {
	hooks := &outcomes{n: map[consumer.Outcome]int{}}
	src := consumertest.NewSource(consumertest.NewMessage("k", "p"), consumertest.NewMessage("k", "p"))
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{Hooks: consumer.Hooks{hooks}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	if err := w.Handle("h", src, dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) {
		runs++
		return nil, nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if runs != 1 || hooks.n[consumer.OutcomeProcessed] != 1 || hooks.n[consumer.OutcomeDuplicate] != 1 {
		t.Fatalf("runs %d, outcomes %v; want 1 run, 1 processed, 1 duplicate", runs, hooks.n)
	}
}

func TestHandleRejectsBadOptions(t *testing.T) {
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) { return nil, nil })
	src := consumertest.NewSource()
	err = w.Handle("h", src, h, dedupworker.WithLease(-time.Second))
	if !errors.Is(err, idempotency.ErrInvalidOption) || !strings.Contains(err.Error(), `"h"`) {
		t.Errorf("negative lease: %v; want ErrInvalidOption naming the handler", err)
	}
	var ce *dedupworker.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Lease" {
		t.Errorf("negative lease: %v; want a ConfigError on Lease", err)
	}
	err = w.Handle("h", src, h, dedupworker.WithoutDedup(), dedupworker.WithLease(time.Second))
	if err == nil || !strings.Contains(err.Error(), "WithoutDedup") || !strings.Contains(err.Error(), "WithLease") {
		t.Errorf("WithoutDedup with a dedup option: %v; want an error naming WithoutDedup and WithLease", err)
	}
	err = w.Handle("h", src, h, dedupworker.WithoutDedup(), dedupworker.WithBackoff(time.Second, time.Millisecond))
	if !errors.As(err, &ce) || ce.Field != "Backoff.Max" {
		t.Errorf("WithoutDedup with a backoff below its start: %v; want a ConfigError on Backoff.Max", err)
	}
	if err := w.Handle("bad name!", src, h); err == nil {
		t.Error("an invalid handler name was accepted")
	}
}

func TestRunsOnce(t *testing.T) {
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("h", consumertest.NewSource(), dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) { return nil, nil })); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); !errors.Is(err, dedupworker.ErrRunning) {
		t.Fatalf("second Run: %v, want ErrRunning", err)
	}
}

// WithoutDedup runs every delivery: a redelivery runs again.
func TestWithoutDedup(t *testing.T) {
	src := consumertest.NewSource(consumertest.NewMessage("k", "p"), consumertest.NewMessage("k", "p"))
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	if err := w.Handle("h", src, dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) {
		runs++
		return nil, nil
	}), dedupworker.WithoutDedup()); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Fatalf("runs %d, want 2", runs)
	}
}

// A failing handler is retried by the source after the backoff, with the
// attempt counted, until it succeeds.
func TestRetriedUntilDone(t *testing.T) {
	src := consumertest.NewSource(consumertest.NewMessage("k", "p"))
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var attempts []int
	if err := w.Handle("h", src, dedupworker.HandlerFunc(func(ctx context.Context, _ *dedupworker.Message) ([]byte, error) {
		c, _ := dedupworker.ClaimOf(ctx)
		attempts = append(attempts, c.Attempt)
		if len(attempts) < 3 {
			return nil, errors.New("not yet")
		}
		return nil, nil
	}), dedupworker.WithBackoff(time.Millisecond, time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(attempts) != 3 || attempts[2] != 3 {
		t.Fatalf("attempts %v, want [1 2 3]", attempts)
	}
	ds := src.Deliveries()
	if st, _ := ds[len(ds)-1].Settled(); st != consumertest.Acked || len(ds) != 3 {
		t.Fatalf("%d deliveries, the last %s; want 3, the last acked", len(ds), st)
	}
}

// WithMaxAttempts reaches a handler registered WithoutDedup: with one
// attempt allowed, the first failure is dead-lettered instead of retried
// with the default backoff.
func TestRetryOptionsReachHandlersWithoutDedup(t *testing.T) {
	src := consumertest.NewSource(consumertest.NewMessage("k", "x"))
	w, err := dedupworker.NewWorker(memstore.New(memstore.Options{}), dedupworker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	fail := dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) {
		return nil, errors.New("transient")
	})
	if err := w.Handle("h", src, fail, dedupworker.WithoutDedup(), dedupworker.WithMaxAttempts(1)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	ds := src.Deliveries()
	if len(ds) != 1 {
		t.Fatalf("%d deliveries, want 1: the failure was retried", len(ds))
	}
	if dl := ds[0].ExpectDeadLettered(t); dl.Reason != dispatch.ReasonMaxAttempts {
		t.Fatalf("dead letter %+v, want reason %s", dl, dispatch.ReasonMaxAttempts)
	}
}

// countingHook implements HookOutcome.
type countingHook struct{ n int }

func (h *countingHook) OnOutcome(string, string, dedupworker.Outcome) { h.n++ }

// A hook that implements no hook interface is refused with a ConfigError
// that names its index and type; a hook whose method has a pointer receiver,
// passed as a value, is such a hook.
func TestNewWorkerRefusesUntypedHooks(t *testing.T) {
	store := memstore.New(memstore.Options{})
	for _, c := range []struct {
		name  string
		hooks []dedupworker.Hook
		field string
		typ   string
	}{
		{"a struct", []dedupworker.Hook{&countingHook{}, struct{}{}}, "Hooks[1]", "struct {}"},
		{"a value of a pointer-receiver hook", []dedupworker.Hook{countingHook{}}, "Hooks[0]", "dedupworker_test.countingHook"},
	} {
		_, err := dedupworker.NewWorker(store, dedupworker.Config{Hooks: c.hooks})
		var ce *dedupworker.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(ce.Reason, c.typ) || !errors.Is(err, dedupworker.ErrInvalidConfig) {
			t.Errorf("%s: %v; want a ConfigError on %s naming %s", c.name, err, c.field, c.typ)
		}
	}
	h := &countingHook{}
	w, err := dedupworker.NewWorker(store, dedupworker.Config{Hooks: []dedupworker.Hook{h}})
	if err != nil {
		t.Fatalf("a HookOutcome was refused: %v", err)
	}
	src := consumertest.NewSource(consumertest.NewMessage("k", "x"))
	if err := w.Handle("h", src, dedupworker.HandlerFunc(func(context.Context, *dedupworker.Message) ([]byte, error) { return nil, nil })); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h.n != 1 {
		t.Errorf("the hook saw %d outcomes, want 1", h.n)
	}
}
