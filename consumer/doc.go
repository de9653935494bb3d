// Package consumer defines the transport-neutral vocabulary of dedupworker:
// a Message, the Delivery that carries its acknowledgement obligations, the
// Handler that does the user's work, and the Source and Processor contracts
// through which transports (transports/kafka, transports/nats) and the
// deduplication engine (package idempotency) meet.
//
// The package imports only the standard library. Transports implement Source
// and Delivery; the engine implements Processor as a Middleware around a
// Handler. Without a middleware a Handler runs at least once, exactly as the
// broker delivers it.
//
// A handler chooses the fate of a failed message with the error it returns:
//
//	return nil, consumer.Permanent(err)          // dead-letter, never retry
//	return nil, consumer.RetryAfter(time.Minute)  // retry after a minute
//	return nil, err                               // retry with the backoff
package consumer
