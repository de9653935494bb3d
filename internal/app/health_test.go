package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/testenv"
)

func risksOf(h *StoreHealth) map[string]StoreRisk {
	m := map[string]StoreRisk{}
	for _, r := range h.Risks {
		m[r.Check] = r
	}
	return m
}

func configSet(t *testing.T, c *redis.Client, kv ...string) {
	t.Helper()
	for i := 0; i < len(kv); i += 2 {
		if err := c.ConfigSet(context.Background(), kv[i], kv[i+1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[i], kv[i+1], err)
		}
	}
}

// A Redis that evicts, keeps nothing on disk and has no replica is reported
// with one risk per check, each naming the setting seen and the fix; the
// volatile-* policies count as eviction too.
func TestStoreHealthRisks(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t) // --save "" --appendonly no
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	configSet(t, admin, "maxmemory", "2mb", "maxmemory-policy", "allkeys-lru")
	rc := testRedis(srv.URL(), "risk-"+testenv.RandID())
	h, err := CheckStoreHealth(testCtx(t), &rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	rs := risksOf(h)
	for check, want := range map[string]string{
		"eviction":    "maxmemory-policy allkeys-lru",
		"persistence": `appendonly no, save ""`,
		"replicas":    "connected_slaves 0, redis.durability unset",
	} {
		if r, ok := rs[check]; !ok || r.Seen != want || r.Fix == "" || r.Node != srv.Addr() {
			t.Errorf("check %s: %+v, want seen %q on %s with a fix", check, r, want, srv.Addr())
		}
	}
	if _, ok := rs["appendfsync"]; ok || len(h.Unread) != 0 {
		t.Errorf("appendfsync risk without AOF, or unread settings: %+v", h)
	}
	if s := rs["eviction"].String(); !strings.Contains(s, "noeviction") || !strings.Contains(s, srv.Addr()) {
		t.Errorf("risk line %q names neither the node nor the fix", s)
	}

	configSet(t, admin, "maxmemory-policy", "volatile-ttl")
	if h, err = CheckStoreHealth(testCtx(t), &rc, nil); err != nil || risksOf(h)["eviction"].Seen != "maxmemory-policy volatile-ttl" {
		t.Errorf("volatile-ttl: %+v, %v; want an eviction risk (every record has a TTL)", h, err)
	}
	// Durability asking for more replicas than there are: every write would
	// fail closed.
	rc.Durability = config.Durability{Replicas: 1, Timeout: config.Duration(50 * time.Millisecond)}
	if h, err = CheckStoreHealth(testCtx(t), &rc, nil); err != nil || risksOf(h)["replicas"].Seen != "connected_slaves 0, redis.durability.replicas 1" {
		t.Errorf("durability 1 without a replica: %+v, %v; want a replicas risk", h, err)
	}
}

// A primary with AOF, noeviction and a connected replica reports no risk;
// appendfsync no is reported, everysec is not.
func TestStoreHealthSafe(t *testing.T) {
	t.Parallel()
	srv, _ := testenv.StartReplicatedRedis(t)
	primary := srv.Client(t)
	rc := testRedis(srv.URL(), "safe-"+testenv.RandID())
	h, err := CheckStoreHealth(testCtx(t), &rc, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Risks) != 0 || len(h.Unread) != 0 {
		t.Fatalf("AOF, noeviction and a replica: %+v, want no risk", h)
	}
	configSet(t, primary, "appendfsync", "no")
	if h, err = CheckStoreHealth(testCtx(t), &rc, nil); err != nil || risksOf(h)["appendfsync"].Seen != "appendonly yes, appendfsync no" || len(h.Risks) != 1 {
		t.Fatalf("appendfsync no: %+v, %v; want only the appendfsync risk", h, err)
	}
}

