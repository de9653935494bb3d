package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

func TestRedisAnswers(t *testing.T) {
	c := testenv.RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Redis(t) found %s, which does not answer: %v", testenv.Redis(t), err)
	}
}

func TestRedisClusterIsHealthy(t *testing.T) {
	c := testenv.RedisClusterClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") {
		t.Fatalf("RedisCluster(t) found %v, cluster info %q, err %v", testenv.RedisCluster(t), info, err)
	}
	// Keys in different slots must be reachable through the seeds.
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := c.Set(ctx, "testenv:"+k, "1", time.Minute).Err(); err != nil {
			t.Fatalf("set %s: %v", k, err)
		}
	}
}
