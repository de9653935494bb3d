package metrics

import (
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// Outcomes lists every value of the outcome label, so a registered handler
// exports zeros for outcomes that have not happened yet.
var Outcomes = []consumer.Outcome{
	consumer.OutcomeProcessed, consumer.OutcomeDuplicate, consumer.OutcomeReclaimed,
	consumer.OutcomeMismatch, consumer.OutcomeMissingKey, consumer.OutcomePassthrough,
	consumer.OutcomeFailed, consumer.OutcomeDeadLettered, consumer.OutcomeLeaseLost,
	consumer.OutcomeStoreBypassed, consumer.OutcomeWouldSkip, consumer.OutcomeInFlight,
	consumer.OutcomeStoreError, consumer.OutcomeCancelled,
}

// StoreOps lists the op label values of the store metrics. wait is the
// Redis store's WAIT for replicas, reported from inside its
// claims, completions, releases and steps when durability is on; inflight
// is a wait for a key in flight elsewhere.
var StoreOps = []string{"claim", "complete", "renew", "release", "step", "inflight", "get", "delete", "ping", "wait"}

// DurableOps lists the op label values of dedup_durability_shortfalls_total:
// the store writes that wait for replicas.
var DurableOps = []string{"claim", "complete", "release", "step"}

// outcomeIndex is the position of each outcome in Outcomes, the index of a
// handler's resolved dedup_messages_total children.
var outcomeIndex = func() map[consumer.Outcome]int {
	idx := make(map[consumer.Outcome]int, len(Outcomes))
	for i, o := range Outcomes {
		idx[o] = i
	}
	return idx
}()

// Metrics is a consumer.Hook that implements every hook interface.
//
// The hooks run for every delivery, so they do not look series up by label
// values: New resolves the children of the fixed label sets (StoreOps,
// DurableOps, the lease renewal results) and Register those of a handler
// (each outcome for its transport, its in-flight gauge and duration
// histogram) once, and the hooks find them by a lookup in maps that are
// never written after they are published. The resolved sets are bounded:
// the fixed lists, and per handler what Register was called with, once per
// configured handler. A label value outside them (a handler never
// registered, an op or result not listed) is looked up by
// WithLabelValues on each call, as Prometheus does, and never cached, so
// it adds nothing here.
type Metrics struct {
	messages        *prometheus.CounterVec
	handlerDuration *prometheus.HistogramVec
	storeDuration   *prometheus.HistogramVec
	storeErrors     *prometheus.CounterVec
	leaseRenewals   *prometheus.CounterVec
	inflight        *prometheus.GaugeVec
	corrupt         prometheus.Counter
	shortfalls      *prometheus.CounterVec
	storeRisk       *prometheus.GaugeVec
	evictions       prometheus.Counter

	store      map[string]storeSeries        // by op; written only in New
	renewals   map[string]prometheus.Counter // by result; written only in New
	shortfallC map[string]prometheus.Counter // by op; written only in New

	mu       sync.Mutex                                // serialises Register's copy and publish
	handlers atomic.Pointer[map[string]*handlerSeries] // by handler; replaced, never written, once published
}

// storeSeries is one store op's resolved children.
type storeSeries struct {
	duration prometheus.Observer
	errors   prometheus.Counter
}

// handlerSeries is one registered handler's resolved children.
type handlerSeries struct {
	duration prometheus.Observer
	inflight prometheus.Gauge
	// transports holds the outcome counters per transport the handler was
	// registered with: one in the binary, where a handler has one source.
	transports []transportSeries
}

// transportSeries is dedup_messages_total of one handler and transport, by
// the outcome's position in Outcomes.
type transportSeries struct {
	transport string
	outcomes  []prometheus.Counter // len(Outcomes)
}

// StoreRiskChecks lists the check label values of dedup_store_risk: the
// store health checks (docs/SECURITY.md, "Store health checks").
var StoreRiskChecks = []string{"eviction", "persistence", "replicas", "appendfsync", "failover"}

var (
	_ consumer.HookOutcome       = (*Metrics)(nil)
	_ consumer.HookHandlerDone   = (*Metrics)(nil)
	_ consumer.HookInflight      = (*Metrics)(nil)
	_ consumer.HookStoreCall     = (*Metrics)(nil)
	_ consumer.HookLeaseRenewal  = (*Metrics)(nil)
	_ consumer.HookCorruptRecord = (*Metrics)(nil)

	_ consumer.HookDurabilityShortfall = (*Metrics)(nil)
)

// New creates the metrics and registers them, with the Go and process
// collectors, on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_messages_total",
			Help: "Deliveries settled, by transport, handler and outcome.",
		}, []string{"transport", "handler", "outcome"}),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedup_handler_duration_seconds",
			Help:    "Time one handler run took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14), // 1ms .. ~150s
		}, []string{"handler"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "dedup_store_duration_seconds",
			Help:    "Time one call to the deduplication store took, by operation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14), // 100µs .. ~15s
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_store_errors_total",
			Help: "Failed calls to the deduplication store, by operation and by the node that failed them (a Redis Cluster primary's address; \"\" for a single server or an error of no one node).",
		}, []string{"op", "node"}),
		leaseRenewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_lease_renewals_total",
			Help: "Lease renewals by result: ok, lost, error.",
		}, []string{"result"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedup_inflight",
			Help: "Deliveries being processed now, by handler.",
		}, []string{"handler"}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedup_corrupt_records_total",
			Help: "Stored values that were not valid records and were replaced by a claim.",
		}),
		shortfalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dedup_durability_shortfalls_total",
			Help: "Store writes that fewer replicas than redis.durability.replicas acknowledged in time, by operation and by the node whose replicas fell short (a Redis Cluster primary's address; \"\" for a single server); each write's keys failed closed.",
		}, []string{"op", "node"}),
		storeRisk: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dedup_store_risk",
			Help: "1 when the store health check found the Redis settings risk running a key twice (eviction, persistence, replicas, appendfsync), else 0, also when the setting could not be read.",
		}, []string{"check"}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dedup_store_evictions_total",
			Help: "Keys Redis evicted since the worker started (INFO stats evicted_keys, summed over primaries): an evicted record lets a duplicate run again.",
		}),
	}
	for _, c := range []prometheus.Collector{
		m.messages, m.handlerDuration, m.storeDuration, m.storeErrors, m.leaseRenewals, m.inflight, m.corrupt, m.shortfalls, m.storeRisk, m.evictions,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				continue
			}
			return nil, err
		}
	}
	m.renewals = make(map[string]prometheus.Counter, 3)
	for _, r := range []string{"ok", "lost", "error"} {
		m.renewals[r] = m.leaseRenewals.WithLabelValues(r)
	}
	m.store = make(map[string]storeSeries, len(StoreOps))
	for _, op := range StoreOps {
		m.store[op] = storeSeries{
			duration: m.storeDuration.WithLabelValues(op),
			errors:   m.storeErrors.WithLabelValues(op, ""), // zero series: an alert on rate() sees them before the first error
		}
	}
	m.shortfallC = make(map[string]prometheus.Counter, len(DurableOps))
	for _, op := range DurableOps {
		m.shortfallC[op] = m.shortfalls.WithLabelValues(op, "")
	}
	for _, c := range StoreRiskChecks {
		m.storeRisk.WithLabelValues(c)
	}
	return m, nil
}

