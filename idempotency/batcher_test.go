package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

func TestBatcherNeverSendsAKeyTwiceInOneBatch(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]string
	first := true
	send := func(_ context.Context, keys []string) ([]string, error) {
		mu.Lock()
		wait := first
		first = false
		batches = append(batches, keys)
		mu.Unlock()
		if wait {
			<-release // hold the flights so the rest queue
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				return nil, errors.New("duplicate key in one batch")
			}
			seen[k] = true
		}
		return keys, nil
	}
	b := newBatcher("test", 5*time.Second, func(k string) string { return k }, send)
	b.maxFlights = 1
	keys := []string{"a", "x", "x", "y", "x", "z"}
	var wg sync.WaitGroup
	errs := make([]error, len(keys))
	started := make(chan struct{}, len(keys))
	for i, k := range keys {
		wg.Go(func() {
			started <- struct{}{}
			got, err := b.do(context.Background(), k, false)
			if err == nil && got != k {
				err = fmt.Errorf("answer %q for %q", got, k)
			}
			errs[i] = err
		})
		<-started
		if i == 0 {
			// the first request holds the only flight
			for {
				mu.Lock()
				n := len(batches)
				mu.Unlock()
				if n == 1 {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	for {
		b.mu.Lock()
		n := len(b.pending)
		b.mu.Unlock()
		if n == len(keys)-1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	b.wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d (%s): %v", i, keys[i], err)
		}
	}
	if len(batches) < 4 { // [a], then x needs three batches
		t.Fatalf("batches %v: the three x requests must go in three batches", batches)
	}
}

func TestBatcherAnswersAbandonedRequestsWithoutSending(t *testing.T) {
	sent := 0
	b := newBatcher("test", time.Second, func(k string) string { return k }, func(_ context.Context, keys []string) ([]string, error) {
		sent += len(keys)
		return keys, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.do(ctx, "k", false); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's", err)
	}
	b.wait()
	if sent != 0 {
		t.Fatalf("sent %d requests whose caller had left, want 0", sent)
	}
}

// recorder is a batcher's send that records the keys of each call.
type recorder struct {
	mu      sync.Mutex
	batches [][]string
}

func (r *recorder) send(_ context.Context, keys []string) ([]string, error) {
	r.mu.Lock()
	r.batches = append(r.batches, keys)
	r.mu.Unlock()
	return keys, nil
}

func (r *recorder) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.batches...)
}

// pendingReaches waits until n requests are queued in b, failing t after
// a deadline.
func pendingReaches[Req, Res any](t *testing.T, b *batcher[Req, Res], n int) {
	t.Helper()
	testenv.EventuallyNil(t, 10*time.Second, fmt.Sprintf("%d requests queued", n), func() error {
		b.mu.Lock()
		got := len(b.pending)
		b.mu.Unlock()
		if got != n {
			return fmt.Errorf("%d queued", got)
		}
		return nil
	})
}

func TestBatcherLingerGathersATrickleIntoOneCall(t *testing.T) {
	var rec recorder
	b := newBatcher("test", 5*time.Second, func(k string) string { return k }, rec.send)
	b.linger = time.Hour // only a full queue ends it
	var wg sync.WaitGroup
	for i := range lingerFull {
		if i == lingerFull-1 {
			// Every earlier request waits, unsent, for company.
			pendingReaches(t, b, lingerFull-1)
			if got := rec.get(); len(got) != 0 {
				t.Fatalf("calls %v before the queue was full, want none while lingering", got)
			}
		}
		wg.Go(func() {
			k := fmt.Sprint("k", i)
			if got, err := b.do(context.Background(), k, true); err != nil || got != k {
				t.Errorf("request %s: answer %q, %v", k, got, err)
			}
		})
	}
	wg.Wait()
	b.wait()
	if got := rec.get(); len(got) != 1 || len(got[0]) != lingerFull {
		t.Fatalf("calls %v, want the %d requests in one call", got, lingerFull)
	}
}

func TestBatcherLingerSendsALoneRequestOnceItHasWaited(t *testing.T) {
	var rec recorder
	const linger = 20 * time.Millisecond
	b := newBatcher("test", 5*time.Second, func(k string) string { return k }, rec.send)
	b.linger = linger
	start := time.Now()
	if got, err := b.do(context.Background(), "k", true); err != nil || got != "k" {
		t.Fatalf("answer %q, %v", got, err)
	}
	if waited := time.Since(start); waited < linger {
		t.Fatalf("answered after %s, before the linger of %s", waited, linger)
	}
	b.wait()
	if got := rec.get(); len(got) != 1 || len(got[0]) != 1 {
		t.Fatalf("calls %v, want one call of the one request", got)
	}
}

func TestBatcherLingerDropsARequestWhoseCallerLeft(t *testing.T) {
	var rec recorder
	b := newBatcher("test", 5*time.Second, func(k string) string { return k }, rec.send)
	b.linger = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := b.do(ctx, "gone", true)
		errc <- err
	}()
	pendingReaches(t, b, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's", err)
	}
	b.wait()
	if got := rec.get(); len(got) != 0 {
		t.Fatalf("calls %v, want none: the only caller left while it lingered", got)
	}
}

func TestCompletionLingerDefaultsAndTurnsOff(t *testing.T) {
	for _, c := range []struct {
		set, want time.Duration
	}{{0, DefaultCompletionLinger}, {-1, 0}, {7 * time.Millisecond, 7 * time.Millisecond}} {
		e, err := New(nopStore{}, Config{CompletionLinger: c.set})
		if err != nil {
			t.Fatal(err)
		}
		if e.completer.linger != c.want {
			t.Errorf("CompletionLinger %s: the completer lingers %s, want %s", c.set, e.completer.linger, c.want)
		}
		if e.claimer.linger != 0 || e.preparer.linger != 0 {
			t.Errorf("CompletionLinger %s: claims linger (%s, %s), want never", c.set, e.claimer.linger, e.preparer.linger)
		}
	}
}

// nopStore is a Store no test method calls: New needs one.
type nopStore struct{ Store }

func TestBatcherUrgentRequestEndsALinger(t *testing.T) {
	var rec recorder
	b := newBatcher("test", 5*time.Second, func(k string) string { return k }, rec.send)
	b.linger = time.Hour // only a full queue, or an urgent request, ends it
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := b.do(context.Background(), "patient", true); err != nil {
			t.Errorf("patient: %v", err)
		}
	})
	pendingReaches(t, b, 1)
	// The next message of an ordered lane waits for this one: it goes at
	// once, and takes the lingering one along.
	if _, err := b.do(context.Background(), "urgent", false); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	b.wait()
	if got := rec.get(); len(got) != 1 || len(got[0]) != 2 {
		t.Fatalf("calls %v, want both requests in one call", got)
	}
}
