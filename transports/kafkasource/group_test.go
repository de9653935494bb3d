package kafkasource_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

func produceN(e *env, perPartition int) {
	var msgs []msg
	for i := range perPartition {
		for p := range e.parts {
			msgs = append(msgs, msg{partition: p, value: strconv.Itoa(i)})
		}
	}
	e.produce(e.topic, msgs)
}

// TestCrashBeforeCommit: a member that handled everything but died before
// committing leaves nothing committed; the next member of the group is
// given every one of those offsets again.
func TestCrashBeforeCommit(t *testing.T) {
	t.Parallel()
	const per = 30
	e := newEnv(t, 2)
	produceN(e, per)
	total := per * e.parts

	rec1 := newRecord()
	h1 := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec1.start(m)
		rec1.finish(m)
		return nil, nil
	})
	s1 := e.source(nil)
	kafkasource.SimulateCrash(s1)
	r1 := run(t, worker(t, "crash", s1, h1))
	testenv.Eventually(t, 30*time.Second, "first member handled everything", func() bool { return rec1.distinct() == total })
	if err := r1.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for p, c := range e.committed() {
		if c >= 0 {
			t.Fatalf("partition %d: committed %d after a crash before any commit", p, c)
		}
	}

	rec2 := newRecord()
	h2 := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec2.start(m)
		rec2.finish(m)
		return nil, nil
	})
	r2 := run(t, worker(t, "crash", e.source(nil), h2))
	ends := e.ends(e.topic, e.parts)
	testenv.Eventually(t, 30*time.Second, "second member committed the ends", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r2.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := rec2.distinct(); got != total {
		t.Fatalf("the new member was redelivered %d offsets, want all %d", got, total)
	}
}

// watchCommits checks, until stopped, that the group's committed offset of
// every partition never passes a message whose handler has not finished.
func watchCommits(t *testing.T, e *env, rec *record) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			c := e.committed()
			if p, o, ok := rec.allFinishedBelow(c); !ok {
				t.Errorf("partition %d: committed offset %d passes unfinished offset %d", p, c[p], o)
				return
			}
		}
	})
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// TestRebalance: a second member joins while handlers run, then the first
// leaves: nothing is skipped, and the committed offsets never pass an
// unfinished message. Without deduplication a message may run twice across
// the rebalance (at least once): the count is logged, not asserted.
func TestRebalance(t *testing.T) {
	t.Parallel()
	const per = 100
	e := newEnv(t, 4)
	produceN(e, per)
	total := per * e.parts

	rec := newRecord()
	var byB atomic.Int32
	handler := func(isB bool) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			rec.start(m)
			if isB {
				byB.Add(1)
			}
			time.Sleep(5 * time.Millisecond) // work, so that rebalances hit running handlers
			rec.finish(m)
			return nil, nil
		})
	}
	stopWatch := watchCommits(t, e, rec)
	defer stopWatch()

	a := run(t, worker(t, "rb", e.source(nil), handler(false), dispatch.WithConcurrency(4)))
	testenv.Eventually(t, 30*time.Second, "member A made progress", func() bool { return rec.distinct() >= 40 })
	b := run(t, worker(t, "rb", e.source(nil), handler(true), dispatch.WithConcurrency(4)))
	testenv.Eventually(t, 30*time.Second, "member B took partitions", func() bool { return byB.Load() >= 10 })
	if err := a.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("member A: Run returned %v, want nil", err)
	}
	ends := e.ends(e.topic, e.parts)
	testenv.Eventually(t, 30*time.Second, "committed offsets at the ends", func() bool { return reachedEnds(e.committed(), ends) })
	if err := b.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("member B: Run returned %v, want nil", err)
	}
	stopWatch()
	if got := rec.distinct(); got != total {
		t.Fatalf("%d distinct offsets handled, want %d: messages were skipped", got, total)
	}
	t.Logf("%d handler runs for %d messages (%d redelivered across rebalances)", rec.runs(), total, rec.runs()-total)
}

