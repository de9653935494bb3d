package config

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

const redisTail = "handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x]}}\n"

// The Sentinel form that redis.master_name + redis.addrs once was fails
// with the field, its line and the new form, not with "unknown field".
func TestMasterNameMovedToSentinel(t *testing.T) {
	y := "redis:\n  addrs: [127.0.0.1:26379]\n  master_name: dedup\n" + redisTail
	_, err := Parse([]byte(y), env(nil))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %v, want *config.Error", err)
	}
	const want = "config: redis.master_name (line 3): moved to redis.sentinel.master; write redis.sentinel: {master: ..., addrs: [...]}"
	if ce.Path != "redis.master_name" || ce.Line != 3 || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %q (path %q line %d), want it to start with %q", err, ce.Path, ce.Line, want)
	}
	// A field of that name elsewhere is merely unknown.
	_, err = Parse([]byte("handlers:\n  - name: a\n    master_name: x\n"), env(nil))
	if !errors.As(err, &ce) || ce.Path != "handlers[0].master_name" || !strings.Contains(ce.Msg, "unknown field") {
		t.Fatalf("handlers[0].master_name: %v", err)
	}
}

func TestRedisSentinelErrorsNameFieldAndLine(t *testing.T) {
	cases := []errCase{
		{"with url", "redis:\n  url: redis://h:1/0\n  sentinel: {master: m, addrs: [h:26379]}\n", "redis.sentinel", 3, "redis.url or redis.sentinel"},
		{"with addrs", "redis:\n  addrs: [h:7000]\n  sentinel: {master: m, addrs: [h:26379]}\n", "redis.sentinel", 3, "Cluster seeds"},
		{"no master", "redis:\n  sentinel: {addrs: [h:26379]}\n", "redis.sentinel.master", 2, "required"},
		{"no addrs", "redis:\n  sentinel:\n    master: m\n", "redis.sentinel.addrs", 2, "at least one Sentinel"},
		{"bad addr", "redis:\n  sentinel:\n    master: m\n    addrs: [h:26379, h]\n", "redis.sentinel.addrs[1]", 4, "want host:port"},
		{"two passwords", "redis:\n  sentinel:\n    master: m\n    addrs: [h:26379]\n    password: p\n    password_file: /f\n", "redis.sentinel.password_file", 6, "not both"},
		{"unknown field", "redis:\n  sentinel: {master: m, addrs: [h:26379], tls: {}}\n", "redis.sentinel.tls", 2, "unknown field"},
	}
	wantErrors(t, redisTail, cases)
}

// redis.sentinel is read whole, takes no default URL, and its password is
// redacted by Print like the data nodes' one.
func TestRedisSentinelParsesAndPrintsRedacted(t *testing.T) {
	y := "redis:\n  sentinel: {master: dedup, addrs: ['127.0.0.1:26390', '127.0.0.1:26391'], username: sen, password: '${SENTINEL_PW}'}\n" +
		"  username: app\n  password: Data-Secret-77\n" + redisTail
	c, err := Parse([]byte(y), env(map[string]string{"SENTINEL_PW": "Sentinel-Secret-42"}))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Redis.Sentinel
	if c.Redis.URL != "" || s == nil || s.Master != "dedup" || len(s.Addrs) != 2 || s.Username != "sen" || s.Password != "Sentinel-Secret-42" {
		t.Fatalf("redis: %+v sentinel %+v", c.Redis, s)
	}
	out, err := c.Print()
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"Sentinel-Secret-42", "Data-Secret-77"} {
		if strings.Contains(string(out), secret) {
			t.Fatalf("Print shows a password:\n%s", out)
		}
	}
	if !strings.Contains(string(out), "master: dedup") || strings.Count(string(out), "<redacted>") != 2 {
		t.Fatalf("Print must show the sentinel section with both passwords redacted:\n%s", out)
	}
	// Printed and read again, it is the same deployment.
	if _, err := Parse(out, env(nil)); err != nil {
		t.Fatalf("Print's output does not parse: %v\n%s", err, out)
	}
}

