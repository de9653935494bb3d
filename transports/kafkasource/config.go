package kafkasource

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/dedupworker/consumer"
)

// Start positions for a group that has no committed offset on a partition.
const (
	StartEarliest = "earliest"
	StartLatest   = "latest"
)

// Ordering modes.
const (
	// OrderingPartition processes each partition in offset order, one
	// message at a time; partitions run in parallel.
	OrderingPartition = "partition"
	// OrderingKey runs distinct message keys of one partition in parallel,
	// each key in offset order. Messages without a key have no order to keep
	// and run in parallel with everything else.
	OrderingKey = "key"
)

// Isolation levels: which records of transactional producers a Source
// reads.
const (
	// IsolationReadCommitted reads records of committed transactions and
	// non-transactional records; records of aborted transactions are
	// skipped, and records of open transactions wait until the transaction
	// ends.
	IsolationReadCommitted = "read_committed"
	// IsolationReadUncommitted reads every data record, also those of
	// aborted and open transactions.
	IsolationReadUncommitted = "read_uncommitted"
)

// SASL mechanisms accepted in SASL.Mechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// SASL configures SASL authentication.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
	Mechanism string
	Username  string
	Password  string
}

// Config configures a Source. Brokers, Topic and GroupID are required; every
// other field has a default.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port").
	Brokers []string
	// Topic is the topic to consume.
	Topic string
	// GroupID is the consumer group.
	GroupID string
	// Start is where a partition without a committed offset begins:
	// "earliest" (default) or "latest".
	Start string
	// SessionTimeout is how long the coordinator waits for a heartbeat
	// before it evicts the member. Default 10s.
	SessionTimeout time.Duration
	// HeartbeatInterval is how often the member heartbeats. A heartbeat is
	// also how a member learns that a rebalance started, so it bounds how
	// fast partitions move. Default SessionTimeout/10.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the coordinator waits for members to
	// rejoin during a rebalance. Default 30s. Must exceed RevokeTimeout.
	RebalanceTimeout time.Duration
	// RevokeTimeout bounds how long in-flight work of a revoked partition
	// may finish before its context is cancelled with ErrRevoked.
	// Default 10s.
	RevokeTimeout time.Duration
	// MaxWait is how long a fetch waits on the broker for new data.
	// Default 250ms (kafka-go's own default of 10s makes every stop slow).
	MaxWait time.Duration
	// Isolation is "read_committed" (default) or "read_uncommitted": whether
	// records of aborted transactions are skipped. Transaction
	// markers (control records) are never handed to the Runner under
	// either level; their offsets are committed like any other.
	Isolation string
	// Ordering is "partition" (default) or "key".
	Ordering string
	// CommitInterval is how often finished offsets are committed (also on
	// revoke and shutdown). Default 1s.
	CommitInterval time.Duration
	// BatchSize caps how many messages are handed to Runner.Prepare at once
	// (one deduplication round trip) and, per partition, how many messages
	// may wait unfinished before fetching pauses. Default 100.
	BatchSize int
	// MaxUnfinished caps how many messages of one partition may be fetched
	// and not yet finished; fetching pauses beyond it. It bounds how far
	// key ordering runs ahead of a slow key (and how many claims wait), the
	// messages a crash or a rebalance redelivers, and the memory held: every
	// fetched message is in memory until it is finished. Default BatchSize
	// with partition ordering, and twice that when the runner batches
	// (Runner.Batching): room for the run a lane starts while the run
	// before it stores its results (see the package doc). 4×BatchSize with
	// key ordering. A larger window claims further ahead: a member that
	// crashes leaves those claims to run out their lease before another
	// member takes the keys. docs/PERFORMANCE.md has what the batching
	// window buys.
	MaxUnfinished int
	// FetchMaxBytes caps what one fetch returns for a partition (the
	// partitions a broker leads fetch in shared requests, each with this
	// cap); the broker still returns a record batch larger than it whole. A partition holds the
	// fetch it is dispatching and at most one more: the fetcher fetches
	// again once the rest of its last fetch fits in MaxUnfinished (or
	// BatchSize, the larger). Default 1 MiB.
	FetchMaxBytes int
	// FetchBufferBytes caps the memory the Source holds in fetched
	// messages not yet acked, across all its partitions, so that a
	// backlog's start does not decode a fetch of every partition at once.
	// A fetcher acquires its fetch's expected size before it fetches (its
	// last fetch's size, at least FetchMaxBytes), and each message gives
	// its share back when it is acked; what a partition still holds when it
	// stops or is revoked goes back then. A fetch that decodes more than it
	// acquired (a record batch larger than FetchMaxBytes is returned whole)
	// is kept and takes the excess: the Source holds at most this plus one
	// such excess per partition, and nobody fetches again until it is back
	// under. A partition's first fetch, whose size is unknown, waits while
	// another's runs. Fetchers wait in the order they asked, so every
	// partition fetches in turn; a fetch never waits for more than this
	// whole budget. A message counts what it holds on the heap: its key,
	// value and headers, about 700 bytes for its decoding and delivery, and,
	// when it has headers, about 460 bytes for their map and 70 a header
	// beside the header's key and twice its value (kafka-go's and the
	// delivery's copy). Default 32 MiB (or FetchMaxBytes if larger); at
	// least FetchMaxBytes.
	FetchBufferBytes int
	// DeadLetterTopic receives dead-lettered messages; empty means none
	// (Delivery.DeadLetter returns consumer.ErrNoDeadLetter).
	DeadLetterTopic string
	// SASL enables SASL authentication when not nil.
	SASL *SASL
	// TLS enables TLS when not nil.
	TLS *tls.Config
	// Logger receives the source's logs; nil discards them.
	Logger *slog.Logger
	// Dialer is the base for every connection (ClientID, DialFunc,
	// KeepAlive, Resolver, …). SASL and TLS above override its fields of
	// the same purpose. Nil means a default dialer.
	Dialer *kafka.Dialer
	// NetworkTimeout bounds every request to a broker and every dial;
	// requests to the group coordinator made by kafka-go are bounded by
	// NetworkTimeout + RebalanceTimeout, and a JoinGroup by NetworkTimeout +
	// 2×RebalanceTimeout (a coordinator may hold it that long). Default 10s.
	NetworkTimeout time.Duration
}

