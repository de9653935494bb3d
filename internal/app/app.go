package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/tracing"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/actions"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/metrics"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafkasource"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// App is an assembled worker. Build it, Run it once, and it cleans up after
// itself when Run returns.
type App struct {
	cfg        *config.Config
	log        *slog.Logger
	store      *redisbackend.Store
	client     redis.UniversalClient // the store's, for the health checks
	closeStore func() error          // closes store, and a client it does not own
	worker     *dedupworker.Worker
	metrics    *metrics.Metrics
	reg        *prometheus.Registry
	checks     []metrics.Check
	// evictionInterval is how often Run samples evicted_keys.
	evictionInterval time.Duration

	mu      sync.Mutex
	closers []func() error // in reverse order of creation
	httpSrv *metrics.Server
}

// Options adjust Build for tests and the demo.
type Options struct {
	// Registry receives the metrics; a new one when nil.
	Registry *prometheus.Registry
	// Hooks are added to the metrics hooks (the demo counts runs).
	Hooks []dedupworker.Hook
	// Wrap, when set, wraps each handler's action as its middleware (the
	// demo counts runs). A forward action is a consumer.BatchHandler: Wrap
	// returns one around it (consumer.Batched), or Build fails.
	Wrap func(handler string, h dedupworker.Handler) dedupworker.Handler
	// Tracer, when set, puts a span around every delivery and injects its
	// context into what forward and http actions send.
	Tracer *tracing.Tracer
}

// connectTimeout bounds every connection made while building.
const connectTimeout = 10 * time.Second

// Build connects to Redis and the brokers and assembles the worker. Errors
// name the handler and the field at fault. On error everything already
// opened is closed.
func Build(ctx context.Context, cfg *config.Config, log *slog.Logger, opts Options) (_ *App, err error) {
	a := &App{cfg: cfg, log: log, reg: opts.Registry, evictionInterval: evictionSampleInterval}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
	}
	if a.metrics, err = metrics.New(a.reg); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	hooks := append([]dedupworker.Hook{a.metrics}, opts.Hooks...)

	// The store gets the hooks too: its WAITs and durability shortfalls
	// reach /metrics.
	if a.store, a.client, a.closeStore, err = openStore(ctx, &cfg.Redis, log, hooks); err != nil {
		return nil, err
	}
	a.checks = append(a.checks, metrics.Check{Name: "redis", Fn: a.store.Ping})
	if err := registerLocalCache(a.reg, a.store); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if a.worker, err = dedupworker.NewWorker(a.store, workerConfig(cfg, log, hooks, opts.Tracer)); err != nil {
		return nil, err
	}

	conns := &natsConns{app: a, ctx: ctx}
	var inject actions.Injector
	if t := opts.Tracer; t != nil {
		inject = func(ctx context.Context, h consumer.Header) { t.Propagator().Inject(ctx, tracing.HeaderCarrier(h)) }
	}
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		field := fmt.Sprintf("handlers[%d] (%s)", i, h.Name)
		src, transport, err := a.source(h, conns)
		if err != nil {
			return nil, fmt.Errorf("%s.source: %w", field, err)
		}
		action, err := a.action(h, conns, inject)
		if err != nil {
			return nil, fmt.Errorf("%s.action: %w", field, err)
		}
		hopts := handlerOptions(h)
		if opts.Wrap != nil {
			name := h.Name
			hopts = append(hopts, dedupworker.WithMiddleware(func(next dedupworker.Handler) dedupworker.Handler { return opts.Wrap(name, next) }))
		}
		if err := a.worker.Handle(h.Name, src, action, hopts...); err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		a.metrics.Register(transport, h.Name)
	}
	return a, nil
}

