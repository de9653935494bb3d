package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// safeRedis starts a private primary that the store health checks find
// nothing wrong with (AOF on, noeviction, one connected replica) and
// returns its URL: for validate --online --strict tests about something
// else. Both servers are killed when the test ends.
func safeRedis(t *testing.T) string {
	t.Helper()
	primary, _ := testenv.StartReplicatedRedis(t)
	return primary.URL()
}

// evictingRedis is a private Redis of 2 MB that evicts with allkeys-lru.
func evictingRedis(t *testing.T) *testenv.RedisServer {
	t.Helper()
	return testenv.StartRedisServer(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
}

// validate --online names the eviction risk of a Redis that evicts, with
// the setting seen and the fix, and exits 0; under --strict it exits 2. A
// primary with AOF, noeviction and a replica passes --strict.
func TestValidateOnlineStoreRisks(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VSR_"+id, "vsr."+id, time.Minute)
	config := func(redisURL string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: VSR_%s}}
    retention: 1h
    missing_key: passthrough # no dead_letter: only the store may warn
    action: {exec: {command: [/bin/true]}}
`, redisURL, url, id)
	}
	srv := evictingRedis(t)
	risky := config(srv.URL())
	want := `warning: redis ` + srv.Addr() + `: store risk "eviction": maxmemory-policy allkeys-lru: `
	code, _, stderr := runCmd(t, "validate", "-c", risky, "--online")
	if code != 0 || !strings.Contains(stderr, want) || !strings.Contains(stderr, "fix: CONFIG SET maxmemory-policy noeviction") {
		t.Fatalf("validate --online on an evicting Redis: exit %d, stderr %q; want exit 0 and a warning containing %q and the fix", code, stderr, want)
	}
	for _, check := range []string{`"persistence": appendonly no, save ""`, `"replicas": connected_slaves 0, redis.durability unset`} {
		if !strings.Contains(stderr, `store risk `+check) {
			t.Errorf("no warning %q:\n%s", check, stderr)
		}
	}
	if code, _, _ := runCmd(t, "validate", "-c", risky); code != 0 {
		t.Errorf("offline validate: exit %d, want 0 (no network, no store checks)", code)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", risky, "--online", "--strict"); code != exitUsage || !strings.Contains(stderr, want) {
		t.Errorf("validate --online --strict on an evicting Redis: exit %d, stderr %q; want 2", code, stderr)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", config(safeRedis(t)), "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Errorf("validate --online --strict with AOF, noeviction and a replica: exit %d, stderr %q; want 0 and no warning", code, stderr)
	}
}

// run logs the eviction risk at start, naming the check, the setting and
// the fix, and /metrics shows dedup_store_risk{check="eviction"} 1.
func TestRunReportsStoreRisk(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "RSR_"+id, "rsr."+id)
	srv := evictingRedis(t)
	addr := testenv.FreeAddr(t)
	cfg := writeConfig(t, `
redis: {url: %q}
http: {addr: %q}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: RSR_%s}}
    action: {exec: {command: [/bin/true]}}
`, srv.URL(), addr, url, id)
	p := start(t, nil, "run", "-c", cfg)
	risk := func(check string) string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, `dedup_store_risk{check="`+check+`"} `); ok {
				return v
			}
		}
		return ""
	}
	testenv.Eventually(t, 20*time.Second, "/metrics shows dedup_store_risk", func() bool { return risk("eviction") != "" })
	if got := risk("eviction"); got != "1" {
		t.Errorf(`dedup_store_risk{check="eviction"} = %q, want 1`, got)
	}
	if got := risk("appendfsync"); got != "0" {
		t.Errorf(`dedup_store_risk{check="appendfsync"} = %q, want 0`, got)
	}
	logs := p.stderr.String()
	for _, want := range []string{`"level":"WARN"`, `"check":"eviction"`, `"seen":"maxmemory-policy allkeys-lru"`, `"fix":"CONFIG SET maxmemory-policy noeviction`} {
		if !strings.Contains(logs, want) {
			t.Errorf("run's log has no %s:\n%s", want, logs)
		}
	}
	if code := p.term(20 * time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0", code)
	}
}