// defaultHeartbeat is HeartbeatInterval's default for a session timeout.
func defaultHeartbeat(session time.Duration) time.Duration {
	return max(session/10, 50*time.Millisecond)
}

// defaultMaxUnfinished is MaxUnfinished's default for a batch size and an
// ordering.
func defaultMaxUnfinished(batch int, ordering string) int {
	if ordering == OrderingKey {
		return 4 * batch
	}
	return batch
}

func (c *Config) withDefaults() {
	if c.Start == "" {
		c.Start = StartEarliest
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = defaultHeartbeat(c.SessionTimeout)
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = 30 * time.Second
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = min(10*time.Second, c.RebalanceTimeout/2)
	}
	if c.MaxWait == 0 {
		c.MaxWait = 250 * time.Millisecond
	}
	if c.Ordering == "" {
		c.Ordering = OrderingPartition
	}
	if c.Isolation == "" {
		c.Isolation = IsolationReadCommitted
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = time.Second
	}
	if c.BatchSize == 0 {
		c.BatchSize = 100
	}
	if c.MaxUnfinished == 0 {
		c.MaxUnfinished = defaultMaxUnfinished(c.BatchSize, c.Ordering)
	}
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = 1 << 20
	}
	if c.FetchBufferBytes == 0 {
		c.FetchBufferBytes = max(DefaultFetchBufferBytes, c.FetchMaxBytes)
	}
	if c.NetworkTimeout == 0 {
		c.NetworkTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// DefaultFetchBufferBytes is Config.FetchBufferBytes's default, unless
// FetchMaxBytes is larger.
const DefaultFetchBufferBytes = 32 << 20

// ErrInvalidConfig is wrapped by every error New returns for a bad Config.
// New reports every bad field at once: its error joins one
// *consumer.ConfigError per field (errors.As finds the first), each with
// the Config field's Go path ("Start", "Brokers[1]", "SASL.Mechanism").
var ErrInvalidConfig = errors.New("dedup: kafka: invalid config")

// Validate checks c as New does, with its defaults filled in: nil, or the
// joined *consumer.ConfigError of every bad field.
func (c Config) Validate() error {
	c.withDefaults()
	return c.validate()
}

// validate checks a config whose defaults are filled in. Every error is a
// ConfigError naming the field.
func (c *Config) validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &consumer.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...), Err: ErrInvalidConfig})
	}
	if len(c.Brokers) == 0 {
		bad("Brokers", "at least one broker address (host:port) is required")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			bad(fmt.Sprintf("Brokers[%d]", i), "empty address: want host:port")
		}
	}
	if c.Topic == "" {
		bad("Topic", "required")
	}
	if c.GroupID == "" {
		bad("GroupID", "required")
	}
	if c.DeadLetterTopic != "" && c.DeadLetterTopic == c.Topic {
		bad("DeadLetterTopic", "%q is Topic: it must differ, or dead letters are consumed again", c.DeadLetterTopic)
	}
	oneOf := func(field, v string, valid ...string) {
		if !slices.Contains(valid, v) {
			bad(field, "%q: want %s", v, strings.Join(valid, " or "))
		}
	}
	oneOf("Start", c.Start, StartEarliest, StartLatest)
	oneOf("Ordering", c.Ordering, OrderingPartition, OrderingKey)
	oneOf("Isolation", c.Isolation, IsolationReadCommitted, IsolationReadUncommitted)
	positive := func(field string, d time.Duration) {
		if d <= 0 {
			bad(field, "%v: must be positive", d)
		}
	}
	positive("SessionTimeout", c.SessionTimeout)
	positive("HeartbeatInterval", c.HeartbeatInterval)
	positive("RebalanceTimeout", c.RebalanceTimeout)
	positive("RevokeTimeout", c.RevokeTimeout)
	positive("MaxWait", c.MaxWait)
	positive("CommitInterval", c.CommitInterval)
	positive("NetworkTimeout", c.NetworkTimeout)
	if c.HeartbeatInterval > 0 && c.SessionTimeout > 0 && c.HeartbeatInterval*3 > c.SessionTimeout {
		if c.HeartbeatInterval == defaultHeartbeat(c.SessionTimeout) {
			// The heartbeat is SessionTimeout's default: the field to
			// change is the one the caller set.
			bad("SessionTimeout", "%v: too short for the default HeartbeatInterval %v (a tenth of it, at least 50ms), which must fit in it three times: use at least 150ms", c.SessionTimeout, c.HeartbeatInterval)
		} else {
			bad("HeartbeatInterval", "%v: must be at most a third of SessionTimeout (%v)", c.HeartbeatInterval, c.SessionTimeout)
		}
	}
	if c.RevokeTimeout > 0 && c.RebalanceTimeout > 0 && c.RevokeTimeout >= c.RebalanceTimeout {
		bad("RevokeTimeout", "%v: must be shorter than RebalanceTimeout (%v), or the member is evicted while it drains", c.RevokeTimeout, c.RebalanceTimeout)
	}
	atLeastOne := func(field string, n int) {
		if n < 1 {
			bad(field, "%d: must be at least 1", n)
		}
	}
	atLeastOne("BatchSize", c.BatchSize)
	if c.BatchSize >= 1 || c.MaxUnfinished != defaultMaxUnfinished(c.BatchSize, c.Ordering) {
		// A MaxUnfinished derived from a bad BatchSize is that
		// field's error, reported above.
		atLeastOne("MaxUnfinished", c.MaxUnfinished)
	}
	atLeastOne("FetchMaxBytes", c.FetchMaxBytes)
	if c.FetchMaxBytes >= 1 && c.FetchBufferBytes < c.FetchMaxBytes {
		bad("FetchBufferBytes", "%d: must be at least FetchMaxBytes (%d), or no fetch fits: raise it or lower FetchMaxBytes", c.FetchBufferBytes, c.FetchMaxBytes)
	}
	if c.SASL != nil {
		if c.SASL.Username == "" {
			bad("SASL.Username", "required")
		}
		if _, err := c.SASL.mechanism(); err != nil {
			bad("SASL.Mechanism", "%v", err)
		}
	}
	return errors.Join(errs...)
}

