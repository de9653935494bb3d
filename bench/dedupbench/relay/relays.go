package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
)

// The hand-written relays run as child processes of the benchmark, so that
// their CPU and memory are measured the way dedupworker's are:
//
//	relay child -mode raw|naive -transport kafka|nats ...
//
// raw forwards with no deduplication; naive makes two Redis calls per
// message, a SET NX PX claim before forwarding and a SET of the result
// after, the way a team would write it by hand.

// childOptions configures a hand-written relay.
type childOptions struct {
	mode, transport        string
	brokers                []string
	natsURL                string
	in, out, group         string
	redisURL, ns           string
	concurrency, batch     int
	lease                  time.Duration
	commitEvery            time.Duration
	maxAckPending          int
	publishAsyncMaxPending int
	// NATS variants of the relays, to measure what one difference from
	// dedupworker's relay costs: the output carries Nats-Msg-Id (the key),
	// and the pull subscription asks for pullMax messages (0: the
	// library's default, 500).
	msgID   bool
	pullMax int
}

// parseChildFlags parses and checks the child's arguments.
func parseChildFlags(args []string) (childOptions, error) {
	var o childOptions
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	var brokers string
	fs.StringVar(&o.mode, "mode", "raw", "raw or naive")
	fs.StringVar(&o.transport, "transport", "kafka", "kafka or nats")
	fs.StringVar(&brokers, "brokers", "127.0.0.1:9092", "Kafka brokers, comma-separated")
	fs.StringVar(&o.natsURL, "nats", "nats://127.0.0.1:4222", "NATS URL")
	fs.StringVar(&o.in, "in", "", "input topic, or NATS input stream")
	fs.StringVar(&o.out, "out", "", "output topic or NATS subject")
	fs.StringVar(&o.group, "group", "", "Kafka group or NATS durable")
	fs.StringVar(&o.redisURL, "redis", "redis://127.0.0.1:6379/0", "Redis URL (naive)")
	fs.StringVar(&o.ns, "ns", "", "Redis key prefix (naive)")
	fs.IntVar(&o.concurrency, "concurrency", 64, "concurrent Redis calls (naive) and NATS handlers")
	fs.IntVar(&o.batch, "batch", 1000, "most messages forwarded in one Kafka write")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "the claim's PX (naive)")
	fs.DurationVar(&o.commitEvery, "commit-interval", time.Second, "Kafka offset commit interval")
	fs.IntVar(&o.maxAckPending, "max-ack-pending", 4096, "the NATS consumer's MaxAckPending")
	fs.IntVar(&o.publishAsyncMaxPending, "publish-async-max-pending", 4096, "NATS PublishAsyncMaxPending")
	fs.BoolVar(&o.msgID, "msg-id", false, "NATS: set the output's Nats-Msg-Id to the idempotency key, as dedupworker's forward.nats does")
	fs.IntVar(&o.pullMax, "pull-max", 0, "NATS: the pull subscription's PullMaxMessages (0: the library's default)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.brokers = strings.Split(brokers, ",")
	if o.in == "" || o.out == "" || o.group == "" {
		return o, errors.New("child: -in, -out and -group are required")
	}
	if o.mode != "raw" && o.mode != "naive" {
		return o, fmt.Errorf("child -mode: %q is neither raw nor naive", o.mode)
	}
	if o.mode == "naive" && o.ns == "" {
		return o, errors.New("child -ns: naive needs a Redis key prefix")
	}
	if o.pullMax < 0 {
		return o, fmt.Errorf("child -pull-max: %d; want 0 (the library's default) or more", o.pullMax)
	}
	return o, nil
}

