package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/dispatch"
)

// Options configure a demo run. The zero value runs the standard demo.
type Options struct {
	// Unique is the number of distinct keys per transport. Default 200.
	Unique int
	// DupRatio is the share of keys published a second time, as separate
	// messages. Default 0.3.
	DupRatio float64
	// RetryEvery makes the first run of every n-th key fail, forcing a
	// redelivery. Default 10; negative disables.
	RetryEvery int
	// RedisURL overrides the Redis choice; "inprocess" forces the in-process
	// one. Default: $REDIS_URL, else 127.0.0.1:6379 if it answers, else
	// in-process.
	RedisURL string
	// Timeout bounds the whole run. Default 60s.
	Timeout time.Duration
	// Logger receives the worker's logs. Default: warnings to stderr.
	Logger *slog.Logger
}

// Row is one transport's figures.
type Row struct {
	Transport       string
	Published       int
	Unique          int
	Runs            int // successful handler runs
	DuplicatesAcked int
	Retried         int // forced failures that were redelivered
	Output          int // messages the relay forwarded, as the output shows them
}

// OK reports whether the transport ran each key exactly once.
func (r Row) OK() bool {
	return r.Runs == r.Unique && r.Output == r.Unique && r.Published-r.Unique == r.DuplicatesAcked
}

// Report is the result of a demo run.
type Report struct {
	Redis string // where Redis came from
	Rows  []Row
	Took  time.Duration
}

// OK reports whether every transport ran each key exactly once.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if !row.OK() {
			return false
		}
	}
	return len(r.Rows) > 0
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "Redis: %s\n\n", r.Redis)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "transport\tpublished\tunique keys\thandler runs\tduplicates acked\tforced retries\tforwarded\tresult\t")
	for _, row := range r.Rows {
		res := "ok"
		if !row.OK() {
			res = "MISMATCH"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", row.Transport, row.Published, row.Unique, row.Runs, row.DuplicatesAcked, row.Retried, row.Output, res)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nhandler runs == unique keys on every transport: %v (%.1fs)\n", r.OK(), r.Took.Seconds())
}

