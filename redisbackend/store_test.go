package redisbackend_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

const testGrace = 45 * time.Second

func TestStoreStandalone(t *testing.T) {
	client := testenv.RedisClient(t)
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness { return newHarness(t, client) })
}

func TestStoreCluster(t *testing.T) {
	client := testenv.RedisClusterClient(t)
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness { return newHarness(t, client) })
}

// newStore makes a Store in a fresh namespace on client, closed and its keys
// deleted when the test ends.
func newStore(t testing.TB, client redis.UniversalClient, opts redisbackend.Options) *redisbackend.Store {
	t.Helper()
	if opts.Namespace == "" {
		opts.Namespace = "test-" + testenv.RandID()
	}
	s, err := redisbackend.New(client, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		deleteNamespace(t, client, opts.Namespace)
	})
	return s
}

// deleteNamespace removes every key of ns, on every master of a cluster.
func deleteNamespace(t testing.TB, client redis.UniversalClient, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	del := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, ns+":*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			batch = append(batch, iter.Val())
			if len(batch) == 1000 {
				if err := c.Unlink(ctx, batch...).Err(); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	var err error
	if cc, ok := client.(*redis.ClusterClient); ok {
		// Unlink per key: keys of one batch are in different slots.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			iter := m.Scan(ctx, 0, ns+":*", 1000).Iterator()
			for iter.Next(ctx) {
				if err := m.Unlink(ctx, iter.Val()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		})
	} else {
		err = del(ctx, client)
	}
	if err != nil {
		t.Logf("cleaning namespace %s: %v", ns, err)
	}
}

func newHarness(t *testing.T, client redis.UniversalClient) *storetest.Harness {
	return newHarnessWith(t, client, redisbackend.Options{Grace: testGrace})
}

// newHarnessWith is newHarness for a store with opts (Grace must be
// testGrace).
func newHarnessWith(t *testing.T, client redis.UniversalClient, opts redisbackend.Options) *storetest.Harness {
	s := newStore(t, client, opts)
	ctx := func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	return &storetest.Harness{
		Store: s,
		Grace: testGrace,
		TTL: func(t *testing.T, key string) time.Duration {
			d, err := client.PTTL(ctx(t), s.RedisKey(key)).Result()
			if err != nil {
				t.Fatalf("PTTL: %v", err)
			}
			return d
		},
		SetRaw: func(t *testing.T, key string, raw []byte) {
			if err := client.Set(ctx(t), s.RedisKey(key), raw, 10*time.Minute).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
		},
		SetWrongType: func(t *testing.T, key string) {
			if err := client.RPush(ctx(t), s.RedisKey(key), "a", "b").Err(); err != nil {
				t.Fatalf("RPUSH: %v", err)
			}
		},
		CompleteSilently: func(t *testing.T, key string, result []byte) {
			completeSilently(t, client, s.RedisKey(key), result)
		},
		FlushScripts: func(t *testing.T) {
			if err := client.ScriptFlush(ctx(t)).Err(); err != nil {
				t.Fatalf("SCRIPT FLUSH: %v", err)
			}
		},
	}
}

// completeSilently rewrites the CLAIMED record at rkey as COMPLETED, as the
// complete script would, but without PUBLISH.
func completeSilently(t *testing.T, client redis.UniversalClient, rkey string, result []byte) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	raw, err := client.Get(ctx, rkey).Bytes()
	if err != nil {
		t.Fatalf("GET %s: %v", rkey, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var rec map[string]any
	if err := dec.Decode(&rec); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	if rec["state"] != "CLAIMED" {
		t.Fatalf("%s is %v, want CLAIMED", rkey, rec["state"])
	}
	rec["state"] = "COMPLETED"
	rec["outcome"] = "ok"
	rec["completed_at_ms"] = time.Now().UnixMilli()
	rec["result"] = base64.StdEncoding.EncodeToString(result)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, rkey, b, redis.KeepTTL).Err(); err != nil {
		t.Fatalf("SET %s: %v", rkey, err)
	}
}
