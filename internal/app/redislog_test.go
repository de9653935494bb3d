package app

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// lockedBuffer is a bytes.Buffer safe for go-redis's goroutines and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// A line go-redis logs (here: no Sentinel answers) arrives as a structured
// record of the worker's logger.
func TestRedisLogsAreStructured(t *testing.T) {
	var out lockedBuffer
	RedisLogs(slog.New(slog.NewJSONHandler(&out, nil)))
	t.Cleanup(func() { RedisLogs(slog.New(slog.DiscardHandler)) })

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
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