func (o *Options) defaults() {
	if o.Unique == 0 {
		o.Unique = 200
	}
	if o.DupRatio == 0 {
		o.DupRatio = 0.3
	}
	if o.RetryEvery == 0 {
		o.RetryEvery = 10
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
}

// Run runs the demo. progress receives one line per phase.
func Run(ctx context.Context, opts Options, progress io.Writer) (*Report, error) {
	opts.defaults()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	say := func(format string, args ...any) { fmt.Fprintf(progress, "• "+format+"\n", args...) }

	env, err := startServers(ctx, opts.RedisURL, say)
	if err != nil {
		return nil, err
	}
	defer env.close()
	cfg, err := config.Parse([]byte(demoConfig(env)), nil)
	if err != nil {
		return nil, fmt.Errorf("demo config: %w", err)
	}

	counts := map[string]*handlerCounts{"nats-orders": {}, "kafka-orders": {}}
	a, err := app.Build(ctx, cfg, opts.Logger, app.Options{
		Hooks: consumer.Hooks{outcomeCounter(counts)},
		Wrap: func(name string, h consumer.Handler) consumer.Handler {
			return counts[name].wrap(h, opts.RetryEvery)
		},
	})
	if err != nil {
		return nil, err
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- a.Run(runCtx) }()

	keys := plan(opts.Unique, opts.DupRatio)
	if err := publishNATS(ctx, env.js, keys); err != nil {
		return nil, err
	}
	if err := publishKafka(ctx, env.brokers, keys); err != nil {
		return nil, err
	}
	say("published %d messages (%d unique keys, %d duplicates) on each transport; every %d-th key fails once", len(keys), opts.Unique, len(keys)-opts.Unique, opts.RetryEvery)

	if err := waitSettled(ctx, counts, len(keys), runErr, opts.Timeout); err != nil {
		stopRun()
		<-runErr
		return nil, err
	}
	stopRun()
	if err := <-runErr; err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	return report(ctx, env, counts, len(keys), opts.Unique, time.Since(start))
}

// demoEnv is the servers one demo runs against.
type demoEnv struct {
	redisURL, redisDesc, natsURL string
	brokers                      []string
	js                           jetstream.JetStream
	closers                      []func()
}

// close stops the servers, the last started first.
func (e *demoEnv) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startServers starts the servers of the demo (Redis: redisURL if set, see
// chooseRedis) and creates its streams; Kafka's topics are seeded by the in-process broker.
func startServers(ctx context.Context, redisURL string, say func(string, ...any)) (env *demoEnv, err error) {
	env = &demoEnv{}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	var stopRedis func()
	env.redisURL, env.redisDesc, stopRedis, err = chooseRedis(redisURL)
	if err != nil {
		return nil, err
	}
	env.closers = append(env.closers, stopRedis)
	say("Redis: %s", env.redisDesc)

	natsURL, stopNATS, err := startNATS()
	if err != nil {
		return nil, err
	}
	env.natsURL = natsURL
	env.closers = append(env.closers, stopNATS)
	say("NATS JetStream: in-process nats-server at %s", natsURL)

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "demo-in"), kfake.SeedTopics(1, "demo-out", "demo-dlq"),
		kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("starting the in-process Kafka broker: %w", err)
	}
	env.closers = append(env.closers, kc.Close)
	env.brokers = kc.ListenAddrs()
	say("Kafka: in-process Kafka-protocol broker (kfake) at %s", env.brokers[0])

	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	env.closers = append(env.closers, nc.Close)
	if env.js, err = jetstream.New(nc); err != nil {
		return nil, err
	}
	for name, subj := range map[string]string{"DEMO_IN": "demo.in", "DEMO_OUT": "demo.out"} {
		if _, err := env.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			return nil, fmt.Errorf("creating stream %s: %w", name, err)
		}
	}
	return env, nil
}

// demoConfig is the binary's configuration of the demo: a forward relay on
// each transport, in a fresh namespace so that reruns on a shared Redis
// start clean.
func demoConfig(env *demoEnv) string {
	ns := "demo-" + randomHex(4)
	return fmt.Sprintf(`
redis: {url: %q, namespace: %s}
http: {addr: ""}
shutdown_timeout: 5s
handlers:
  - name: nats-orders
    source: {nats: {url: %q, stream: DEMO_IN, consumer: demo, subject: demo.in, ack_wait: 10s}}
    lease: 10s
    backoff: {initial: 50ms, max: 200ms}
    action: {forward: {nats: {subject: demo.out}}}
    dead_letter: {nats: {subject: demo.dlq}}
  - name: kafka-orders
    source: {kafka: {brokers: [%q], topic: demo-in, group: demo, session_timeout: 6s, commit_interval: 200ms}}
    lease: 10s
    backoff: {initial: 50ms, max: 200ms}
    action: {forward: {kafka: {topic: demo-out}}}
    dead_letter: {kafka: {topic: demo-dlq}}
`, env.redisURL, ns, env.natsURL, env.brokers[0])
}

// waitSettled returns once every published message of both handlers was
// acked as processed or duplicate, or an error when ctx ends first or the
// worker stops.
func waitSettled(ctx context.Context, counts map[string]*handlerCounts, published int, runErr <-chan error, timeout time.Duration) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for counts["nats-orders"].settled() < published || counts["kafka-orders"].settled() < published {
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo did not finish in %s: nats %s, kafka %s", timeout, counts["nats-orders"], counts["kafka-orders"])
		case err := <-runErr:
			return fmt.Errorf("worker stopped early: %w", err)
		case <-tick.C:
		}
	}
	return nil
}

