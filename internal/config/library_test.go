package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

const (
	libHead = "handlers:\n  - name: a\n"
	libNATS = "    source: {nats: {url: nats://x, stream: S}}\n"
	libExec = "    action: {exec: {command: [x]}}\n"
)

// The limits that the engine, the sources and the store check themselves
// reach the user at the YAML field the refused value was built from, with
// its line; a table without the entry would report the handler (or redis)
// instead. Every entry whose limit a file can break is here; the others
// (in_flight_wait, backoff.initial, commit_interval: the decoder refuses
// negative durations and 0 takes the default) only through
// TestFieldTablesCoverTheBuiltValues.
func TestLibraryLimitsNameFieldAndLine(t *testing.T) {
	kafkaSrc := func(extra string) string {
		return "    source: {kafka: {brokers: [b:1], topic: t" + extra + "}}\n"
	}
	cases := []errCase{
		// idempotency options (handlerOptionFields)
		{"missing_key", libHead + libNATS + libExec + "    missing_key: drop\n", "handlers[0].missing_key", 5, `"drop": want reject or passthrough`},
		{"mismatch", libHead + libNATS + libExec + "    mismatch: overwrite\n", "handlers[0].mismatch", 5, `"overwrite": want reject or ignore`},
		{"lease", libHead + "    source: {nats: {url: nats://x, stream: S, ack_wait: 1s}}\n" + libExec + "    lease: 50ms\n", "handlers[0].lease", 5, "50ms: must be at least 100ms"},
		{"lease before the ack_wait it defaults", libHead + libNATS + libExec + "    lease: 50ms\n", "handlers[0].lease", 5, "50ms: must be at least 100ms"},
		{"key before lease", libHead + libNATS + "    key: [uuid]\n" + libExec + "    lease: 50ms\n", "handlers[0].key[0]", 4, "want header"},
		{"retention", libHead + libNATS + libExec + "    retention: 500ms\n", "handlers[0].retention", 5, "must be at least 1s"},
		{"max_attempts", libHead + libNATS + libExec + "    max_attempts: -1\n", "handlers[0].max_attempts", 5, "-1: must be at least 1"},
		{"backoff.max", libHead + libNATS + libExec + "    backoff:\n      initial: 1m\n      max: 5s\n", "handlers[0].backoff.max", 7, "5s is below handlers[0].backoff.initial 1m0s"},
		// transports/kafkasource (kafkaFields)
		{"kafka brokers", libHead + "    source: {kafka: {topic: t}}\n" + libExec, "handlers[0].source.kafka.brokers", 3, "at least one broker"},
		{"kafka brokers before dead_letter", libHead + "    source: {kafka: {topic: t}}\n" + libExec + "    dead_letter: {kafka: {topic: t.dlq}}\n", "handlers[0].source.kafka.brokers", 3, "at least one broker"},
		{"kafka brokers[1]", libHead + "    source:\n      kafka:\n        brokers: [b:1, ' ']\n        topic: t\n" + libExec, "handlers[0].source.kafka.brokers[1]", 5, "empty address"},
		{"kafka topic", libHead + "    source: {kafka: {brokers: [b:1]}}\n" + libExec, "handlers[0].source.kafka.topic", 3, "required"},
		{"kafka start", libHead + "    source:\n      kafka:\n        brokers: [b:1]\n        topic: t\n        start: middle\n" + libExec, "handlers[0].source.kafka.start", 7, `"middle": want earliest or latest`},
		{"kafka session_timeout", libHead + kafkaSrc(", session_timeout: 100ms") + libExec, "handlers[0].source.kafka.session_timeout", 3, "use at least 150ms"},
		{"kafka isolation", libHead + kafkaSrc(", isolation: dirty") + libExec, "handlers[0].source.kafka.isolation", 3, "want read_committed or read_uncommitted"},
		// transports/natssource (natsFields)
		{"nats stream", libHead + "    source: {nats: {url: nats://x}}\n" + libExec, "handlers[0].source.nats.stream", 3, "required"},
		{"nats stream name", libHead + "    source: {nats: {url: nats://x, stream: a.b}}\n" + libExec, "handlers[0].source.nats.stream", 3, `"a.b": must not contain`},
		{"nats consumer", libHead + "    source: {nats: {url: nats://x, stream: S, consumer: 'c d'}}\n" + libExec, "handlers[0].source.nats.consumer", 3, `"c d": must not contain`},
		{"nats consumer default", "handlers:\n  - name: a.b\n" + libNATS + libExec, "handlers[0].source.nats.consumer", 3, `"a.b-dedup": must not contain whitespace, '.'`},
		{"nats subject", libHead + "    source: {nats: {url: nats://x, stream: S, subject: 'a.>.b'}}\n" + libExec, "handlers[0].source.nats.subject", 3, "not a valid subject filter"},
		{"nats ack_wait", libHead + "    source: {nats: {url: nats://x, stream: S, ack_wait: 500ms}}\n" + libExec, "handlers[0].source.nats.ack_wait", 3, "500ms: must be at least 1s"},
		{"nats ack_wait default", libHead + libNATS + libExec + "    lease: 500ms\n", "handlers[0].source.nats.ack_wait", 3, "must be at least 1s (not set: it defaults to the handler's lease)"},
		{"nats max_ack_pending", libHead + "    source:\n      nats:\n        url: nats://x\n        stream: S\n        max_ack_pending: -1\n" + libExec, "handlers[0].source.nats.max_ack_pending", 7, "must not be negative"},
		{"nats dead_letter subject", libHead + libNATS + libExec + "    dead_letter: {nats: {subject: 'dlq.*'}}\n", "handlers[0].dead_letter.nats.subject", 5, "no wildcards"},
		// redisbackend (storeFields)
		{"redis namespace", "redis:\n  namespace: '{x}'\n", "redis.namespace", 2, "hash tag"},
		{"redis grace", "redis:\n  grace: 500us\n", "redis.grace", 2, "at least 1ms"},
	}
	wantErrors(t, "", cases[:len(cases)-2])
	wantErrors(t, redisTail, cases[len(cases)-2:])
}

