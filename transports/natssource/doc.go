// Package natssource is dedupworker's NATS JetStream transport: a [Source]
// over a durable pull consumer of nats.go's jetstream package. Library users
// hand it to the worker with their handler; the dedupworker binary builds
// one from a config's source.nats block.
//
//	js, err := jetstream.New(nc)
//	src, err := natssource.New(js, natssource.Config{Stream: "ORDERS", Consumer: "orders"})
//
// # The durable consumer
//
// [New] binds to the durable named by [Config.Consumer] when it exists and
// creates it when it does not: explicit acks, [Config.AckWait], no
// MaxDeliver (the worker counts attempts itself) and [Config.MaxAckPending],
// by default from the handler's concurrency. An existing durable is updated
// to the configured AckWait and to a larger MaxAckPending, with a log line,
// unless [Config.BindOnly] is set.
//
// # Delivery
//
// One pull subscription stays open while Consume runs. The messages received
// and not yet acked are bounded in bytes by [Config.FetchBufferBytes]. Each
// batch of what has arrived is shown to the runner once, so the
// deduplication engine claims it in one Redis round trip, and runs on at
// most the runner's concurrency; a batch handler's slot holds a run of up to
// [Config.Batch] messages. A delivery maps onto JetStream as follows:
//
//	Ack        Ack, or DoubleAck when Config.AckSync is set
//	Nak        NakWithDelay(delay), or Nak when delay is zero
//	Heartbeat  InProgress, which resets AckWait while a handler runs
//	Attempt    the message's NumDelivered
//	DeadLetter publish to Config.DeadLetterSubject
//
// A dead letter carries the original payload and headers plus the
// dead-letter headers. When a stream captures [Config.DeadLetterSubject]
// the publish waits for the stream's acknowledgement, so a dead letter that
// was not stored is retried; otherwise it goes out on core NATS, seen only by
// subscribers present at that moment, which the Source logs at start.
// [Source.Pending] reports the consumer's backlog. On cancellation the
// subscription is drained and every message received but not started is
// nakked for prompt redelivery. A deleted stream or consumer ends Consume
// with an error naming both.
//
// # Request and reply
//
// JetStream does not keep a message's reply subject, so [Request] carries the
// requester's inbox in the [HeaderReplyTo] header, and [Reply] answers such a
// message: a duplicate can be answered with the stored result. How the
// subscription sizes its pull requests, and why, is in docs/DECISIONS.md.
package natssource