// Register makes a handler's series exist (at zero) before its first
// message, and resolves them for the hooks. Calling it again for the same
// handler and transport changes nothing.
func (m *Metrics) Register(transport, handler string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.handlers.Load()
	var prev *handlerSeries
	if old != nil {
		prev = (*old)[handler]
	}
	if prev != nil && prev.transport(transport) != nil {
		return
	}
	hs := &handlerSeries{
		duration: m.handlerDuration.WithLabelValues(handler),
		inflight: m.inflight.WithLabelValues(handler),
	}
	if prev != nil {
		hs.transports = slices.Clone(prev.transports)
	}
	ts := transportSeries{transport: transport, outcomes: make([]prometheus.Counter, len(Outcomes))}
	for i, o := range Outcomes {
		ts.outcomes[i] = m.messages.WithLabelValues(transport, handler, string(o))
	}
	hs.transports = append(hs.transports, ts)
	next := make(map[string]*handlerSeries, 1)
	if old != nil {
		next = maps.Clone(*old)
	}
	next[handler] = hs
	m.handlers.Store(&next)
}

// handler is the resolved series of a registered handler, or nil.
func (m *Metrics) handler(name string) *handlerSeries {
	if hs := m.handlers.Load(); hs != nil {
		return (*hs)[name]
	}
	return nil
}

