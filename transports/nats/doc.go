// Package nats is the NATS JetStream transport of dedupworker: a
// consumer.Source over a durable pull consumer of nats.go's jetstream package.
//
// The Source binds to the durable consumer named in Config when it exists,
// unchanged, and creates it when it does not (AckExplicit, AckWait from
// Config, MaxDeliver unlimited because the worker counts attempts, and
// MaxAckPending equal to the handler's concurrency; SPEC §9.2).
//
// It fetches in batches that never exceed the free processing capacity,
// shows each fetched batch to the processor once (consumer.Runner.Prepare,
// so the deduplication engine claims a whole batch in one Redis round trip,
// SPEC §4.4), and runs each delivery on its own goroutine, at most
// Runner.Concurrency at a time. The jetstream Consume callback is serial, so
// the Source uses Fetch and FetchNoWait instead: FetchNoWait takes what is
// available at once; when nothing is, Fetch waits up to Config.FetchMaxWait
// for a first message and FetchNoWait adds what came with it, so a quiet
// stream's message is not held back to fill a batch. Under load, when fewer
// than half the slots are free, the Source lingers up to 2ms for more to come
// free, so batches (and batch claims) keep a useful size.
//
// A Delivery maps the transport-neutral obligations onto JetStream:
//
//	Ack        Ack, or DoubleAck when Config.AckSync is set
//	Nak        NakWithDelay(delay), or Nak when delay is zero
//	Heartbeat  InProgress (resets AckWait while a handler runs)
//	Attempt    the NumDelivered of the message metadata
//	DeadLetter publish to Config.DeadLetterSubject (see below)
//
// Dead letters carry the original payload and headers (except the
// server-reserved "Nats-" headers other than Nats-Msg-Id, which would make the
// publish fail or roll up the dead-letter stream) plus the headers of
// consumer.DeadLetter.Headers. When a JetStream stream captures the
// dead-letter subject, the publish waits for the stream's acknowledgement,
// so a dead letter that was not stored is retried rather than lost. When no
// stream captures it, the message is published on core NATS and the
// connection flushed: then only subscribers present at that moment see it,
// which the Source logs once at start.
//
// JetStream does not store the reply subject of a published message, so a
// request/reply over a stream carries the requester's inbox in the
// Dedup-Reply-To header (HeaderReplyTo). Reply answers such a message; an
// idempotency OnDuplicate hook can use it to answer a repeated request with
// the stored result.
//
// The nats.Conn reconnects by itself (configure it with nats.MaxReconnects(-1)
// for a long-running worker); the Source stops fetching while it is
// disconnected, because a pull request buffered meanwhile would be answered
// into an inbox nobody reads, and retries failed fetches with a backoff,
// logging them. A closed connection ends Consume with an error. A stream or consumer deleted before or during
// the run ends Consume with an error naming both (it wraps
// jetstream.ErrStreamNotFound or jetstream.ErrConsumerNotFound).
package nats