// report counts the outputs and builds the demo's report.
func report(ctx context.Context, env *demoEnv, counts map[string]*handlerCounts, published, unique int, took time.Duration) (*Report, error) {
	natsOut, err := streamCount(ctx, env.js, "DEMO_OUT")
	if err != nil {
		return nil, err
	}
	kafkaOut, err := topicCount(ctx, env.brokers, "demo-out")
	if err != nil {
		return nil, err
	}
	rep := &Report{Redis: env.redisDesc, Took: took}
	for _, t := range []struct {
		name, handler string
		out           int
	}{{"nats", "nats-orders", natsOut}, {"kafka", "kafka-orders", kafkaOut}} {
		c := counts[t.handler]
		rep.Rows = append(rep.Rows, Row{
			Transport: t.name, Published: published, Unique: unique,
			Runs: int(c.runs.Load()), DuplicatesAcked: int(c.duplicates.Load()), Retried: int(c.failed.Load()), Output: t.out,
		})
	}
	return rep, nil
}

// handlerCounts counts one handler's runs and outcomes.
type handlerCounts struct {
	runs, failed          atomic.Int64
	processed, duplicates atomic.Int64
	mu                    sync.Mutex
	failedOnce            map[string]bool
}

func (c *handlerCounts) settled() int { return int(c.processed.Load() + c.duplicates.Load()) }

func (c *handlerCounts) String() string {
	return fmt.Sprintf("%d runs, %d processed, %d duplicates", c.runs.Load(), c.processed.Load(), c.duplicates.Load())
}

// wrap counts successful runs and makes the first run of every n-th key
// fail, so the transport must redeliver it.
func (c *handlerCounts) wrap(next consumer.Handler, n int) consumer.Handler {
	one := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if err := c.forcedFailure(m, n); err != nil {
			return nil, err
		}
		res, err := next.Handle(ctx, m)
		if err == nil {
			c.runs.Add(1)
		}
		return res, err
	})
	bh, ok := next.(consumer.BatchHandler)
	if !ok {
		return one
	}
	// The forward actions are batch handlers: a run keeps going to them in
	// one call, less its forced failures, as production runs it.
	return consumer.Batched(one, consumer.BatchFunc(func(ctx context.Context, msgs []*consumer.Message, results []consumer.Result) {
		var (
			pass []*consumer.Message
			ctxs []context.Context
			idx  []int
		)
		for i, m := range msgs {
			if err := c.forcedFailure(m, n); err != nil {
				results[i].Err = err
				continue
			}
			pass = append(pass, m)
			ctxs = append(ctxs, dedupworker.MessageContext(ctx, i))
			idx = append(idx, i)
		}
		if len(pass) == 0 {
			return
		}
		sub := make([]consumer.Result, len(pass))
		dispatch.CallBatchHandler(dispatch.WithMessageContexts(ctx, ctxs), bh, pass, sub)
		for j, i := range idx {
			results[i] = sub[j]
			if sub[j].Err == nil {
				c.runs.Add(1)
			}
		}
	}))
}

// forcedFailure fails the first run of every n-th key, so the demo shows a
// retry.
func (c *handlerCounts) forcedFailure(m *consumer.Message, n int) error {
	key := m.Header.Get("Idempotency-Key")
	i, err := strconv.Atoi(key[len("order-"):])
	if n <= 0 || err != nil || i%n != 0 {
		return nil
	}
	c.mu.Lock()
	first := !c.failedOnce[key]
	if c.failedOnce == nil {
		c.failedOnce = map[string]bool{}
	}
	c.failedOnce[key] = true
	c.mu.Unlock()
	if !first {
		return nil
	}
	c.failed.Add(1)
	return dedupworker.RetryAfter(20*time.Millisecond, errors.New("demo: forced failure"))
}

type outcomeCounter map[string]*handlerCounts

func (oc outcomeCounter) OnOutcome(handler, _ string, o consumer.Outcome) {
	c := oc[handler]
	if c == nil {
		return
	}
	switch o {
	case consumer.OutcomeProcessed, consumer.OutcomeReclaimed:
		c.processed.Add(1)
	case consumer.OutcomeDuplicate:
		c.duplicates.Add(1)
	}
}

