package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RedisLogs sends go-redis's own log lines (a Sentinel that does not answer,
// a dropped pub/sub connection, a pool error) to log as WARN records with
// component=go-redis, so they reach the operator in the worker's format
// instead of as plain text on stderr between its JSON lines. go-redis has
// one logger per process; the last call wins.
func RedisLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ log *slog.Logger }

// Printf implements go-redis's logging interface.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}

// RedisWarnings sends go-redis's own log lines to w, one line each, as
// "warning: go-redis: …": the form of the other warnings of the commands
// that are not the worker (validate --online, inspect, forget, records,
// redrive, stats), so that a Sentinel that does not answer reads as one of
// them. go-redis has one logger per process; the last call wins.
func RedisWarnings(w io.Writer) { redis.SetLogger(&redisWarnings{w: w}) }

type redisWarnings struct {
	mu sync.Mutex // keeps the lines of concurrent go-redis goroutines whole
	w  io.Writer
}

// Printf implements go-redis's logging interface.
func (l *redisWarnings) Printf(_ context.Context, format string, v ...any) {
	line := "warning: go-redis: " + strings.TrimSpace(fmt.Sprintf(format, v...)) + "\n"
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, line)
}
