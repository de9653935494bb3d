package actions

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// NATSAsyncPublisher is a NATSPublisher that can also publish without
// waiting for the PubAck, as a jetstream.JetStream can. ForwardNATS uses it
// to publish a run at once.
type NATSAsyncPublisher interface {
	NATSPublisher
	PublishMsgAsync(msg *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// IdempotencyHeader is the header forward and http set to the raw key.
const IdempotencyHeader = "Idempotency-Key"

// publishAckTimeout bounds the wait for a batch's JetStream PubAcks when the
// handler's context has no earlier deadline: the default timeout of a
// synchronous JetStream publish.
const publishAckTimeout = 5 * time.Second

// outgoing returns m's headers for the forwarded copy: the incoming ones,
// with Idempotency-Key set to the claim's key (replacing an incoming header
// of that name in any case), and the trace context of ctx.
func outgoing(ctx context.Context, m *consumer.Message, key string, inject Injector) consumer.Header {
	h := m.Header.Clone()
	if h == nil {
		h = consumer.Header{}
	}
	if key != "" {
		h.Set(IdempotencyHeader, key)
	}
	inject.into(ctx, h)
	return h
}

// ForwardKafka publishes the payload unchanged, with the original key and
// headers and Idempotency-Key set to the idempotency key (SPEC §9.3), and
// waits for the write to be acknowledged. The writer decides the topic.
//
// It is a consumer.BatchHandler: a run is written in one WriteMessages
// call, in order (the writer keeps the order of the messages it puts in one
// partition), and each message's result is its own entry of kafka-go's
// WriteErrors. The messages that concurrent calls (other partitions' lanes)
// send to one output partition while a write to it is in flight go to w
// together in the next call (coalescingWriter); messages for a partition
// with no write in flight are written at once. With a w NewKafkaWriter did
// not make, coalescingWriter cannot tell partitions apart and keeps one
// write in flight. w should not linger (NewKafkaWriter's does not): what it
// gets is already whole.
func ForwardKafka(handler string, w KafkaWriter, inject Injector) consumer.BatchFunc {
	cw := newCoalescingWriter(w)
	return func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		out := make([]kafka.Message, len(ms))
		for i, m := range ms {
			mctx := consumer.MessageContext(ctx, i)
			h := outgoing(mctx, m, claimOf(mctx, handler).Key, inject)
			msg := kafka.Message{Key: m.Key, Value: m.Payload, Headers: make([]kafka.Header, 0, len(h))}
			for name, vs := range h {
				for _, v := range vs {
					msg.Headers = append(msg.Headers, kafka.Header{Key: name, Value: []byte(v)})
				}
			}
			out[i] = msg
		}
		err := cw.WriteMessages(ctx, out...)
		if err == nil {
			return
		}
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == len(ms) {
			for i, e := range werrs {
				if e != nil {
					results[i].Err = fmt.Errorf("forward to kafka: %w", e)
				}
			}
			return
		}
		for i := range results {
			results[i].Err = fmt.Errorf("forward to kafka: %w", err)
		}
	}
}

// ForwardNATS publishes the payload unchanged to subject through JetStream,
// with the original headers, Idempotency-Key and Nats-Msg-Id set to the key
// (each replacing an incoming header of its name, in any case), so
// JetStream's own duplicate window covers a crash between this publish and
// the completion (SPEC §9.3). The result is "<stream>:<sequence>".
//
// It is a consumer.BatchHandler. When js is a NATSAsyncPublisher every
// message of a run is published asynchronously, then each waits for its own
// PubAck, all within the context's deadline or publishAckTimeout, whichever
// is earlier; otherwise the messages are published one after another, each
// waiting for its PubAck.
func ForwardNATS(handler string, js NATSPublisher, subject string, inject Injector) consumer.BatchFunc {
	async, _ := js.(NATSAsyncPublisher)
	return func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		futures := make([]jetstream.PubAckFuture, len(ms))
		for i, m := range ms {
			mctx := consumer.MessageContext(ctx, i)
			key := claimOf(mctx, handler).Key
			h := outgoing(mctx, m, key, inject)
			var opts []jetstream.PublishOpt
			if key != "" {
				h.Del(nats.MsgIdHdr)
				opts = append(opts, jetstream.WithMsgID(key))
			}
			msg := nats.NewMsg(subject)
			msg.Data = m.Payload
			for name, vs := range h {
				for _, v := range vs {
					msg.Header.Add(name, v)
				}
			}
			if async == nil {
				ack, err := js.PublishMsg(mctx, msg, opts...)
				if err != nil {
					results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, err)
					continue
				}
				results[i].Value = fmt.Appendf(nil, "%s:%d", ack.Stream, ack.Sequence)
				continue
			}
			f, err := async.PublishMsgAsync(msg, opts...)
			if err != nil {
				results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, err)
				continue
			}
			futures[i] = f
		}
		wctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
		defer cancel()
		for i, f := range futures {
			if f == nil {
				continue
			}
			select {
			case ack := <-f.Ok():
				results[i].Value = fmt.Appendf(nil, "%s:%d", ack.Stream, ack.Sequence)
			case err := <-f.Err():
				results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, err)
			case <-wctx.Done():
				results[i].Err = fmt.Errorf("forward to nats %s: no PubAck: %w", subject, context.Cause(wctx))
			}
		}
	}
}
