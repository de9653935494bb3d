package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// stageTrace records, for the worker's latency-phase messages (those
// stamped with tsHeader), when each stage of a delivery began, so that the
// publish→ack latency can be split into where it was spent:
//
//	fetch    publish → the batch holding it reached Prepare
//	claim    Prepare (the batch claim, one store round trip)
//	queue    Prepare returned → Process began (waiting for a slot or
//	         for the batch ahead of it)
//	adopt    Process began → the handler ran (taking the batch's claim, or
//	         claiming alone)
//	settle   the handler returned → Process returned (completion and ack)
type stageTrace struct {
	mu sync.Mutex
	m  map[string]*stageTimes // by tsHeader value
}

type stageTimes struct {
	pub, prep0, prep1, proc0, hand, proc1 int64 // unix ns
}

// stageNames are the stages in order, as reported.
var stageNames = [...]string{"fetch", "claim", "queue", "adopt", "settle"}

func newStageTrace() *stageTrace { return &stageTrace{m: make(map[string]*stageTimes)} }

// mark sets, with set, the time of a stage of m when m is a latency-phase
// message.
func (s *stageTrace) mark(m *consumer.Message, set func(*stageTimes, int64)) {
	if s == nil {
		return
	}
	ts := m.Header.Get(tsHeader)
	if ts == "" {
		return
	}
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.m[ts]
	if t == nil {
		pub, err := strconv.ParseInt(ts, 10, 64)
		if err != nil {
			return
		}
		t = &stageTimes{pub: pub}
		s.m[ts] = t
	}
	set(t, now)
}

// quantiles returns p50 and p99 per stage in milliseconds, over the
// deliveries that went through every stage (a duplicate never reaches the
// handler and is left out).
func (s *stageTrace) quantiles() map[string][2]float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ds [len(stageNames)][]time.Duration
	for _, t := range s.m {
		if t.prep0 == 0 || t.proc0 == 0 || t.hand == 0 || t.proc1 == 0 {
			continue
		}
		marks := [...]int64{t.pub, t.prep0, t.prep1, t.proc0, t.hand, t.proc1}
		for i := range stageNames {
			ds[i] = append(ds[i], time.Duration(marks[i+1]-marks[i]))
		}
	}
	out := make(map[string][2]float64, len(stageNames))
	for i, name := range stageNames {
		if _, p50, p99 := quantiles(ds[i]); len(ds[i]) > 0 {
			out[name] = [2]float64{ms(p50), ms(p99)}
		}
	}
	return out
}

// formatStages renders quantiles as "fetch 0.41/2.10 claim …" (p50/p99 ms).
func formatStages(q map[string][2]float64) string {
	var b strings.Builder
	for _, name := range stageNames {
		if v, ok := q[name]; ok {
			fmt.Fprintf(&b, "%s %.2f/%.2f  ", name, v[0], v[1])
		}
	}
	return strings.TrimSpace(b.String())
}
