package app

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

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