func childMain(args []string) error {
	o, err := parseChildFlags(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var c *naiveClaims
	if o.mode == "naive" {
		opt, err := redis.ParseURL(o.redisURL)
		if err != nil {
			return fmt.Errorf("child -redis: %w", err)
		}
		opt.PoolSize = o.concurrency
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = 3*time.Second, 5*time.Second, 5*time.Second
		rdb := redis.NewClient(opt)
		defer func() { _ = rdb.Close() }()
		c = &naiveClaims{rdb: rdb, ns: o.ns, lease: o.lease, sem: make(chan struct{}, o.concurrency)}
	}
	switch o.transport {
	case "kafka":
		err = kafkaRelay(ctx, o, c)
	case "nats":
		err = natsRelay(ctx, o, c)
	default:
		return fmt.Errorf("child -transport: %q is neither kafka nor nats", o.transport)
	}
	if err != nil && ctx.Err() != nil {
		// Stopped mid-run: what was not committed or acked is redelivered
		// to the next consumer, as with any relay.
		return nil
	}
	return err
}

// naiveClaims is the hand-written deduplication: a claim with SET NX PX
// before the work, and the result with SET after it, one call each per
// message.
type naiveClaims struct {
	rdb   *redis.Client
	ns    string
	lease time.Duration
	sem   chan struct{} // bounds the calls in flight
}

// claim reports whether this process won key.
func (c *naiveClaims) claim(ctx context.Context, key string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.rdb.SetNX(ctx, c.ns+":"+key, "claimed", c.lease).Result()
}

// complete records key's result, kept for a day as dedupworker's default
// retention keeps it.
func (c *naiveClaims) complete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.rdb.Set(ctx, c.ns+":"+key, "done", 24*time.Hour).Err()
}