// redis.durability: replicas from 0, and a timeout of at least 1ms when
// any replica is asked for; errors name the field and its line.
func TestRedisDurability(t *testing.T) {
	cfg, err := Parse([]byte("redis:\n  durability: {replicas: 1, timeout: 50ms}\n"+redisTail), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Redis.Durability; d.Replicas != 1 || d.Timeout.D() != 50*time.Millisecond {
		t.Fatalf("durability %+v, want 1 replica and 50ms", d)
	}
	out, err := cfg.Print()
	if err != nil || !strings.Contains(string(out), "durability:\n        replicas: 1\n        timeout: 50ms\n") {
		t.Fatalf("--print does not show redis.durability (%v):\n%s", err, out)
	}
	if cfg, err := Parse([]byte(redisTail), env(nil)); err != nil || cfg.Redis.Durability != (Durability{}) {
		t.Fatalf("default durability %+v, %v; want none", cfg.Redis.Durability, err)
	}
	cases := []errCase{
		{"negative", "redis:\n  durability:\n    replicas: -1\n", "redis.durability.replicas", 3, "must not be negative"},
		{"no timeout", "redis:\n  durability:\n    replicas: 2\n", "redis.durability.timeout", 2, "required when redis.durability.replicas is 2"},
		{"under 1ms", "redis:\n  durability:\n    replicas: 1\n    timeout: 500us\n", "redis.durability.timeout", 4, "at least 1ms"},
		{"unknown field", "redis:\n  durability: {replicas: 1, timeout: 1s, wait: 1}\n", "redis.durability.wait", 2, "unknown field"},
	}
	wantErrors(t, redisTail, cases)
}

// redis.local_cache: on by default (10000 entries, 10s), off with
// entries: 0; errors name the field, its line and the fix.
func TestRedisLocalCache(t *testing.T) {
	cfg, err := Parse([]byte(redisTail), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if lc := cfg.Redis.LocalCache; lc.Size() != DefaultLocalCacheEntries || lc.TTL.D() != DefaultLocalCacheTTL {
		t.Fatalf("default local cache: %d entries, ttl %s", lc.Size(), lc.TTL)
	}
	cfg, err = Parse([]byte("redis:\n  local_cache: {entries: 500, ttl: 2s}\n"+redisTail), env(nil))
	if err != nil || cfg.Redis.LocalCache.Size() != 500 || cfg.Redis.LocalCache.TTL.D() != 2*time.Second {
		t.Fatalf("local cache %+v, %v; want 500 entries, 2s", cfg.Redis.LocalCache, err)
	}
	out, err := cfg.Print()
	if err != nil || !strings.Contains(string(out), "local_cache:\n        entries: 500\n        ttl: 2s\n") {
		t.Fatalf("--print does not show redis.local_cache (%v):\n%s", err, out)
	}
	if cfg, err := Parse(out, env(nil)); err != nil || cfg.Redis.LocalCache.Size() != 500 {
		t.Fatalf("printed config read back: %v", err)
	}
	cfg, err = Parse([]byte("redis:\n  local_cache: {entries: 0}\n"+redisTail), env(nil))
	if err != nil || cfg.Redis.LocalCache.Size() != 0 {
		t.Fatalf("entries: 0 must turn the cache off: %+v, %v", cfg.Redis.LocalCache, err)
	}
	cases := []errCase{
		{"negative entries", "redis:\n  local_cache:\n    entries: -1\n", "redis.local_cache.entries", 3, "0 turns the cache off"},
		{"negative ttl", "redis:\n  local_cache:\n    ttl: -1s\n", "redis.local_cache.ttl", 3, "must not be negative"},
		{"under 1ms", "redis:\n  local_cache:\n    entries: 10\n    ttl: 500us\n", "redis.local_cache.ttl", 4, "at least 1ms"},
		{"unknown field", "redis:\n  local_cache: {entries: 1, size: 1}\n", "redis.local_cache.size", 2, "unknown field"},
	}
	wantErrors(t, redisTail, cases)
}

// redis.completion_linger: omitted, the library's default (filled in, so
// --print shows it); 0s or 0 turns it off; a negative value is refused with
// the field, its line and the fix.
func TestRedisCompletionLinger(t *testing.T) {
	for y, want := range map[string]time.Duration{
		"":                                   idempotency.DefaultCompletionLinger,
		"redis:\n  completion_linger: 0s\n":  0,
		"redis:\n  completion_linger: 0\n":   0,
		"redis:\n  completion_linger: 5ms\n": 5 * time.Millisecond,
		"redis:\n  completion_linger: ~\n":   idempotency.DefaultCompletionLinger,
		"redis:\n  completion_linger: 1s\n":  time.Second,
	} {
		cfg, err := Parse([]byte(y+redisTail), env(nil))
		if err != nil {
			t.Fatalf("%q: %v", y, err)
		}
		l := cfg.Redis.CompletionLinger
		if l == nil || l.D() != want {
			t.Fatalf("%q: completion_linger %v, want %s", y, l, want)
		}
		out, err := cfg.Print()
		if err != nil || !strings.Contains(string(out), "completion_linger: "+Duration(want).String()+"\n") {
			t.Fatalf("%q: --print does not show completion_linger %s (%v):\n%s", y, Duration(want), err, out)
		}
		if back, err := Parse(out, env(nil)); err != nil || back.Redis.CompletionLinger == nil || *back.Redis.CompletionLinger != *l {
			t.Fatalf("%q: printed config read back: %v", y, err)
		}
	}
	cases := []errCase{
		{"negative", "redis:\n  url: redis://h:1/0\n  completion_linger: -1ms\n", "redis.completion_linger", 3, "must not be negative; use 0s to turn the linger off"},
		{"no unit", "redis:\n  completion_linger: 5\n", "redis.completion_linger", 2, "not a duration"},
		{"seconds for milliseconds", "redis:\n  url: redis://h:1/0\n  completion_linger: 3s\n", "redis.completion_linger", 3, "3s would hold each forward run's acks that long: want at most 1s (the default is 3ms; 0s turns it off)"},
	}
	wantErrors(t, redisTail, cases)
	// The fix is this field's: other durations are refused without it.
	_, err := Parse([]byte("redis:\n  grace: -1s\n"+redisTail), env(nil))
	if err == nil || strings.Contains(err.Error(), "linger") {
		t.Fatalf("negative redis.grace: %v", err)
	}
}
