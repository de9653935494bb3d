package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// stats on a private Redis with a maxmemory: its bytes per record agree
// with what N records really added to used_memory, and --rate's projection
// is rate × retention × that size.
func TestStatsMeasuresAndProjects(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const maxmemory = 256 << 20
	if err := client.ConfigSet(ctx, "maxmemory", "268435456").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	usedMemory := func() int64 {
		info, err := client.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				var n int64
				for _, c := range v {
					n = n*10 + int64(c-'0')
				}
				return n
			}
		}
		t.Fatal("INFO memory has no used_memory")
		return 0
	}
	store, err := redisbackend.New(client, redisbackend.Options{Namespace: "stats"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	const n = 8000 // under stats' default --sample, so it counts them all
	before := usedMemory()
	for start := 0; start < n; start += 1000 {
		reqs := make([]idempotency.ClaimRequest, 1000)
		for i := range reqs {
			reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey("orders", "order-"+testenv.RandID()+testenv.RandID()), Fingerprint: "fp-0123456789abcdef", FingerprintVersion: 1, Lease: 30 * time.Second}
		}
		res, err := store.Claim(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		cs := make([]idempotency.Completion, len(res))
		for i, r := range res {
			cs[i] = idempotency.Completion{Key: reqs[i].Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("receipt-0123456789"), Retention: time.Hour}
		}
		if _, err := store.Complete(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	delta := usedMemory() - before
	cfg := writeConfig(t, `redis: {url: %q, namespace: stats}
handlers:
  - name: orders
    source: {nats: {url: "nats://127.0.0.1:4222", stream: S}}
    action: {exec: {command: [cat]}}
    retention: 1h
`, srv.URL())
	code, out, stderr := runCmd(t, "stats", "-c", cfg, "--rate", "100/s", "-o", "json")
	var v statsView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("stats -o json: exit %d\n%s\n%s", code, out, stderr)
	}
	if v.Sampled || v.Records != n || len(v.Handlers) != 1 || v.Handlers[0].ByState["completed"] != n || v.Handlers[0].CompletedSampled != memSample {
		t.Fatalf("want all %d completed records of orders counted, %d measured: %+v", n, memSample, v)
	}
	if v.MaxMemory != maxmemory || len(v.Policies) != 1 || v.Policies[0] != "noeviction" || v.UsedMemory <= delta {
		t.Errorf("memory: used %d, max %d, policies %v; want max %d, noeviction, used > the records' %d", v.UsedMemory, v.MaxMemory, v.Policies, maxmemory, delta)
	}
	per, grown := v.Handlers[0].BytesPerCompleted, float64(delta)/n
	if per < grown/2 || per > grown*2 {
		t.Errorf("bytes per completed record %.0f by MEMORY USAGE, %.0f by used_memory's growth: want them within a factor 2", per, grown)
	}
	pr := v.Projection
	if pr == nil || pr.Fits == nil || !*pr.Fits || pr.PerHandler["orders"] != int64(100*3600*per) || pr.Bytes != pr.PerHandler["orders"] {
		t.Errorf("projection %+v, want 100/s × 3600 s × %.0f B, fitting under 256 MiB", pr, per)
	}
	t.Logf("%d records: MEMORY USAGE says %.0f B each, used_memory grew %d B = %.0f B each; projection at 100/s × 1h: %d B (%s) of maxmemory %d B; %d records by that measure would be %.0f B, really %d B",
		n, per, delta, grown, pr.Bytes, humanBytes(pr.Bytes), v.MaxMemory, n, per*n, delta)

	code, out, stderr = runCmd(t, "stats", "-c", cfg, "--rate", "100/s", "--sample", "500")
	if code != 0 || !strings.Contains(out, "a SAMPLE of") || !strings.Contains(out, "fits under maxmemory 256.0 MiB") || !strings.Contains(out, "maxmemory-policy: noeviction") || !strings.Contains(out, "measured by MEMORY USAGE") {
		t.Fatalf("stats --sample 500: exit %d\n%s\n%s", code, out, stderr)
	}
	t.Logf("stats --rate 100/s --sample 500:\n%s", out)
}

func TestStatsRefusesBadUsage(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "redis: {url: redis://127.0.0.1:1/0}\n"+storeHandler)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stats"}, "-c FILE is required"},
		{[]string{"stats", "-c", cfg, "--rate", "fast"}, `--rate "fast": want new keys per second`},
		{[]string{"stats", "-c", cfg, "--rate", "10/d"}, `--rate "10/d"`},
		{[]string{"stats", "-c", cfg, "--sample", "0"}, "--sample 0"},
	} {
		code, _, stderr := runCmd(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// On the Cluster stats counts the records of every primary and sums their
// memory.
func TestStatsOnTheCluster(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisCluster(t)
	ns := "clstats-" + testenv.RandID()
	seedRecords(t, testenv.RedisClusterClient(t), ns, 5, 0)
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, "redis://"+addrs[0]+"/0", ns)
	code, out, stderr := runCmd(t, "stats", "-c", cfg, "-o", "json")
	var v statsView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("stats -o json: exit %d\n%s\n%s", code, out, stderr)
	}
	var orders *handlerStats
	for i := range v.Handlers {
		if v.Handlers[i].Name == "orders" {
			orders = &v.Handlers[i]
		}
	}
	if len(v.Nodes) != len(addrs) || v.Sampled || orders == nil || v.KeysScanned != 22 || v.Records != 21 {
		t.Fatalf("want %d primaries, all 22 keys, 21 records (20 of orders, 1 of other; 1 value is no record), got %+v", len(addrs), v)
	}
	for _, c := range []string{"claimed", "released", "completed", "dead_lettered"} {
		if orders.ByState[c] != 5 {
			t.Errorf("orders %s: %d, want 5 (%v)", c, orders.ByState[c], orders.ByState)
		}
	}
}
