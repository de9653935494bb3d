package actions

import (
	"context"
	"errors"
	"fmt"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/idemkit/dedupworker"

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
// headers and Idempotency-Key set to the idempotency key, and
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
		out := kafkaRun(ctx, ms, handler, inject)
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

// kafkaRun builds the forwarded copies of a run: each message's key and
// payload, its headers as outgoing returns them, in one allocation for every
// message's headers and one for every header value of the run. The writer
// may still read them after WriteMessages returned (a cancelled write), so
// they are never reused. Without an injector the headers are copied from
// the message's directly, skipping an incoming Idempotency-Key (of any case)
// when the claim's key replaces it, which is what outgoing does without
// building the intermediate Header.
func kafkaRun(ctx context.Context, ms []*consumer.Message, handler string, inject Injector) []kafka.Message {
	out := make([]kafka.Message, len(ms))
	keys := make([]string, len(ms))
	n, size := 0, 0
	for i, m := range ms {
		keys[i] = claimOf(dedupworker.MessageContext(ctx, i), handler).Key
		for _, vs := range m.Header {
			n += len(vs)
			for _, v := range vs {
				size += len(v)
			}
		}
		n++
		size += len(keys[i])
	}
	hs := make([]kafka.Header, 0, n)
	vals := make([]byte, 0, size)
	add := func(name, v string) {
		start := len(vals)
		vals = append(vals, v...)
		hs = append(hs, kafka.Header{Key: name, Value: vals[start:len(vals):len(vals)]})
	}
	for i, m := range ms {
		start := len(hs)
		key := keys[i]
		if inject != nil {
			for name, vs := range outgoing(dedupworker.MessageContext(ctx, i), m, key, inject) {
				for _, v := range vs {
					add(name, v)
				}
			}
		} else {
			for name, vs := range m.Header {
				if key != "" && isIdempotencyHeader(name) {
					continue
				}
				for _, v := range vs {
					add(name, v)
				}
			}
			if key != "" {
				add(IdempotencyHeader, key)
			}
		}
		out[i] = kafka.Message{Key: m.Key, Value: m.Payload, Headers: hs[start:len(hs):len(hs)]}
	}
	return out
}

// isIdempotencyHeader reports whether name is Idempotency-Key in some
// case, as consumer.Header.Set matches names.
func isIdempotencyHeader(name string) bool {
	return name == IdempotencyHeader || len(name) == len(IdempotencyHeader) && textproto.CanonicalMIMEHeaderKey(name) == IdempotencyHeader
}

// ForwardNATS publishes the payload unchanged to subject through JetStream,
// with the original headers, Idempotency-Key and Nats-Msg-Id set to the key
// (each replacing an incoming header of its name, in any case), so
// JetStream's own duplicate window covers a crash between this publish and
// the completion. The result is "<stream>:<sequence>".
//
// It is a consumer.BatchHandler. When js is a *NATSJetStream every message
// of a run is published asynchronously, then the run waits for each
// message's own PubAck or error, all within the context's deadline or
// publishAckTimeout, whichever is earlier: a message with neither by then
// fails with "no PubAck". Any other js publishes the messages one after
// another, each waiting for its PubAck.
func ForwardNATS(handler string, js NATSPublisher, subject string, inject Injector) consumer.BatchFunc {
	async, _ := js.(*NATSJetStream)
	return func(ctx context.Context, ms []*consumer.Message, results []consumer.Result) {
		// The run's messages in one allocation, and the one-key value
		// slices of their Idempotency-Key and Nats-Msg-Id headers in
		// another. A no-responders retry's timer (NATSJetStream) may
		// still publish a message of a run that ended, and keeps the
		// run's arrays until it fired, so they are never reused.
		out := make([]nats.Msg, len(ms))
		keys := make([]string, len(ms))
		for i, m := range ms {
			mctx := dedupworker.MessageContext(ctx, i)
			var kv []string
			if key := claimOf(mctx, handler).Key; key != "" {
				keys[i] = key
				kv = keys[i : i+1 : i+1]
			}
			// Nats-Msg-Id is a header of the message rather than a
			// jetstream.WithMsgID option: the async path publishes on
			// the core connection, and a synchronous publish without
			// options skips jetstream's per-message option parsing.
			out[i] = nats.Msg{Subject: subject, Data: m.Payload, Header: natsHeader(mctx, m, kv, inject)}
		}
		if async != nil {
			async.publishRun(ctx, subject, out, results)
			return
		}
		res := resultBlock{left: len(ms)}
		for i := range out {
			ack, err := js.PublishMsg(dedupworker.MessageContext(ctx, i), &out[i])
			if err != nil {
				res.left--
				results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, err)
				continue
			}
			results[i].Value = res.add(ack.Stream, ack.Sequence)
		}
	}
}

// natsOutgoing returns m's headers for the copy ForwardNATS publishes: the
// incoming ones, with Idempotency-Key and Nats-Msg-Id set to key when there
// is one (replacing incoming headers of those names in any case), and the
// trace context of ctx. It is one map: the incoming value slices are
// shared, clipped so that an append to one of them copies it instead of
// writing into the incoming message's, and nothing in the publish path
// writes into a value slice (nats.Header.Set and consumer.Header.Set
// replace the slice).
func natsOutgoing(ctx context.Context, m *consumer.Message, key string, inject Injector) nats.Header {
	var kv []string
	if key != "" {
		kv = []string{key}
	}
	return natsHeader(ctx, m, kv, inject)
}

// natsHeader is natsOutgoing with the key as the value slice to set, kv:
// nil for no key, else the key alone, with no room to append (both
// headers share it).
func natsHeader(ctx context.Context, m *consumer.Message, kv []string, inject Injector) nats.Header {
	n := len(m.Header)
	if kv != nil {
		n += 2
	}
	h := make(nats.Header, n)
	for k, v := range m.Header {
		if kv != nil && (sameName(k, IdempotencyHeader) || sameName(k, nats.MsgIdHdr)) {
			continue
		}
		h[k] = v[:len(v):len(v)]
	}
	if kv != nil {
		h[IdempotencyHeader] = kv
		h[nats.MsgIdHdr] = kv
	}
	inject.into(ctx, consumer.Header(h))
	return h
}

// sameName reports whether header names a and b are equal in any case, as
// consumer.Header.Del matches them, without allocating: for a name of
// header token characters, as IdempotencyHeader and nats.MsgIdHdr are,
// equal length and Unicode case folding match exactly the names whose
// canonical forms are equal.
func sameName(a, b string) bool {
	return len(a) == len(b) && strings.EqualFold(a, b)
}

// resultBlock writes the forward results of a run into shared blocks
// rather than one allocation each: left is how many results of the run are
// still to come, each of which is either added or, when its message failed,
// counted off; it only sizes the next block, so a miscount costs an
// allocation, never a result. A result is its own clipped slice of a
// block (an append to it copies), and the stores of this module copy what
// they keep, so a block lives no longer than the run's completions.
type resultBlock struct {
	b    []byte
	left int
}

// add returns a PubAck's result, "<stream>:<sequence>", and counts it off.
func (r *resultBlock) add(stream string, seq uint64) []byte {
	need := len(stream) + 1 + 20 // 20: the digits of the largest uint64
	if cap(r.b)-len(r.b) < need {
		// Room for every result still to come of this stream.
		r.b = make([]byte, 0, need*max(r.left, 1))
	}
	r.left--
	start := len(r.b)
	r.b = append(r.b, stream...)
	r.b = append(r.b, ':')
	r.b = strconv.AppendUint(r.b, seq, 10)
	return r.b[start:len(r.b):len(r.b)]
}
