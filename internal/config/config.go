package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/transports/kafkasource"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// Config is the whole file.
type Config struct {
	Redis           Redis     `yaml:"redis"`
	HTTP            HTTP      `yaml:"http"`
	Log             Log       `yaml:"log"`
	ShutdownTimeout Duration  `yaml:"shutdown_timeout"`
	Handlers        []Handler `yaml:"handlers"`
}

// Redis says where the deduplication store is: exactly
// one of URL, Addrs or Sentinel. Username, Password, PasswordFile and TLS
// are those of the data nodes, whichever of the three finds them.
type Redis struct {
	// URL is redis://[user:password@]host:port/db or rediss:// for TLS. A
	// URL that names a Cluster node (INFO says cluster_enabled:1) gets a
	// Cluster client seeded with that node.
	URL string `yaml:"url"`
	// Addrs lists Redis Cluster seed nodes (host:port), instead of URL.
	Addrs []string `yaml:"addrs"`
	// Sentinel finds the primary through Redis Sentinel, instead of URL.
	Sentinel *Sentinel `yaml:"sentinel"`
	// Username and Password (or PasswordFile) authenticate to the data
	// nodes; a username or password in URL is overridden by these.
	Username     string `yaml:"username"`
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
	// TLS configures TLS to the data nodes, and to the Sentinels too
	// (go-redis dials both with one TLS configuration).
	TLS            *TLS     `yaml:"tls"`
	Namespace      string   `yaml:"namespace"`
	Grace          Duration `yaml:"grace"`
	ConnectTimeout Duration `yaml:"connect_timeout"`
	// Durability makes every claim and completion wait for replicas
	// before the worker acts on it, so that a failover to a replica keeps
	// them. The zero value waits for none.
	Durability Durability `yaml:"durability"`
	// LocalCache answers the duplicates of keys this worker completed from
	// memory, without Redis; on by default (see LocalCache).
	LocalCache LocalCache `yaml:"local_cache"`
	// CompletionLinger is how long the completions of a forward action's
	// run may wait, while another handler is running, for other runs' to
	// share their Redis call (idempotency.Config.CompletionLinger): at a
	// steady rate the round trips fall, and the run's acks wait up to this
	// long. One setting for the process: its handlers share one engine.
	// Omitted, the library's default (3ms), which Parse fills in; 0s turns
	// the linger off; at most MaxCompletionLinger. Nil only in a Redis built without Parse.
	CompletionLinger *Duration `yaml:"completion_linger"`
}

// MaxCompletionLinger is the longest redis.completion_linger the config
// takes: the linger exists to share a Redis call among runs that finish
// milliseconds apart, and a longer one (3s written for 3ms) would only hold
// every forward run's acks, and on NATS its concurrency slot, that long.
const MaxCompletionLinger = time.Second

// Defaults of redis.local_cache.
const (
	DefaultLocalCacheEntries = 10_000
	DefaultLocalCacheTTL     = 10 * time.Second
)

// LocalCache is redis.local_cache: the worker keeps the records it
// completed, at most Entries of them for at most TTL each (never longer
// than the record's retention), and answers their duplicates without a
// Redis call. A forget (dedupworker forget) reaches every worker's cache
// through Redis Pub/Sub; a record that changes otherwise (deleted by hand,
// evicted) may be answered from a cache for up to TTL. A duplicate of a key
// the worker is still running is answered in flight from memory too, and
// waits in memory for that run's completion; if the worker's claim was
// lost without it knowing, that lasts until the claim's lease end at most.
type LocalCache struct {
	// Entries is the most records kept; default 10000, 0 turns the cache
	// off.
	Entries *int `yaml:"entries"`
	// TTL bounds how long an entry answers, and so how stale an answer can
	// be; default 10s, at least 1ms.
	TTL Duration `yaml:"ttl"`
}

// Size is Entries with its default: the cache's bound, 0 when off.
func (l LocalCache) Size() int {
	if l.Entries == nil {
		return DefaultLocalCacheEntries
	}
	return *l.Entries
}

// TTLOrDefault is TTL with its default, for a Redis built without Parse
// (inspect's and forget's flags).
func (l LocalCache) TTLOrDefault() time.Duration {
	if l.TTL == 0 {
		return DefaultLocalCacheTTL
	}
	return l.TTL.D()
}

