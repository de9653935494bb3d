package metrics

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

func newMetrics(t testing.TB) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// TestHooksConcurrent calls every hook from many goroutines, for registered
// and unregistered handlers and for known and unknown store ops, and checks
// that each series holds exactly the sum of what was reported to it.
func TestHooksConcurrent(t *testing.T) {
	m, reg := newMetrics(t)
	m.Register("kafka", "orders")
	m.Register("nats", "mail")
	const goroutines, rounds = 8, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				for _, h := range []struct{ handler, transport string }{{"orders", "kafka"}, {"mail", "nats"}, {"unregistered", "kafka"}} {
					m.OnOutcome(h.handler, h.transport, Outcomes[(g+i)%len(Outcomes)])
					m.OnHandlerDone(h.handler, time.Millisecond, nil)
					m.OnInflight(h.handler, 1)
					m.OnInflight(h.handler, -1)
					m.OnInflight(h.handler, 1)
				}
				m.OnStoreCall("claim", 2*time.Millisecond, nil)
				m.OnStoreCall("complete", time.Millisecond, errors.New("boom"))
				m.OnStoreCall("custom-op", time.Millisecond, errors.New("boom"))
				m.OnLeaseRenewal("orders", "ok")
				m.OnLeaseRenewal("orders", "other")
				m.OnDurabilityShortfall("claim", "")
				m.OnDurabilityShortfall("claim", "127.0.0.1:7001")
				m.OnStoreCall("claim", time.Millisecond, &idempotency.BatchError{Errs: []error{
					nil,
					&idempotency.NodeError{Node: "127.0.0.1:7001", Err: errors.New("boom")},
					fmt.Errorf("wrapped: %w", &idempotency.NodeError{Node: "127.0.0.1:7002", Err: errors.New("boom")}),
					&idempotency.NodeError{Node: "127.0.0.1:7001", Err: errors.New("again")},
				}})
				m.OnCorruptRecord("orders")
			}
		})
	}
	wg.Wait()

	// Each (goroutine, round) pair reports one outcome per handler, chosen
	// by (g+i) mod len(Outcomes).
	want := make(map[consumer.Outcome]float64)
	for g := range goroutines {
		for i := range rounds {
			want[Outcomes[(g+i)%len(Outcomes)]]++
		}
	}
	n := float64(goroutines * rounds)
	for _, h := range []struct{ handler, transport string }{{"orders", "kafka"}, {"mail", "nats"}, {"unregistered", "kafka"}} {
		for _, o := range Outcomes {
			expect(t, reg, want[o], "dedup_messages_total", "transport", h.transport, "handler", h.handler, "outcome", string(o))
		}
		expect(t, reg, n, "dedup_inflight", "handler", h.handler)
		expect(t, reg, n, "dedup_handler_duration_seconds", "handler", h.handler)
	}
	expect(t, reg, 0, "dedup_store_errors_total", "op", "claim", "node", "")
	expect(t, reg, n, "dedup_store_errors_total", "op", "claim", "node", "127.0.0.1:7001")
	expect(t, reg, n, "dedup_store_errors_total", "op", "claim", "node", "127.0.0.1:7002")
	expect(t, reg, n, "dedup_store_errors_total", "op", "complete", "node", "")
	expect(t, reg, n, "dedup_store_errors_total", "op", "custom-op", "node", "")
	expect(t, reg, n, "dedup_lease_renewals_total", "result", "ok")
	expect(t, reg, n, "dedup_lease_renewals_total", "result", "other")
	expect(t, reg, n, "dedup_durability_shortfalls_total", "op", "claim", "node", "")
	expect(t, reg, n, "dedup_durability_shortfalls_total", "op", "claim", "node", "127.0.0.1:7001")
	expect(t, reg, n, "dedup_corrupt_records_total")
	for _, op := range []string{"claim", "complete", "custom-op"} {
		want := n
		if op == "claim" {
			want = 2 * n
		}
		expect(t, reg, want, "dedup_store_duration_seconds", "op", op)
	}
}

