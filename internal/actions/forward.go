package actions

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
)

// KafkaWriter is what ForwardKafka needs of a *kafka.Writer.
type KafkaWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// NATSPublisher is what ForwardNATS needs of a jetstream.JetStream.
type NATSPublisher interface {
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// IdempotencyHeader is the header forward and http set to the raw key.
const IdempotencyHeader = "Idempotency-Key"

// ForwardKafka publishes the payload unchanged, with the original key and
// headers and Idempotency-Key set to the idempotency key (SPEC §9.3), and
// waits for the write to be acknowledged. The writer decides the topic.
func ForwardKafka(handler string, w KafkaWriter, inject Injector) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		ci := claimOf(ctx, handler)
		h := m.Header.Clone()
		if h == nil {
			h = consumer.Header{}
		}
		if ci.Key != "" {
			h.Set(IdempotencyHeader, ci.Key)
		}
		inject.into(ctx, h)
		msg := kafka.Message{Key: m.Key, Value: m.Payload}
		for name, vs := range h {
			for _, v := range vs {
				msg.Headers = append(msg.Headers, kafka.Header{Key: name, Value: []byte(v)})
			}
		}
		if err := w.WriteMessages(ctx, msg); err != nil {
			return nil, fmt.Errorf("forward to kafka: %w", err)
		}
		return nil, nil
	})
}

// ForwardNATS publishes the payload unchanged to subject through JetStream,
// with the original headers, Idempotency-Key and Nats-Msg-Id set to the key,
// so JetStream's own duplicate window covers a crash between this publish and
// the completion (SPEC §9.3). The result is "<stream>:<sequence>".
func ForwardNATS(handler string, js NATSPublisher, subject string, inject Injector) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		ci := claimOf(ctx, handler)
		msg := nats.NewMsg(subject)
		msg.Data = m.Payload
		h := m.Header.Clone()
		if h == nil {
			h = consumer.Header{}
		}
		inject.into(ctx, h)
		for name, vs := range h {
			for _, v := range vs {
				msg.Header.Add(name, v)
			}
		}
		var opts []jetstream.PublishOpt
		if ci.Key != "" {
			msg.Header.Del(IdempotencyHeader)
			msg.Header.Set(IdempotencyHeader, ci.Key)
			msg.Header.Del(nats.MsgIdHdr)
			opts = append(opts, jetstream.WithMsgID(ci.Key))
		}
		ack, err := js.PublishMsg(ctx, msg, opts...)
		if err != nil {
			return nil, fmt.Errorf("forward to nats %s: %w", subject, err)
		}
		return fmt.Appendf(nil, "%s:%d", ack.Stream, ack.Sequence), nil
	})
}