// TestRevokeCancelsAfterTimeout: a handler still running when its partition
// is revoked gets RevokeTimeout, then its context is cancelled with
// ErrRevoked; its offset is not committed, and the partition's next owner
// processes the message.
func TestRevokeCancelsAfterTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(e.topic, []msg{{value: "stuck"}, {value: "after"}})

	cause := make(chan error, 1)
	var aRuns atomic.Int32
	rec := newRecord()
	hA := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		if m.Origin.Offset == 0 && aRuns.Add(1) == 1 {
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return nil, ctx.Err()
		}
		rec.finish(m)
		return nil, nil
	})
	hB := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		rec.finish(m)
		return nil, nil
	})
	stopWatch := watchCommits(t, e, rec)
	defer stopWatch()
	short := func(c *kafkasource.Config) { c.RevokeTimeout = 300 * time.Millisecond }
	a := run(t, worker(t, "rv", e.source(short), hA))
	testenv.Eventually(t, 30*time.Second, "the stuck handler started", func() bool { return aRuns.Load() == 1 })
	b := run(t, worker(t, "rv", e.source(short), hB))
	select {
	case err := <-cause:
		if !errors.Is(err, kafkasource.ErrRevoked) {
			t.Fatalf("handler context cause = %v, want ErrRevoked", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck handler was not cancelled after the rebalance")
	}
	testenv.Eventually(t, 30*time.Second, "both messages committed", func() bool { return e.committed()[0] == 2 })
	for _, r := range []*testenv.Running{a, b} {
		if err := r.Stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !rec.finished[0][0] || !rec.finished[0][1] {
		t.Fatalf("finished = %v, want offsets 0 and 1", rec.finished[0])
	}
}

// TestShutdown: on cancel the source stops fetching and starting
// deliveries, waits for the in-flight one, commits it, and Run returns nil;
// queued deliveries are not run and stay uncommitted.
func TestShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(e.topic, []msg{{value: "0"}, {value: "1"}, {value: "2"}, {value: "3"}})

	started := make(chan struct{})
	release := make(chan struct{})
	rec := newRecord()
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		if m.Origin.Offset == 0 {
			close(started)
			<-release
		}
		rec.finish(m)
		return nil, nil
	})
	r := run(t, worker(t, "sd", e.source(nil), h))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery")
	}
	r.Cancel()
	select {
	case <-r.Done():
		t.Fatalf("Run returned %v while a handler was still running", r.Wait(t, time.Second))
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if got := e.committed()[0]; got != 1 {
		t.Fatalf("committed %d after shutdown, want 1 (the in-flight message only)", got)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen[0]) != 1 {
		t.Fatalf("handled offsets %v after stop, want only [0]", rec.seen[0])
	}
}

// TestCommitOnRevoke: with no interval commits, a member commits what it
// finished when a rebalance revokes its partitions, so the next owners are
// not redelivered any of it.
func TestCommitOnRevoke(t *testing.T) {
	t.Parallel()
	const per = 25
	e := newEnv(t, 2)
	produceN(e, per)
	total := per * e.parts
	noInterval := func(c *kafkasource.Config) { c.CommitInterval = time.Hour }

	rec := newRecord()
	hA := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		rec.finish(m)
		return nil, nil
	})
	a := run(t, worker(t, "cr", e.source(noInterval), hA))
	testenv.Eventually(t, 30*time.Second, "member A handled everything", func() bool { return rec.distinct() == total })
	for p, c := range e.committed() {
		if c >= 0 {
			t.Fatalf("partition %d committed %d before any revoke: the interval is an hour", p, c)
		}
	}
	var byB atomic.Int32
	hB := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		byB.Add(1)
		return nil, nil
	})
	b := run(t, worker(t, "cr", e.source(noInterval), hB))
	ends := e.ends(e.topic, e.parts)
	testenv.Eventually(t, 30*time.Second, "commits at the ends after the rebalance", func() bool { return reachedEnds(e.committed(), ends) })
	if err := b.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := byB.Load(); n != 0 {
		t.Errorf("member B was redelivered %d messages that A had finished", n)
	}
}
