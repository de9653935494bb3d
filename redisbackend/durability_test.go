package redisbackend_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/lua"
	"github.com/idemkit/dedupworker/redisbackend"
)

// durabilityHooks records what the store reports about its WAITs.
type durabilityHooks struct {
	mu        sync.Mutex
	waits     []time.Duration
	waitErrs  int
	shortfall map[string]int
}

func (h *durabilityHooks) OnStoreCall(op string, took time.Duration, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if op != redisbackend.OpReplicaWait {
		return
	}
	h.waits = append(h.waits, took)
	if err != nil {
		h.waitErrs++
	}
}

// OnDurabilityShortfall counts shortfalls by op, and by op and node as
// "op@node" when node is not "".
func (h *durabilityHooks) OnDurabilityShortfall(op, node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.shortfall == nil {
		h.shortfall = map[string]int{}
	}
	h.shortfall[op]++
	if node != "" {
		h.shortfall[op+"@"+node]++
	}
}

func (h *durabilityHooks) counts() (waits, waitErrs int, shortfall map[string]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waits), h.waitErrs, maps.Clone(h.shortfall)
}

// replicaOf returns a replica of the Sentinel deployment's current primary,
// as the primary's INFO replication names it.
func replicaOf(t *testing.T, sen *testenv.Sentinel) (primary, replica string) {
	t.Helper()
	ctx := ctxFor(t, 5*time.Second)
	primary, err := sen.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: primary, DialTimeout: time.Second})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("INFO replication on %s: %v", primary, err)
	}
	m := regexp.MustCompile(`slave\d+:ip=([^,]+),port=(\d+),state=online`).FindStringSubmatch(info)
	if m == nil {
		testenv.Unavailable(t, "redis sentinel replica", "primary "+primary+" has no online replica:\n"+info)
	}
	return primary, net.JoinHostPort(m[1], m[2])
}

// With Durability on a primary with a replica, claims, steps, releases and
// completions succeed, and each is on the replica as soon as the call
// returns: WAIT held the call until the replica had it.
func TestDurabilityReplicaHasEveryWrite(t *testing.T) {
	sen := testenv.RedisSentinel(t)
	client := sen.Client(t)
	hooks := &durabilityHooks{}
	s := newStore(t, client, redisbackend.Options{
		Durability: redisbackend.Durability{Replicas: 1, Timeout: time.Second},
		Hooks:      consumer.Hooks{hooks},
	})
	_, replicaAddr := replicaOf(t, sen)
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr, DialTimeout: time.Second})
	t.Cleanup(func() { _ = replica.Close() })
	ctx := ctxFor(t, 20*time.Second)
	onReplica := func(step, key string, check func(rec map[string]any) bool) {
		t.Helper()
		raw, err := replica.Get(ctx, s.RedisKey(key)).Result()
		if err != nil {
			t.Fatalf("%s: GET %s on the replica %s: %v", step, key, replicaAddr, err)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(raw), &rec); err != nil || !check(rec) {
			t.Fatalf("%s: the replica holds %s", step, raw)
		}
	}

	reqs := claimReqs("orders", 16)
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		t.Fatalf("Claim with Replicas 1: %v", err)
	}
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew {
			t.Fatalf("key %d: %s", i, r.Outcome)
		}
		onReplica("claim", reqs[i].Key, func(rec map[string]any) bool {
			return rec["state"] == "CLAIMED" && rec["token"] == r.Claim.Token
		})
	}
	first := res[0].Claim
	if ok, err := s.SaveStep(ctx, first.Key, first.Token, "charge", []byte("ch_1")); err != nil || !ok {
		t.Fatalf("SaveStep = %v, %v", ok, err)
	}
	onReplica("step", first.Key, func(rec map[string]any) bool {
		steps, _ := rec["steps"].(map[string]any)
		return steps["charge"] != nil
	})
	if ok, err := s.Release(ctx, first.Key, first.Token, time.Minute); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	onReplica("release", first.Key, func(rec map[string]any) bool { return rec["released"] == true })

	cs := make([]idempotency.Completion, 0, len(res)-1)
	for _, r := range res[1:] {
		cs = append(cs, idempotency.Completion{Key: r.Claim.Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("done"), Retention: time.Minute})
	}
	ok, err := s.Complete(ctx, cs)
	if err != nil {
		t.Fatalf("Complete with Replicas 1: %v", err)
	}
	for i, c := range cs {
		if !ok[i] {
			t.Fatalf("completion %d = false", i)
		}
		onReplica("complete", c.Key, func(rec map[string]any) bool {
			return rec["state"] == "COMPLETED" && rec["token"] == c.Token
		})
	}
	waits, waitErrs, short := hooks.counts()
	if waits != 4 || waitErrs != 0 || len(short) != 0 {
		t.Errorf("hooks saw %d WAITs (%d failed), shortfalls %v; want 4 (claim, step, release, complete) and none failed", waits, waitErrs, short)
	}
}

