package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/internal/redisprobe"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
)

// Defaults of Options and of NewFromURL's client.
const (
	DefaultNamespace   = "dedup"
	DefaultGrace       = 60 * time.Second
	DefaultPollFloor   = 50 * time.Millisecond
	DefaultPollCap     = time.Second
	DefaultDialTimeout = 5 * time.Second
	DefaultIOTimeout   = 3 * time.Second
)

// Options configure a Store. The zero value is valid: every zero field takes
// its default.
type Options struct {
	// Namespace prefixes every key ("<namespace>:<key>") and the
	// notification channel ("<namespace>:dedup:done"). Default "dedup". It
	// may not contain '{' or '}': a hash tag would pin every key to one
	// cluster slot.
	Namespace string
	// Grace is the least time a CLAIMED key outlives its lease (TTL =
	// lease + max(grace, the claim's ClaimRequest.Retention)), so an
	// expired claim is seen and reclaimed rather than vanishing; also the
	// least time a released record is kept. Default 60s.
	Grace time.Duration
	// Logger receives the store's warnings (a lost subscription, a script
	// reload). Default: discard.
	Logger *slog.Logger
	// PollFloor and PollCap bound Wait's re-reads: the first after
	// PollFloor, doubling up to PollCap. Defaults 50ms and 1s.
	PollFloor time.Duration
	PollCap   time.Duration
	// Durability makes the writes the engine acts on wait for replicas.
	// The zero value does not wait.
	Durability Durability
	// Hooks receive the store's own measurements: consumer.HookStoreCall
	// with op "wait" (OpReplicaWait) for every WAIT, and
	// consumer.HookDurabilityShortfall for every call that failed for want
	// of replicas, once per node that fell short (a Cluster primary's
	// address; "" on a single node). The engine's own hooks (idempotency.Config.Hooks) time
	// the Store's methods; these see inside them. Default: none.
	Hooks consumer.Hooks
	// LocalCache keeps the records this Store completed in process, so
	// that their duplicates are answered without Redis, and answers the
	// claims and Waits of keys this Store holds a live claim on (see
	// LocalCache for what it answers and its staleness bounds). The zero
	// value is off.
	LocalCache LocalCache
}

// Durability asks Redis, with WAIT, to confirm that a write reached
// replicas before the store reports it.
//
// With Replicas > 0, every Claim, Complete, Release and SaveStep sends
// WAIT Replicas Timeout right after its script, on the same connection in
// the same pipeline (on a ClusterClient, one pipeline per primary that ran a
// script), and succeeds only when at least Replicas replicas acknowledged
// it. Otherwise the call fails with an error wrapping ErrReplicaShortfall
// and idempotency.ErrStoreUnavailable: the engine then runs no handler and
// acks nothing, and retries with backoff. Renew does not wait:
// a renewal lost in a failover is made good by the next one, every lease/3.
//
// What this survives and what it does not is in the package documentation
// (Durability).
type Durability struct {
	// Replicas is how many replicas must acknowledge each write. 0 (the
	// default) sends no WAIT at all.
	Replicas int
	// Timeout is how long each WAIT may block (milliseconds; at least 1ms).
	// Required when Replicas > 0, and shorter than the client's read
	// timeout, which bounds the whole pipeline.
	Timeout time.Duration
}

// ErrInvalidOptions is wrapped by every error New and NewFromURL return for
// a bad Options value: a *consumer.ConfigError whose Field is the Go path
// under Options ("Grace", "Durability.Timeout", "LocalCache.TTL").
var ErrInvalidOptions = errors.New("dedup: redisbackend: invalid options")

// Validate checks o as New does, except for the limits that depend on the
// client (Durability.Timeout against its read timeout): nil, or the first
// bad field's *consumer.ConfigError.
func (o Options) Validate() error {
	_, err := o.withDefaults()
	return err
}

// invalidOption is the error for Options' field at the Go path field.
func invalidOption(field, format string, args ...any) error {
	return &consumer.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...), Err: ErrInvalidOptions}
}

