package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// Fault timeline of TestClusterFaultStaysInItsShard, from the first
// publish: the load runs for loadFor, and the fault lasts from faultAt to
// faultAt+faultFor.
const (
	loadRate = 200 // keys a second
	loadFor  = 10 * time.Second
	faultAt  = 3 * time.Second
	faultFor = 3 * time.Second
)

// TestClusterFaultStaysInItsShard runs a steady load of keys through the
// engine on a private Redis Cluster of 3 primaries and 3 replicas, and
// breaks one shard for faultFor: its replica stopped (SIGSTOP, and its
// link cut with CLIENT KILL TYPE replica on its primary: loopback buffers
// would otherwise hide the stop), or its primary stopped, with
// cluster-require-full-coverage no and no failover within the fault. Each
// fault runs with Options.Durability and without. The keys of the healthy
// shards keep completing during the fault, the keys of the broken shard
// complete after it, and no key is lost or run twice. The completions a
// second of each phase are logged.
func TestClusterFaultStaysInItsShard(t *testing.T) {
	testenv.Long(t, "starts private clusters and runs a load for a while")
	for _, fault := range []string{"replica", "primary"} {
		for _, durable := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s stopped, durability %v", fault, durable), func(t *testing.T) {
				runClusterFault(t, fault, durable)
			})
		}
	}
}

// completion is when a delivered key was acked.
type completion struct {
	key string
	at  time.Duration // since the load started
}

func runClusterFault(t *testing.T, fault string, durable bool) {
	c := startPrivateCluster(t, 3, true, "--cluster-require-full-coverage", "no")
	client := c.clusterClient(t, "")
	opts := redisbackend.Options{Namespace: "fault-" + testenv.RandID(), Logger: testenv.Logger(t)}
	if durable {
		opts.Durability = redisbackend.Durability{Replicas: 1, Timeout: 500 * time.Millisecond}
	}
	store := newStore(t, client, opts)
	eng, err := idempotency.New(store, idempotency.Config{Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor(idempotency.WithStoreRetry(200*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var runsMu sync.Mutex
	runs := map[string]int{}
	p := dedup("relay", consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
		runsMu.Lock()
		runs[string(m.Payload)]++
		runsMu.Unlock()
		return nil, nil
	}))
	affected := func(key string) bool {
		return c.slotOwner(store.RedisKey(idempotency.EffectiveKey("relay", key))) == 0
	}

	b := newFakeBroker(p, 256)
	start := time.Now()
	b.start = start
	total := int(loadFor.Seconds() * loadRate)
	testenv.Go(t, func(ctx context.Context) error {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for sent := 0; sent < total; {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			due := min(total, int(time.Since(start).Seconds()*loadRate))
			for ; sent < due; sent++ {
				b.publish(fmt.Sprintf("k%05d", sent), 1, time.Now())
			}
		}
		return nil
	})
	fetcher := testenv.Go(t, b.run)

	// The fault.
	time.Sleep(time.Until(start.Add(faultAt)))
	var resume func()
	switch fault {
	case "replica":
		resume = c.replicas[0].pause(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.masters[0].client.Do(ctx, "client", "kill", "type", "replica").Err(); err != nil {
			t.Errorf("CLIENT KILL TYPE replica: %v", err)
		}
		cancel()
	case "primary":
		resume = c.masters[0].pause(t)
	}
	faultStart := time.Since(start)
	time.Sleep(time.Until(start.Add(faultAt + faultFor)))
	resume()
	faultEnd := time.Since(start)

	// Every key completes.
	testenv.Eventually(t, 60*time.Second, "every published key acked", func() bool {
		return b.acked() == total
	})
	_ = fetcher.Stop(t, 10*time.Second)

	done := b.completions()
	ackedAt := map[string]time.Duration{}
	for _, cp := range done {
		ackedAt[cp.key] = cp.at
	}
	lost, twice := 0, 0
	runsMu.Lock()
	for i := range total {
		k := fmt.Sprintf("k%05d", i)
		if _, ok := ackedAt[k]; !ok {
			lost++
		}
		if runs[k] > 1 {
			twice++
		}
		if runs[k] == 0 {
			lost++
		}
	}
	runsMu.Unlock()

	// Completions a second, healthy and affected shards, per phase.
	phases := []struct {
		name     string
		from, to time.Duration
	}{{"before", time.Second, faultStart}, {"during", faultStart, faultEnd}, {"after", faultEnd, faultEnd + 3*time.Second}}
	var row []string
	for _, ph := range phases {
		var healthy, hit int
		for _, cp := range done {
			if cp.at >= ph.from && cp.at < ph.to {
				if affected(cp.key) {
					hit++
				} else {
					healthy++
				}
			}
		}
		secs := (ph.to - ph.from).Seconds()
		row = append(row, fmt.Sprintf("%s: healthy %.0f/s, affected %.0f/s", ph.name, float64(healthy)/secs, float64(hit)/secs))
	}
	t.Logf("fault %s, durability %v, %d keys at %d/s: %s; lost %d, run twice %d",
		fault, durable, total, loadRate, strings.Join(row, "; "), lost, twice)

	if lost != 0 || twice != 0 {
		t.Errorf("%d keys lost, %d run twice; want 0 and 0", lost, twice)
	}
	// The healthy shards' keys published in the fault's first half were
	// acked before it ended: they did not wait for the broken shard.
	var late []string
	for i := range total {
		k := fmt.Sprintf("k%05d", i)
		pub := time.Duration(float64(i) / loadRate * float64(time.Second))
		if affected(k) || pub < faultStart || pub >= faultStart+faultFor/2 {
			continue
		}
		if at, ok := ackedAt[k]; !ok || at >= faultEnd {
			late = append(late, fmt.Sprintf("%s (published %s, acked %s)", k, pub.Round(time.Millisecond), at.Round(time.Millisecond)))
		}
	}
	if len(late) > 0 {
		t.Errorf("%d keys of healthy shards published in the fault's first half were not acked before it ended (fault %s-%s), e.g. %v",
			len(late), faultStart.Round(time.Millisecond), faultEnd.Round(time.Millisecond), late[:min(5, len(late))])
	}
}

// fakeBroker delivers published keys to a processor as a source does:
// fetches of the due messages, Prepare on each fetch, each delivery
// processed on its own goroutine (up to a concurrency), a nakked delivery
// redelivered after its delay as the next attempt.
type fakeBroker struct {
	p     consumer.Processor
	slots chan struct{}
	start time.Time

	mu    sync.Mutex
	queue []queued
	done  []completion
	seen  map[string]bool
}

type queued struct {
	key     string
	attempt int
	due     time.Time
}

func newFakeBroker(p consumer.Processor, concurrency int) *fakeBroker {
	return &fakeBroker{p: p, slots: make(chan struct{}, concurrency), seen: map[string]bool{}}
}

func (b *fakeBroker) publish(key string, attempt int, due time.Time) {
	b.mu.Lock()
	b.queue = append(b.queue, queued{key: key, attempt: attempt, due: due})
	b.mu.Unlock()
}

func (b *fakeBroker) acked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.seen)
}

func (b *fakeBroker) completions() []completion {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.done)
}