// TestRegisterExportsZeros checks the series New and Register export before
// anything happened: every outcome of a registered handler, its in-flight
// gauge and duration histogram, and the fixed store ops and results.
func TestRegisterExportsZeros(t *testing.T) {
	m, reg := newMetrics(t)
	m.Register("kafka", "orders")
	for _, o := range Outcomes {
		expect(t, reg, 0, "dedup_messages_total", "transport", "kafka", "handler", "orders", "outcome", string(o))
	}
	expect(t, reg, 0, "dedup_inflight", "handler", "orders")
	expect(t, reg, 0, "dedup_handler_duration_seconds", "handler", "orders")
	for _, c := range []struct {
		name string
		want int
	}{
		{"dedup_messages_total", len(Outcomes)},
		{"dedup_inflight", 1},
		{"dedup_handler_duration_seconds", 1},
		{"dedup_store_errors_total", len(StoreOps)},
		{"dedup_durability_shortfalls_total", len(DurableOps)},
		{"dedup_lease_renewals_total", 3},
		{"dedup_store_risk", len(StoreRiskChecks)},
	} {
		if got := seriesCount(t, reg, c.name); got != c.want {
			t.Errorf("%s has %d series, want %d", c.name, got, c.want)
		}
	}
}

// series is what reg gathers for the series of family name with exactly the
// labels of want (name=value pairs): its counter or gauge value, or its
// histogram's sample count. ok is false when there is no such series.
func series(t *testing.T, reg prometheus.Gatherer, name string, want ...string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			l := s.GetLabel()
			if len(l)*2 != len(want) {
				continue
			}
			for i := range l {
				if !slices.Contains(pairs(want), l[i].GetName()+"="+l[i].GetValue()) {
					continue next
				}
			}
			switch {
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount()), true
			case s.Counter != nil:
				return s.GetCounter().GetValue(), true
			case s.Gauge != nil:
				return s.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func pairs(kv []string) []string {
	out := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, kv[i]+"="+kv[i+1])
	}
	return out
}

// seriesCount is how many series family name has in reg.
func seriesCount(t *testing.T, reg prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// expect fails t unless the series of family name with labels kv holds want.
func expect(t *testing.T, reg prometheus.Gatherer, want float64, name string, kv ...string) {
	t.Helper()
	got, ok := series(t, reg, name, kv...)
	if !ok {
		t.Errorf("no series %s%v", name, pairs(kv))
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, pairs(kv), got, want)
	}
}

// BenchmarkHooks measures the hooks one delivery of a registered handler
// calls in the relay: its outcome, its handler run, the in-flight gauge up
// and down, and a claim and a completion in the store.
func BenchmarkHooks(b *testing.B) {
	m, _ := newMetrics(b)
	m.Register("kafka", "orders")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.OnInflight("orders", 1)
			m.OnStoreCall("claim", time.Millisecond, nil)
			m.OnHandlerDone("orders", 3*time.Millisecond, nil)
			m.OnStoreCall("complete", time.Millisecond, nil)
			m.OnOutcome("orders", "kafka", consumer.OutcomeProcessed)
			m.OnInflight("orders", -1)
		}
	})
}

// TestRegisterTwice checks that registering a handler again, for the same
// transport or another, keeps what it counted and counts each transport's
// outcomes apart.
func TestRegisterTwice(t *testing.T) {
	m, reg := newMetrics(t)
	m.Register("kafka", "orders")
	m.OnOutcome("orders", "kafka", consumer.OutcomeProcessed)
	m.OnInflight("orders", 2)
	m.Register("kafka", "orders")
	m.Register("nats", "orders")
	m.OnOutcome("orders", "kafka", consumer.OutcomeProcessed)
	m.OnOutcome("orders", "nats", consumer.OutcomeDuplicate)
	m.OnInflight("orders", 1)
	expect(t, reg, 2, "dedup_messages_total", "transport", "kafka", "handler", "orders", "outcome", string(consumer.OutcomeProcessed))
	expect(t, reg, 0, "dedup_messages_total", "transport", "nats", "handler", "orders", "outcome", string(consumer.OutcomeProcessed))
	expect(t, reg, 1, "dedup_messages_total", "transport", "nats", "handler", "orders", "outcome", string(consumer.OutcomeDuplicate))
	expect(t, reg, 3, "dedup_inflight", "handler", "orders")
	if got, want := seriesCount(t, reg, "dedup_messages_total"), 2*len(Outcomes); got != want {
		t.Errorf("dedup_messages_total has %d series, want %d", got, want)
	}
}
