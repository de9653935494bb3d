package natssource_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// TestPullAsksForRunsAhead reads the pull requests each durable's
// subscription sends ($JS.API.CONSUMER.MSG.NEXT.<stream>.<durable>): a
// batching runner's asks for 8 runs at once, within the consumer's
// MaxAckPending; a per-message handler's for its Batch (by default the
// concurrency).
// Every message is still handled once and acked.
func TestPullAsksForRunsAhead(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const n, conc, batch = 600, 16, 10
		cases := []struct {
			durable       string
			batching      bool
			maxAckPending int
			want          int // the first pull request's batch
		}{
			{"runs", true, 0, 8 * batch},    // MaxAckPending conc × batch = 160
			{"capped", true, 30, 30},        // 8 runs exceed the explicit MaxAckPending
			{"permessage", false, 0, batch}, // its Batch, below the concurrency
			{"default", false, 0, conc},     // the default Batch is the concurrency
		}
		var mu sync.Mutex
		asked := map[string][]int{} // durable → each pull request's batch
		prefix := "$JS.API.CONSUMER.MSG.NEXT." + e.stream + "."
		sub, err := e.nc.Subscribe(prefix+"*", func(m *nats.Msg) {
			var req struct {
				Batch int `json:"batch"`
			}
			if err := json.Unmarshal(m.Data, &req); err != nil {
				t.Errorf("pull request %q: %v", m.Data, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			d := strings.TrimPrefix(m.Subject, prefix)
			asked[d] = append(asked[d], req.Batch)
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		if err := e.nc.FlushTimeout(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		e.publish(t, n)

		handled := map[string]map[string]int{}
		for _, c := range cases {
			handled[c.durable] = map[string]int{}
			record := func(msgs []*consumer.Message) {
				mu.Lock()
				defer mu.Unlock()
				for _, m := range msgs {
					handled[c.durable][string(m.Payload)]++
				}
			}
			var h consumer.Handler = consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
				record([]*consumer.Message{m})
				return nil, nil
			})
			if c.batching {
				h = consumer.BatchFunc(func(_ context.Context, msgs []*consumer.Message, _ []consumer.Result) { record(msgs) })
			}
			cfgBatch := batch
			if c.durable == "default" {
				cfgBatch = 0
			}
			src := newSource(t, e, natssource.Config{Consumer: c.durable, AckWait: 10 * time.Second, Batch: cfgBatch, MaxAckPending: c.maxAckPending})
			run(t, dispatch.Config{}, src, h, dispatch.WithConcurrency(conc))
		}
		for _, c := range cases {
			e.drained(t, c.durable, 30*time.Second)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cases {
			reqs := asked[c.durable]
			if len(reqs) == 0 || reqs[0] != c.want {
				t.Errorf("%s: pull requests asked for %v, want the first to ask for %d", c.durable, reqs, c.want)
			}
			for _, b := range reqs {
				if b > c.want {
					t.Errorf("%s: a pull request asked for %d, more than %d", c.durable, b, c.want)
				}
			}
			if len(handled[c.durable]) != n {
				t.Errorf("%s: %d of %d messages handled", c.durable, len(handled[c.durable]), n)
			}
			for p, k := range handled[c.durable] {
				if k != 1 {
					t.Errorf("%s: %s handled %d times", c.durable, p, k)
				}
			}
		}
	})
}

// TestStarvedSubscriptionWarns: a message larger than the consumer lets a
// pull request take is refused by the server (409 Message Size Exceeds
// MaxBytes), which jetstream does not report; the Source sees the consumer
// idle with that message pending and says so, naming the limits. The
// message before it is delivered; the large one is not.
func TestStarvedSubscriptionWarns(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		ctx := ctxT(t, 5*time.Second)
		if _, err := e.js.CreateConsumer(ctx, e.stream, jetstream.ConsumerConfig{
			Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, MaxRequestMaxBytes: 2048,
		}); err != nil {
			t.Fatal(err)
		}
		e.publishEach(t, 10*time.Second, 2, func(i int) *nats.Msg {
			m := nats.NewMsg(e.subj + ".0")
			m.Data = []byte("small")
			if i == 1 {
				m.Data = make([]byte, 16<<10)
			}
			return m
		})
		logs := &testenv.SyncBuffer{}
		s := newSeen()
		src := newSource(t, e, natssource.Config{BindOnly: true, Logger: slog.New(slog.NewTextHandler(logs, nil))})
		run(t, dispatch.Config{}, src, consumer.HandlerFunc(func(_ context.Context, m *consumer.Message) ([]byte, error) {
			s.add(string(m.Payload[:min(len(m.Payload), 5)]), len(m.Payload))
			return nil, nil
		}), dispatch.WithConcurrency(2))
		const warning = "sent none to this worker"
		testenv.Eventually(t, 30*time.Second, "the starvation warning", func() bool { return strings.Contains(logs.String(), warning) })
		if got := s.get("small"); s.count() != 1 || len(got) != 1 || got[0] != 5 {
			t.Errorf("handled %v, want only the small message, once", s.runs)
		}
		for _, f := range []string{"num_pending=1", "pull_max_bytes=2048", "max_request_max_bytes=2048", "delivered_stream_seq=1"} {
			if !strings.Contains(logs.String(), f) {
				t.Errorf("the warning lacks %s:\n%s", f, logs)
			}
		}
	})
}