// workerConfig is the worker's configuration, as a library user writes
// it: the logger, the hooks, shutdown_timeout, the tracer's wrapper and
// redis.completion_linger, whose "omitted" and "0s (off)" are the library's
// 0 (its default) and negative (off).
func workerConfig(cfg *config.Config, log *slog.Logger, hooks []dedupworker.Hook, tracer *tracing.Tracer) dedupworker.Config {
	wc := dedupworker.Config{Logger: log, Hooks: hooks, ShutdownTimeout: cfg.ShutdownTimeout.D()}
	switch l := cfg.Redis.CompletionLinger; {
	case l == nil: // the library's default
	case *l == 0:
		wc.CompletionLinger = -1
	default:
		wc.CompletionLinger = l.D()
	}
	if tracer != nil {
		wc.Wrap = []dedupworker.Wrapper{tracer.Wrap}
	}
	return wc
}

// handlerOptions are a handler's options, as a library user writes them.
// validate has refused what the library would (through
// idempotency.ValidateOptions), so Handle fails here only on what the
// configuration cannot express.
func handlerOptions(h *config.Handler) []dedupworker.Option {
	keys := make([]dedupworker.KeySource, 0, len(h.Key))
	for _, k := range h.Key {
		ks, _ := idempotency.ParseKeySource(k) // validate refuses a key that does not parse
		keys = append(keys, ks)
	}
	opts := []dedupworker.Option{
		dedupworker.WithConcurrency(h.Concurrency),
		dedupworker.WithKey(keys...),
		dedupworker.WithMissingKey(dedupworker.MissingKeyPolicy(h.MissingKey)),
		dedupworker.WithMismatch(dedupworker.MismatchPolicy(h.Mismatch)),
		dedupworker.WithFingerprintHeaders(h.FingerprintHeaders...),
		dedupworker.WithLease(h.Lease.D()),
		dedupworker.WithRetention(h.Retention.D()),
		dedupworker.WithInFlightWait(h.InFlightWait.D()),
		dedupworker.WithMaxAttempts(h.MaxAttempts),
		dedupworker.WithBackoff(h.Backoff.Initial.D(), h.Backoff.Max.D()),
	}
	if h.Mode == "shadow" {
		opts = append(opts, dedupworker.WithShadow())
	}
	if h.FailOpen {
		opts = append(opts, dedupworker.WithFailOpen())
	}
	return opts
}

// Registry is the Prometheus registry behind /metrics.
func (a *App) Registry() *prometheus.Registry { return a.reg }

// Store is the deduplication store.
func (a *App) Store() *redisbackend.Store { return a.store }

// HTTPAddr is the bound address of the metrics server, once Run started it.
func (a *App) HTTPAddr() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.httpSrv == nil {
		return ""
	}
	return a.httpSrv.Addr()
}

// Run checks the store's settings (a warning and
// dedup_store_risk per risk), serves metrics, samples the store's evictions
// and runs the worker until ctx is cancelled (then drains and returns nil)
// or a source fails.
func (a *App) Run(ctx context.Context) error {
	defer a.close()
	a.reportStoreHealth(ctx)
	sctx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() { a.sampleEvictions(sctx, a.evictionInterval) })
	defer func() {
		stopSampling()
		sampling.Wait()
	}()
	if addr := *a.cfg.HTTP.Addr; addr != "" {
		srv, err := metrics.Listen(addr, a.reg, a.checks, a.log)
		if err != nil {
			return fmt.Errorf("http.addr %s: %w", addr, err)
		}
		a.mu.Lock()
		a.httpSrv = srv
		a.mu.Unlock()
		srv.Start()
		a.log.Info("serving /metrics, /healthz and /readyz", "addr", srv.Addr())
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	return a.worker.Run(ctx)
}

func (a *App) onClose(f func() error) {
	a.mu.Lock()
	a.closers = append(a.closers, f)
	a.mu.Unlock()
}

func (a *App) close() {
	a.mu.Lock()
	cs := a.closers
	a.closers = nil
	a.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i](); err != nil {
			a.log.Warn("closing", "err", err)
		}
	}
	if a.store != nil {
		_ = a.closeStore()
		a.store, a.client, a.closeStore = nil, nil, nil
	}
}

