package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafkasource"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// The limits of the values this file builds are checked by the packages
// that take them: validate builds each value, asks the package, and turns
// its *consumer.ConfigError into an *Error at the YAML path that the
// value's field comes from, through one table per value.

// DedupOptions are the handler's deduplication options, as the engine
// takes them.
func (h *Handler) DedupOptions() []idempotency.Option {
	var keys []idempotency.KeySource
	for _, k := range h.Key {
		ks, _ := idempotency.ParseKeySource(k) // validate refuses a key that does not parse
		keys = append(keys, ks)
	}
	opts := []idempotency.Option{
		idempotency.WithKeySources(keys...),
		idempotency.WithMissingKey(idempotency.MissingKeyPolicy(h.MissingKey)),
		idempotency.WithMismatch(idempotency.MismatchPolicy(h.Mismatch)),
		idempotency.WithFingerprintHeaders(h.FingerprintHeaders...),
		idempotency.WithLease(h.Lease.D()),
		idempotency.WithRetention(h.Retention.D()),
		idempotency.WithInFlightWait(h.InFlightWait.D()),
		idempotency.WithMaxAttempts(h.MaxAttempts),
		idempotency.WithBackoff(h.Backoff.Initial.D(), h.Backoff.Max.D()),
	}
	if h.Mode == "shadow" {
		opts = append(opts, idempotency.WithShadow())
	}
	if h.FailOpen {
		opts = append(opts, idempotency.WithFailOpen())
	}
	return opts
}

// KafkaConfig is the handler's Kafka source (source.kafka) as
// transports/kafkasource takes it, without the Dialer (SASL and TLS) and the
// Logger, which the caller adds. It is the zero Config when the source is
// not Kafka.
func (h *Handler) KafkaConfig() kafkasource.Config {
	k := h.Source.Kafka
	if k == nil {
		return kafkasource.Config{}
	}
	kc := kafkasource.Config{
		Brokers: k.Brokers, Topic: k.Topic, GroupID: k.Group, Start: k.Start,
		SessionTimeout: k.SessionTimeout.D(), CommitInterval: k.CommitInterval.D(),
		Ordering: h.Ordering, Isolation: k.Isolation, FetchBufferBytes: k.FetchBufferBytes,
	}
	if dl := h.DeadLetter; dl != nil && dl.Kafka != nil {
		kc.DeadLetterTopic = dl.Kafka.Topic
	}
	return kc
}

// NATSConfig is the handler's NATS source (source.nats) as transports/natssource
// takes it, without the Logger, which the caller adds. It is the zero
// Config when the source is not NATS.
func (h *Handler) NATSConfig() natssource.Config {
	n := h.Source.NATS
	if n == nil {
		return natssource.Config{}
	}
	nc := natssource.Config{
		Stream: n.Stream, Consumer: n.Consumer, Subject: n.Subject,
		AckWait: n.AckWait.D(), MaxAckPending: n.MaxAckPending,
		FetchBufferBytes: n.FetchBufferBytes,
	}
	if dl := h.DeadLetter; dl != nil && dl.NATS != nil {
		nc.DeadLetterSubject = dl.NATS.Subject
	}
	return nc
}

// StoreOptions are redis's store options (namespace, grace, durability,
// local_cache) as redisbackend takes them, without the Logger and Hooks,
// which the caller adds. local_cache with entries 0 is the cache off.
func (r *Redis) StoreOptions() redisbackend.Options {
	o := redisbackend.Options{
		Namespace:  r.Namespace,
		Grace:      r.Grace.D(),
		Durability: redisbackend.Durability{Replicas: r.Durability.Replicas, Timeout: r.Durability.Timeout.D()},
	}
	if n := r.LocalCache.Size(); n != 0 {
		o.LocalCache = redisbackend.LocalCache{Entries: n, TTL: r.LocalCache.TTLOrDefault()}
	}
	return o
}

// field is where a library value's field comes from in the file.
type field struct {
	// path is the YAML path, relative to the table's base.
	path string
	// dflt says where the value comes from when the file leaves the field
	// out and its default is taken from another one; empty otherwise.
	dflt string
}

// fieldTable maps the Go path of a library value's field
// (consumer.ConfigError.Field, without an index) to the YAML field it is
// built from.
type fieldTable map[string]field

// handlerOptionFields is DedupOptions' table, under handlers[i].
var handlerOptionFields = fieldTable{
	"KeySources":      {path: "key"},
	"MissingKey":      {path: "missing_key"},
	"Mismatch":        {path: "mismatch"},
	"Lease":           {path: "lease"},
	"Retention":       {path: "retention"},
	"InFlightWait":    {path: "in_flight_wait", dflt: "the handler's lease"},
	"MaxAttempts":     {path: "max_attempts"},
	"Backoff.Initial": {path: "backoff.initial"},
	"Backoff.Max":     {path: "backoff.max"},
}

