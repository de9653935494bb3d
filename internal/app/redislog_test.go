package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// A line go-redis logs (here: no Sentinel answers) arrives as a structured
// record of the worker's logger.
func TestRedisLogsAreStructured(t *testing.T) {
	var out testenv.SyncBuffer
	RedisLogs(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(func() { RedisLogs(slog.New(slog.DiscardHandler)) })

	pingMissingSentinel(t)

	var rec map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if err := json.Unmarshal([]byte(line), &rec); err == nil && rec["component"] == "go-redis" {
			break
		}
		rec = nil
	}
	if rec == nil {
		t.Fatalf("no go-redis record among the logs:\n%s", out.String())
	}
	if rec["level"] != "WARN" || !strings.Contains(rec["msg"].(string), "sentinel") {
		t.Errorf("record %v: want level WARN and go-redis's message about the Sentinel", rec)
	}
}

// Under RedisWarnings the same line is one "warning: go-redis: " line of the
// command's stderr.
func TestRedisWarningsAreCommandLines(t *testing.T) {
	var out testenv.SyncBuffer
	RedisWarnings(&out)
	t.Cleanup(func() { RedisLogs(slog.New(slog.DiscardHandler)) })

	pingMissingSentinel(t)
	text := out.String()
	if !strings.HasSuffix(text, "\n") || !strings.Contains(text, "sentinel") {
		t.Fatalf("no whole go-redis line about the Sentinel:\n%q", text)
	}
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !strings.HasPrefix(line, "warning: go-redis: ") || strings.TrimPrefix(line, "warning: go-redis: ") == "" {
			t.Errorf("line %q: want \"warning: go-redis: \" and go-redis's message", line)
		}
	}
}

// pingMissingSentinel pings through a Sentinel that does not answer, so
// that go-redis logs about it.
func pingMissingSentinel(t *testing.T) {
	t.Helper()
	closed := testenv.FreeAddr(t)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: "nobody", SentinelAddrs: []string{closed},
		DialTimeout: 200 * time.Millisecond, MaxRetries: -1,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("Ping through a Sentinel that does not exist succeeded")
	}
}