// transport is the handler's outcome counters for transport, or nil.
func (hs *handlerSeries) transport(name string) *transportSeries {
	for i := range hs.transports {
		if hs.transports[i].transport == name {
			return &hs.transports[i]
		}
	}
	return nil
}

// OnOutcome counts a settled delivery.
func (m *Metrics) OnOutcome(handler, transport string, o consumer.Outcome) {
	if hs := m.handler(handler); hs != nil {
		if ts := hs.transport(transport); ts != nil {
			if i, ok := outcomeIndex[o]; ok {
				ts.outcomes[i].Inc()
				return
			}
		}
	}
	m.messages.WithLabelValues(transport, handler, string(o)).Inc()
}

// OnHandlerDone observes a handler run.
func (m *Metrics) OnHandlerDone(handler string, took time.Duration, _ error) {
	if hs := m.handler(handler); hs != nil {
		hs.duration.Observe(took.Seconds())
		return
	}
	m.handlerDuration.WithLabelValues(handler).Observe(took.Seconds())
}

// OnInflight moves the in-flight gauge.
func (m *Metrics) OnInflight(handler string, delta int) {
	if hs := m.handler(handler); hs != nil {
		hs.inflight.Add(float64(delta))
		return
	}
	m.inflight.WithLabelValues(handler).Add(float64(delta))
}

// OnStoreCall observes a store call and counts its failure once for every
// node that failed part of it: the idempotency.NodeError values in err (a
// Redis Cluster's primaries, a bounded set), or node "" when err names none.
func (m *Metrics) OnStoreCall(op string, took time.Duration, err error) {
	s, ok := m.store[op]
	if !ok {
		s = storeSeries{duration: m.storeDuration.WithLabelValues(op)}
	}
	s.duration.Observe(took.Seconds())
	if err == nil {
		return
	}
	nodes := errNodes(err, nil)
	if len(nodes) == 0 {
		if s.errors == nil {
			s.errors = m.storeErrors.WithLabelValues(op, "")
		}
		s.errors.Inc()
		return
	}
	for _, n := range nodes {
		if n == "" && s.errors != nil {
			s.errors.Inc()
			continue
		}
		m.storeErrors.WithLabelValues(op, n).Inc()
	}
}

// errNodes appends to nodes the distinct nodes that err's
// idempotency.NodeError values name, searching its whole tree.
func errNodes(err error, nodes []string) []string {
	if ne, ok := err.(*idempotency.NodeError); ok {
		if !slices.Contains(nodes, ne.Node) {
			nodes = append(nodes, ne.Node)
		}
		return nodes
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			return errNodes(e, nodes)
		}
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if e != nil {
				nodes = errNodes(e, nodes)
			}
		}
	}
	return nodes
}

// OnLeaseRenewal counts a renewal by result.
func (m *Metrics) OnLeaseRenewal(_ string, result string) {
	if c, ok := m.renewals[result]; ok {
		c.Inc()
		return
	}
	m.leaseRenewals.WithLabelValues(result).Inc()
}

// OnCorruptRecord counts a recovered corrupt record.
func (m *Metrics) OnCorruptRecord(string) { m.corrupt.Inc() }

// OnDurabilityShortfall counts a store write that too few replicas of node
// acknowledged.
func (m *Metrics) OnDurabilityShortfall(op, node string) {
	if c, ok := m.shortfallC[op]; ok && node == "" {
		c.Inc()
		return
	}
	m.shortfalls.WithLabelValues(op, node).Inc()
}

// SetStoreRisk sets dedup_store_risk{check} to 1 when risk, else 0.
func (m *Metrics) SetStoreRisk(check string, risk bool) {
	v := 0.0
	if risk {
		v = 1
	}
	m.storeRisk.WithLabelValues(check).Set(v)
}

// AddEvictions adds n keys Redis evicted to dedup_store_evictions_total.
func (m *Metrics) AddEvictions(n int64) {
	if n > 0 {
		m.evictions.Add(float64(n))
	}
}