// fetch takes up to max due messages off the queue.
func (b *fakeBroker) fetch(max int) []queued {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var out []queued
	rest := b.queue[:0]
	for _, q := range b.queue {
		if len(out) < max && !q.due.After(now) {
			out = append(out, q)
		} else {
			rest = append(rest, q)
		}
	}
	b.queue = rest
	return out
}

// run fetches every 10ms until ctx ends, then waits for the deliveries in
// progress.
func (b *fakeBroker) run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		qs := b.fetch(100)
		if len(qs) == 0 {
			continue
		}
		ds := make([]consumer.Delivery, len(qs))
		for i, q := range qs {
			ds[i] = consumertest.NewDelivery(consumertest.NewMessage(q.key, q.key), q.attempt)
		}
		b.p.Prepare(ctx, ds)
		for i, d := range ds {
			select {
			case b.slots <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
			q := qs[i]
			wg.Go(func() {
				defer func() { <-b.slots }()
				b.p.Process(ctx, d)
				td := d.(*consumertest.Delivery)
				switch st, _ := td.Settled(); st {
				case consumertest.Acked:
					b.mu.Lock()
					if !b.seen[q.key] {
						b.seen[q.key] = true
						b.done = append(b.done, completion{key: q.key, at: time.Since(b.start)})
					}
					b.mu.Unlock()
				default:
					b.publish(q.key, q.attempt+1, time.Now().Add(td.NakDelay()))
				}
			})
		}
	}
}
