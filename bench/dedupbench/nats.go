package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/transports/natssource"
)

type natsTransport struct {
	soak bool
	nc   *nats.Conn
	js   jetstream.JetStream
}

// startNATS returns the URL of --nats, or starts an embedded server with
// JetStream on a random loopback port (stopped by b.close).
func startNATS(b *bench) (string, error) {
	if b.o.natsURL != "" {
		return b.o.natsURL, nil
	}
	dir, err := os.MkdirTemp("", "dedupbench-nats-")
	if err != nil {
		return "", err
	}
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true, NoLog: true,
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	go s.Start()
	b.fixups = append(b.fixups, func() {
		s.Shutdown()
		s.WaitForShutdown()
		_ = os.RemoveAll(dir)
	})
	if !s.ReadyForConnections(10 * time.Second) {
		return "", fmt.Errorf("embedded nats-server not ready within 10s")
	}
	return s.ClientURL(), nil
}

func newNATS(ctx context.Context, b *bench) (*natsTransport, error) {
	url, err := startNATS(b)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("nats at %s: %w", url, err)
	}
	b.fixups = append(b.fixups, nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		return nil, err
	}
	return &natsTransport{nc: nc, js: js, soak: b.o.soak > 0}, nil
}

func (t *natsTransport) name() string { return "nats" }

func streamName(id string) string { return "dedupbench_" + id }
func subject(id string) string    { return "dedupbench." + id }

func (t *natsTransport) create(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg := jetstream.StreamConfig{Name: streamName(id), Subjects: []string{subject(id)}}
	if t.soak {
		cfg.MaxAge = time.Minute // bounded broker memory over a soak
	}
	_, err := t.js.CreateStream(ctx, cfg)
	return err
}

func (t *natsTransport) destroy(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = t.js.DeleteStream(ctx, streamName(id))
}

func (t *natsTransport) publish(ctx context.Context, id string, keys []string, rate float64) error {
	subj := subject(id)
	send := func(k string, stamp bool) error {
		m := &nats.Msg{Subject: subj, Data: payload(k), Header: nats.Header{}}
		m.Header.Set(keyHeader, k)
		if stamp {
			m.Header.Set(tsHeader, strconv.FormatInt(time.Now().UnixNano(), 10))
		}
		for {
			_, err := t.js.PublishMsgAsync(m)
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return err
			}
			// Too many unacknowledged: let the server catch up.
			select {
			case <-t.js.PublishAsyncComplete():
			case <-time.After(10 * time.Second):
				return err
			}
		}
	}
	err := pace(ctx, len(keys), rate, func(lo, hi int) error {
		for _, k := range keys[lo:hi] {
			if err := send(k, rate > 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	select {
	case <-t.js.PublishAsyncComplete():
		return nil
	case <-time.After(time.Minute):
		return fmt.Errorf("publish not acknowledged within a minute")
	}
}

// pace calls send for consecutive ranges covering [0,n): all at once when
// rate is 0, else spread at rate per second.
func pace(ctx context.Context, n int, rate float64, send func(lo, hi int) error) error {
	start := time.Now()
	for i := 0; i < n; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		due := n
		if rate > 0 {
			due = min(n, int(time.Since(start).Seconds()*rate)+1)
			if due <= i {
				time.Sleep(200 * time.Microsecond)
				continue
			}
		}
		if err := send(i, due); err != nil {
			return err
		}
		i = due
	}
	return nil
}

func (t *natsTransport) consumerFor(ctx context.Context, id string) (jetstream.Consumer, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return t.js.CreateConsumer(ctx, streamName(id), jetstream.ConsumerConfig{Durable: "plain", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
}

// raw is jetstream's Consume with an Ack per message.
func (t *natsTransport) raw(ctx context.Context, id string, p *progress) (func() error, error) {
	cons, err := t.consumerFor(ctx, id)
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		p.done(m.Headers().Get(tsHeader))
	})
	if err != nil {
		return nil, err
	}
	return func() error { cc.Stop(); <-cc.Closed(); return nil }, nil
}

// feed is Consume handing each message to the naive goroutines.
func (t *natsTransport) feed(ctx context.Context, id string, jobs chan<- job) (func() error, error) {
	cons, err := t.consumerFor(ctx, id)
	if err != nil {
		return nil, err
	}
	quit := make(chan struct{})
	cc, err := cons.Consume(func(m jetstream.Msg) {
		h := m.Headers()
		j := job{key: h.Get(keyHeader), payload: m.Data(), ts: h.Get(tsHeader), ack: func() { _ = m.Ack() }}
		select {
		case jobs <- j:
		case <-quit:
		}
	})
	if err != nil {
		return nil, err
	}
	return func() error { close(quit); cc.Stop(); <-cc.Closed(); return nil }, nil
}

func (t *natsTransport) source(id string, concurrency int) (consumer.Source, error) {
	return natssource.New(t.js, natssource.Config{Stream: streamName(id), Consumer: "dedup", FetchMaxWait: 100 * time.Millisecond})
}
