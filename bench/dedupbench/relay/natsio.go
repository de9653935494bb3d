package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsAdmin creates the benchmark's streams and publishes its input.
type natsAdmin struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func newNATSAdmin(url string) (*natsAdmin, error) {
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("-nats %s: %w", url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &natsAdmin{nc: nc, js: js}, nil
}

func (n *natsAdmin) close() { n.nc.Close() }

func (n *natsAdmin) createStream(ctx context.Context, name, subject string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := n.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Duplicates: 2 * time.Minute})
	if err != nil {
		return fmt.Errorf("nats create stream %s: %w", name, err)
	}
	return nil
}

func (n *natsAdmin) deleteStreams(names ...string) error {
	var errs []error
	for _, s := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := n.js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			errs = append(errs, fmt.Errorf("nats delete stream %s: %w", s, err))
		}
		cancel()
	}
	return errors.Join(errs...)
}

// natsMessage is in as a NATS message. It carries no Nats-Msg-Id: a
// duplicate must reach the relay, not be dropped by the input stream.
func natsMessage(subject string, in input, ts time.Time) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(keyHeader, in.Key)
	if !ts.IsZero() {
		m.Header.Set(tsHeader, strconv.FormatInt(ts.UnixNano(), 10))
	}
	m.Data = payload(in)
	return m
}

func (n *natsAdmin) publish(ctx context.Context, msgs []*nats.Msg) error {
	for _, m := range msgs {
		if _, err := n.js.PublishMsgAsync(m); err != nil {
			return fmt.Errorf("nats publish %s: %w", m.Subject, err)
		}
	}
	select {
	case <-n.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(60 * time.Second):
		return fmt.Errorf("nats publish: %d PubAcks still pending after 60s", n.js.PublishAsyncPending())
	}
}

func (n *natsAdmin) publishBacklog(ctx context.Context, subject string, plan []input) error {
	const chunk = 4000
	for i := 0; i < len(plan); i += chunk {
		msgs := make([]*nats.Msg, 0, chunk)
		for _, in := range plan[i:min(i+chunk, len(plan))] {
			msgs = append(msgs, natsMessage(subject, in, time.Time{}))
		}
		if err := n.publish(ctx, msgs); err != nil {
			return err
		}
	}
	return nil
}

func (n *natsAdmin) publishPaced(ctx context.Context, subject string, plan []input, rate float64) (float64, error) {
	achieved, err := pace(ctx, len(plan), rate, func(from, to int) error {
		now := time.Now()
		for _, in := range plan[from:to] {
			if _, err := n.js.PublishMsgAsync(natsMessage(subject, in, now)); err != nil {
				return fmt.Errorf("nats publish %s: %w", subject, err)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return achieved, n.publish(ctx, nil)
}

// readNATSOutput reads stream from its start into rec with an ordered
// consumer; the returned function stops it.
func (n *natsAdmin) readNATSOutput(ctx context.Context, stream string, rec *recorder) (func(), error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := n.js.OrderedConsumer(cctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("nats output consumer on %s: %w", stream, err)
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		rec.add(0, m.Data(), m.Headers().Get(tsHeader), time.Now())
	}, jetstream.PullMaxMessages(2000))
	if err != nil {
		return nil, fmt.Errorf("nats output consume on %s: %w", stream, err)
	}
	return func() { cc.Stop(); <-cc.Closed() }, nil
}