// plan returns the keys to publish: every key once and DupRatio of them
// again, shuffled (with a fixed seed, so runs compare).
func plan(unique int, ratio float64) []string {
	keys := make([]string, 0, unique+int(float64(unique)*ratio)+1)
	for i := range unique {
		keys = append(keys, "order-"+strconv.Itoa(i))
	}
	for i := range int(float64(unique) * ratio) {
		keys = append(keys, "order-"+strconv.Itoa(i*unique/int(float64(unique)*ratio)))
	}
	r := mrand.New(mrand.NewPCG(1, 2))
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

func payload(key string) []byte { return []byte(`{"order":"` + key + `","amount":42}`) }

func publishNATS(ctx context.Context, js jetstream.JetStream, keys []string) error {
	for _, k := range keys {
		m := nats.NewMsg("demo.in")
		m.Header.Set("Idempotency-Key", k)
		m.Data = payload(k)
		if _, err := js.PublishMsgAsync(m); err != nil {
			return fmt.Errorf("publishing to NATS: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("publishing to NATS: %w", ctx.Err())
	}
}

func publishKafka(ctx context.Context, brokers []string, keys []string) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "demo-in", Balancer: &kafka.RoundRobin{}, BatchTimeout: 5 * time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	msgs := make([]kafka.Message, len(keys))
	for i, k := range keys {
		// Round robin spreads a key's copies over partitions, as producers
		// retrying through different partitions do.
		msgs[i] = kafka.Message{Value: payload(k), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(k)}}}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("publishing to Kafka: %w", err)
	}
	return nil
}

func streamCount(ctx context.Context, js jetstream.JetStream, name string) (int, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return 0, err
	}
	return int(s.CachedInfo().State.Msgs), nil
}

func topicCount(ctx context.Context, brokers []string, topic string) (int, error) {
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	resp, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(0)}}})
	if err != nil {
		return 0, err
	}
	ps := resp.Topics[topic]
	if len(ps) == 0 {
		return 0, fmt.Errorf("no offsets for %s", topic)
	}
	if ps[0].Error != nil {
		return 0, ps[0].Error
	}
	return int(ps[0].LastOffset), nil
}

func chooseRedis(override string) (url, desc string, stop func(), err error) {
	nop := func() {}
	if override != "" && override != "inprocess" {
		return override, config.RedactURL(override) + " (given)", nop, nil
	}
	var skipped []string
	if override == "" {
		if u := os.Getenv("REDIS_URL"); u != "" {
			if answers(u) {
				return u, config.RedactURL(u) + " (from $REDIS_URL)", nop, nil
			}
			skipped = append(skipped, "$REDIS_URL="+config.RedactURL(u)+" does not answer")
		}
		const local = "redis://127.0.0.1:6379/0"
		if answers(local) {
			return local, local + " (" + strings.Join(append(skipped, "a local Redis answered"), "; ") + ")", nop, nil
		}
		skipped = append(skipped, "nothing on 127.0.0.1:6379")
	} else {
		skipped = append(skipped, "as asked")
	}
	mr, err := miniredis.Run()
	if err != nil {
		return "", "", nil, fmt.Errorf("starting an in-process Redis: %w", err)
	}
	return "redis://" + mr.Addr() + "/0", "in-process (miniredis at " + mr.Addr() + "; " + strings.Join(skipped, "; ") + ")", mr.Close, nil
}

// answers reports whether a Redis URL's address accepts a TCP connection.
func answers(rawURL string) bool {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return false
	}
	c, err := net.DialTimeout("tcp", opt.Addr, 300*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func startNATS() (string, func(), error) {
	dir, err := os.MkdirTemp("", "dedupworker-demo-nats-")
	if err != nil {
		return "", nil, err
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true})
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("starting the in-process NATS server: %w", err)
	}
	s.Start()
	stop := func() {
		s.Shutdown()
		s.WaitForShutdown()
		os.RemoveAll(dir)
	}
	if !s.ReadyForConnections(10 * time.Second) {
		stop()
		return "", nil, errors.New("the in-process NATS server did not start in 10s")
	}
	return s.ClientURL(), stop, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