// The README's least-privilege user without +info and +config is told what
// could not be read, and the checks do not fail; with +info (the README's
// line) the eviction and replicas checks run from INFO.
func TestStoreHealthLeastPrivilege(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	configSet(t, admin, "maxmemory-policy", "allkeys-lru")
	const base = "reset on >pw ~ns:* resetchannels &ns:dedup:done &ns:dedup:forget -@all +evalsha +eval +script|load +get +set +del +publish +time +ping +subscribe +unsubscribe"
	acl := func(user, extra string) {
		args := []any{"ACL", "SETUSER", user}
		for _, f := range strings.Fields(base + " " + extra) {
			args = append(args, f)
		}
		if err := admin.Do(context.Background(), args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	acl("noinfo", "")
	acl("withinfo", "+info")

	rc := testRedis(srv.URL(), "ns")
	rc.Username, rc.Password = "noinfo", "pw"
	h, err := CheckStoreHealth(testCtx(t), &rc, nil)
	if err != nil {
		t.Fatalf("as a user without +info: %v, want the checks skipped, not a failure", err)
	}
	if len(h.Risks) != 0 || len(h.Unread) != 1 {
		t.Fatalf("without +info: %+v, want no risk and one unread note", h)
	}
	for _, want := range []string{"could not read maxmemory-policy, appendonly, save, appendfsync (CONFIG GET: NOPERM", "nor INFO (NOPERM", "eviction, persistence, replicas, appendfsync", "+info"} {
		if !strings.Contains(h.Unread[0], want) {
			t.Errorf("unread note %q does not say %q", h.Unread[0], want)
		}
	}

	rc.Username = "withinfo"
	if h, err = CheckStoreHealth(testCtx(t), &rc, nil); err != nil {
		t.Fatal(err)
	}
	rs := risksOf(h)
	if rs["eviction"].Seen != "maxmemory-policy allkeys-lru" || rs["replicas"].Check == "" || len(h.Unread) != 1 ||
		!strings.Contains(h.Unread[0], "could not read save, appendfsync") || !strings.Contains(h.Unread[0], "skipped the persistence check") {
		t.Fatalf("with +info: %+v; want eviction and replicas from INFO, and save/appendfsync said unread", h)
	}
}

// Through Sentinel the primary is checked: its one replica satisfies
// durability 1, not 2. In a Cluster, every primary is checked.
func TestStoreHealthSentinelAndCluster(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		sen := testenv.RedisSentinel(t)
		rc := testRedis("", "hsen-"+testenv.RandID())
		rc.Sentinel = &config.Sentinel{Master: sen.Master, Addrs: sen.Addrs}
		rc.Durability = config.Durability{Replicas: 1, Timeout: config.Duration(time.Second)}
		h, err := CheckStoreHealth(testCtx(t), &rc, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := risksOf(h)["replicas"]; ok {
			t.Errorf("durability 1 with a connected replica: %+v, want no replicas risk", h)
		}
		rc.Durability.Replicas = 2
		if h, err = CheckStoreHealth(testCtx(t), &rc, nil); err != nil || !strings.Contains(risksOf(h)["replicas"].Seen, "redis.durability.replicas 2") ||
			!strings.Contains(risksOf(h)["replicas"].Node, sen.Master) {
			t.Errorf("durability 2 with one replica: %+v, %v; want a replicas risk on the primary", h, err)
		}

		// The local Sentinels' down-after-milliseconds is 1000: a failover
		// is taken as 6s, which a lease of 10s outlasts with 5/8 of it left;
		// one of 2s does not.
		rc.Durability.Replicas = 1
		hs := []config.Handler{{Name: "short", Lease: config.Duration(2 * time.Second)}, {Name: "long", Lease: config.Duration(10 * time.Second)}}
		if h, err = CheckStoreHealth(testCtx(t), &rc, hs); err != nil {
			t.Fatal(err)
		}
		var fo []StoreRisk
		for _, r := range h.Risks {
			if r.Check == "failover" {
				fo = append(fo, r)
			}
		}
		if len(fo) != 1 || fo[0].Seen != "down-after-milliseconds 1000, handlers[0] (short) lease 2s" ||
			!strings.Contains(fo[0].Fix, "raise handlers[0].lease to at least 10s") || !strings.Contains(fo[0].Node, sen.Master) {
			t.Errorf("failover risks %+v, want one for handlers[0] naming its lease and the fix", fo)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		addrs := testenv.RedisCluster(t)
		rc := testRedis("", "hcl-"+testenv.RandID())
		rc.Addrs = addrs
		c, err := RedisClient(testCtx(t), &rc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var count atomic.Int64 // ForEachMaster runs fn concurrently
		_ = c.(*redis.ClusterClient).ForEachMaster(testCtx(t), func(context.Context, *redis.Client) error { count.Add(1); return nil })
		masters := int(count.Load())
		h, err := checkStore(testCtx(t), c, &rc, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The local Cluster has no replicas: every primary is a replicas risk.
		nodes := map[string]bool{}
		for _, r := range h.Risks {
			if r.Check == "replicas" {
				nodes[r.Node] = true
			}
		}
		if len(nodes) != masters || masters < 2 {
			t.Errorf("replicas risks on %v, want one per primary (%d): %+v", nodes, masters, h)
		}
	})
}

// appFixture is a NATS handler on a fresh stream whose action runs are
// counted, built from YAML for the redis section given.
type appFixture struct {
	app  *App
	js   jetstream.JetStream
	subj string
	runs atomic.Int64
	logs *testenv.SyncBuffer
	done chan error
	stop context.CancelFunc
}

func startApp(t *testing.T, redisYAML string, tweak func(*App)) *appFixture {
	t.Helper()
	url := testenv.NATS(t)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	id := "h-" + testenv.RandID()
	stream := strings.ReplaceAll("HEALTH_"+id, "-", "_")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"health." + id}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})
	cfg, err := config.Parse(fmt.Appendf(nil, `
redis: %s
http: {addr: "127.0.0.1:0"}
handlers:
  - name: h
    source: {nats: {url: %q, stream: %s, subject: health.%s}}
    lease: 5s
    backoff: {initial: 100ms, max: 500ms}
    action: {exec: {command: [/bin/true]}}
`, redisYAML, url, stream, id), nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &appFixture{js: js, subj: "health." + id, logs: &testenv.SyncBuffer{}, done: make(chan error, 1)}
	log := slog.New(slog.NewJSONHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := Build(testCtx(t), cfg, log, Options{Wrap: func(_ string, h consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
			f.runs.Add(1)
			return h.Handle(ctx, m)
		})
	}})
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(a)
	}
	f.app = a
	rctx, stop := context.WithCancel(context.Background())
	f.stop = stop
	go func() { f.done <- a.Run(rctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-f.done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Error("Run did not return within 40s of its context's end")
		}
		if t.Failed() {
			t.Logf("logs:\n%s", f.logs.String())
		}
	})
	testenv.Eventually(t, 10*time.Second, "no /metrics", func() bool { return a.HTTPAddr() != "" })
	return f
}

