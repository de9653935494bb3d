// Package actions holds the dedupworker binary's built-in handlers, the
// action of a configured handler: forward to Kafka or NATS, POST over HTTP,
// or exec a command.
// Each is a consumer.Handler; the key, fence and attempt come from the claim
// in the handler's context (dedupworker.ClaimOf).
//
// The forward actions are also consumer.BatchHandlers: a run of messages is
// one produce call (Kafka) or a burst of asynchronous publishes whose
// PubAcks are awaited together (NATS), and each message's claim is found in
// dedupworker.MessageContext. http and exec make one call a message and are
// plain Handlers, so they run exactly as concurrently as the source's
// ordering allows: at once on NATS and across keys under Kafka key
// ordering, one after another within a Kafka partition under partition
// ordering.
package actions
