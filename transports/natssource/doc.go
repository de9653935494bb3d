// Package nats is the NATS JetStream transport of dedupworker: a
// consumer.Source over a durable pull consumer of nats.go's jetstream package.
//
// The Source binds to the durable consumer named in Config when it exists,
// and creates it when it does not (AckExplicit, AckWait from Config,
// MaxDeliver unlimited because the worker counts attempts, and MaxAckPending
// from Config or the handler's concurrency, times Config.Batch for a batch
// handler). An existing consumer
// follows Config's AckWait and a larger MaxAckPending.
//
// It keeps one pull subscription open for the whole of Consume (jetstream's
// Consume, whose callback only hands each message on): the server pushes
// messages as they arrive, without a request round trip per batch. The
// subscription pulls at most Config.Batch messages (default: the handler's
// concurrency) ahead, 8 runs of Config.Batch (whose default for a batch
// handler is at least 128) within MaxAckPending when the runner batches, and pulls more only as the Source takes them, so the
// client holds at most that plus Config.Batch not yet started (what the
// library buffered and what it handed on), however large the consumer's
// MaxAckPending. Config.FetchBufferBytes (default 32 MiB) bounds the same
// messages in bytes: the messages received and not yet acked or nakked
// count their payload, headers and subjects against it, the subscription's
// callback waits while it is full, and each pull request asks for at most
// an eighth of it (never less than the server's max_payload), so a stream
// of large messages does not fill the worker's memory. A stored message
// larger than a pull request may take (the consumer's MaxRequestMaxBytes,
// or a max_payload lowered after it was stored) is refused by the server
// on every request, and the jetstream client does not report that; when
// the consumer has messages pending and sends this worker none for two
// idle checks (10s) while it has a slot free and room in the bound, the
// Source logs a warning that names the limits. Source.Pending reports the
// consumer's backlog (NumPending) while Consume runs, read from each
// received message's metadata and, while none arrives, from those idle
// checks, so a stuck or starved worker's backlog keeps growing.
// Whenever a processing slot is free the Source waits for a message, then
// takes every message already received, up to the free slots and Config.Batch,
// without waiting for more: a quiet stream's message is not held back to fill
// a batch. Under load the next batch grows while the previous one is being
// claimed, and when fewer than half of Config.Batch slots are free a small
// batch waits up to 2ms for slots in use to come free, so that a busy handler
// is fed in batches of useful size. It shows each batch to the processor once
// (consumer.Runner.Prepare, so the deduplication engine claims a whole batch
// in one Redis round trip) and runs each delivery on a pool of at
// most Runner.Concurrency goroutines. A batch handler's slot is a run, not a
// message (consumer.Runner.ProcessBatch): each batch is one ProcessBatch call
// under one slot, so up to concurrency × Config.Batch messages are in its
// calls at once. On cancellation the subscription is drained:
// the server is told to stop sending, whatever it sent before is still
// received, and every message received but not started is nakked for prompt
// redelivery. The naks wait until the server has forgotten the worker's
// last pull request (a consumer info request makes it check): a server
// before 2.10.16 can hand a nakked message to a pull request nobody listens
// to any more, and the message then waits out AckWait.
//
// A Delivery maps the transport-neutral obligations onto JetStream:
//
//	Ack        Ack, or DoubleAck when Config.AckSync is set
//	Nak        NakWithDelay(delay), or Nak when delay is zero
//	Heartbeat  InProgress (resets AckWait while a handler runs or a
//	           duplicate waits for its key's owner)
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
// for a long-running worker); the subscription survives a reconnect and the
// jetstream library renews its pull request on the new connection, as it
// does when the server's idle heartbeats stop for Config.FetchMaxWait (at
// least 1s). A closed connection ends Consume with an error. A
// stream or consumer deleted before or during the run ends Consume with an
// error naming both (it wraps jetstream.ErrStreamNotFound or
// jetstream.ErrConsumerNotFound); the Source looks the consumer up when the
// server reports it deleted, when a pull request gets no responder or no
// heartbeat, and every few seconds while no message arrives.
package natssource
