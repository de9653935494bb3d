package tracing_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/consumer/tracing"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/actions"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

type capture struct {
	mu   sync.Mutex
	msg  *nats.Msg // the last one
	msgs []*nats.Msg
}

func (c *capture) PublishMsg(_ context.Context, m *nats.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msg = m
	c.msgs = append(c.msgs, m)
	return &jetstream.PubAck{Stream: "OUT", Sequence: uint64(len(c.msgs))}, nil
}

const (
	traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parent  = "00f067aa0ba902b7"
)

// tracedForward is the engine on real Redis, in a namespace of the test's
// own, running a NATS forward into a capture behind the tracer, whose
// spans go to the returned exporter; the forward injects the trace
// context it runs in into each message it sends. All of it is closed when
// the test ends.
func tracedForward(t *testing.T) (consumer.Processor, *tracetest.InMemoryExporter, *capture) {
	t.Helper()
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{Namespace: "trace-" + testenv.RandID()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	engine, err := idempotency.New(store, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close() })
	dedup, err := engine.Processor()
	if err != nil {
		t.Fatal(err)
	}
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tracing.New(tp)
	out := &capture{}
	inject := func(ctx context.Context, h consumer.Header) { tr.Propagator().Inject(ctx, tracing.HeaderCarrier(h)) }
	return tr.Wrap("orders", dedup("orders", actions.ForwardNATS("orders", out, "out", inject))), exp, out
}

func TestDeliverySpanContinuesTraceparent(t *testing.T) {
	// A new key's fence is the Redis clock in µs.
	floor := time.Now().Add(-time.Minute).UnixMicro()
	proc, exp, out := tracedForward(t)

	d := consumertest.NewDelivery(consumertest.NewMessage("order-1", `{"id":1}`), 1)
	d.Message().Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
	proc.Process(context.Background(), d)
	d.ExpectAcked(t)

	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1 per delivery", len(spans))
	}
	s := spans[0]
	if s.SpanContext.TraceID().String() != traceID || s.Parent.SpanID().String() != parent || !s.Parent.IsRemote() {
		t.Fatalf("span trace %s parent %s: want trace %s, remote parent %s", s.SpanContext.TraceID(), s.Parent.SpanID(), traceID, parent)
	}
	attrs := map[string]string{}
	for _, kv := range s.Attributes {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	fence, err := strconv.ParseInt(attrs["dedup.fence"], 10, 64)
	if attrs["dedup.outcome"] != "processed" || err != nil || fence < floor || attrs["dedup.handler"] != "orders" || len(attrs["dedup.key_hash"]) != 12 {
		t.Fatalf("span attributes %v: want outcome processed, a fence from the Redis clock (>= %d), handler, a key hash", attrs, floor)
	}
	for _, v := range attrs {
		if strings.Contains(v, "order-1") {
			t.Fatalf("span attributes carry the raw key: %v", attrs)
		}
	}
	// The forwarded message continues the trace from the delivery span.
	tp2 := out.msg.Header.Get("traceparent")
	if want := "00-" + traceID + "-" + s.SpanContext.SpanID().String() + "-01"; tp2 != want {
		t.Fatalf("forwarded traceparent %q, want %q (child of the delivery span)", tp2, want)
	}

	// A duplicate gets its own span, with the duplicate outcome.
	d2 := consumertest.NewDelivery(consumertest.NewMessage("order-1", `{"id":1}`), 1)
	proc.Process(context.Background(), d2)
	if spans := exp.GetSpans(); len(spans) != 2 {
		t.Fatalf("%d spans after a duplicate, want a second span", len(spans))
	}
	var outcome string
	for _, kv := range exp.GetSpans()[1].Attributes {
		if kv.Key == tracing.AttrOutcome {
			outcome = kv.Value.AsString()
		}
	}
	if outcome != "duplicate" {
		t.Fatalf("duplicate span outcome %q", outcome)
	}
}

