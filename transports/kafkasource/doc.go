// Package kafka is the Kafka transport of dedupworker: a consumer.Source
// that consumes one topic as a member of a consumer group, over
// github.com/segmentio/kafka-go.
//
//	src, err := kafka.New(kafka.Config{
//		Brokers: []string{"127.0.0.1:9092"},
//		Topic:   "orders",
//		GroupID: "orders-dedup",
//	})
//	w, err := dedupworker.NewWorker(store, dedupworker.Config{})
//	err = w.Handle("orders", src, handler, dedupworker.WithLease(30*time.Second))
//	err = w.Run(ctx)
//
// # Behaviour
//
// Partitions assigned to the member run in parallel; inside a partition
// messages run in offset order (Ordering "partition"), or, with Ordering
// "key", distinct message keys run in parallel, each key in offset order.
// At most Runner.Concurrency() deliveries are in Process at once
// across the member. Messages without a key have no order to keep: under
// key ordering each runs on its own. Every fetched batch (up to BatchSize
// messages) goes to Runner.Prepare once before its messages run, so the
// deduplication engine claims the batch in one store round trip.
// A partition fetches ahead only while fewer than MaxUnfinished of its
// messages are unfinished, counted from the oldest unfinished one, so a slow
// key cannot make the member claim and buffer without bound. Across all
// partitions, the fetched messages not yet acked are bounded in bytes
// (FetchBufferBytes): a fetcher waits, in turn with the others, for room
// for its fetch before it fetches, so a backlog's start does not decode a
// whole record batch on every partition at once. The bound only delays
// fetches: offsets, their order, commits and rebalances are as without it.
// Source.Lag reports, for each partition the member holds, the partition's
// end (read from every fetch response, and every 5s by a listing while the
// partition's fetcher waits for room) and the offset the group would resume
// at, so a stuck handler's lag keeps growing. Source.FetchStats counts the
// fetch requests and the partitions they carried (see the design section
// below on how partitions share them).
//
// With a batch handler (Runner.Batching), a lane hands its queued messages
// to Runner.ProcessBatch in runs of up to BatchSize; with any other
// handler, in runs of one message. A run's call may tell
// the source that the run's handlers are done while their results are
// still being stored (consumer.RunHandledNotifier; the deduplication engine
// does when every message of the run has a result to store): the lane then
// starts its next run, whose call takes a concurrency slot of its own, with
// what is queued or, when nothing is, with the first messages queued before
// the first call returned, and waits for the first call to return before a
// third. Side effects stay in
// offset order. A message whose result the store then could not take (its
// claim and record were lost) is retried after the run that started
// meanwhile.
//
// Kafka cannot redeliver one message, so a Nak is a retry in place: the
// lane (the partition, or the key) waits the requested delay and processes
// the message again with Attempt()+1. Attempts are counted by
// this member; a message that moves to another member after a rebalance
// starts again at 1. DeadLetter produces the message, with its key, payload
// and headers plus the consumer.DeadLetter headers, to DeadLetterTopic and
// waits for all in-sync replicas.
//
// The committed offset of a partition is its lowest unfinished offset (a
// watermark): offsets finish when their delivery is acked, in any order, and
// the commit never passes a message that has not finished, so a crash never
// skips one. Offsets are committed every CommitInterval, when a partition is
// revoked and when the source stops. What was processed but not committed
// is delivered again to the next owner; the deduplication engine turns those
// redeliveries into acknowledged duplicates.
//
// Rebalance: when the generation ends, the member stops
// fetching, hands deliveries that were fetched but not started to Process
// with a cancelled context (cause ErrStopping, so the engine releases their
// claims), lets in-flight deliveries finish for up to RevokeTimeout, then
// cancels their context with cause ErrRevoked, commits what finished, and
// only then lets the group move to the next generation.
//
// Shutdown: when Consume's context is cancelled the member
// stops fetching, waits for in-flight deliveries (the Worker bounds them
// with its drain timeout), commits, and leaves the group; Consume returns
// nil. Heartbeats continue while it drains, so the commit is accepted.
//
// # Design: ConsumerGroup + Generation, a fetcher per partition, shared fetches
//
// kafka-go offers two ways to be a group member. Reader with GroupID hides
// the group: it assigns, fetches and commits for you, but it does not tell
// its caller when partitions are revoked, it commits "the highest offset
// handed in + 1" (no watermark), and after a rebalance messages of lost
// partitions may still sit in its queue, so a commit could name a partition
// the member no longer owns. None of that is compatible with retry in
// place, key-parallel work or revoke draining.
//
// ConsumerGroup exposes what this transport needs. Next returns a
// Generation with the member's assignment and the committed offset of each
// partition; the generation ends when a heartbeat reports a rebalance (or
// the group is closed); CommitOffsets commits exact offsets under the
// generation's id; and kafka-go waits for every function started with
// Generation.Start before it rejoins. The source starts one such function
// per generation and holds it until its partitions are drained and
// committed, which gives revoke a synchronous hook that commits while the
// generation is still valid (the coordinator accepts commits of the current
// generation while a rebalance is being prepared).
//
// Each assigned partition has its own fetcher. It positions with a
// kafka.Conn to the partition leader (Dialer.DialLeader, ReadOffsets:
// FirstOffset/LastOffset, offsets out of the retained range), which also
// names the leader, then fetches in that broker's rounds: the generation
// keeps one Fetch request of kafka-go's protocol/fetch in flight to each
// broker that leads some of its partitions, and the fetchers that ask while
// it is in flight go together in the next (rounds.go). A round waits on the
// broker up to MaxWait only when it carries every partition of its leader,
// and up to 10ms otherwise (100ms while the same partitions keep finding
// nothing), so that a fetcher that was waiting for room never waits out the
// others' long poll. A fetch's part for a partition is
// a natural batch to hand to Runner.Prepare; cancelling the fetcher's
// context ends its wait for a round at once. The fetcher follows
// kafka-go's Reader in how it reacts to errors: reconnect on a leader change
// or a broken connection, re-resolve the position on OffsetOutOfRange, fail
// Consume on refused credentials or a topic that stays unknown.
//
// # Transactions
//
// Isolation is read_committed by default. kafka-go's own fetch paths do not
// implement it (segmentio/kafka-go#1332): Conn.ReadBatchWith sends the
// isolation level, so the broker stops at the last stable offset (records of
// open transactions wait), but readFetchResponseHeaderV10 (read.go) reads
// and drops the response's aborted transactions, and messageSetReader
// (message_reader.go) reads each batch's attributes and producer id but
// exposes neither on Batch or Message, so a Batch returns the records of
// aborted transactions and the transaction markers as ordinary messages (a
// marker: a 4-byte key, a 6-byte value); Client.Fetch (fetch.go) drops the
// aborted transactions too, and its RecordStream skips control batches
// without saying where. Measured on
// Kafka 3.9 with a franz-go producer: both isolation levels returned every
// aborted record and both markers. So the fetcher reads the protocol/fetch
// response itself (fetch.go): control batches are skipped under either
// level; under read_committed, a transactional batch of a producer that the
// response lists as aborted, from the listed first offset up to that
// producer's abort marker, is skipped, as the Java consumer does. Skipped
// offsets count as read: the committed watermark moves past them.
//
// kafka-go's protocol reader keeps no batch's last offset, so the position
// after a fetch is where the next batch begins, or after the last record of
// the last batch; a fetch whose records all lie before the fetch offset (the
// tail of a batch emptied by compaction) moves on by one offset per fetch.
// The rounds to a broker go through one kafka.Transport, which routes them
// by the topic's metadata and refreshes it in the background (kafka-go's
// MetadataTTL, 6s); a round that fails, or whose answer carries an error
// for some partition, makes it a new one, and the fetchers it answered with
// an error find their leader again and reconnect.
// Under read_committed a partition that starts at "latest" starts at the
// last stable offset, as Kafka's own consumer does: the end of the partition
// would lie after the records of a transaction still open, which then would
// never be read.
//
// Every network call has a deadline: dials and metadata (NetworkTimeout),
// fetches (MaxWait + NetworkTimeout), kafka-go's coordinator calls
// (NetworkTimeout + RebalanceTimeout; JoinGroup another RebalanceTimeout,
// SyncGroup another SessionTimeout), the source's own heartbeats between
// generations and leaves (NetworkTimeout), dead-letter writes
// (2 × NetworkTimeout).
//
// # Keeping the membership through a rebalance
//
// kafka-go's ConsumerGroup sends no heartbeat between generations: while a
// member drains its revoked partitions it sends nothing, and Kafka removes
// a member that sends nothing for the session timeout, also while the group
// prepares a rebalance. The source heartbeats the member id itself from the
// end of a generation until the next one forms, so a drain longer than
// SessionTimeout (up to RevokeTimeout) keeps the member. A JoinGroup that
// fails makes kafka-go forget its member id without leaving; the source
// leaves with it, so the next rebalance does not wait for a member that
// will never rejoin. See group.go.
//
// # Defaults that differ from kafka-go
//
// MaxWait 250ms (kafka-go: 10s, which makes every stop of an idle member take
// seconds), HeartbeatInterval SessionTimeout/10 (kafka-go: 3s, which delays
// every rebalance), SessionTimeout 10s, dead-letter writes with
// a 2ms batch timeout (kafka-go: 1s per synchronous write).
//
// # Limits
//
// kafka-go has no static membership and no cooperative rebalancing: every
// rebalance revokes all partitions of every member, and a member killed
// without leaving holds its partitions until SessionTimeout. If draining on
// shutdown outlasts SessionTimeout the final commit is refused and the
// finished offsets are delivered again (then acknowledged as duplicates).
package kafkasource