// withDefaults returns o with defaults filled in, or an error naming the
// first bad field.
func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	if strings.ContainsAny(o.Namespace, "{}") {
		return o, invalidOption("Namespace", "%q contains '{' or '}': a hash tag would pin every key to one cluster slot", o.Namespace)
	}
	switch {
	case o.Grace < 0:
		return o, invalidOption("Grace", "%s: must not be negative (0 means %s)", o.Grace, DefaultGrace)
	case o.Grace == 0:
		o.Grace = DefaultGrace
	case o.Grace < time.Millisecond:
		return o, invalidOption("Grace", "%s: must be at least 1ms, the store's resolution", o.Grace)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.PollFloor < 0:
		return o, invalidOption("PollFloor", "%s: must not be negative (0 means %s)", o.PollFloor, DefaultPollFloor)
	case o.PollFloor == 0:
		o.PollFloor = DefaultPollFloor
	}
	switch d := o.Durability; {
	case d.Replicas < 0:
		return o, invalidOption("Durability.Replicas", "%d: must not be negative (0 waits for no replica)", d.Replicas)
	case d.Replicas > 0 && d.Timeout <= 0:
		return o, invalidOption("Durability.Timeout", "required when Durability.Replicas is %d: how long each WAIT may block, e.g. 50ms (a WAIT with timeout 0 blocks for ever)", d.Replicas)
	case d.Replicas > 0 && d.Timeout < time.Millisecond:
		return o, invalidOption("Durability.Timeout", "%s: must be at least 1ms (WAIT counts milliseconds)", d.Timeout)
	}
	switch lc := o.LocalCache; {
	case lc.Entries < 0:
		return o, invalidOption("LocalCache.Entries", "%d: must not be negative (0 turns the cache off)", lc.Entries)
	case lc.TTL < 0:
		return o, invalidOption("LocalCache.TTL", "%s: must not be negative; it bounds how long a cached record answers, e.g. 10s", lc.TTL)
	case lc.Entries > 0 && lc.TTL < time.Millisecond:
		return o, invalidOption("LocalCache.TTL", "%s: must be at least 1ms when LocalCache.Entries is %d, e.g. 10s: it bounds how long a cached record answers", lc.TTL, lc.Entries)
	case lc.Entries == 0 && lc.TTL > 0:
		return o, invalidOption("LocalCache.Entries", "0 with LocalCache.TTL %s: set Entries to turn the cache on, or leave TTL zero", lc.TTL)
	}
	switch {
	case o.PollCap < 0:
		return o, invalidOption("PollCap", "%s: must not be negative (0 means %s or PollFloor)", o.PollCap, DefaultPollCap)
	case o.PollCap == 0:
		o.PollCap = max(DefaultPollCap, o.PollFloor)
	case o.PollCap < o.PollFloor:
		return o, invalidOption("PollCap", "%s is less than PollFloor %s: want PollFloor <= PollCap", o.PollCap, o.PollFloor)
	}
	return o, nil
}

// ClientOption adjusts the client options NewFromURL parsed from its URL,
// before the client is made (for example a TLS root CA, pool size or a
// credentials provider).
type ClientOption func(*redis.Options)

// NewFromURL connects to the Redis at url and returns a Store that owns the
// client (Close closes it). url is redis://[user:password@]host[:port][/db]
// or rediss:// for TLS, with go-redis's query parameters (dial_timeout,
// read_timeout, ...). A connect timeout is always set (default 5s, and
// never disabled), read and write timeouts default to 3s, and the client
// honours context deadlines. The server must answer a PING within the
// connect timeout (and ctx), else NewFromURL fails with an error wrapping
// idempotency.ErrStoreUnavailable and naming the address.
func NewFromURL(ctx context.Context, rawURL string, opts Options, clientOpts ...ClientOption) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error repeats the URL, password included: say less.
		return nil, errors.New("dedup: redisbackend: url: not a valid URL, want redis://[user:password@]host[:port][/db] or rediss://host:port for TLS")
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, fmt.Errorf("dedup: redisbackend: url: scheme %q is not supported, want redis:// or rediss://", u.Scheme)
	}
	ro, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("dedup: redisbackend: url: %w", err)
	}
	if ro.DialTimeout <= 0 {
		ro.DialTimeout = DefaultDialTimeout
	}
	if ro.ReadTimeout == 0 {
		ro.ReadTimeout = DefaultIOTimeout
	}
	if ro.WriteTimeout == 0 {
		ro.WriteTimeout = DefaultIOTimeout
	}
	ro.ContextTimeoutEnabled = true
	for _, o := range clientOpts {
		o(ro)
	}
	if ro.DialTimeout <= 0 {
		ro.DialTimeout = DefaultDialTimeout
	}
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, err := redisprobe.Node(ctx, ro); err != nil {
		return nil, storeErr("connect to "+ro.Addr, err)
	}
	client := redis.NewClient(ro)
	s, err := newStore(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.ownsClient = true
	return s, nil
}