func (s *SASL) mechanism() (sasl.Mechanism, error) {
	switch strings.ToUpper(s.Mechanism) {
	case SASLPlain:
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case SASLScramSHA256:
		return scram.Mechanism(scram.SHA256, s.Username, s.Password)
	case SASLScramSHA512:
		return scram.Mechanism(scram.SHA512, s.Username, s.Password)
	default:
		return nil, fmt.Errorf("%q: want %s, %s or %s", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
}

// dialer returns the dialer every connection uses: a copy of cfg.Dialer (or
// a default one) with the timeout, SASL and TLS settings applied.
func (c *Config) dialer() (*kafka.Dialer, error) {
	d := &kafka.Dialer{DualStack: true}
	if c.Dialer != nil {
		cp := *c.Dialer
		d = &cp
	}
	if d.Timeout == 0 {
		d.Timeout = c.NetworkTimeout
	}
	if c.SASL != nil {
		m, err := c.SASL.mechanism()
		if err != nil {
			return nil, err
		}
		d.SASLMechanism = m
	}
	if c.TLS != nil {
		d.TLS = c.TLS
	}
	return d, nil
}

// startOffset is the kafka-go start offset for cfg.Start.
func (c *Config) startOffset() int64 {
	if c.Start == StartLatest {
		return kafka.LastOffset
	}
	return kafka.FirstOffset
}

// isolationLevel is the fetch request's isolation level for cfg.Isolation.
func (c *Config) isolationLevel() kafka.IsolationLevel {
	if c.Isolation == IsolationReadUncommitted {
		return kafka.ReadUncommitted
	}
	return kafka.ReadCommitted
}
