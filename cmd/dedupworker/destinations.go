package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/config"
)

// checkDeadLetters makes sure that every handler's dead letters are stored
// somewhere before run consumes a message: a message that is dead-lettered
// is acked (or committed), so a dead-letter destination that keeps nothing
// would lose it. A NATS subject must be captured by a JetStream stream,
// unless dead_letter.nats.core says that core NATS subscribers are meant to
// receive the dead letters; a Kafka topic must exist. Both are looked up on
// the source's connection, which publishes the dead letters. A destination
// that stores nothing is a usage error (exit 2) naming the field and the
// fix; a broker that does not answer is a runtime error.
func checkDeadLetters(ctx context.Context, cfg *config.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		dl := h.DeadLetter
		switch {
		case dl == nil:
		case dl.NATS != nil && !dl.NATS.Core:
			n := h.Source.NATS
			js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].source.nats", i), n.URL, n.NATSAuth)
			if err != nil {
				return err
			}
			err = natsDeadLetterCheck(ctx, js, i, dl.NATS.Subject)
			done()
			if err != nil {
				return err
			}
		case dl.Kafka != nil:
			k := h.Source.Kafka
			c, done, err := openKafka(ctx, fmt.Sprintf("handlers[%d].source.kafka", i), k.Brokers, k.SASL, k.TLS)
			if err != nil {
				return err
			}
			err = kafkaDeadLetterCheck(ctx, c, i, dl.Kafka.Topic)
			done()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// natsDeadLetterCheck refuses a dead-letter subject that no JetStream stream
// captures (or a server without JetStream): the transport would publish its
// dead letters on core NATS, where they are gone unless a subscriber is
// listening at that moment.
func natsDeadLetterCheck(ctx context.Context, js jetstream.JetStream, i int, subject string) error {
	captured, err := natsCaptured(ctx, js, subject)
	if err != nil {
		return fmt.Errorf("handlers[%d].dead_letter.nats.subject %q: looking up the stream that captures it: %w", i, subject, err)
	}
	if !captured {
		return usagef("handlers[%d].dead_letter.nats.subject %q: no JetStream stream captures it, so a dead letter would be acked and kept nowhere: "+
			"create a stream that captures it ('dedupworker setup -c FILE' does), or, if core NATS subscribers are meant to receive the dead letters, say so with dead_letter: {nats: {subject: %s, core: true}}",
			i, subject, subject)
	}
	return nil
}

// natsCaptured reports whether a JetStream stream captures subject. No
// stream, or no JetStream on the server, is false.
func natsCaptured(ctx context.Context, js jetstream.JetStream, subject string) (bool, error) {
	_, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return false, nil
	default:
		return false, err
	}
}

// kafkaDeadLetterCheck refuses a dead-letter topic that does not exist.
// Whether the brokers would create it on the first write is not asked:
// a topic created that way gets the brokers' defaults, and one they do not
// create fails every dead letter.
func kafkaDeadLetterCheck(ctx context.Context, c *kafka.Client, i int, topic string) error {
	exists, err := kafkaTopicExists(ctx, c, topic)
	if err != nil {
		return fmt.Errorf("handlers[%d].dead_letter.kafka.topic %q: %w", i, topic, err)
	}
	if !exists {
		return usagef("handlers[%d].dead_letter.kafka.topic %q does not exist: create it ('dedupworker setup -c FILE' does) before the worker dead-letters to it", i, topic)
	}
	return nil
}

// kafkaTopicExists asks the cluster's metadata for topic, without asking
// the broker to create it.
func kafkaTopicExists(ctx context.Context, c *kafka.Client, topic string) (bool, error) {
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return false, err
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		switch {
		case t.Error == nil:
			return true, nil
		case errors.Is(t.Error, kafka.UnknownTopicOrPartition):
			return false, nil
		default:
			return false, t.Error
		}
	}
	return false, nil
}

// httpDialCheck opens a TCP connection to the host of an http action's URL
// (port 80 or 443 when the URL names none), within 5s and ctx: validate
// --online reports a server nobody listens on before run retries every
// message against it.
func httpDialCheck(ctx context.Context, i int, h *config.Handler) error {
	field := fmt.Sprintf("handlers[%d].action.http.url", i)
	raw := h.Action.HTTP.URL
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%s %q: connecting to %s: %w: start the server the action posts to, or correct the url", field, redactedURL(u), addr, err)
	}
	return c.Close()
}

// redactedURL is u without its user information, for an error message.
func redactedURL(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}