// Behind the tracer the engine still takes runs: one call for the batch,
// and each delivery its own span, continuing its own traceparent, with its
// own outcome; each forwarded message continues its delivery's span.
func TestBatchKeepsASpanPerDelivery(t *testing.T) {
	proc, exp, out := tracedForward(t)
	if !proc.Batching() {
		t.Fatal("the traced processor must keep the engine's batch runs")
	}

	parents := []string{"00f067aa0ba90201", "00f067aa0ba90202", "00f067aa0ba90203"}
	keys := []string{"order-a", "order-b", "order-a"} // the third is a duplicate of the first
	var ds []consumer.Delivery
	for i, k := range keys {
		d := consumertest.NewDelivery(consumertest.NewMessage(k, `{"key":"`+k+`"}`), 1)
		d.Message().Header.Set("traceparent", "00-"+traceID+"-"+parents[i]+"-01")
		ds = append(ds, d)
	}
	proc.Prepare(context.Background(), ds[:2])
	proc.ProcessBatch(context.Background(), ds[:2])
	proc.Prepare(context.Background(), ds[2:])
	proc.ProcessBatch(context.Background(), ds[2:])
	for _, d := range ds {
		d.(*consumertest.Delivery).ExpectAcked(t)
	}

	spans := exp.GetSpans()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3: one per delivery", len(spans))
	}
	byParent := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byParent[s.Parent.SpanID().String()] = s
	}
	want := []string{"processed", "processed", "duplicate"}
	for i, p := range parents {
		s, ok := byParent[p]
		if !ok {
			t.Fatalf("no span continues traceparent %s: spans %v", p, spans)
		}
		var outcome, hash string
		for _, kv := range s.Attributes {
			switch kv.Key {
			case tracing.AttrOutcome:
				outcome = kv.Value.AsString()
			case tracing.AttrKeyHash:
				hash = kv.Value.AsString()
			}
		}
		if outcome != want[i] || len(hash) != 12 {
			t.Errorf("delivery %d (%s): outcome %q key hash %q, want %q and a hash", i, keys[i], outcome, hash, want[i])
		}
	}
	out.mu.Lock()
	defer out.mu.Unlock()
	if len(out.msgs) != 2 {
		t.Fatalf("%d messages forwarded, want 2 (the duplicate is not)", len(out.msgs))
	}
	for i, m := range out.msgs {
		s := byParent[parents[i]]
		if got, want := m.Header.Get("traceparent"), "00-"+traceID+"-"+s.SpanContext.SpanID().String()+"-01"; got != want {
			t.Errorf("forwarded message %d traceparent %q, want %q (child of its delivery's span)", i, got, want)
		}
	}
}

// plainProc is a Processor whose handler does not batch: it records
// whether each delivery came through ProcessBatch or Process, and whether
// a span was open in the context it came with.
type plainProc struct {
	calls []string
}

func (p *plainProc) Prepare(context.Context, []consumer.Delivery) {}
func (p *plainProc) Batching() bool                               { return false }

func (p *plainProc) Process(ctx context.Context, d consumer.Delivery) {
	p.calls = append(p.calls, "Process span="+strconv.FormatBool(trace.SpanFromContext(ctx).SpanContext().IsValid()))
	_ = d.Ack(ctx)
}

func (p *plainProc) ProcessBatch(ctx context.Context, ds []consumer.Delivery) {
	p.calls = append(p.calls, "ProcessBatch("+strconv.Itoa(len(ds))+") span="+strconv.FormatBool(trace.SpanFromContext(ctx).SpanContext().IsValid()))
	for _, d := range ds {
		_ = d.Ack(ctx)
	}
}

// A processor that does not batch still gets a run of one through
// ProcessBatch (a Kafka lane's run, which the engine reports handled before
// it stores the result), inside the delivery's span; a longer run is taken
// a delivery at a time through Process, each in its own span.
func TestPlainRunOfOneStaysARun(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	next := &plainProc{}
	proc := tracing.New(tp).Wrap("plain", next)

	one := []consumer.Delivery{consumertest.NewDelivery(consumertest.NewMessage("k1", "v"), 1)}
	proc.ProcessBatch(context.Background(), one)
	two := []consumer.Delivery{
		consumertest.NewDelivery(consumertest.NewMessage("k2", "v"), 1),
		consumertest.NewDelivery(consumertest.NewMessage("k3", "v"), 1),
	}
	proc.ProcessBatch(context.Background(), two)

	want := []string{"ProcessBatch(1) span=true", "Process span=true", "Process span=true"}
	if !slices.Equal(next.calls, want) {
		t.Fatalf("calls %q, want %q", next.calls, want)
	}
	if n := len(exp.GetSpans()); n != 3 {
		t.Fatalf("%d spans ended, want 3: one a delivery", n)
	}
	for _, d := range append(one, two...) {
		d.(*consumertest.Delivery).ExpectAcked(t)
	}
}
