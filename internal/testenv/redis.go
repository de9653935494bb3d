package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Local defaults tried when the environment names no Redis.
const (
	localRedisURL = "redis://127.0.0.1:6379/0"
	redisProbe    = 2 * time.Second
)

var localClusterAddrs = []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}

var (
	redisOnce sync.Once
	redisURL  string
	redisWhy  string

	clusterOnce  sync.Once
	clusterAddrs []string
	clusterWhy   string
)

// Redis returns the URL of a real Redis server for a storage test (never an
// in-process imitation: the storage semantics are Redis's own). It is found
// once per test binary, in this order: $REDIS_URL, which must answer; else
// redis://127.0.0.1:6379/0 when it answers; else a Redis container when a
// Docker engine answers (see the package documentation for the variables
// that force or forbid containers). Without one the test is skipped, or
// failed under DEDUP_REQUIRE_SERVICES=1.
func Redis(t testing.TB) string {
	t.Helper()
	url, why := FindRedis()
	if why != "" {
		requireContainer(t, "redis", why)
		Unavailable(t, "redis", why)
	}
	return url
}

// FindRedis is Redis without a test: the URL, or why there is none. For
// TestMain and examples.
func FindRedis() (url, why string) {
	redisOnce.Do(func() {
		if containersOnly() {
			redisURL, redisWhy = redisContainer("")
			return
		}
		if env := os.Getenv("REDIS_URL"); env != "" {
			redisURL = env
			if err := pingRedisURL(env); err != nil {
				redisWhy = "REDIS_URL is set but does not answer: " + err.Error()
			}
			return
		}
		redisURL = localRedisURL
		if err := pingRedisURL(localRedisURL); err != nil {
			redisURL, redisWhy = redisContainer("REDIS_URL is not set and nothing answers on 127.0.0.1:6379 (" +
				err.Error() + "); start redis-server or set REDIS_URL")
		}
	})
	return redisURL, redisWhy
}

// redisContainer starts the binary's Redis container, or says why there is
// none after before, what the earlier steps found.
func redisContainer(before string) (url, why string) {
	return fromContainer("redis", "REDIS_URL", before, startRedisContainer, sameString, sameString, sameString)
}

// RedisClient returns a client on Redis(t), closed when the test ends.
func RedisClient(t testing.TB) redis.UniversalClient {
	t.Helper()
	opt, err := redis.ParseURL(Redis(t))
	if err != nil {
		t.Fatalf("testenv: redis URL: %v", err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisCluster returns the seed addresses of a real Redis Cluster:
// $REDIS_CLUSTER_ADDRS (comma-separated) when set, else 127.0.0.1:7000-7002
// (as .ci/redis-cluster.sh starts them). Every address must answer CLUSTER
// INFO with cluster_state:ok; otherwise the test is skipped, or failed under
// DEDUP_REQUIRE_SERVICES=1.
func RedisCluster(t testing.TB) []string {
	t.Helper()
	clusterOnce.Do(func() {
		if why := onlyContainersWhy("a Redis Cluster", ".ci/redis-cluster.sh"); why != "" {
			clusterWhy = why
			return
		}
		if env := os.Getenv("REDIS_CLUSTER_ADDRS"); env != "" {
			for a := range strings.SplitSeq(env, ",") {
				if a = strings.TrimSpace(a); a != "" {
					clusterAddrs = append(clusterAddrs, a)
				}
			}
			if err := probeCluster(clusterAddrs); err != nil {
				clusterWhy = "REDIS_CLUSTER_ADDRS is set but " + err.Error()
			}
			return
		}
		clusterAddrs = localClusterAddrs
		if err := probeCluster(clusterAddrs); err != nil {
			clusterWhy = "REDIS_CLUSTER_ADDRS is not set and no healthy cluster on 127.0.0.1:7000-7002 (" +
				err.Error() + "); containers provide no Redis Cluster: run .ci/redis-cluster.sh or set REDIS_CLUSTER_ADDRS"
		}
	})
	if clusterWhy != "" {
		Unavailable(t, "redis cluster", clusterWhy)
	}
	return append([]string(nil), clusterAddrs...)
}

// RedisClusterClient returns a cluster client on RedisCluster(t), closed when
// the test ends.
func RedisClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: RedisCluster(t)})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func pingRedisURL(url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	opt.DialTimeout = redisProbe
	opt.MaxRetries = -1
	c := redis.NewClient(opt)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), redisProbe)
	defer cancel()
	return c.Ping(ctx).Err()
}

func probeCluster(addrs []string) error {
	if len(addrs) == 0 {
		return fmt.Errorf("no addresses")
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, DialTimeout: redisProbe, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), redisProbe)
		info, err := c.ClusterInfo(ctx).Result()
		cancel()
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("%s: %v", a, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", a)
		}
	}
	return nil
}

// DropNamespace registers a cleanup that deletes every key of namespace ns
// (ns:* and {ns}:*) from the shared Redis when the test ends, for tests and
// benchmarks that write many records with long retentions: left behind, they
// would make every later SCAN of the shared server walk them.
func DropNamespace(t testing.TB, ns string) {
	t.Helper()
	client := RedisClient(t)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, pattern := range []string{ns + ":*", "{" + ns + "}:*"} {
			iter := client.Scan(ctx, 0, pattern, 1000).Iterator()
			batch := make([]string, 0, 1000)
			for iter.Next(ctx) {
				if batch = append(batch, iter.Val()); len(batch) == cap(batch) {
					client.Unlink(ctx, batch...)
					batch = batch[:0]
				}
			}
			if len(batch) > 0 {
				client.Unlink(ctx, batch...)
			}
			if err := iter.Err(); err != nil {
				t.Logf("testenv: dropping namespace %s: %v", ns, err)
			}
		}
	})
}
