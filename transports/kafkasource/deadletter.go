package kafkasource

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
)

// deadLetterWriter produces dead-lettered messages synchronously.
type deadLetterWriter struct {
	w         *kafka.Writer
	transport *kafka.Transport
	timeout   time.Duration
}

// newDeadLetterWriter returns nil when no dead-letter topic is configured.
func (s *Source) newDeadLetterWriter() *deadLetterWriter {
	if s.cfg.DeadLetterTopic == "" {
		return nil
	}
	tr := &kafka.Transport{
		Dial:        s.dialer.DialFunc,
		DialTimeout: s.cfg.NetworkTimeout,
		ClientID:    s.dialer.ClientID,
		TLS:         s.dialer.TLS,
		SASL:        s.dialer.SASLMechanism,
	}
	return &deadLetterWriter{
		w: &kafka.Writer{
			Addr:         kafka.TCP(s.cfg.Brokers...),
			Topic:        s.cfg.DeadLetterTopic,
			Balancer:     &kafka.Hash{},
			RequiredAcks: kafka.RequireAll,
			// A dead letter is written alone and synchronously: kafka-go's
			// default 1s batch timeout would add a second to each.
			BatchTimeout: 2 * time.Millisecond,
			BatchSize:    1,
			WriteTimeout: s.cfg.NetworkTimeout,
			ReadTimeout:  s.cfg.NetworkTimeout,
			MaxAttempts:  3,
			Transport:    tr,
			Logger:       kafkaLogger(s.log, -8),
			ErrorLogger:  kafkaLogger(s.log, -8),
		},
		transport: tr,
		timeout:   2 * s.cfg.NetworkTimeout,
	}
}

// write produces the original key, payload and headers, with the
// dead-letter headers replacing any original header of the same name.
func (w *deadLetterWriter) write(ctx context.Context, m *kafka.Message, dl consumer.Header) error {
	names := make([]string, 0, len(dl))
	replaced := make(map[string]bool, len(dl))
	for k := range dl {
		names = append(names, k)
		replaced[strings.ToLower(k)] = true
	}
	sort.Strings(names)
	hs := make([]kafka.Header, 0, len(m.Headers)+len(dl))
	for _, h := range m.Headers {
		if !replaced[strings.ToLower(h.Key)] {
			hs = append(hs, h)
		}
	}
	for _, k := range names {
		for _, v := range dl[k] {
			hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	err := w.w.WriteMessages(ctx, kafka.Message{Key: m.Key, Value: m.Value, Headers: hs, Time: m.Time})
	if err != nil {
		return fmt.Errorf("dedup: kafka: dead-letter to %q: %w", w.w.Topic, err)
	}
	return nil
}

func (w *deadLetterWriter) close() error {
	err := w.w.Close()
	w.transport.CloseIdleConnections()
	return err
}
