package integration_test

// Counters the tests of every transport in this package share.

import (
	"fmt"
	"sync"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
)

// outcomeCounts counts outcomes (consumer.HookOutcome).
type outcomeCounts struct {
	mu sync.Mutex
	n  map[consumer.Outcome]int
}

func (o *outcomeCounts) OnOutcome(_, _ string, out consumer.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[consumer.Outcome]int{}
	}
	o.n[out]++
}

func (o *outcomeCounts) get(out consumer.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}

func (o *outcomeCounts) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprint(o.n)
}

// runCounts counts a handler's starts and completions per idempotency
// key. A ledger embeds it and guards its own fields with the same mu.
type runCounts struct {
	mu        sync.Mutex
	starts    map[string]int
	completes map[string]int
}

func newRunCounts() runCounts {
	return runCounts{starts: map[string]int{}, completes: map[string]int{}}
}

func (c *runCounts) totals() (starts, completes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.starts {
		starts += n
	}
	for _, n := range c.completes {
		completes += n
	}
	return starts, completes
}

// eachRanOnce fails t for every key whose handler started more than once.
func (c *runCounts) eachRanOnce(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range c.starts {
		if n != 1 {
			t.Errorf("key %s ran %d times", k, n)
		}
	}
}

// checkDeduplicated fails t unless the handler started and completed once
// for each of unique keys, and the outcomes counted processed messages
// and duplicates acked.
func checkDeduplicated(t testing.TB, runs *runCounts, unique int, outs *outcomeCounts, processed, duplicates int) {
	t.Helper()
	starts, completes := runs.totals()
	if starts != unique || completes != unique {
		t.Errorf("handler ran %d times (%d completed) for %d unique keys", starts, completes, unique)
	}
	runs.eachRanOnce(t)
	if got := outs.get(consumer.OutcomeProcessed); got != processed {
		t.Errorf("processed %d, want %d (%s)", got, processed, outs)
	}
	if got := outs.get(consumer.OutcomeDuplicate); got != duplicates {
		t.Errorf("duplicates acked %d, want %d (%s)", got, duplicates, outs)
	}
}
