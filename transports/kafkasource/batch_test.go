package kafkasource_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// runChecker checks the calls of a batch handler: a call holds one lane's
// messages (a partition's, or a key's under key ordering), within a lane
// every call's offsets increase, each call starts past the last offset any
// earlier call of the lane saw, and the failed offsets of a call are retried
// alone, in order, before the lane's next run.
type runChecker struct {
	lane     func(*consumer.Message) string
	mu       sync.Mutex
	maxSeen  map[string]int64
	retries  map[string][]int64 // failed offsets awaiting their retry, in order
	calls    int
	maxRun   int
	handled  map[[2]int64]bool
	problems []string
}

func newRunChecker(lane func(*consumer.Message) string) *runChecker {
	return &runChecker{lane: lane, maxSeen: map[string]int64{}, retries: map[string][]int64{}, handled: map[[2]int64]bool{}}
}

func byPartition(m *consumer.Message) string { return fmt.Sprint(m.Origin.Partition) }

func (c *runChecker) call(msgs []*consumer.Message, failed func(*consumer.Message) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	c.maxRun = max(c.maxRun, len(msgs))
	p := c.lane(msgs[0])
	offs := make([]int64, len(msgs))
	for i, m := range msgs {
		offs[i] = m.Origin.Offset
		if l := c.lane(m); l != p {
			c.problems = append(c.problems, fmt.Sprintf("a run mixes lanes %s and %s", p, l))
		}
	}
	if rs := c.retries[p]; len(rs) > 0 {
		if len(offs) != 1 || offs[0] != rs[0] {
			c.problems = append(c.problems, fmt.Sprintf("lane %s: call %v before the retry of failed offset %d", p, offs, rs[0]))
		}
		c.retries[p] = rs[1:]
	} else {
		last, ok := c.maxSeen[p]
		for i, o := range offs {
			if ok && o <= last || i > 0 && o <= offs[i-1] {
				c.problems = append(c.problems, fmt.Sprintf("lane %s: call %v after offset %d: offsets must only increase", p, offs, last))
				break
			}
		}
		c.maxSeen[p] = offs[len(offs)-1]
	}
	for _, m := range msgs {
		if failed(m) {
			c.retries[p] = append(c.retries[p], m.Origin.Offset)
		} else {
			c.handled[[2]int64{int64(m.Origin.Partition), m.Origin.Offset}] = true
		}
	}
}

// TestBatchRunsKeepPartitionOrder: a batch handler under partition ordering
// gets runs of a partition in offset order; a failed message is retried,
// alone and in order, before any later run of its partition, and the
// committed offset never passes it while it is unfinished.
func TestBatchRunsKeepPartitionOrder(t *testing.T) {
	t.Parallel()
	const parts, per = 4, 300
	e := newRealEnv(t, parts)
	var msgs []msg
	for i := range per {
		for p := range parts {
			msgs = append(msgs, msg{partition: p, value: fmt.Sprint(i)})
		}
	}
	e.produce(e.topic, msgs)

	// Offsets 37 and 41 of partition 1 fail on their first attempt.
	failing := map[int64]bool{37: true, 41: true}
	var failMu sync.Mutex
	chk := newRunChecker(byPartition)
	var commitProblems []string
	h := consumer.BatchFunc(func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		failMu.Lock()
		failed := map[*consumer.Message]bool{}
		for i, m := range ms {
			if m.Origin.Partition != 1 {
				continue
			}
			if failing[m.Origin.Offset] {
				delete(failing, m.Origin.Offset)
				failed[m] = true
				results[i].Err = dispatch.RetryAfter(400*time.Millisecond, nil)
				continue
			}
			if len(ms) == 1 && (m.Origin.Offset == 37 || m.Origin.Offset == 41) {
				// The retry: the commits made while it waited (every
				// 100ms) must not have passed it.
				if c := e.committed()[1]; c > m.Origin.Offset {
					commitProblems = append(commitProblems, fmt.Sprintf("committed %d while offset %d was unfinished", c, m.Origin.Offset))
				}
			}
		}
		failMu.Unlock()
		chk.call(ms, func(m *consumer.Message) bool { return failed[m] })
	})
	src := e.source(func(c *kafkasource.Config) { c.BatchSize = 50 })
	w := worker(t, "batch", src, h, dispatch.WithConcurrency(8))
	r := run(t, w)
	ends := e.ends(e.topic, parts)
	testenv.Eventually(t, 60*time.Second, "every offset committed", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	chk.mu.Lock()
	defer chk.mu.Unlock()
	failMu.Lock()
	defer failMu.Unlock()
	for _, p := range slices.Concat(chk.problems, commitProblems) {
		t.Error(p)
	}
	if len(failing) != 0 {
		t.Errorf("offsets %v never ran", failing)
	}
	if len(chk.handled) != parts*per {
		t.Errorf("%d messages handled successfully, want %d", len(chk.handled), parts*per)
	}
	if chk.maxRun < 2 || chk.maxRun > 50 {
		t.Errorf("largest run %d: runs of a backlog must be batched, within BatchSize 50", chk.maxRun)
	}
	for p, rs := range chk.retries {
		if len(rs) > 0 {
			t.Errorf("lane %s: failed offsets %v were never retried", p, rs)
		}
	}
}

// TestBatchRunsKeepKeyOrder: under key ordering a run holds one key's
// messages in offset order, and a key's failed message is retried before
// the key's next run; other keys of the partition go on meanwhile.
func TestBatchRunsKeepKeyOrder(t *testing.T) {
	t.Parallel()
	const parts, keys, per = 4, 12, 40
	e := newRealEnv(t, parts)
	var msgs []msg
	for i := range per {
		for k := range keys {
			msgs = append(msgs, msg{partition: k % parts, key: fmt.Sprintf("key-%d", k), value: fmt.Sprint(i)})
		}
	}
	e.produce(e.topic, msgs)

	byKey := func(m *consumer.Message) string { return string(m.Key) }
	chk := newRunChecker(byKey)
	var (
		failMu sync.Mutex
		failed = map[string]bool{}
	)
	h := consumer.BatchFunc(func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		fails := map[*consumer.Message]bool{}
		failMu.Lock()
		for i, m := range ms {
			// The first attempt of every key's 8th message fails.
			if string(m.Payload) == "7" && !failed[string(m.Key)] {
				failed[string(m.Key)] = true
				fails[m] = true
				results[i].Err = dispatch.RetryAfter(200*time.Millisecond, nil)
			}
		}
		failMu.Unlock()
		chk.call(ms, func(m *consumer.Message) bool { return fails[m] })
	})
	src := e.source(func(c *kafkasource.Config) { c.Ordering = kafkasource.OrderingKey; c.BatchSize = 50 })
	r := run(t, worker(t, "batchkey", src, h, dispatch.WithConcurrency(8)))
	ends := e.ends(e.topic, parts)
	testenv.Eventually(t, 60*time.Second, "every offset committed", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	chk.mu.Lock()
	defer chk.mu.Unlock()
	for _, p := range chk.problems {
		t.Error(p)
	}
	failMu.Lock()
	defer failMu.Unlock()
	if len(failed) != keys {
		t.Errorf("%d keys had a failure, want %d", len(failed), keys)
	}
	if len(chk.handled) != keys*per {
		t.Errorf("%d messages handled successfully, want %d", len(chk.handled), keys*per)
	}
	if chk.maxRun < 2 {
		t.Errorf("largest run %d: a key's queued messages must be batched", chk.maxRun)
	}
	for k, rs := range chk.retries {
		if len(rs) > 0 {
			t.Errorf("%s: failed offsets %v were never retried", k, rs)
		}
	}
}
