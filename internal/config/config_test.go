package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const specExample = `
redis: {url: redis://127.0.0.1:6379/0, namespace: dedup}
http: {addr: 127.0.0.1:9464}
handlers:
  - name: orders
    source:
      kafka: {brokers: [127.0.0.1:9092], topic: orders, group: orders-dedup, start: earliest, session_timeout: 10s}
    key: [header:Idempotency-Key, json:id]
    missing_key: reject
    mismatch: reject
    lease: 30s
    retention: 24h
    max_attempts: 5
    backoff: {initial: 1s, max: 5m}
    concurrency: 16
    ordering: partition
    action:
      forward: {kafka: {brokers: [127.0.0.1:9092], topic: orders.unique}}
    dead_letter: {kafka: {topic: orders.dlq}}
`

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestParseSpecExample(t *testing.T) {
	c, err := Parse([]byte(specExample), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	h := c.Handlers[0]
	if h.Lease.D() != 30*time.Second || h.Retention.D() != 24*time.Hour || h.Backoff.Max.D() != 5*time.Minute {
		t.Fatalf("durations: %+v", h)
	}
	if h.InFlightWait.D() != 30*time.Second {
		t.Fatalf("in_flight_wait defaults to the lease, got %s", h.InFlightWait)
	}
	if got := h.DeadLetter.Kafka.Brokers; len(got) != 1 || got[0] != "127.0.0.1:9092" {
		t.Fatalf("dead_letter brokers default to the source's, got %v", got)
	}
	if *c.HTTP.Addr != "127.0.0.1:9464" || c.Redis.Grace.D() != time.Minute {
		t.Fatalf("defaults: %+v", c)
	}
}

// errCase is a config that Parse must refuse with an *Error at path and
// line whose message contains msg.
type errCase struct {
	name, yaml, path string
	line             int
	msg              string
}

// wantErrors parses each case's YAML followed by tail and checks its error.
func wantErrors(t *testing.T, tail string, cases []errCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.yaml+tail), env(nil))
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want *config.Error", err)
			}
			if ce.Path != c.path || ce.Line != c.line || !strings.Contains(ce.Msg, c.msg) {
				t.Fatalf("got %q (path %q line %d), want path %q line %d containing %q", err, ce.Path, ce.Line, c.path, c.line, c.msg)
			}
		})
	}
}

func TestParseErrorsNameFieldAndLine(t *testing.T) {
	cases := []errCase{
		{"unknown field", "handlers:\n  - name: a\n    leese: 3s\n", "handlers[0].leese", 3, "unknown field"},
		{"bad duration", "handlers:\n  - name: a\n    lease: 30x\n", "handlers[0].lease", 3, "not a duration"},
		{"wrong type", "handlers:\n  - name: a\n    max_attempts: many\n", "handlers[0].max_attempts", 3, "want an integer"},
		{"list expected", "handlers:\n  - name: a\n    key: header:X\n", "handlers[0].key", 3, "want a list"},
		{"two sources", "handlers:\n  - name: a\n    source:\n      kafka: {brokers: [b:1], topic: t}\n      nats: {url: nats://x, stream: S}\n    action: {exec: {command: [x]}}\n", "handlers[0].source", 3, "two sources"},
		{"two actions", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action:\n      exec: {command: [x]}\n      http: {url: http://x}\n", "handlers[0].action", 4, "two actions"},
		{"missing required", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1]}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.kafka.topic", 3, "required"},
		{"bad isolation", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t, isolation: dirty}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.kafka.isolation", 3, "want read_committed or read_uncommitted"},
		{"bad key source", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    key: [uuid]\n    action: {exec: {command: [x]}}\n", "handlers[0].key[0]", 4, "want header"},
		{"http tls on http://", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {http: {url: 'http://x/hook', tls: {ca_file: ca.pem}}}\n", "handlers[0].action.http.tls", 4, "https:// URL"},
		{"http tls cert without key", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {http: {url: 'https://x/hook', tls: {cert_file: c.pem}}}\n", "handlers[0].action.http.tls", 4, "cert_file and key_file together"},
		{"exec env not a name", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x], env: [API_TOKEN, 'A=b']}}\n", "handlers[0].action.exec.env[1]", 4, "want the name of an environment variable"},
		{"exec env DEDUP_", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x], env: [DEDUP_KEY]}}\n", "handlers[0].action.exec.env[0]", 4, "set by the action"},
		{"exec env as a map", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x], env: {A: b}}}\n", "handlers[0].action.exec.env", 4, "want a list"},
		{"small fetch_buffer_bytes", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t, fetch_buffer_bytes: 1000}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.kafka.fetch_buffer_bytes", 3, "1000: must be at least 1048576 (1 MiB, one fetch)"},
		{"negative fetch_buffer_bytes", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t, fetch_buffer_bytes: -1}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.kafka.fetch_buffer_bytes", 3, "-1: must be at least 1048576"},
		{"small nats fetch_buffer_bytes", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, fetch_buffer_bytes: 65536}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.nats.fetch_buffer_bytes", 3, "65536: must be at least 1048576 (1 MiB, the servers' default max_payload)"},
		{"negative max_ack_pending", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, max_ack_pending: -1}}\n    action: {exec: {command: [x]}}\n", "handlers[0].source.nats.max_ack_pending", 3, "must not be negative"},
		{"no handlers", "redis: {namespace: x}\n", "handlers", 0, "at least one"},
		{"dead-letter credentials (kafka)", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t}}\n    action: {exec: {command: [x]}}\n    dead_letter: {kafka: {topic: t.dlq, sasl: {mechanism: plain, username: u, password: p}}}\n", "handlers[0].dead_letter.kafka.sasl", 5, "source's credentials"},
		{"dead-letter tls (kafka)", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t}}\n    action: {exec: {command: [x]}}\n    dead_letter: {kafka: {topic: t.dlq, tls: {ca_file: ca.pem}}}\n", "handlers[0].dead_letter.kafka.tls", 5, "source's connection"},
		{"dead-letter credentials (nats)", "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, user: a, password: b}}\n    action: {exec: {command: [x]}}\n    dead_letter: {nats: {subject: d, user: c, password: d}}\n", "handlers[0].dead_letter.nats", 5, "source's credentials"},
		{"loop", "handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t}}\n    action: {forward: {kafka: {topic: t}}}\n", "handlers[0].action.forward.kafka.topic", 4, "loop"},
	}
	wantErrors(t, "", cases)
}

