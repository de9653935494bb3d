package redisbackend_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// The store on Sentinel: a FailoverClient that asks a real redis-sentinel
// for the master passes the whole suite.
func TestStoreSentinel(t *testing.T) {
	dir := t.TempDir()
	master := testenv.StartRedisServer(t)
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte("sentinel monitor dedupmaster "+strings.Replace(master.Addr(), ":", " ", 1)+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := testenv.NewRedisServer(t, testenv.RedisServerConfig{ConfigFile: conf, Args: []string{"--sentinel"}, Dir: dir})
	sc := redis.NewSentinelClient(sentinel.Options())
	t.Cleanup(func() { _ = sc.Close() })
	testenv.EventuallyNil(t, 10*time.Second, "redis-sentinel to name the master", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return sc.GetMasterAddrByName(ctx, "dedupmaster").Err()
	})
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "dedupmaster",
		SentinelAddrs: []string{sentinel.Addr()},
	})
	t.Cleanup(func() { _ = client.Close() })
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness { return newHarness(t, client) })
}