func (a *App) source(h *config.Handler, conns *natsConns) (consumer.Source, string, error) {
	log := a.log.With("handler", h.Name)
	if k := h.Source.Kafka; k != nil {
		// SASL and TLS come with the dialer, as validate --online and
		// forward.kafka make them.
		d, err := KafkaDialer("kafka", k.SASL, k.TLS)
		if err != nil {
			return nil, "", err
		}
		kc := h.KafkaConfig()
		kc.Dialer, kc.Logger = d, log
		src, err := kafkasource.New(kc)
		if err != nil {
			return nil, "", err
		}
		a.checks = append(a.checks, metrics.Check{Name: "kafka " + h.Name, Fn: dialAny(k.Brokers)})
		err = registerFetchBuffer(a.reg, h.Name, func() fetchBufferStats {
			st := src.FetchBufferStats()
			return fetchBufferStats{st.Size, st.Held, st.Waited}
		})
		if err != nil {
			return nil, "", err
		}
		err = registerKafkaFetches(a.reg, h.Name, func() kafkasource.FetchStats { return src.FetchStats() })
		if err != nil {
			return nil, "", err
		}
		err = registerLag(a.reg, h.Name, func(add func(partition string, lag float64)) {
			for _, l := range src.Lag() {
				add(strconv.Itoa(l.Partition), float64(l.Lag))
			}
		})
		if err != nil {
			return nil, "", err
		}
		return src, "kafka", nil
	}
	n := h.Source.NATS
	js, err := conns.get("nats", n.URL, n.NATSAuth)
	if err != nil {
		return nil, "", err
	}
	nc := h.NATSConfig()
	nc.Logger = log
	src, err := natssource.New(js, nc)
	if err != nil {
		return nil, "", err
	}
	err = registerFetchBuffer(a.reg, h.Name, func() fetchBufferStats {
		st := src.FetchBufferStats()
		return fetchBufferStats{st.Size, st.Held, st.Waited}
	})
	if err != nil {
		return nil, "", err
	}
	err = registerLag(a.reg, h.Name, func(add func(partition string, lag float64)) {
		if p, ok := src.Pending(); ok {
			add("", float64(p.Messages))
		}
	})
	if err != nil {
		return nil, "", err
	}
	return src, "nats", nil
}

// httpActionClient is the http action's client (actions.HTTPClient, which
// keeps concurrency connections to the server), whose transport with tls
// also verifies the server and presents the client certificate of
// action.http.tls. Errors name the field under the handler's action.
func httpActionClient(act *config.HTTPAction, concurrency int) (*http.Client, error) {
	c := actions.HTTPClient(act.Timeout.D(), concurrency)
	if act.TLS == nil {
		return c, nil
	}
	tc, err := tlsConfig("http.tls", act.TLS)
	if err != nil {
		return nil, err
	}
	c.Transport.(*http.Transport).TLSClientConfig = tc
	return c, nil
}

func (a *App) action(h *config.Handler, conns *natsConns, inject actions.Injector) (consumer.Handler, error) {
	switch act := h.Action; {
	case act.HTTP != nil:
		client, err := httpActionClient(act.HTTP, h.Concurrency)
		if err != nil {
			return nil, err
		}
		// The idle connections' goroutines end with the App.
		a.onClose(func() error { client.CloseIdleConnections(); return nil })
		return actions.HTTP(actions.HTTPConfig{
			Handler: h.Name, URL: act.HTTP.URL, Timeout: act.HTTP.Timeout.D(),
			MaxResultBytes: act.HTTP.MaxResultBytes, Headers: act.HTTP.Headers, Logger: a.log, Inject: inject,
			Client: client, Concurrency: h.Concurrency,
		}), nil
	case act.Exec != nil:
		return actions.Exec(actions.ExecConfig{
			Handler: h.Name, Command: act.Exec.Command, Timeout: act.Exec.Timeout.D(),
			MaxOutputBytes: act.Exec.MaxOutputBytes, Env: act.Exec.Env,
		}), nil
	case act.Forward != nil && act.Forward.Kafka != nil:
		k := act.Forward.Kafka
		w, err := a.kafkaWriter(k)
		if err != nil {
			return nil, err
		}
		return actions.ForwardKafka(h.Name, w, inject), nil
	case act.Forward != nil && act.Forward.NATS != nil:
		n := act.Forward.NATS
		js, err := conns.get("forward.nats", n.URL, n.NATSAuth)
		if err != nil {
			return nil, err
		}
		return actions.ForwardNATS(h.Name, js, n.Subject, inject), nil
	}
	return nil, errors.New("no action configured")
}