// Durability is redis.durability: WAIT Replicas Timeout after every claim,
// completion, release and step; a write fewer replicas acknowledged in time
// fails closed: the message is not acked, and is delivered again.
type Durability struct {
	// Replicas is how many replicas must acknowledge each write; 0 (the
	// default) sends no WAIT.
	Replicas int `yaml:"replicas"`
	// Timeout is how long each WAIT may block; required, at least 1ms,
	// when Replicas > 0.
	Timeout Duration `yaml:"timeout"`
}

// Sentinel names a primary monitored by Redis Sentinel and the Sentinels to
// ask for it. Username and Password (or PasswordFile) are the Sentinels'
// own credentials (their requirepass or ACL user), not the data nodes'.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string `yaml:"master"`
	// Addrs are the Sentinels (host:port).
	Addrs        []string `yaml:"addrs"`
	Username     string   `yaml:"username"`
	Password     Secret   `yaml:"password"`
	PasswordFile string   `yaml:"password_file"`
}

// TLS configures a TLS client.
type TLS struct {
	CAFile             string `yaml:"ca_file"`
	CertFile           string `yaml:"cert_file"`
	KeyFile            string `yaml:"key_file"`
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// HTTP configures the metrics and health server: /metrics, /healthz and
// /readyz.
type HTTP struct {
	// Addr is host:port; nil means the default 127.0.0.1:9464 and "" turns
	// the server off.
	Addr *string `yaml:"addr"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // json or text
}

// Handler is one deduplicated consumer.
type Handler struct {
	Name               string      `yaml:"name"`
	Source             Source      `yaml:"source"`
	Key                []string    `yaml:"key"`
	MissingKey         string      `yaml:"missing_key"`
	Mismatch           string      `yaml:"mismatch"`
	FingerprintHeaders []string    `yaml:"fingerprint_headers"`
	Lease              Duration    `yaml:"lease"`
	Retention          Duration    `yaml:"retention"`
	InFlightWait       Duration    `yaml:"in_flight_wait"`
	MaxAttempts        int         `yaml:"max_attempts"`
	Backoff            Backoff     `yaml:"backoff"`
	Concurrency        int         `yaml:"concurrency"`
	Ordering           string      `yaml:"ordering"`
	Mode               string      `yaml:"mode"`
	FailOpen           bool        `yaml:"fail_open"`
	Action             Action      `yaml:"action"`
	DeadLetter         *DeadLetter `yaml:"dead_letter"`
}

// Backoff is the retry backoff after handler errors.
type Backoff struct {
	Initial Duration `yaml:"initial"`
	Max     Duration `yaml:"max"`
}

// Source is exactly one of Kafka or NATS.
type Source struct {
	Kafka *KafkaSource `yaml:"kafka"`
	NATS  *NATSSource  `yaml:"nats"`
}

// KafkaSource is a Kafka consumer group.
type KafkaSource struct {
	Brokers        []string `yaml:"brokers"`
	Topic          string   `yaml:"topic"`
	Group          string   `yaml:"group"`
	Start          string   `yaml:"start"`
	SessionTimeout Duration `yaml:"session_timeout"`
	CommitInterval Duration `yaml:"commit_interval"`
	SASL           *SASL    `yaml:"sasl"`
	TLS            *TLS     `yaml:"tls"`
	// Isolation is read_committed (default: records of aborted
	// transactions are never handled) or read_uncommitted.
	Isolation string `yaml:"isolation"`
	// FetchBufferBytes caps the heap the source holds in fetched messages
	// not yet done, across its partitions (kafkasource.Config's field of
	// the name). Default 32 MiB.
	FetchBufferBytes int `yaml:"fetch_buffer_bytes"`
}

// minFetchBufferBytes is the smallest fetch_buffer_bytes: one Kafka fetch
// of the size the source asks for (kafkasource.Config.FetchMaxBytes's
// default), one message of a NATS server's default max_payload. The
// libraries take less (a message larger than the bound is taken alone); a
// file's smaller value is more likely a unit mistaken than a choice.
const minFetchBufferBytes = 1 << 20

// SASL configures Kafka authentication.
type SASL struct {
	Mechanism    string `yaml:"mechanism"` // plain, scram-sha-256, scram-sha-512
	Username     string `yaml:"username"`
	Password     Secret `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// NATSSource is a JetStream durable pull consumer.
type NATSSource struct {
	URL      string   `yaml:"url"`
	Stream   string   `yaml:"stream"`
	Consumer string   `yaml:"consumer"`
	Subject  string   `yaml:"subject"`
	AckWait  Duration `yaml:"ack_wait"`
	// MaxAckPending is the MaxAckPending of a consumer the worker creates;
	// 0 means the handler's concurrency, or for a forward action (a batch
	// handler, whose concurrency counts runs of up to max(concurrency, 128)
	// messages) concurrency × max(concurrency, 128), at most 4096. Workers
	// sharing one durable consumer share this window: set it to replicas
	// times that.
	MaxAckPending int `yaml:"max_ack_pending"`
	// FetchBufferBytes caps the bytes of the messages the source holds
	// received and not yet acked or nakked (natssource.Config's field of
	// the name). Default 32 MiB.
	FetchBufferBytes int `yaml:"fetch_buffer_bytes"`
	NATSAuth         `yaml:",inline"`
}

// NATSAuth holds NATS credentials; at most one kind is used.
type NATSAuth struct {
	User      string `yaml:"user"`
	Password  Secret `yaml:"password"`
	Token     Secret `yaml:"token"`
	CredsFile string `yaml:"creds_file"`
	TLS       *TLS   `yaml:"tls"`
}

// Action is exactly one of Forward, HTTP or Exec: what runs once per key.
type Action struct {
	Forward *Forward    `yaml:"forward"`
	HTTP    *HTTPAction `yaml:"http"`
	Exec    *ExecAction `yaml:"exec"`
}

// Forward publishes the message to Kafka or NATS.
type Forward struct {
	Kafka *KafkaOut `yaml:"kafka"`
	NATS  *NATSOut  `yaml:"nats"`
}

// KafkaOut is a Kafka destination. Brokers and credentials default to the
// handler's Kafka source.
type KafkaOut struct {
	Brokers []string `yaml:"brokers"`
	Topic   string   `yaml:"topic"`
	SASL    *SASL    `yaml:"sasl"`
	TLS     *TLS     `yaml:"tls"`
}

// NATSOut is a NATS destination. URL and credentials default to the
// handler's NATS source.
type NATSOut struct {
	URL      string `yaml:"url"`
	Subject  string `yaml:"subject"`
	NATSAuth `yaml:",inline"`
}

// HTTPAction POSTs the message.
type HTTPAction struct {
	URL            string            `yaml:"url"`
	Timeout        Duration          `yaml:"timeout"`
	MaxResultBytes int               `yaml:"max_result_bytes"`
	Headers        map[string]string `yaml:"headers"`
	// TLS verifies an https:// server against ca_file (the system roots
	// without it) and presents cert_file/key_file to one that asks for a
	// client certificate.
	TLS *TLS `yaml:"tls"`
}

// ExecAction runs a command with the payload on stdin.
type ExecAction struct {
	Command        []string `yaml:"command"`
	Timeout        Duration `yaml:"timeout"`
	MaxOutputBytes int      `yaml:"max_output_bytes"`
	// Env names the worker's environment variables the command sees besides
	// PATH, HOME, LANG, TZ and the DEDUP_* variables; the rest of the
	// worker's environment, secrets included, is not passed on.
	Env []string `yaml:"env"`
}

// DeadLetter is exactly one of Kafka or NATS.
type DeadLetter struct {
	Kafka *KafkaOut       `yaml:"kafka"`
	NATS  *DeadLetterNATS `yaml:"nats"`
}

// DeadLetterNATS is a dead-letter subject on the source's server.
type DeadLetterNATS struct {
	NATSOut `yaml:",inline"`
	// Core says that dead letters are meant for core NATS subscribers: the
	// worker then starts although no JetStream stream captures Subject, and
	// a dead letter published while no subscriber listens is gone. Without
	// it (the default), run and validate --online refuse a dead-letter
	// subject that no stream captures, since a dead-lettered message is
	// acked.
	Core bool `yaml:"core,omitempty"`
}

// natsOut is the destination of a NATS dead letter, nil when there is
// none.
func (dl *DeadLetter) natsOut() *NATSOut {
	if dl.NATS == nil {
		return nil
	}
	return &dl.NATS.NATSOut
}

// Defaults.
const (
	DefaultHTTPAddr       = "127.0.0.1:9464"
	DefaultMaxResultBytes = 1 << 20
)

// Load reads, expands, decodes, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data, os.LookupEnv)
}

// Parse decodes, defaults and validates YAML text. lookupEnv resolves
// ${NAME} references (os.LookupEnv when nil).
func Parse(data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	var c Config
	lines, err := parse(data, &c, lookupEnv)
	if err != nil {
		return nil, err
	}
	c.fillDefaults()
	if err := c.validate(lines); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) fillDefaults() {
	if c.Redis.URL == "" && len(c.Redis.Addrs) == 0 && c.Redis.Sentinel == nil {
		c.Redis.URL = "redis://127.0.0.1:6379/0"
	}
	setDefault(&c.Redis.Namespace, "dedup")
	setDur(&c.Redis.Grace, 60*time.Second)
	setDur(&c.Redis.ConnectTimeout, 5*time.Second)
	if c.Redis.LocalCache.Entries == nil {
		n := DefaultLocalCacheEntries
		c.Redis.LocalCache.Entries = &n
	}
	setDur(&c.Redis.LocalCache.TTL, DefaultLocalCacheTTL)
	if c.Redis.CompletionLinger == nil {
		d := Duration(idempotency.DefaultCompletionLinger)
		c.Redis.CompletionLinger = &d
	}
	if c.HTTP.Addr == nil {
		a := DefaultHTTPAddr
		c.HTTP.Addr = &a
	}
	setDefault(&c.Log.Level, "info")
	setDefault(&c.Log.Format, "json")
	setDur(&c.ShutdownTimeout, 30*time.Second)
	for i := range c.Handlers {
		h := &c.Handlers[i]
		if len(h.Key) == 0 {
			h.Key = []string{"header:Idempotency-Key"}
		}
		setDefault(&h.MissingKey, string(idempotency.MissingKeyReject))
		setDefault(&h.Mismatch, string(idempotency.MismatchReject))
		setDur(&h.Lease, 30*time.Second)
		setDur(&h.Retention, 24*time.Hour)
		setDur(&h.InFlightWait, h.Lease.D())
		if h.MaxAttempts == 0 {
			h.MaxAttempts = 5
		}
		setDur(&h.Backoff.Initial, time.Second)
		setDur(&h.Backoff.Max, 5*time.Minute)
		if h.Concurrency == 0 {
			h.Concurrency = 16
		}
		setDefault(&h.Ordering, "partition")
		setDefault(&h.Mode, "enforce")
		if k := h.Source.Kafka; k != nil {
			setDefault(&k.Start, "earliest")
			setDefault(&k.Isolation, "read_committed")
			setDur(&k.SessionTimeout, 10*time.Second)
			setDur(&k.CommitInterval, time.Second)
			if k.FetchBufferBytes == 0 {
				k.FetchBufferBytes = kafkasource.DefaultFetchBufferBytes
			}
			if k.Group == "" && h.Name != "" {
				k.Group = h.Name + "-dedup"
			}
		}
		if n := h.Source.NATS; n != nil {
			setDur(&n.AckWait, h.Lease.D())
			if n.FetchBufferBytes == 0 {
				n.FetchBufferBytes = natssource.DefaultFetchBufferBytes
			}
			if n.Consumer == "" && h.Name != "" {
				n.Consumer = h.Name + "-dedup"
			}
		}
		if a := h.Action.HTTP; a != nil {
			setDur(&a.Timeout, 10*time.Second)
			if a.MaxResultBytes == 0 {
				a.MaxResultBytes = DefaultMaxResultBytes
			}
		}
		if a := h.Action.Exec; a != nil {
			setDur(&a.Timeout, h.Lease.D())
			if a.MaxOutputBytes == 0 {
				a.MaxOutputBytes = DefaultMaxResultBytes
			}
		}
		h.defaultOutputs()
	}
}

// defaultOutputs fills a forward or dead-letter destination's brokers/URL and
// credentials from the handler's source of the same kind.
func (h *Handler) defaultOutputs() {
	outsK := []*KafkaOut{}
	outsN := []*NATSOut{}
	if f := h.Action.Forward; f != nil {
		outsK, outsN = appendNonNil(outsK, f.Kafka), appendNonNil(outsN, f.NATS)
	}
	if dl := h.DeadLetter; dl != nil {
		outsK, outsN = appendNonNil(outsK, dl.Kafka), appendNonNil(outsN, dl.natsOut())
	}
	if k := h.Source.Kafka; k != nil {
		for _, o := range outsK {
			if len(o.Brokers) == 0 {
				o.Brokers = slices.Clone(k.Brokers)
				if o.SASL == nil {
					o.SASL = k.SASL
				}
				if o.TLS == nil {
					o.TLS = k.TLS
				}
			}
		}
	}
	if n := h.Source.NATS; n != nil {
		for _, o := range outsN {
			if o.URL == "" {
				o.URL = n.URL
				if o.NATSAuth == (NATSAuth{}) {
					o.NATSAuth = n.NATSAuth
				}
			}
		}
	}
}

func appendNonNil[T any](s []*T, v *T) []*T {
	if v != nil {
		return append(s, v)
	}
	return s
}

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

func setDur(d *Duration, v time.Duration) {
	if *d == 0 {
		*d = Duration(v)
	}
}

var validName = regexp.MustCompile(`^[A-Za-z0-9_.\-]{1,64}$`)

// envName is a portable environment variable name (POSIX: letters, digits
// and _, not starting with a digit).
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// validate checks what decoding cannot: required fields, choices, exclusive
// options. The values it hands to the library (the store's options, the
// engine's options, the sources' configs) are checked by the packages that
// take them, and their errors mapped to the YAML field (libraryError).
// Errors carry the line of the field, or of its parent when the field is
// missing.
func (c *Config) validate(lines map[string]int) error {
	fail := func(path, format string, args ...any) error {
		return &Error{Path: path, Line: lineOf(lines, path), Msg: fmt.Sprintf(format, args...)}
	}
	if c.Redis.URL != "" && len(c.Redis.Addrs) > 0 {
		return fail("redis.addrs", "give either redis.url or redis.addrs (Cluster seeds), not both")
	}
	if err := c.Redis.validateSentinel(fail); err != nil {
		return err
	}
	if u := c.Redis.URL; u != "" && !strings.HasPrefix(u, "redis://") && !strings.HasPrefix(u, "rediss://") {
		return fail("redis.url", "%q: want redis://host:port/db or rediss:// for TLS", u)
	}
	if c.Redis.Password != "" && c.Redis.PasswordFile != "" {
		return fail("redis.password_file", "give either password or password_file, not both")
	}
	if err := libraryError(c.Redis.StoreOptions().Validate(), "redis", storeFields, lines); err != nil {
		return err
	}
	if l := c.Redis.CompletionLinger; l != nil && l.D() > MaxCompletionLinger {
		return fail("redis.completion_linger", "%s would hold each forward run's acks that long: want at most %s (the default is %s; 0s turns it off)",
			*l, Duration(MaxCompletionLinger), Duration(idempotency.DefaultCompletionLinger))
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		return fail("log.level", "%q: want debug, info, warn or error", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "text" {
		return fail("log.format", "%q: want json or text", c.Log.Format)
	}
	if len(c.Handlers) == 0 {
		return fail("handlers", "at least one handler is required")
	}
	names := map[string]int{}
	for i := range c.Handlers {
		h := &c.Handlers[i]
		p := fmt.Sprintf("handlers[%d]", i)
		if !validName.MatchString(h.Name) {
			return fail(p+".name", "%q: required, 1-64 letters, digits, '_', '.' or '-'", h.Name)
		}
		if j, dup := names[h.Name]; dup {
			return fail(p+".name", "%q is also the name of handlers[%d]", h.Name, j)
		}
		names[h.Name] = i
		if err := h.validate(p, fail, lines); err != nil {
			return err
		}
	}
	return nil
}

// lineOf is the line of the field at path, or of its nearest parent that
// the file holds when the field is absent.
func lineOf(lines map[string]int, path string) int {
	line := lines[path]
	for p := path; line == 0 && p != ""; {
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
		line = lines[p]
	}
	return line
}

type failFunc func(path, format string, args ...any) error

// validateSentinel checks redis.sentinel: the only way to the store when
// given, with a master name, at least one Sentinel, and one kind of
// password.
func (r *Redis) validateSentinel(fail failFunc) error {
	s := r.Sentinel
	switch {
	case s == nil:
		return nil
	case r.URL != "":
		return fail("redis.sentinel", "give either redis.url or redis.sentinel, not both (the Sentinels name the primary)")
	case len(r.Addrs) > 0:
		return fail("redis.sentinel", "give either redis.addrs (Cluster seeds) or redis.sentinel, not both; the Sentinels go in redis.sentinel.addrs")
	case s.Master == "":
		return fail("redis.sentinel.master", "required: the name the Sentinels monitor the primary under (sentinel monitor NAME ...)")
	case len(s.Addrs) == 0:
		return fail("redis.sentinel.addrs", "required: at least one Sentinel host:port")
	case s.Password != "" && s.PasswordFile != "":
		return fail("redis.sentinel.password_file", "give either password or password_file, not both")
	}
	for i, a := range s.Addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fail(fmt.Sprintf("redis.sentinel.addrs[%d]", i), "%q: want host:port, e.g. 127.0.0.1:26379", a)
		}
	}
	return nil
}

// validate checks handlers[i] at path p. What the engine and the source
// check of the values built from it is asked of them (libraryError): the
// engine's options after the keys parse, the source's config after them
// (ack_wait defaults to the lease), both before the action and the
// dead-letter destination, which take the source's brokers or URL.
func (h *Handler) validate(p string, fail failFunc, lines map[string]int) error {
	switch {
	case h.Source.Kafka != nil && h.Source.NATS != nil:
		return fail(p+".source", "two sources: give exactly one of kafka or nats")
	case h.Source.Kafka == nil && h.Source.NATS == nil:
		return fail(p+".source", "required: give exactly one of kafka or nats")
	}
	if k := h.Source.Kafka; k != nil {
		// SASL goes to the dialer, not to the source's Config.
		if err := validateSASL(p+".source.kafka.sasl", k.SASL, fail); err != nil {
			return err
		}
		// The library's own check names FetchMaxBytes, which a file does
		// not set.
		if k.FetchBufferBytes < minFetchBufferBytes {
			return fail(p+".source.kafka.fetch_buffer_bytes", "%d: must be at least %d (1 MiB, one fetch); leave it out for the default, %d (32 MiB)", k.FetchBufferBytes, minFetchBufferBytes, kafkasource.DefaultFetchBufferBytes)
		}
	}
	if n := h.Source.NATS; n != nil {
		// The url is the connection's, not the source's Config.
		if n.URL == "" {
			return fail(p+".source.nats.url", "required, e.g. nats://127.0.0.1:4222")
		}
		if h.Ordering == "key" {
			return fail(p+".ordering", "ordering: key is for Kafka sources; NATS runs up to concurrency messages in any order")
		}
		if n.FetchBufferBytes < minFetchBufferBytes {
			return fail(p+".source.nats.fetch_buffer_bytes", "%d: must be at least %d (1 MiB, the servers' default max_payload); leave it out for the default, %d (32 MiB)", n.FetchBufferBytes, minFetchBufferBytes, natssource.DefaultFetchBufferBytes)
		}
	}
	for i, k := range h.Key {
		if _, err := idempotency.ParseKeySource(k); err != nil {
			return fail(fmt.Sprintf("%s.key[%d]", p, i), "%v", err)
		}
		if k == "kafka-key" && h.Source.Kafka == nil {
			return fail(fmt.Sprintf("%s.key[%d]", p, i), "kafka-key needs a kafka source")
		}
	}
	if err := libraryError(idempotency.ValidateOptions(h.DedupOptions()...), p, handlerOptionFields, lines); err != nil {
		return err
	}
	// After the lease: the NATS ack_wait defaults to it.
	if h.Source.Kafka != nil {
		if err := libraryError(h.KafkaConfig().Validate(), p, kafkaFields, lines); err != nil {
			return err
		}
	} else if err := libraryError(h.NATSConfig().Validate(), p, natsFields, lines); err != nil {
		return err
	}
	switch {
	case h.Concurrency < 1 || h.Concurrency > 10000:
		return fail(p+".concurrency", "%d: want 1 to 10000", h.Concurrency)
	case h.Ordering != "partition" && h.Ordering != "key":
		return fail(p+".ordering", "%q: want partition or key", h.Ordering)
	case h.Mode != "enforce" && h.Mode != "shadow":
		return fail(p+".mode", "%q: want enforce or shadow", h.Mode)
	}
	if err := h.validateAction(p, fail); err != nil {
		return err
	}
	if dl := h.DeadLetter; dl != nil {
		dp := p + ".dead_letter"
		if err := validateOut(dp, dl.Kafka, dl.natsOut(), h, fail); err != nil {
			return err
		}
		// The transport publishes dead letters on its own connection.
		switch {
		case h.Source.Kafka != nil && dl.Kafka == nil:
			return fail(dp, "a Kafka source dead-letters to a Kafka topic: use dead_letter: {kafka: {topic: ...}}")
		case h.Source.NATS != nil && dl.NATS == nil:
			return fail(dp, "a NATS source dead-letters to a NATS subject: use dead_letter: {nats: {subject: ...}}")
		case dl.Kafka != nil && !sameBrokers(dl.Kafka.Brokers, h.Source.Kafka.Brokers):
			return fail(dp+".kafka.brokers", "the dead-letter topic must be on the source's cluster; leave brokers out")
		case dl.NATS != nil && dl.NATS.URL != h.Source.NATS.URL:
			return fail(dp+".nats.url", "the dead-letter subject must be on the source's server; leave url out")
		// ... and with the source's credentials: others would be ignored.
		case dl.Kafka != nil && dl.Kafka.SASL != nil && !reflect.DeepEqual(dl.Kafka.SASL, h.Source.Kafka.SASL):
			return fail(dp+".kafka.sasl", "dead letters are published with the source's credentials; leave sasl out")
		case dl.Kafka != nil && dl.Kafka.TLS != nil && !reflect.DeepEqual(dl.Kafka.TLS, h.Source.Kafka.TLS):
			return fail(dp+".kafka.tls", "dead letters are published on the source's connection; leave tls out")
		case dl.NATS != nil && dl.NATS.NATSAuth != (NATSAuth{}) && !reflect.DeepEqual(dl.NATS.NATSAuth, h.Source.NATS.NATSAuth):
			return fail(dp+".nats", "dead letters are published with the source's credentials; leave user, password, token, creds_file and tls out")
		}
	}
	return nil
}

func (h *Handler) validateAction(p string, fail failFunc) error {
	a := h.Action
	n := 0
	for _, set := range []bool{a.Forward != nil, a.HTTP != nil, a.Exec != nil} {
		if set {
			n++
		}
	}
	ap := p + ".action"
	switch {
	case n == 0:
		return fail(ap, "required: give exactly one of forward, http or exec")
	case n > 1:
		return fail(ap, "two actions: give exactly one of forward, http or exec")
	}
	switch {
	case a.Forward != nil:
		return validateOut(ap+".forward", a.Forward.Kafka, a.Forward.NATS, h, fail)
	case a.HTTP != nil:
		if !strings.HasPrefix(a.HTTP.URL, "http://") && !strings.HasPrefix(a.HTTP.URL, "https://") {
			return fail(ap+".http.url", "%q: want an http:// or https:// URL", a.HTTP.URL)
		}
		if a.HTTP.MaxResultBytes < 0 {
			return fail(ap+".http.max_result_bytes", "must not be negative")
		}
		if t := a.HTTP.TLS; t != nil {
			if !strings.HasPrefix(a.HTTP.URL, "https://") {
				return fail(ap+".http.tls", "set for %q: TLS needs an https:// URL", a.HTTP.URL)
			}
			if (t.CertFile == "") != (t.KeyFile == "") {
				return fail(ap+".http.tls", "give cert_file and key_file together (the client certificate and its key)")
			}
		}
	case a.Exec != nil:
		if len(a.Exec.Command) == 0 || a.Exec.Command[0] == "" {
			return fail(ap+".exec.command", "required: the program and its arguments, e.g. [/usr/local/bin/handle, --flag]")
		}
		if a.Exec.MaxOutputBytes < 0 {
			return fail(ap+".exec.max_output_bytes", "must not be negative")
		}
		for i, name := range a.Exec.Env {
			ep := fmt.Sprintf("%s.exec.env[%d]", ap, i)
			switch {
			case !envName.MatchString(name):
				return fail(ep, "%q: want the name of an environment variable (letters, digits, _), e.g. API_TOKEN; its value comes from the worker's environment", name)
			case strings.HasPrefix(name, "DEDUP_"):
				return fail(ep, "%q: the DEDUP_* variables are set by the action itself; leave it out", name)
			}
		}
	}
	return nil
}

func validateOut(p string, k *KafkaOut, n *NATSOut, h *Handler, fail failFunc) error {
	switch {
	case k != nil && n != nil:
		return fail(p, "give exactly one of kafka or nats, not both")
	case k == nil && n == nil:
		return fail(p, "required: give one of kafka or nats")
	case k != nil:
		if len(k.Brokers) == 0 {
			return fail(p+".kafka.brokers", "required when the source is not Kafka")
		}
		if k.Topic == "" {
			return fail(p+".kafka.topic", "required")
		}
		if h.Source.Kafka != nil && k.Topic == h.Source.Kafka.Topic && sameBrokers(k.Brokers, h.Source.Kafka.Brokers) {
			return fail(p+".kafka.topic", "%q is the source topic: that would loop", k.Topic)
		}
		return validateSASL(p+".kafka.sasl", k.SASL, fail)
	default:
		if n.URL == "" {
			return fail(p+".nats.url", "required when the source is not NATS")
		}
		if n.Subject == "" {
			return fail(p+".nats.subject", "required")
		}
	}
	return nil
}

func sameBrokers(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func validateSASL(p string, s *SASL, fail failFunc) error {
	if s == nil {
		return nil
	}
	if !slices.Contains([]string{"plain", "scram-sha-256", "scram-sha-512"}, s.Mechanism) {
		return fail(p+".mechanism", "%q: want plain, scram-sha-256 or scram-sha-512", s.Mechanism)
	}
	if s.Username == "" {
		return fail(p+".username", "required")
	}
	if s.Password == "" && s.PasswordFile == "" {
		return fail(p+".password", "required (or password_file)")
	}
	return nil
}

// Print renders the configuration with defaults filled in and secrets
// redacted, as validate --print shows it: Secret fields, and credentials
// written inside the Redis and NATS URLs.
func (c *Config) Print() ([]byte, error) {
	cp := *c
	cp.Redis.URL = RedactURL(cp.Redis.URL)
	cp.Handlers = slices.Clone(c.Handlers)
	redactNATS := func(o *NATSOut) *NATSOut {
		if o == nil {
			return nil
		}
		o2 := *o
		o2.URL = RedactURL(o2.URL)
		return &o2
	}
	for i := range cp.Handlers {
		h := &cp.Handlers[i]
		if n := h.Source.NATS; n != nil {
			n2 := *n
			n2.URL = RedactURL(n2.URL)
			h.Source.NATS = &n2
		}
		if f := h.Action.Forward; f != nil {
			f2 := *f
			f2.NATS = redactNATS(f2.NATS)
			h.Action.Forward = &f2
		}
		if dl := h.DeadLetter; dl != nil {
			dl2 := *dl
			if dl2.NATS != nil {
				n := *dl2.NATS
				n.NATSOut = *redactNATS(&n.NATSOut)
				dl2.NATS = &n
			}
			h.DeadLetter = &dl2
		}
	}
	return yaml.Marshal(&cp)
}

// RedactURL hides the credentials of a URL, or of each URL of a
// comma-separated list (NATS): a password, or a user without a password
// (a NATS token), reads "<redacted>". When some part holds no URL user but
// the text holds '@', where credentials end is unclear and the whole text is
// redacted.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		switch {
		case err == nil && u.User != nil:
			parts[i] = redactUser(u)
		case strings.Contains(p, "@") || err != nil && strings.Contains(s, "@"):
			// One URL whose password holds ',', or not a URL at all.
			if u, err := url.Parse(s); err == nil && u.User != nil && !strings.Contains(u.Host, ",") {
				return redactUser(u)
			}
			return "<redacted>"
		}
	}
	return strings.Join(parts, ",")
}

func redactUser(u *url.URL) string {
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "<redacted>")
	} else {
		u.User = url.User("<redacted>")
	}
	return strings.Replace(u.String(), url.QueryEscape("<redacted>"), "<redacted>", 1)
}