// A dead-letter destination that names the source's brokers or URL, or
// repeats its credentials, is the source's connection: accepted.
func TestDeadLetterOnTheSourceConnection(t *testing.T) {
	for _, y := range []string{
		"handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t, sasl: {mechanism: plain, username: u, password: p}}}\n    action: {exec: {command: [x]}}\n    dead_letter: {kafka: {brokers: [b:1], topic: t.dlq}}\n",
		"handlers:\n  - name: a\n    source: {kafka: {brokers: [b:1], topic: t, sasl: {mechanism: plain, username: u, password: p}}}\n    action: {exec: {command: [x]}}\n    dead_letter: {kafka: {topic: t.dlq, sasl: {mechanism: plain, username: u, password: p}}}\n",
		"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, user: a, password: b}}\n    action: {exec: {command: [x]}}\n    dead_letter: {nats: {url: nats://x, subject: d}}\n",
	} {
		if _, err := Parse([]byte(y), env(nil)); err != nil {
			t.Errorf("%v\n%s", err, y)
		}
	}
}

func TestEnvExpansion(t *testing.T) {
	y := "redis: {url: '${REDIS_URL}', password: '${REDIS_PW}'}\nhandlers:\n  - name: a\n    source: {nats: {url: '${NATS_URL:-nats://127.0.0.1:4222}', stream: S}}\n    action: {exec: {command: [x]}}\n"
	c, err := Parse([]byte(y), env(map[string]string{"REDIS_URL": "redis://r:1/0", "REDIS_PW": "hunter2"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.URL != "redis://r:1/0" || c.Redis.Password != "hunter2" || c.Handlers[0].Source.NATS.URL != "nats://127.0.0.1:4222" {
		t.Fatalf("expansion: %+v %+v", c.Redis, c.Handlers[0].Source.NATS)
	}
	out, err := c.Print()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "hunter2") || !strings.Contains(string(out), "<redacted>") {
		t.Fatalf("Print must redact secrets:\n%s", out)
	}
	_, err = Parse([]byte(y), env(nil))
	var ce *Error
	if !errors.As(err, &ce) || ce.Path != "redis.url" || !strings.Contains(ce.Msg, "REDIS_URL is not set") {
		t.Fatalf("unset variable: %v", err)
	}
}

func TestParseDuration(t *testing.T) {
	for s, want := range map[string]time.Duration{"300ms": 300 * time.Millisecond, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "24h": 24 * time.Hour} {
		if got, err := ParseDuration(s); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %s, %v; want %s", s, got, err, want)
		}
	}
	for _, s := range []string{"", "d", "7", "3 days", "1dx"} {
		if _, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) accepted", s)
		}
	}
	if Duration(48*time.Hour).String() != "2d" || Duration(90*time.Second).String() != "1m30s" {
		t.Fatal("Duration.String must round-trip through ParseDuration")
	}
}

// dead_letter.nats.core is read, and defaults the dead-letter URL and
// credentials from the source like any destination; a forward has no core.
func TestDeadLetterNATSCore(t *testing.T) {
	const base = `
handlers:
  - name: a
    source: {nats: {url: "nats://u:pw@127.0.0.1:4222", stream: S}}
    action: {forward: {nats: {subject: out%s}}}
    dead_letter: {nats: {subject: dlq.a%s}}
`
	c, err := Parse(fmt.Appendf(nil, base, "", ", core: true"), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	dl := c.Handlers[0].DeadLetter.NATS
	if !dl.Core || dl.Subject != "dlq.a" || dl.URL != "nats://u:pw@127.0.0.1:4222" {
		t.Fatalf("dead_letter.nats: %+v; want core, subject dlq.a and the source's URL", dl)
	}
	if c, err := Parse(fmt.Appendf(nil, base, "", ""), env(nil)); err != nil || c.Handlers[0].DeadLetter.NATS.Core {
		t.Fatalf("without core: %v, core %v; want false", err, c.Handlers[0].DeadLetter.NATS.Core)
	}
	out, err := c.Print()
	if err != nil || !strings.Contains(string(out), "core: true") || strings.Contains(string(out), ":pw@") {
		t.Fatalf("Print: %v\n%s\nwant core: true and the password redacted", err, out)
	}
	_, err = Parse(fmt.Appendf(nil, base, ", core: true", ""), env(nil))
	var ce *Error
	if !errors.As(err, &ce) || ce.Path != "handlers[0].action.forward.nats.core" {
		t.Fatalf("core on a forward: %v; want an error at handlers[0].action.forward.nats.core", err)
	}
}
