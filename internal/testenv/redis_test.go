package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// TestStartSentinelFailsOver: killing the private deployment's primary makes
// the Sentinels promote the replica, with the writes it acknowledged; the
// old primary comes back as a replica.
func TestStartSentinelFailsOver(t *testing.T) {
	s := testenv.StartSentinel(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := s.Client(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Do(ctx, "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want 1 replica", n, err)
	}
	old := s.KillPrimary(t)
	now, err := s.WaitFailover(old, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	direct := redis.NewClient(&redis.Options{Addr: now})
	defer direct.Close()
	if got, err := direct.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("the promoted replica %s: GET k = %q, %v; want \"v\"", now, got, err)
	}
	if err := s.RestartNode(old); err != nil {
		t.Fatal(err)
	}
	s.WaitHealthy(t, 30*time.Second)
	got, err := c.Get(ctx, "k").Result()
	if err != nil || got != "v" {
		for _, a := range s.Data {
			rc := redis.NewClient(&redis.Options{Addr: a})
			info, _ := rc.Info(ctx, "replication").Result()
			v, _ := rc.Get(ctx, "k").Result()
			rc.Close()
			t.Logf("%s: k=%q %s", a, v, info)
		}
		p, _ := s.Primary(ctx)
		t.Logf("sentinel says primary %s", p)
		t.Fatalf("after the failover to %s: GET k = %q, %v; want \"v\"", now, got, err)
	}
}
