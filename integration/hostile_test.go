package integration_test

// Hostile input (issue 8): keys, payloads, headers, stored values and
// configuration that a careless or malicious producer or operator can
// produce. Each test asserts the documented outcome; none may crash the
// worker or ack a message whose work did not finish.

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/actions"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// hostileFix is an engine over real Redis in a namespace of its own.
type hostileFix struct {
	store   *redisbackend.Store
	eng     *idempotency.Engine
	oc      *outcomeCounts
	corrupt atomic.Int32
}

func (f *hostileFix) OnCorruptRecord(string) { f.corrupt.Add(1) }

func newHostileFix(t *testing.T) *hostileFix {
	t.Helper()
	rc := testenv.RedisClient(t)
	ns := "hostile-" + testenv.RandID()
	testenv.DropNamespace(t, ns)
	store, err := redisbackend.New(rc, redisbackend.Options{Namespace: ns, Grace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	f := &hostileFix{store: store, oc: &outcomeCounts{}}
	f.eng, err = idempotency.New(store, idempotency.Config{Hooks: consumer.Hooks{f.oc, f}, StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.eng.Close() })
	return f
}

// hostileCounter is a handler that counts runs per key and returns "ok".
type hostileCounter struct {
	mu   sync.Mutex
	runs map[string]int
	fn   func(ctx context.Context, m *consumer.Message) ([]byte, error)
}

func (h *hostileCounter) Handle(ctx context.Context, m *consumer.Message) ([]byte, error) {
	ci, _ := dedupworker.ClaimOf(ctx)
	h.mu.Lock()
	if h.runs == nil {
		h.runs = map[string]int{}
	}
	h.runs[ci.Key]++
	h.mu.Unlock()
	if h.fn != nil {
		return h.fn(ctx, m)
	}
	return []byte("ok"), nil
}

func (h *hostileCounter) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.runs[key]
}

func (h *hostileCounter) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.runs {
		n += c
	}
	return n
}