func (a *App) kafkaWriter(k *config.KafkaOut) (*actions.KafkaBatchWriter, error) {
	tr, err := KafkaTransport("forward.kafka", k.SASL, k.TLS)
	if err != nil {
		return nil, err
	}
	w := actions.NewKafkaWriter(kafka.TCP(k.Brokers...), k.Topic, &partitionCounts{RoundTripper: tr, ttl: partitionCountTTL}, connectTimeout)
	// Closers run last first: the writer flushes, then the transport's
	// connections close (Writer.Close leaves a transport it did not make
	// open).
	a.onClose(func() error { tr.CloseIdleConnections(); return nil })
	a.onClose(w.Close)
	return w, nil
}

// dialAny is a readiness check: some broker accepts a TCP connection.
func dialAny(brokers []string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for _, b := range brokers {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", b)
			if err == nil {
				return c.Close()
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
}

// natsConns shares one connection per server and credentials.
type natsConns struct {
	app   *App
	ctx   context.Context // Build's: connecting stops with it
	conns map[string]jetstream.JetStream
}

// natsConnKey identifies a connection by its URL and every field that says
// who connects: a forward that names another password, token or client
// certificate than its source gets a connection of its own, not the
// source's. (The key lives only in memory, like the credentials.)
func natsConnKey(url string, auth config.NATSAuth) string {
	var tls config.TLS
	if auth.TLS != nil {
		tls = *auth.TLS
	}
	return strings.Join([]string{url, auth.User, string(auth.Password), string(auth.Token), auth.CredsFile,
		tls.CAFile, tls.CertFile, tls.KeyFile, tls.ServerName, strconv.FormatBool(tls.InsecureSkipVerify)}, "\x00")
}

func (c *natsConns) get(field, url string, auth config.NATSAuth) (jetstream.JetStream, error) {
	id := natsConnKey(url, auth)
	if js, ok := c.conns[id]; ok {
		return js, nil
	}
	closed := make(chan struct{})
	shown := config.RedactURL(url) // for logs, errors and /readyz: no credentials
	nc, err := DialNATS(c.ctx, field, url, auth,
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: a deliberate close
				c.app.log.Warn("nats disconnected; reconnecting", "url", shown, "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { c.app.log.Info("nats reconnected", "url", shown) }),
	)
	if err != nil {
		return nil, err
	}
	c.app.onClose(func() error {
		// Drain flushes what was published and the last acks, then closes.
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		select {
		case <-closed:
		case <-time.After(connectTimeout):
			nc.Close()
		}
		return nil
	})
	// forward.nats waits for a run's PubAcks through this context's ack
	// handlers (actions.NATSJetStream).
	js, err := actions.NewNATSJetStream(nc)
	if err != nil {
		return nil, err
	}
	c.app.checks = append(c.app.checks, metrics.Check{Name: "nats " + shown, Fn: func(context.Context) error {
		if s := nc.Status(); s != nats.CONNECTED {
			return fmt.Errorf("nats %s: %s", shown, s)
		}
		return nil
	}})
	if c.conns == nil {
		c.conns = map[string]jetstream.JetStream{}
	}
	c.conns[id] = js
	return js, nil
}

// fetchBufferStats is a source's bound on the messages it holds
// (source.kafka.fetch_buffer_bytes, source.nats.fetch_buffer_bytes): its
// size, what it holds, and how long the source's receivers (Kafka's
// partition fetchers, the NATS subscription's callback) waited for room.
type fetchBufferStats struct {
	size, held int64
	waited     time.Duration
}

// registerFetchBuffer exports a source's bound on the messages it holds
// under the handler's name: what it holds, and how long its receivers
// waited for room, which tells an operator whether the bound sets the pace.
func registerFetchBuffer(reg prometheus.Registerer, handler string, stats func() fetchBufferStats) error {
	labels := prometheus.Labels{"handler": handler}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "dedup_fetch_buffer_bytes",
			Help:        "What the source's received messages not yet done count against its fetch_buffer_bytes (Kafka: with what fetches in progress set aside).",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().held) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "dedup_fetch_buffer_limit_bytes",
			Help:        "The source's fetch_buffer_bytes: the bound on its received messages not yet done.",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().size) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "dedup_fetch_wait_seconds_total",
			Help:        "Time the source waited for room under its fetch_buffer_bytes, summed over its receivers (Kafka: one a partition; NATS: one): a rate near their number means the bound sets the pace.",
			ConstLabels: labels,
		}, func() float64 { return stats().waited.Seconds() }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// registerKafkaFetches exports a Kafka source's fetch requests and the
// partitions they carried, read from stats at each scrape.
func registerKafkaFetches(reg prometheus.Registerer, handler string, stats func() kafkasource.FetchStats) error {
	labels := prometheus.Labels{"handler": handler}
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "dedup_kafka_fetch_requests_total",
			Help:        "Fetch requests the handler's Kafka source sent. Its partitions on one broker share a request; at the topic's end a request long-polls, about one a max wait (250ms) for each broker, so a far higher rate means some partitions are held (slow handlers) while the others wait for records.",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().Requests) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "dedup_kafka_fetch_partitions_total",
			Help:        "Partitions the handler's Kafka fetch requests carried, summed: divided by dedup_kafka_fetch_requests_total, the partitions a request carried on average.",
			ConstLabels: labels,
		}, func() float64 { return float64(stats().Partitions) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// lagHelp is dedup_source_lag's help text.
const lagHelp = "Messages of the handler's source not handled yet, as last read. Kafka: for each partition this worker holds, " +
	"the partition's end offset minus the offset the group would resume at. NATS (partition=\"\"): the consumer's num_pending, " +
	"messages not yet delivered to any worker of the durable, the same in each. Absent while the source is not consuming. " +
	"Across workers: sum by (handler) (max by (handler, partition) (dedup_source_lag))."

// lagCollector is dedup_source_lag{handler,partition} for one handler: at
// each scrape, read calls add once for each partition its source reports.
type lagCollector struct {
	desc *prometheus.Desc
	read func(add func(partition string, lag float64))
}

// Describe sends the one metric c exports.
func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect sends a series for each partition the source reports now.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	c.read(func(partition string, lag float64) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, lag, partition)
	})
}