// A durable store on the Sentinel pair passes the whole conformance suite:
// WAIT changes when a call returns, never what it returns.
func TestStoreSentinelDurable(t *testing.T) {
	client := testenv.RedisSentinel(t).Client(t)
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness {
		return newHarnessWith(t, client, redisbackend.Options{
			Grace:      testGrace,
			Durability: redisbackend.Durability{Replicas: 1, Timeout: time.Second},
		})
	})
}

// Against a Redis without replicas, WAIT counts 0 of 1: the claim fails as
// the store being unavailable, returns no claim, and is counted.
func TestDurabilityShortfallFailsClosed(t *testing.T) {
	t.Parallel()
	client := testenv.RedisClient(t)
	hooks := &durabilityHooks{}
	const timeout = 50 * time.Millisecond
	s := newStore(t, client, redisbackend.Options{
		Durability: redisbackend.Durability{Replicas: 1, Timeout: timeout},
		Hooks:      consumer.Hooks{hooks},
	})
	ctx := ctxFor(t, 10*time.Second)
	start := time.Now()
	res, err := s.Claim(ctx, claimReqs("orders", 3))
	took := time.Since(start)
	if err == nil || res != nil {
		t.Fatalf("Claim on a Redis without replicas = %+v, %v; want no results and an error", res, err)
	}
	if !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, redisbackend.ErrReplicaShortfall) ||
		!strings.HasPrefix(err.Error(), "dedup: redis claim: ") || !strings.Contains(err.Error(), "0 of 1 replicas") {
		t.Errorf("error %q: want ErrStoreUnavailable and ErrReplicaShortfall, naming the op and the count", err)
	}
	if took < timeout {
		t.Errorf("Claim failed after %s, before WAIT's timeout %s", took, timeout)
	}
	waits, waitErrs, short := hooks.counts()
	if waits != 1 || waitErrs != 1 || short["claim"] != 1 || len(short) != 1 {
		t.Errorf("hooks saw %d WAITs (%d failed), shortfalls %v; want 1, 1 and claim=1", waits, waitErrs, short)
	}
	if d := hooks.waits[0]; d < timeout-5*time.Millisecond || d > timeout+time.Second {
		t.Errorf("WAIT took %s on the server's clock, want about its timeout %s", d, timeout)
	}
	// WAIT undid nothing: the claims are on the primary. The store gave
	// them back, so the keys are free at once and their attempt counts are
	// as before the claim (0).
	plain := newStore(t, client, redisbackend.Options{Namespace: s.Namespace()})
	for _, r := range claimReqs("orders", 3) {
		rec, err := s.Get(ctx, r.Key)
		if err != nil || rec == nil || !rec.Released || rec.Attempts != 0 {
			t.Fatalf("%s after the shortfall: %+v, %v; want a released record with attempts 0", r.Key, rec, err)
		}
		res, err := plain.Claim(ctx, []idempotency.ClaimRequest{r})
		if err != nil || res[0].Outcome != idempotency.ClaimNew || res[0].Claim.Attempts != 1 || res[0].Claim.Fence <= rec.Fence {
			t.Fatalf("claim of %s after the shortfall = %+v, %v; want NEW, attempt 1, a fence above %d", r.Key, res, err, rec.Fence)
		}
	}
	_, err = s.Complete(ctx, []idempotency.Completion{{Key: "orders:0", Token: "t", Outcome: idempotency.RecordOutcomeOK, Retention: time.Minute}})
	if !errors.Is(err, redisbackend.ErrReplicaShortfall) {
		t.Errorf("Complete on a Redis without replicas = %v, want a shortfall", err)
	}
	if _, _, short := hooks.counts(); short["complete"] != 1 {
		t.Errorf("shortfalls %v, want complete=1", short)
	}
}

