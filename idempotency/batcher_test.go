package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
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
			got, err := b.do(context.Background(), k)
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
	if _, err := b.do(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want the context's", err)
	}
	b.wait()
	if sent != 0 {
		t.Fatalf("sent %d requests whose caller had left, want 0", sent)
	}
}