func (f *appFixture) publish(t *testing.T, keys ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, k := range keys {
		m := nats.NewMsg(f.subj)
		m.Header.Set("Idempotency-Key", k)
		m.Data = []byte("x")
		if _, err := f.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
}

// metric is the value of the series named exactly by series (name and
// labels as /metrics writes them), or -1 when absent.
func (f *appFixture) metric(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + f.app.HTTPAddr() + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return -1
}

// run on a Redis that evicts: a warning naming the eviction check and the
// fix, dedup_store_risk{check="eviction"} 1 on /metrics, and once keys are
// evicted, dedup_store_evictions_total grows with an error line.
func TestRunReportsEvictionRiskAndEvictions(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	configSet(t, admin, "maxmemory", "2mb", "maxmemory-policy", "allkeys-lru")
	f := startApp(t, fmt.Sprintf("{url: %q, namespace: evict}", srv.URL()), func(a *App) { a.evictionInterval = 50 * time.Millisecond })

	if got := f.metric(t, `dedup_store_risk{check="eviction"}`); got != 1 {
		t.Errorf(`dedup_store_risk{check="eviction"} = %v, want 1`, got)
	}
	if got := f.metric(t, `dedup_store_risk{check="appendfsync"}`); got != 0 {
		t.Errorf(`dedup_store_risk{check="appendfsync"} = %v, want 0`, got)
	}
	logs := f.logs.String()
	if !strings.Contains(logs, `"check":"eviction"`) || !strings.Contains(logs, `"seen":"maxmemory-policy allkeys-lru"`) || !strings.Contains(logs, "noeviction") {
		t.Errorf("no warning naming the eviction check, the policy and the fix:\n%s", logs)
	}
	if got := f.metric(t, "dedup_store_evictions_total"); got != 0 {
		t.Fatalf("dedup_store_evictions_total = %v before any eviction, want 0", got)
	}
	// 4 MB of values into a 2 MB Redis.
	pipe := admin.Pipeline()
	for i := range 400 {
		pipe.Set(context.Background(), fmt.Sprintf("filler:%d", i), strings.Repeat("x", 10_000), 0)
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "dedup_store_evictions_total did not move", func() bool {
		return f.metric(t, "dedup_store_evictions_total") > 0
	})
	testenv.Eventually(t, 5*time.Second, "no error line for the evictions", func() bool {
		return strings.Contains(f.logs.String(), `"level":"ERROR","msg":"Redis evicted keys`)
	})
}

// With redis.durability replicas: 1 on the Sentinel pair the worker
// processes every message; on the standalone server, which has no
// replica, it fails closed — no handler runs — and /metrics counts the
// shortfalls and times the WAITs.
func TestRunDurability(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		sen := testenv.RedisSentinel(t)
		f := startApp(t, fmt.Sprintf("{sentinel: {master: %s, addrs: [%s]}, namespace: %s, durability: {replicas: 1, timeout: 1s}}",
			sen.Master, strings.Join(sen.Addrs, ", "), "dur-"+testenv.RandID()), nil)
		f.publish(t, "a", "b", "c", "a")
		testenv.EventuallyNil(t, 30*time.Second, "3 processed and 1 duplicate on /metrics", func() error {
			if f.metric(t, `dedup_messages_total{handler="h",outcome="processed",transport="nats"}`) == 3 &&
				f.metric(t, `dedup_messages_total{handler="h",outcome="duplicate",transport="nats"}`) == 1 {
				return nil
			}
			return fmt.Errorf("%d runs of 3 keys", f.runs.Load())
		})
		if n := f.runs.Load(); n != 3 {
			t.Errorf("%d handler runs, want 3", n)
		}
		if got := f.metric(t, `dedup_store_duration_seconds_count{op="wait"}`); got < 2 {
			t.Errorf(`dedup_store_duration_seconds_count{op="wait"} = %v, want the WAITs timed`, got)
		}
	})
	t.Run("no replica", func(t *testing.T) {
		t.Parallel()
		f := startApp(t, fmt.Sprintf("{url: %q, namespace: %s, durability: {replicas: 1, timeout: 20ms}}", testenv.Redis(t), "dur0-"+testenv.RandID()), nil)
		f.publish(t, "x")
		testenv.Eventually(t, 20*time.Second, "no durability shortfall on /metrics", func() bool {
			return f.metric(t, `dedup_durability_shortfalls_total{node="",op="claim"}`) > 0
		})
		if n := f.runs.Load(); n != 0 {
			t.Errorf("%d handler runs without a replica, want 0 (fail closed)", n)
		}
		if got := f.metric(t, `dedup_store_risk{check="replicas"}`); got != 1 {
			t.Errorf(`dedup_store_risk{check="replicas"} = %v, want 1 (no replica for durability 1)`, got)
		}
	})
}