// Every field that KafkaConfig, NATSConfig and StoreOptions set from a file
// that sets every field is in its table, and every table entry names a
// field of the file: a new field built from the file without a table entry,
// or a misspelt path, fails here.
func TestFieldTablesCoverTheBuiltValues(t *testing.T) {
	y := `redis:
  namespace: ns
  grace: 2m
  durability: {replicas: 1, timeout: 50ms}
  local_cache: {entries: 5, ttl: 2s}
handlers:
  - name: k
    source: {kafka: {brokers: [b:1], topic: t, group: g, start: latest, session_timeout: 20s, commit_interval: 2s, isolation: read_uncommitted, fetch_buffer_bytes: 2097152}}
    ordering: key
    action: {exec: {command: [x]}}
    dead_letter: {kafka: {topic: t.dlq}}
  - name: n
    source: {nats: {url: nats://x, stream: S, consumer: c, subject: s.>, ack_wait: 40s, max_ack_pending: 7, fetch_buffer_bytes: 3145728}}
    action: {exec: {command: [x]}}
    dead_letter: {nats: {subject: dlq}}
`
	c, err := Parse([]byte(y), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		value any
		table fieldTable
		root  reflect.Type
	}{
		{"KafkaConfig", c.Handlers[0].KafkaConfig(), kafkaFields, reflect.TypeFor[Handler]()},
		{"NATSConfig", c.Handlers[1].NATSConfig(), natsFields, reflect.TypeFor[Handler]()},
		{"StoreOptions", c.Redis.StoreOptions(), storeFields, reflect.TypeFor[Redis]()},
	} {
		set := setFields(reflect.ValueOf(tc.value), "")
		for _, f := range set {
			if _, ok := tc.table[f]; !ok {
				t.Errorf("%s sets %s, which its table does not map to a YAML field", tc.name, f)
			}
		}
		for goPath, f := range tc.table {
			if !slices.Contains(set, goPath) {
				t.Errorf("%s's table maps %s, which a file that sets every field does not set", tc.name, goPath)
			}
			if !yamlPathExists(tc.root, f.path) {
				t.Errorf("%s's table maps %s to %q, which is not a field of the file", tc.name, goPath, f.path)
			}
		}
	}
	for goPath, f := range handlerOptionFields {
		if !yamlPathExists(reflect.TypeFor[Handler](), f.path) {
			t.Errorf("handlerOptionFields maps %s to %q, which is not a field of the file", goPath, f.path)
		}
	}
}

// setFields lists the Go paths of v's non-zero fields, into nested structs.
func setFields(v reflect.Value, prefix string) []string {
	var out []string
	for i := range v.NumField() {
		f, sf := v.Field(i), v.Type().Field(i)
		if f.IsZero() {
			continue
		}
		if f.Kind() == reflect.Struct {
			out = append(out, setFields(f, prefix+sf.Name+".")...)
			continue
		}
		out = append(out, prefix+sf.Name)
	}
	return out
}

// yamlPathExists reports whether path ("source.kafka.brokers") is a chain
// of yaml keys from the struct type t.
func yamlPathExists(t reflect.Type, path string) bool {
	for _, key := range strings.Split(path, ".") {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return false
		}
		next, ok := yamlField(t, key)
		if !ok {
			return false
		}
		t = next
	}
	return true
}

// yamlField is the type of t's field whose yaml key is key, looking into
// inlined structs.
func yamlField(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		sf := t.Field(i)
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if ft, ok := yamlField(sf.Type, key); ok {
				return ft, true
			}
			continue
		}
		if name == key {
			return sf.Type, true
		}
	}
	return nil, false
}

// yamlNames writes the Go paths of the table's fields as YAML paths, and
// leaves quoted values and other words alone.
func TestYAMLNames(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"required when Durability.Replicas is 2", "required when redis.durability.replicas is 2"},
		{`"Durability.Replicas" is a quoted value`, `"Durability.Replicas" is a quoted value`},
		{`"a \"Grace\" b" and Grace.`, `"a \"Grace\" b" and redis.grace.`},
		{"GraceX and xGrace and Durability", "GraceX and xGrace and Durability"},
		{"5s is below Grace", "5s is below redis.grace"},
		{`unterminated "Grace`, `unterminated "Grace`},
	} {
		if got := yamlNames(tc.in, "redis", storeFields); got != tc.want {
			t.Errorf("yamlNames(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