// each runs f for every index of n concurrently (at most cap(c.sem) at a
// time) and returns the first error.
func (c *naiveClaims) each(n int, f func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		c.sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-c.sem }()
			errs[i] = f(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func headerValue(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

// kafkaRelay reads the input with a consumer group and forwards each
// fetched run in one write (order kept per partition: a write completes
// before the next starts), committing offsets only of forwarded runs.
func kafkaRelay(ctx context.Context, o childOptions, c *naiveClaims) error {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: o.brokers, GroupID: o.group, Topic: o.in,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond,
		CommitInterval: o.commitEvery, StartOffset: kafka.FirstOffset,
		Dialer: &kafka.Dialer{Timeout: 5 * time.Second},
		// Short backoffs after an empty fetch: kafka-go's default (100ms up
		// to 1s) would add that delay to a message arriving on an idle
		// partition.
		ReadBackoffMin: time.Millisecond, ReadBackoffMax: 5 * time.Millisecond,
	})
	defer func() { _ = r.Close() }()
	w := &kafka.Writer{
		Addr: kafka.TCP(o.brokers...), Topic: o.out, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchSize: o.batch, BatchTimeout: time.Millisecond,
		WriteTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
	}
	defer func() { _ = w.Close() }()

	fetched := make(chan kafka.Message, o.batch*4)
	fetchErr := make(chan error, 1)
	fctx, cancelFetch := context.WithCancel(ctx)
	defer cancelFetch()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		defer close(fetched)
		for {
			m, err := r.FetchMessage(fctx)
			if err != nil {
				if fctx.Err() == nil {
					fetchErr <- err
				}
				return
			}
			select {
			case fetched <- m:
			case <-fctx.Done():
				return
			}
		}
	})
	batch := make([]kafka.Message, 0, o.batch)
	for {
		batch = batch[:0]
		m, ok := <-fetched
		if !ok {
			select {
			case err := <-fetchErr:
				return fmt.Errorf("kafka fetch: %w", err)
			default:
				return nil
			}
		}
		batch = append(batch, m)
	drain:
		for len(batch) < o.batch {
			select {
			case m, ok := <-fetched:
				if !ok {
					break drain
				}
				batch = append(batch, m)
			default:
				break drain
			}
		}
		outs := make([]kafka.Message, 0, len(batch))
		keep := make([]bool, len(batch))
		if c != nil {
			err := c.each(len(batch), func(i int) error {
				won, err := c.claim(ctx, headerValue(batch[i].Headers, "Idempotency-Key"))
				keep[i] = won
				return err
			})
			if err != nil {
				return fmt.Errorf("naive claim: %w", err)
			}
		}
		for i, m := range batch {
			if c == nil || keep[i] {
				outs = append(outs, kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
			}
		}
		if len(outs) > 0 {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := w.WriteMessages(wctx, outs...)
			cancel()
			if err != nil {
				return fmt.Errorf("kafka write: %w", err)
			}
		}
		if c != nil {
			err := c.each(len(batch), func(i int) error {
				if !keep[i] {
					return nil
				}
				return c.complete(ctx, headerValue(batch[i].Headers, "Idempotency-Key"))
			})
			if err != nil {
				return fmt.Errorf("naive complete: %w", err)
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.CommitMessages(cctx, batch...)
		cancel()
		if err != nil {
			return fmt.Errorf("kafka commit: %w", err)
		}
	}
}

// natsRelay consumes the input stream with a durable pull consumer. raw
// publishes each message asynchronously and acks it when its PubAck comes;
// naive hands each message to one of concurrency workers that claim,
// publish and wait for the PubAck, complete, then ack.
func natsRelay(ctx context.Context, o childOptions, c *naiveClaims) error {
	nc, err := nats.Connect(o.natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return fmt.Errorf("nats connect %s: %w", o.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(o.publishAsyncMaxPending))
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cons, err := js.CreateOrUpdateConsumer(cctx, o.in, jetstream.ConsumerConfig{
		Durable: o.group, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
		MaxAckPending: o.maxAckPending, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("nats consumer %s on %s: %w", o.group, o.in, err)
	}
	work := make(chan jetstream.Msg, o.maxAckPending)
	failed := make(chan error, 1)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	var wg sync.WaitGroup
	type pending struct {
		f jetstream.PubAckFuture
		m jetstream.Msg
	}
	acks := make(chan pending, o.publishAsyncMaxPending)
	if c == nil {
		wg.Go(func() {
			for p := range acks {
				select {
				case <-p.f.Ok():
					_ = p.m.Ack()
				case err := <-p.f.Err():
					_ = p.m.Nak()
					fail(fmt.Errorf("nats publish: %w", err))
				}
			}
		})
	} else {
		for range o.concurrency {
			wg.Go(func() {
				for m := range work {
					key := m.Headers().Get("Idempotency-Key")
					won, err := c.claim(ctx, key)
					if err != nil {
						_ = m.Nak()
						fail(fmt.Errorf("naive claim: %w", err))
						continue
					}
					if won {
						out := natsOutput(o, m)
						pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
						_, err = js.PublishMsg(pctx, out)
						cancel()
						if err == nil {
							err = c.complete(ctx, key)
						}
						if err != nil {
							_ = m.Nak()
							fail(fmt.Errorf("naive relay: %w", err))
							continue
						}
					}
					_ = m.Ack()
				}
			})
		}
	}
	var pullOpts []jetstream.PullConsumeOpt
	if o.pullMax > 0 {
		pullOpts = append(pullOpts, jetstream.PullMaxMessages(o.pullMax))
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if c != nil {
			work <- m
			return
		}
		f, err := js.PublishMsgAsync(natsOutput(o, m))
		if err != nil {
			_ = m.Nak()
			fail(fmt.Errorf("nats publish: %w", err))
			return
		}
		acks <- pending{f, m}
	}, pullOpts...)
	if err != nil {
		close(work)
		close(acks)
		wg.Wait()
		return fmt.Errorf("nats consume: %w", err)
	}
	select {
	case <-ctx.Done():
		err = nil
	case err = <-failed:
	}
	cc.Drain()
	<-cc.Closed()
	close(work)
	close(acks)
	wg.Wait()
	return err
}

// natsOutput is the copy of m the NATS relays publish: its payload and
// headers (m's own map), and with -msg-id Nats-Msg-Id set to its
// idempotency key in a new map, so that m's headers stay as they came.
func natsOutput(o childOptions, m jetstream.Msg) *nats.Msg {
	if !o.msgID {
		return &nats.Msg{Subject: o.out, Data: m.Data(), Header: nats.Header(m.Headers())}
	}
	h := make(nats.Header, len(m.Headers())+1)
	for k, v := range m.Headers() {
		h[k] = v
	}
	h.Set(nats.MsgIdHdr, m.Headers().Get(keyHeader))
	return &nats.Msg{Subject: o.out, Data: m.Data(), Header: h}
}
