package redisprobe

import (
	"context"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Node asks the server of ro, on a throwaway connection without go-redis's
// retries and within ro.DialTimeout (and ctx), whether it answers and
// whether it runs in Cluster mode, so that an unreachable server fails fast
// with the dial's own error ("connection refused") rather than a deadline
// that ran out during retries. A server that refuses INFO (an ACL without
// +info, a renamed command) but answers PING is taken as standalone.
func Node(ctx context.Context, ro *redis.Options) (cluster bool, err error) {
	po := *ro
	po.DB = 0 // a Cluster node refuses SELECT of any other
	po.MaxRetries = -1
	po.DialerRetries = 1
	po.PoolSize = 1
	po.MinIdleConns = 0
	c := redis.NewClient(&po)
	defer c.Close()
	if ro.DialTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ro.DialTimeout)
		defer cancel()
	}
	info, err := c.Info(ctx, "cluster").Result()
	if err == nil {
		return strings.Contains(info, "cluster_enabled:1"), nil
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false, err // no answer at all
	}
	return false, c.Ping(ctx).Err() // refused INFO, or refused us
}

// AuthRefused reports whether err is the server refusing the client's
// credentials: a wrong username or password (WRONGPASS), or none given to a
// server that requires one (NOAUTH).
func AuthRefused(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.TrimPrefix(rerr.Error(), "ERR ")
	return strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH")
}