// kafkaFields is KafkaConfig's table, under handlers[i].
var kafkaFields = fieldTable{
	"Brokers":          {path: "source.kafka.brokers"},
	"Topic":            {path: "source.kafka.topic"},
	"GroupID":          {path: "source.kafka.group", dflt: `the handler's name and "-dedup"`},
	"Start":            {path: "source.kafka.start"},
	"SessionTimeout":   {path: "source.kafka.session_timeout"},
	"CommitInterval":   {path: "source.kafka.commit_interval"},
	"Isolation":        {path: "source.kafka.isolation"},
	"FetchBufferBytes": {path: "source.kafka.fetch_buffer_bytes"},
	"Ordering":         {path: "ordering"},
	"DeadLetterTopic":  {path: "dead_letter.kafka.topic"},
}

// natsFields is NATSConfig's table, under handlers[i].
var natsFields = fieldTable{
	"Stream":            {path: "source.nats.stream"},
	"Consumer":          {path: "source.nats.consumer", dflt: `the handler's name and "-dedup"`},
	"Subject":           {path: "source.nats.subject"},
	"AckWait":           {path: "source.nats.ack_wait", dflt: "the handler's lease"},
	"MaxAckPending":     {path: "source.nats.max_ack_pending"},
	"FetchBufferBytes":  {path: "source.nats.fetch_buffer_bytes"},
	"DeadLetterSubject": {path: "dead_letter.nats.subject"},
}

// storeFields is StoreOptions' table, under redis.
var storeFields = fieldTable{
	"Namespace":           {path: "namespace"},
	"Grace":               {path: "grace"},
	"Durability.Replicas": {path: "durability.replicas"},
	"Durability.Timeout":  {path: "durability.timeout"},
	"LocalCache.Entries":  {path: "local_cache.entries"},
	"LocalCache.TTL":      {path: "local_cache.ttl"},
}

// StoreError is err, returned by redisbackend.New for the options
// StoreOptions built, at the YAML path (under redis) of the field it names:
// for the checks New alone can make, against the client (the durability
// timeout against the client's read timeout).
func (r *Redis) StoreError(err error) error {
	return libraryError(err, "redis", storeFields, nil)
}

// indexSuffix splits "Brokers[1]" into "Brokers" and "[1]".
var indexSuffix = regexp.MustCompile(`^(.*?)((?:\[\d+\])*)$`)

// libraryError turns err, returned by a package's validation of a value
// built from the file, into an *Error: the first *consumer.ConfigError it
// holds, at the YAML path its field maps to in table (under base), with
// the Go paths of table's fields in its reason written as YAML paths too.
// A field the table does not hold is reported at base, under its Go name.
func libraryError(err error, base string, table fieldTable, lines map[string]int) error {
	if err == nil {
		return nil
	}
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) {
		return &Error{Path: base, Line: lineOf(lines, base), Msg: err.Error()}
	}
	m := indexSuffix.FindStringSubmatch(ce.Field)
	reason := yamlNames(ce.Reason, base, table)
	f, ok := table[m[1]]
	if !ok {
		return &Error{Path: base, Line: lineOf(lines, base), Msg: ce.Field + ": " + reason}
	}
	path := join(base, f.path) + m[2]
	if _, set := lines[path]; !set && f.dflt != "" {
		reason += fmt.Sprintf(" (not set: it defaults to %s)", f.dflt)
	}
	return &Error{Path: path, Line: lineOf(lines, path), Msg: reason}
}

// yamlNames rewrites every Go path of table's fields in a ConfigError's
// reason as its full YAML path, so that "required when Durability.Replicas
// is 2" reads "required when redis.durability.replicas is 2". Quoted
// values ("...") are copied as they are.
func yamlNames(reason, base string, table fieldTable) string {
	var b strings.Builder
	for i := 0; i < len(reason); {
		c := reason[i]
		switch {
		case c == '"':
			j := i + 1
			for j < len(reason) && reason[j] != '"' {
				if reason[j] == '\\' {
					j++
				}
				j++
			}
			j = min(j+1, len(reason))
			b.WriteString(reason[i:j])
			i = j
		case isLetter(c) && (i == 0 || !isNameByte(reason[i-1])):
			j := i
			for j < len(reason) && isNameByte(reason[j]) {
				j++
			}
			word := strings.TrimRight(reason[i:j], ".")
			if f, ok := table[word]; ok {
				b.WriteString(join(base, f.path))
			} else {
				b.WriteString(word)
			}
			i += len(word)
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String()
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// isNameByte reports whether c may be part of a Go path (Durability.Timeout).
func isNameByte(c byte) bool { return isLetter(c) || c >= '0' && c <= '9' || c == '_' || c == '.' }

func join(base, path string) string {
	if base == "" {
		return path
	}
	return base + "." + path
}