func (f *hostileFix) proc(t *testing.T, h consumer.Handler, opts ...idempotency.Option) consumer.Processor {
	t.Helper()
	dedup, err := f.eng.Processor(append([]idempotency.Option{idempotency.WithLease(5 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return dedup("h", h)
}

func hostileDelivery(key string, payload []byte) *consumertest.Delivery {
	d := consumertest.NewDelivery(consumertest.NewMessage("", ""), 1)
	d.Message().Payload = payload
	d.Message().Header.Set("Idempotency-Key", key)
	return d
}

// An empty key (present but "") is a missing key: with the default reject
// policy it is dead-lettered with reason missing_key and acked, and the
// handler never runs; with passthrough it runs, counted as passthrough.
func TestHostileEmptyKey(t *testing.T) {
	t.Parallel()
	f := newHostileFix(t)
	h := &hostileCounter{}
	d := hostileDelivery("", []byte("x"))
	f.proc(t, h).Process(context.Background(), d)
	if dl := d.ExpectDeadLettered(t); dl.Reason != "missing_key" || h.total() != 0 {
		t.Fatalf("empty key (reject): dead letter %+v runs %d; want dead-lettered missing_key, acked, not run", dl, h.total())
	}
	d = hostileDelivery("", []byte("x"))
	f.proc(t, h, idempotency.WithMissingKey(idempotency.MissingKeyPassthrough)).Process(context.Background(), d)
	d.ExpectAcked(t)
	if h.total() != 1 || f.oc.get(consumer.OutcomePassthrough) != 1 {
		t.Fatalf("empty key (passthrough): runs %d outcomes %v", h.total(), f.oc)
	}
}

// A 1 MiB key and keys that are not UTF-8 deduplicate like any other: the
// first runs, the repeat is a duplicate, a key differing in one byte is its
// own key, and no Redis key grows past the hashed form.
func TestHostileHugeAndBinaryKeys(t *testing.T) {
	t.Parallel()
	f := newHostileFix(t)
	h := &hostileCounter{}
	p := f.proc(t, h)
	ctx := context.Background()
	huge := strings.Repeat("k", 1<<20)
	huge2 := huge[:len(huge)-1] + "j"
	keys := []string{huge, huge2, "\xff\xfe\x00\x01", "\xff\xfe\x00\x02", "\xc3\x28", "a\r\nb", strings.Repeat("\x80", 300)}
	for round := range 2 {
		for _, k := range keys {
			d := hostileDelivery(k, []byte("payload"))
			p.Process(ctx, d)
			d.ExpectAcked(t)
			if n := h.count(k); n != 1 {
				t.Fatalf("round %d: key %q… ran %d times, want 1", round, k[:min(len(k), 8)], n)
			}
		}
	}
	if got := f.oc.get(consumer.OutcomeDuplicate); got != len(keys) {
		t.Fatalf("duplicates %d, want %d (%v)", got, len(keys), f.oc)
	}
	for _, k := range keys {
		rec, err := f.store.Get(ctx, idempotency.EffectiveKey("h", k))
		if err != nil || rec == nil || rec.State != idempotency.StateCompleted {
			t.Fatalf("record of %q…: %+v, %v", k[:min(len(k), 8)], rec, err)
		}
	}
	rc := testenv.RedisClient(t)
	stored, err := rc.Keys(ctx, f.store.Namespace()+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range stored {
		if len(k) > len(f.store.Namespace())+len(":h:")+idempotency.MaxKeyBytes {
			t.Errorf("a Redis key of %d bytes: long keys must be hashed", len(k))
		}
	}
}

// A payload that is not JSON with a json: key source is a missing key,
// not a crash and not an error: dead-lettered missing_key and
// acked; a header source listed first still wins.
func TestHostileNonJSONPayload(t *testing.T) {
	t.Parallel()
	f := newHostileFix(t)
	h := &hostileCounter{}
	p := f.proc(t, h, idempotency.WithKeySources(idempotency.HeaderKey("X-Key"), idempotency.JSONKey("order.id")))
	ctx := context.Background()
	for _, payload := range [][]byte{
		[]byte("not json"), {0xff, 0x00, 0xfe}, []byte(`{"order":`), []byte(`{"order":{"id":null}}`),
		[]byte(`{"order":{"id":{"x":1}}}`), []byte(`["order"]`), []byte(strings.Repeat("[", 100000)), nil,
	} {
		d := consumertest.NewDelivery(consumertest.NewMessage("", ""), 1)
		d.Message().Payload = payload
		p.Process(ctx, d)
		if dl := d.ExpectDeadLettered(t); dl.Reason != "missing_key" {
			t.Fatalf("payload %q…: dead letter %+v; want dead-lettered missing_key and acked", payload[:min(len(payload), 12)], dl)
		}
	}
	if h.total() != 0 {
		t.Fatalf("handler ran %d times for messages without a key", h.total())
	}
	d := consumertest.NewDelivery(consumertest.NewMessage("", ""), 1)
	d.Message().Payload = []byte("not json")
	d.Message().Header.Set("X-Key", "from-header")
	p.Process(ctx, d)
	d.ExpectAcked(t)
	if h.count("from-header") != 1 {
		t.Fatal("a header key before a json: source was not used for a non-JSON payload")
	}
}

// 10 MiB payloads: JetStream refuses them at publish (max_payload, 1 MiB by
// default), so a producer learns at once and nothing reaches the worker; at
// the engine (as from Kafka, whose limits are the broker's) they
// deduplicate by fingerprint: the same content is a duplicate, other content
// under the same key is a mismatch, dead-lettered and acked without running.
func TestHostileTenMiBPayload(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 10<<20/16)
	t.Run("nats refuses at publish", func(t *testing.T) {
		h := newNATSHarness(t, testenv.EmbeddedNATS(t))
		m := nats.NewMsg(h.subj + ".big")
		m.Data = big
		m.Header.Set("Idempotency-Key", "big")
		_, err := h.js.PublishMsg(natsCtx(t, 10*time.Second), m)
		if !errors.Is(err, nats.ErrMaxPayload) {
			t.Fatalf("publishing 10 MiB: %v, want nats.ErrMaxPayload", err)
		}
	})
	t.Run("engine", func(t *testing.T) {
		f := newHostileFix(t)
		h := &hostileCounter{fn: func(_ context.Context, m *consumer.Message) ([]byte, error) {
			if len(m.Payload) != len(big) {
				return nil, errors.New("payload truncated")
			}
			return []byte("ok"), nil
		}}
		p := f.proc(t, h)
		ctx := context.Background()
		d := hostileDelivery("big", big)
		p.Process(ctx, d)
		d.ExpectAcked(t)
		d = hostileDelivery("big", big)
		p.Process(ctx, d)
		d.ExpectAcked(t)
		other := bytes.Clone(big)
		other[len(other)-1] = 'X'
		d = hostileDelivery("big", other)
		p.Process(ctx, d)
		if dl := d.ExpectDeadLettered(t); h.count("big") != 1 || dl.Reason != "fingerprint_mismatch" {
			t.Fatalf("runs %d, last dead letter %+v; want 1 run and a mismatch dead-lettered", h.count("big"), dl)
		}
		if f.oc.get(consumer.OutcomeProcessed) != 1 || f.oc.get(consumer.OutcomeDuplicate) != 1 || f.oc.get(consumer.OutcomeMismatch) != 1 {
			t.Fatalf("outcomes %v", f.oc)
		}
	})
}

// Binary header values (every byte value, NUL included) take part in the
// fingerprint exactly: the same bytes are a duplicate, one byte different is
// a mismatch; and as a key source they deduplicate too.
func TestHostileBinaryHeaders(t *testing.T) {
	t.Parallel()
	f := newHostileFix(t)
	h := &hostileCounter{}
	p := f.proc(t, h, idempotency.WithFingerprintHeaders("X-Bin"), idempotency.WithKeySources(idempotency.HeaderKey("X-Bin-Key")))
	var all []byte
	for i := range 256 {
		all = append(all, byte(i))
	}
	mk := func(bin []byte) *consumertest.Delivery {
		d := consumertest.NewDelivery(consumertest.NewMessage("", ""), 1)
		d.Message().Payload = []byte("p")
		d.Message().Header.Set("X-Bin", string(bin))
		d.Message().Header.Set("X-Bin-Key", string(all[:200]))
		return d
	}
	ctx := context.Background()
	for range 2 {
		d := mk(all)
		p.Process(ctx, d)
		d.ExpectAcked(t)
	}
	other := bytes.Clone(all)
	other[0] = 1
	d := mk(other)
	p.Process(ctx, d)
	if dl := d.ExpectDeadLettered(t); h.total() != 1 || dl.Reason != "fingerprint_mismatch" {
		t.Fatalf("runs %d, dead letter %+v; want one run, then a mismatch", h.total(), dl)
	}
}

// A record overwritten with garbage, or with JSON of the wrong shape, is
// absent to readers and replaced by the next claim (a RECOVERED
// claim), counted as corrupt: the handler runs (the only safe choice when the
// stored state is unknown), the record is whole again, and the next delivery
// is a duplicate.
func TestHostileCorruptRecord(t *testing.T) {
	t.Parallel()
	f := newHostileFix(t)
	h := &hostileCounter{}
	p := f.proc(t, h)
	ctx := context.Background()
	rc := testenv.RedisClient(t)
	values := []string{
		"garbage", "\x00\xff", "", "null", "[]", `"COMPLETED"`, `{}`,
		`{"state":"COMPLETED"}`,
		`{"v":1,"state":"COMPLETED","fp":"1:x","fpv":1,"token":"t","fence":"one","claimed_at_ms":1,"lease_until_ms":1,"attempts":1}`,
		`{"v":1,"state":"DONE","fp":"1:x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":1,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":9999999999999,"attempts":1,"steps":{"a":7}}`,
		`{"v":1,"state":"COMPLETED","fp":"1:x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":1,"attempts":1,"result":"!!not base64"}`,
	}
	for i, v := range values {
		key := "corrupt-" + string(rune('a'+i))
		d := hostileDelivery(key, []byte("p"))
		p.Process(ctx, d)
		d.ExpectAcked(t)
		if err := rc.Set(ctx, f.store.RedisKey(idempotency.EffectiveKey("h", key)), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if rec, err := f.store.Get(ctx, idempotency.EffectiveKey("h", key)); err != nil || rec != nil {
			t.Fatalf("Get of %q = %+v, %v; want absent", v, rec, err)
		}
		d = hostileDelivery(key, []byte("p"))
		p.Process(ctx, d)
		d.ExpectAcked(t)
		if n := h.count(key); n != 2 {
			t.Fatalf("value %q: handler ran %d times, want 2 (the value could not say the key was done)", v, n)
		}
		rec, err := f.store.Get(ctx, idempotency.EffectiveKey("h", key))
		if err != nil || rec == nil || rec.State != idempotency.StateCompleted {
			t.Fatalf("value %q: record after recovery %+v, %v", v, rec, err)
		}
		d = hostileDelivery(key, []byte("p"))
		p.Process(ctx, d)
		d.ExpectAcked(t)
		if n := h.count(key); n != 2 {
			t.Fatalf("value %q: a delivery after recovery ran again (%d runs)", v, n)
		}
	}
	if got := int(f.corrupt.Load()); got != len(values) {
		t.Fatalf("corrupt records counted %d, want %d", got, len(values))
	}
}

// A result larger than the http action's cap is stored truncated to the cap
// (documented in actions.HTTP) and acked; a failing endpoint is never acked.
func TestHostileResultOverCap(t *testing.T) {
	t.Parallel()
	var fail atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(bytes.Repeat([]byte("r"), 4<<20))
	}))
	t.Cleanup(srv.Close)
	f := newHostileFix(t)
	act := actions.HTTP(actions.HTTPConfig{Handler: "h", URL: srv.URL, Timeout: 10 * time.Second, MaxResultBytes: 1000})
	p := f.proc(t, act)
	ctx := context.Background()
	d := hostileDelivery("big-result", []byte("p"))
	p.Process(ctx, d)
	d.ExpectAcked(t)
	rec, err := f.store.Get(ctx, idempotency.EffectiveKey("h", "big-result"))
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted || len(rec.Result) != 1000 {
		t.Fatalf("record %v, %v; want COMPLETED with a 1000-byte result", rec != nil, err)
	}
	fail.Store(true)
	d = hostileDelivery("failing", []byte("p"))
	p.Process(ctx, d)
	d.ExpectNakked(t)
	if rec, _ := f.store.Get(ctx, idempotency.EffectiveKey("h", "failing")); rec != nil && rec.State == idempotency.StateCompleted {
		t.Fatal("a failed http action left a COMPLETED record")
	}
}

// Through a real Worker on a real JetStream: a stream of hostile messages
// (no key, empty key, binary key, non-JSON, a key of 60 KiB, binary headers)
// neither stops the worker nor leaves anything unacked, and every well-formed
// message after them is processed exactly once.
func TestHostileNATSWorkerSurvives(t *testing.T) {
	t.Parallel()
	h := newNATSHarness(t, testenv.EmbeddedNATS(t))
	oc := &outcomeCounts{}
	led := newNATSLedger()
	r := h.start(t, natsWorkerSpec{handler: led.handler(), hooks: consumer.Hooks{oc}, opts: []idempotency.Option{
		idempotency.WithKeySources(idempotency.HeaderKey("Idempotency-Key"), idempotency.JSONKey("id")),
		idempotency.WithFingerprintHeaders("X-Bin"),
	}})
	ctx := natsCtx(t, 30*time.Second)
	var n uint64
	pub := func(key *string, data []byte, bin string) {
		t.Helper()
		m := nats.NewMsg(h.subj + ".x")
		m.Data = data
		if key != nil {
			m.Header.Set("Idempotency-Key", *key)
		}
		if bin != "" {
			m.Header.Set("X-Bin", bin)
		}
		if _, err := h.js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish: %v", err)
		}
		n++
	}
	s := func(v string) *string { return &v }
	pub(nil, []byte("no key at all"), "")
	pub(s(""), []byte("empty key"), "")
	pub(s("\xff\xfe\x00bin"), []byte("binary key"), "")
	pub(nil, []byte("{not json"), "")
	pub(s(strings.Repeat("L", 60<<10)), []byte("long key"), "")
	pub(s("bin-hdr"), []byte("x"), "\x00\x01\xff\xfe")
	pub(s("bin-hdr"), []byte("x"), "\x00\x01\xff\xfe")
	pub(nil, []byte(`{"id":"from-json"}`), "")
	for _, k := range []string{"ok-1", "ok-2", "ok-1"} {
		pub(s(k), []byte("fine"), "")
	}
	h.drained(t, "c", n, 30*time.Second)
	select {
	case <-r.Done():
		t.Fatalf("the worker stopped: %v", r.Wait(t, time.Second))
	default:
	}
	for _, k := range []string{"\xff\xfe\x00bin", strings.Repeat("L", 60<<10), "bin-hdr", "from-json", "ok-1", "ok-2"} {
		led.mu.Lock()
		c := led.completes[k]
		led.mu.Unlock()
		if c != 1 {
			t.Errorf("key %q… completed %d times, want 1", k[:min(len(k), 8)], c)
		}
	}
	if oc.get(consumer.OutcomeMissingKey) != 3 || oc.get(consumer.OutcomeDuplicate) != 2 {
		t.Errorf("outcomes %v: want 3 missing_key, 2 duplicates", oc)
	}
}

// hostileBinary is the package's dedupworker binary.
func hostileBinary(t testing.TB) string {
	t.Helper()
	return hostileBin
}

// A config in which every field is wrong: validate exits 2 and names the
// first wrong field with its line, and nothing after it.
func TestHostileConfigEveryFieldWrong(t *testing.T) {
	t.Parallel()
	bin := hostileBinary(t)
	dir := t.TempDir()
	cases := []struct{ name, text, want string }{
		{"types", `redis: {url: [1], namespace: {a: b}, grace: forever}
http: {addr: [x]}
log: {level: loud, format: xml}
shutdown_timeout: -5s
handlers:
  - name: "bad name!"
    source: {kafka: {brokers: 1}, nats: {url: 3}}
    key: [nonsense]
    lease: 30x
    max_attempts: many
    concurrency: -1
    action: {forward: {}, http: {url: ftp://x}, exec: {command: []}}
`, "redis.url (line 1)"},
		{"values", `redis: {url: http://127.0.0.1, password: a, password_file: b}
log: {level: loud}
handlers:
  - name: "bad name!"
    key: [nonsense]
    lease: 1ms
`, "redis.url (line 1)"},
		{"handler", `handlers:
  - name: ok
    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}
    key: ["json:a..b", nonsense]
    missing_key: maybe
    mismatch: sometimes
    lease: 1ms
    action: {exec: {command: [/bin/true]}}
`, "handlers[0].key[0] (line 4)"},
		{"unknown", "handlerz: []\nredis: {}\n", "handlerz (line 1): unknown field"},
		{"bad yaml", "handlers: [\n", "not valid YAML"},
		{"days overflow", "handlers:\n  - name: a\n    retention: 213504d\n", "handlers[0].retention (line 3)"},
	}
	for _, tc := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".yaml")
		if err := os.WriteFile(path, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "validate", "-c", path)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s: validate = %v, want exit 2; stderr %s", tc.name, err, stderr.String())
			continue
		}
		lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
		if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
			t.Errorf("%s: stderr %q, want one line naming %q", tc.name, stderr.String(), tc.want)
		}
	}
}

