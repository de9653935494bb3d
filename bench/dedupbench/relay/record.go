package main

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
)

// stream names one ordered sequence of the output: the messages of input
// partition in that came out in output partition out. Within it, the first
// copies of the keys must come in input order.
type stream struct{ out, in int }

// recorder collects what a relay outputs: which keys, how often, in which
// order, when, and how long after their publish.
type recorder struct {
	mu         sync.Mutex
	seen       map[string]int
	last       map[stream]int
	total      int
	violations int
	bad        int // outputs whose payload could not be read
	firstAt    time.Time
	lastAt     time.Time
	onFirst    func()
	lat        []time.Duration
}

func newRecorder(onFirst func()) *recorder {
	return &recorder{seen: map[string]int{}, last: map[stream]int{}, onFirst: onFirst}
}

// add records one output message received at now from output partition
// out; ts is its publish-timestamp header (unix ns), empty when it has none.
func (r *recorder) add(out int, payload []byte, ts string, now time.Time) {
	b, err := parsePayload(payload)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.total == 0 {
		r.firstAt = now
		if r.onFirst != nil {
			r.onFirst()
		}
	}
	r.total++
	r.lastAt = now
	if err != nil {
		r.bad++
		return
	}
	if ts != "" {
		if ns, err := strconv.ParseInt(ts, 10, 64); err == nil {
			r.lat = append(r.lat, now.Sub(time.Unix(0, ns)))
		}
	}
	r.seen[b.ID]++
	if r.seen[b.ID] > 1 {
		return // a repeat: its first copy was checked for order
	}
	s := stream{out, b.Part}
	if prev, ok := r.last[s]; ok && b.Seq <= prev {
		r.violations++
		return
	}
	r.last[s] = b.Seq
}

// snapshot is what a recorder has seen so far.
type snapshot struct {
	Total, Distinct, Violations, Bad int
	FirstAt, LastAt                  time.Time
}

func (r *recorder) snapshot() snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return snapshot{Total: r.total, Distinct: len(r.seen), Violations: r.violations, Bad: r.bad, FirstAt: r.firstAt, LastAt: r.lastAt}
}

// missing returns how many of keys were not output.
func (r *recorder) missing(keys []input) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, in := range keys {
		if !in.Dup && r.seen[in.Key] == 0 {
			n++
		}
	}
	return n
}

// takeLatencies returns the latencies recorded so far and forgets them.
func (r *recorder) takeLatencies() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lat
	r.lat = nil
	return l
}

// quantile returns the q-quantile (0 ≤ q ≤ 1) of d by the nearest-rank
// method, sorting d; 0 for no samples.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	rank := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(rank, 0), len(d)-1)]
}