// cmdLog records, per node address, the command names of every pipeline
// a cluster's node clients send.
type cmdLog struct {
	mu    sync.Mutex
	pipes map[string][][]string
}

func (l *cmdLog) hook(addr string) redis.Hook { return &nodeHook{l: l, addr: addr} }

type nodeHook struct {
	l    *cmdLog
	addr string
}

func (h *nodeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
			if args := c.Args(); c.Name() == "evalsha" && len(args) > 1 {
				names[i] += ":" + fmt.Sprint(args[1]) // which script
			}
		}
		h.l.mu.Lock()
		if h.l.pipes == nil {
			h.l.pipes = map[string][][]string{}
		}
		h.l.pipes[h.addr] = append(h.l.pipes[h.addr], names)
		h.l.mu.Unlock()
		return next(ctx, cmds)
	}
}

// On a cluster, the scripts of a batch go to the primaries of their slots,
// and each primary's pipeline ends with the WAIT for it, so the WAIT runs
// on the connection that ran the scripts. The test cluster has no
// replicas: every WAIT counts 0 and the batch fails closed.
func TestDurabilityClusterWaitsOnEachPrimary(t *testing.T) {
	t.Parallel()
	log := &cmdLog{}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t)})
	client.OnNewNode(func(node *redis.Client) { node.AddHook(log.hook(node.Options().Addr)) })
	t.Cleanup(func() { _ = client.Close() })
	hooks := &durabilityHooks{}
	s := newStore(t, client, redisbackend.Options{
		Durability: redisbackend.Durability{Replicas: 1, Timeout: 20 * time.Millisecond},
		Hooks:      consumer.Hooks{hooks},
	})
	ctx := ctxFor(t, 10*time.Second)
	reqs := claimReqs("orders", 64)
	owners := map[string]bool{}
	for _, r := range reqs {
		m, err := client.MasterForKey(ctx, s.RedisKey(r.Key))
		if err != nil {
			t.Fatal(err)
		}
		owners[m.Options().Addr] = true
	}
	if len(owners) < 2 {
		t.Fatalf("64 keys landed on %d primaries; the test needs a batch spanning nodes", len(owners))
	}
	log.mu.Lock()
	log.pipes = nil
	log.mu.Unlock()

	res, err := s.Claim(ctx, reqs)
	var be *idempotency.BatchError
	if !errors.Is(err, redisbackend.ErrReplicaShortfall) || !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.As(err, &be) || len(be.Errs) != len(reqs) || len(res) != len(reqs) {
		t.Fatalf("Claim on a cluster without replicas = %v, %v; want a BatchError of shortfalls", res, err)
	}
	for i, kerr := range be.Errs {
		var ne *idempotency.NodeError
		if !errors.Is(kerr, redisbackend.ErrReplicaShortfall) || !errors.As(kerr, &ne) {
			t.Fatalf("key %d: error %v, want a shortfall naming its node", i, kerr)
		}
		if m, _ := client.MasterForKey(ctx, s.RedisKey(reqs[i].Key)); ne.Node != m.Options().Addr {
			t.Errorf("key %d: shortfall names node %q, want its primary %s", i, ne.Node, m.Options().Addr)
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	// The claim's pipelines; after them the store gives the claims back,
	// in pipelines of the release script without WAIT.
	claimSHA := "evalsha:" + redis.NewScript(lua.Claim).Hash()
	var scripted []string
	for addr, pipes := range log.pipes {
		for _, names := range pipes {
			if !slices.Contains(names, claimSHA) {
				continue
			}
			scripted = append(scripted, addr)
			tail := names[len(names)-3:]
			if !slices.Equal(tail, []string{"time", "wait", "time"}) {
				t.Errorf("%s: pipeline %v does not end with TIME, WAIT, TIME", addr, names)
			}
			if slices.Contains(names[:len(names)-3], "wait") {
				t.Errorf("%s: pipeline %v has a WAIT before its scripts' end", addr, names)
			}
		}
	}
	slices.Sort(scripted)
	want := make([]string, 0, len(owners))
	for a := range owners {
		want = append(want, a)
	}
	slices.Sort(want)
	if !slices.Equal(scripted, want) {
		t.Errorf("pipelines with scripts went to %v, want one to each primary owning a key: %v", scripted, want)
	}
	if waits, _, short := hooks.counts(); waits != len(owners) || short["claim"] != len(owners) || len(short) != 1+len(owners) {
		t.Errorf("hooks saw %d WAITs, shortfalls %v; want %d WAITs and a claim shortfall on each primary", waits, short, len(owners))
	}
}

// Without Durability no WAIT is sent, on a cluster either.
func TestNoDurabilityNoWait(t *testing.T) {
	t.Parallel()
	log := &cmdLog{}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t)})
	client.OnNewNode(func(node *redis.Client) { node.AddHook(log.hook(node.Options().Addr)) })
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, redisbackend.Options{})
	ctx := ctxFor(t, 10*time.Second)
	res, err := s.Claim(ctx, claimReqs("orders", 16))
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]idempotency.Completion, len(res))
	for i, r := range res {
		cs[i] = idempotency.Completion{Key: r.Claim.Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Minute}
	}
	if _, err := s.Complete(ctx, cs); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for addr, pipes := range log.pipes {
		for _, names := range pipes {
			if slices.Contains(names, "wait") {
				t.Errorf("%s: pipeline %v sends WAIT without Durability", addr, names)
			}
		}
	}
}