// A record that vanishes while its handler runs (Redis restarted without its
// data) leaves no new owner to finish the key: the engine must redeliver,
// not ack (the chaos driver lost keys this way). When another worker did
// take the key over, the delivery is acked: the new owner finishes it.
func TestHostileRecordGoneUnderHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		replace func(ctx context.Context, rc redis.UniversalClient, key string) error
		wantAck bool
	}{
		{"wiped", func(ctx context.Context, rc redis.UniversalClient, key string) error {
			return rc.Del(ctx, key).Err()
		}, false},
		{"taken over", func(ctx context.Context, rc redis.UniversalClient, key string) error {
			other := `{"v":1,"state":"CLAIMED","fp":"1:x","fpv":1,"token":"someone-else","fence":2,"claimed_at_ms":1,"lease_until_ms":99999999999999,"attempts":2}`
			return rc.Set(ctx, key, other, time.Minute).Err()
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newHostileFix(t)
			rc := testenv.RedisClient(t)
			started := make(chan struct{})
			h := &hostileCounter{fn: func(ctx context.Context, _ *consumer.Message) ([]byte, error) {
				close(started)
				<-ctx.Done() // until the engine cancels it (lease lost)
				return nil, ctx.Err()
			}}
			p := f.proc(t, h, idempotency.WithLease(300*time.Millisecond))
			d := hostileDelivery("vanishing", []byte("p"))
			done := make(chan struct{})
			go func() { defer close(done); p.Process(context.Background(), d) }()
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("handler did not start")
			}
			if err := tc.replace(context.Background(), rc, f.store.RedisKey(idempotency.EffectiveKey("h", "vanishing"))); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler was not cancelled after its claim was lost")
			}
			if tc.wantAck {
				d.ExpectAcked(t)
			} else {
				d.ExpectNakked(t)
			}
			if f.oc.get(consumer.OutcomeLeaseLost) != 1 {
				t.Fatalf("outcomes %v, want lease_lost", f.oc)
			}
		})
	}
}