// A WAIT as long as the read timeout would have the pipeline time out
// before WAIT answers: refused, naming the field.
func TestOpenStoreDurabilityTimeoutUnderReadTimeout(t *testing.T) {
	t.Parallel()
	rc := testRedis(testenv.Redis(t), "durto-"+testenv.RandID())
	rc.Durability = config.Durability{Replicas: 1, Timeout: config.Duration(3 * time.Second)}
	_, _, err := OpenStore(testCtx(t), &rc, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "redis.durability.timeout: 3s: must be shorter than the client's read timeout 3s") {
		t.Fatalf("durability timeout 3s with read timeout 3s: %v, want an error naming redis.durability.timeout", err)
	}
	rc.Durability.Timeout = config.Duration(2 * time.Second)
	_, closeStore, err := OpenStore(testCtx(t), &rc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("durability timeout 2s: %v", err)
	}
	_ = closeStore()
}

// Sentinels that do not answer skip the failover check, and say so.
func TestFailoverCheckUnread(t *testing.T) {
	t.Parallel()
	rc := testRedis("", "fo-"+testenv.RandID())
	rc.Sentinel = &config.Sentinel{Master: "m", Addrs: []string{"127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))}}
	rc.ConnectTimeout = config.Duration(200 * time.Millisecond)
	rs, unread := failoverRisks(testCtx(t), &rc, []config.Handler{{Name: "h", Lease: config.Duration(time.Second)}})
	if len(rs) != 0 || !strings.Contains(unread, "skipped the failover check") || !strings.Contains(unread, "down-after-milliseconds") {
		t.Errorf("risks %+v, unread %q: want no risk and the check said skipped", rs, unread)
	}
}