// registerLag exports a handler's source lag under its name (see lagHelp):
// how far the worker is behind its source, which the metrics of what it
// handled cannot show when it handles nothing.
func registerLag(reg prometheus.Registerer, handler string, read func(add func(partition string, lag float64))) error {
	desc := prometheus.NewDesc("dedup_source_lag", lagHelp, []string{"partition"}, prometheus.Labels{"handler": handler})
	return reg.Register(&lagCollector{desc: desc, read: read})
}

// registerLocalCache exports the store's local cache (redis.local_cache):
// its hits, the records it holds, and whether its forget subscription
// stands (while it does not, the cache answers nothing).
func registerLocalCache(reg prometheus.Registerer, s *redisbackend.Store) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dedup_local_cache_hits_total",
			Help: "Duplicates answered from the worker's local cache of the records it completed, without Redis.",
		}, func() float64 { return float64(s.LocalCacheStats().Hits) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dedup_local_cache_entries",
			Help: "Records held in the worker's local cache.",
		}, func() float64 { return float64(s.LocalCacheStats().Entries) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dedup_local_cache_subscribed",
			Help: "1 while the local cache's forget subscription stands and the cache may answer; 0 while it is down (the cache is empty).",
		}, func() float64 {
			if s.LocalCacheStats().Subscribed {
				return 1
			}
			return 0
		}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