func TestDurabilityOptionsNameTheField(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ReadTimeout: time.Second}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	for _, tc := range []struct {
		d     redisbackend.Durability
		field string
	}{
		{redisbackend.Durability{Replicas: -1}, "Durability.Replicas"},
		{redisbackend.Durability{Replicas: 1}, "Durability.Timeout"},
		{redisbackend.Durability{Replicas: 1, Timeout: -time.Second}, "Durability.Timeout"},
		{redisbackend.Durability{Replicas: 1, Timeout: 500 * time.Microsecond}, "Durability.Timeout"},
		{redisbackend.Durability{Replicas: 1, Timeout: time.Second}, "Durability.Timeout"}, // = ReadTimeout
	} {
		_, err := redisbackend.New(client, redisbackend.Options{Durability: tc.d})
		if optionField(err) != tc.field {
			t.Errorf("New(Durability %+v) = %v, want an error naming %s", tc.d, err, tc.field)
		}
	}
	for _, d := range []redisbackend.Durability{{}, {Timeout: time.Second}, {Replicas: 2, Timeout: 900 * time.Millisecond}} {
		s, err := redisbackend.New(client, redisbackend.Options{Durability: d})
		if err != nil {
			t.Errorf("New(Durability %+v) = %v", d, err)
			continue
		}
		_ = s.Close()
	}
}

// BenchmarkDurability measures what WAIT adds to a claim and a completion
// on the Sentinel pair (primary and one replica): the same work with
// Replicas 0 and 1, one message per call and 64 per call. ns/msg is the time
// per message; wait-µs/call the WAIT's own time on the server's clock.
func BenchmarkDurability(b *testing.B) {
	client := testenv.RedisSentinel(b).Client(b)
	for _, replicas := range []int{0, 1} {
		for _, size := range []int{1, 64} {
			b.Run(fmt.Sprintf("replicas-%d/batch-%d", replicas, size), func(b *testing.B) {
				hooks := &durabilityHooks{}
				s := newStore(b, client, redisbackend.Options{
					Durability: redisbackend.Durability{Replicas: replicas, Timeout: time.Second},
					Hooks:      consumer.Hooks{hooks},
				})
				ctx := context.Background()
				n := 0
				run := func() {
					reqs := claimReqs(fmt.Sprintf("bench-%d", n), size)
					n++
					res, err := s.Claim(ctx, reqs)
					if err != nil {
						b.Fatal(err)
					}
					cs := make([]idempotency.Completion, len(res))
					for i, r := range res {
						cs[i] = idempotency.Completion{Key: r.Claim.Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("ok"), Retention: time.Minute}
					}
					if _, err := s.Complete(ctx, cs); err != nil {
						b.Fatal(err)
					}
				}
				run()
				hooks.mu.Lock()
				hooks.waits = nil
				hooks.mu.Unlock()
				msgs := 0
				for b.Loop() {
					run()
					msgs += size
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(msgs), "ns/msg")
				hooks.mu.Lock()
				defer hooks.mu.Unlock()
				if len(hooks.waits) > 0 {
					var sum time.Duration
					for _, d := range hooks.waits {
						sum += d
					}
					b.ReportMetric(float64(sum.Microseconds())/float64(len(hooks.waits)), "wait-µs/call")
				}
			})
		}
	}
}
