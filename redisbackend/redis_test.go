package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// countHook counts the commands a client sends and the round trips it
// makes (a pipeline is one).
type countHook struct {
	cmds, trips, evalsha atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

func (h *countHook) count(cmd redis.Cmder) {
	h.cmds.Add(1)
	if cmd.Name() == "evalsha" {
		h.evalsha.Add(1)
	}
}

func claimReqs(prefix string, n int) []idempotency.ClaimRequest {
	reqs := make([]idempotency.ClaimRequest, n)
	for i := range reqs {
		reqs[i] = idempotency.ClaimRequest{Key: fmt.Sprintf("%s:%d", prefix, i), Fingerprint: "1:f", FingerprintVersion: 1, Lease: 30 * time.Second}
	}
	return reqs
}

// A batch is one script call on a single node.
func TestBatchIsOneCallStandalone(t *testing.T) {
	opt, _ := redis.ParseURL(testenv.Redis(t))
	client := redis.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, redisbackend.Options{})
	hook := &countHook{}
	client.AddHook(hook)
	ctx := ctxFor(t, 10*time.Second)
	// Load the scripts outside the count.
	if _, err := s.Claim(ctx, claimReqs("warm", 1)); err != nil {
		t.Fatal(err)
	}
	hook.cmds.Store(0)
	res, err := s.Claim(ctx, claimReqs("orders", 64))
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]idempotency.Completion, len(res))
	for i, r := range res {
		cs[i] = idempotency.Completion{Key: r.Claim.Key, Token: r.Claim.Token, Outcome: "ok", Retention: time.Minute}
	}
	if _, err := s.Complete(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if n := hook.cmds.Load(); n != 2 {
		t.Errorf("claim + complete of 64 keys sent %d commands, want 2", n)
	}
}

// On a cluster a batch is split by slot: one EVALSHA per slot, in one
// pipeline, and every key is claimed where it lives.
func TestBatchSpansSlotsCluster(t *testing.T) {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisCluster(t)})
	t.Cleanup(func() { _ = client.Close() })
	s := newStore(t, client, redisbackend.Options{})
	ctx := ctxFor(t, 10*time.Second)
	// A first multi-slot batch loads the scripts on every node: not counted.
	if _, err := s.Claim(ctx, claimReqs("warm", 8)); err != nil {
		t.Fatal(err)
	}
	hook := &countHook{}
	client.AddHook(hook)
	reqs := claimReqs("orders", 64)
	slots := map[int64]bool{}
	masters := map[string]bool{}
	for _, r := range reqs {
		slot, err := client.ClusterKeySlot(ctx, s.RedisKey(r.Key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		slots[slot] = true
		m, err := client.MasterForKey(ctx, s.RedisKey(r.Key))
		if err != nil {
			t.Fatal(err)
		}
		masters[m.Options().Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("64 keys landed on %d master(s); the test needs a batch spanning nodes", len(masters))
	}
	hook.evalsha.Store(0)
	hook.trips.Store(0)
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if n := hook.evalsha.Load(); n != int64(len(slots)) {
		t.Errorf("claim of 64 keys in %d slots sent %d EVALSHA, want one per slot", len(slots), n)
	}
	if n := hook.trips.Load(); n != 1 {
		t.Errorf("claim of a batch took %d pipelines/calls, want 1 pipeline", n)
	}
	cs := make([]idempotency.Completion, len(res))
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew || r.Claim.Key != reqs[i].Key {
			t.Fatalf("key %d: %s", i, r.Outcome)
		}
		cs[i] = idempotency.Completion{Key: r.Claim.Key, Token: r.Claim.Token, Outcome: "ok", Result: []byte(r.Claim.Key), Retention: time.Minute}
	}
	ok, err := s.Complete(ctx, cs)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range ok {
		if !v {
			t.Errorf("completion %d = false", i)
		}
	}
	// Each record is on the node that owns its slot, readable with a plain GET.
	for _, r := range reqs {
		rec, err := s.Get(ctx, r.Key)
		if err != nil || rec == nil || string(rec.Result) != r.Key {
			t.Errorf("Get(%s) = %+v, %v", r.Key, rec, err)
		}
	}
}

// New refuses what is not a usable client; the Options it refuses are in
// TestOptionsNameTheField.
func TestNewRefusesClients(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	if _, err := redisbackend.New(nil, redisbackend.Options{}); err == nil {
		t.Error("New(nil client): no error")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redisbackend.New(ring, redisbackend.Options{}); err == nil || !strings.Contains(err.Error(), "Ring") {
		t.Errorf("New(Ring) = %v, want it refused", err)
	}
	s, err := redisbackend.New(client, redisbackend.Options{})
	if err != nil {
		t.Fatalf("New with zero Options: %v", err)
	}
	if s.Namespace() != "dedup" || s.RedisKey("orders:1") != "dedup:orders:1" || s.Channel() != "dedup:dedup:done" {
		t.Errorf("defaults: namespace %q key %q channel %q", s.Namespace(), s.RedisKey("orders:1"), s.Channel())
	}
	_ = s.Close()
}

func TestNewFromURLBadScheme(t *testing.T) {
	for _, u := range []string{"http://127.0.0.1:6379", "127.0.0.1:6379", "unix:///tmp/redis.sock"} {
		_, err := redisbackend.NewFromURL(context.Background(), u, redisbackend.Options{})
		if err == nil || !strings.Contains(err.Error(), "url: ") || !strings.Contains(err.Error(), "redis://") {
			t.Errorf("NewFromURL(%q) = %v, want an error naming the url and the schemes it takes", u, err)
		}
		if errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Errorf("NewFromURL(%q): a bad URL is not the store being down: %v", u, err)
		}
	}
	_, err := redisbackend.NewFromURL(context.Background(), "redis://user:s3cret@[::1", redisbackend.Options{})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("NewFromURL of a malformed URL = %v; want an error that does not repeat the password", err)
	}
	_, err = redisbackend.NewFromURL(context.Background(), "redis://127.0.0.1:6379/notadb", redisbackend.Options{})
	if err == nil || !strings.Contains(err.Error(), "url") {
		t.Errorf("NewFromURL with a bad db = %v", err)
	}
	_, err = redisbackend.NewFromURL(context.Background(), "redis://127.0.0.1:6379", redisbackend.Options{Grace: -1})
	if optionField(err) != "Grace" {
		t.Errorf("NewFromURL with bad Options = %v, want a ConfigError for Grace", err)
	}
}

func TestNewFromURLUnreachableFailsFast(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s, err := redisbackend.NewFromURL(context.Background(), "redis://127.0.0.1:1/0", redisbackend.Options{})
	took := time.Since(start)
	if err == nil {
		_ = s.Close()
		t.Fatal("NewFromURL of a closed port: no error")
	}
	if !errors.Is(err, idempotency.ErrStoreUnavailable) || !strings.Contains(err.Error(), "127.0.0.1:1") ||
		!strings.HasPrefix(err.Error(), "dedup: redis connect to ") {
		t.Errorf("error %q: want ErrStoreUnavailable naming the address", err)
	}
	if took > time.Second {
		t.Errorf("NewFromURL of a closed port took %s; a refused connection must fail at once", took)
	}
}

// A server that accepts connections but never answers fails NewFromURL
// within the connect timeout, not the read timeouts and retries after it.
func TestNewFromURLSilentServerFailsWithinConnectTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() { // accept and hold connections, never reply
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	const connect = 700 * time.Millisecond
	start := time.Now()
	s, err := redisbackend.NewFromURL(context.Background(), "redis://"+ln.Addr().String()+"/0?dial_timeout=700ms", redisbackend.Options{})
	took := time.Since(start)
	if err == nil {
		_ = s.Close()
		t.Fatal("NewFromURL of a silent server: no error")
	}
	if !errors.Is(err, idempotency.ErrStoreUnavailable) || !strings.Contains(err.Error(), ln.Addr().String()) {
		t.Errorf("error %q: want ErrStoreUnavailable naming the address", err)
	}
	if took < connect/2 || took > connect+500*time.Millisecond {
		t.Errorf("NewFromURL of a silent server took %s, want about the connect timeout %s", took, connect)
	}
}

func TestNewFromURLOwnsClient(t *testing.T) {
	s, err := redisbackend.NewFromURL(ctxFor(t, 10*time.Second), testenv.Redis(t), redisbackend.Options{Namespace: "url-" + testenv.RandID()})
	if err != nil {
		t.Fatalf("NewFromURL(%s): %v", testenv.Redis(t), err)
	}
	ctx := ctxFor(t, 10*time.Second)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	res, err := s.Claim(ctx, claimReqs("k", 1))
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("Claim = %+v, %v", res, err)
	}
	if _, err := s.Delete(ctx, "k:0"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, redisbackend.ErrClosed) || !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("Ping after Close = %v, want ErrClosed and ErrStoreUnavailable", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

// ACL user and password in the URL reach the server; a wrong password fails
// without being repeated in the error.
func TestNewFromURLACL(t *testing.T) {
	admin := testenv.RedisClient(t)
	ctx := ctxFor(t, 10*time.Second)
	user := "dedup-acl-" + testenv.RandID()
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pa:ss w0rd", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
	u, err := url.Parse(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(user, "pa:ss w0rd")
	s, err := redisbackend.NewFromURL(ctx, u.String(), redisbackend.Options{Namespace: "acl-" + testenv.RandID()})
	if err != nil {
		t.Fatalf("NewFromURL with ACL credentials: %v", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	who, err := admin.Do(ctx, "CLIENT", "LIST").Text()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(who, "user="+user) {
		t.Errorf("no connection of user %s in CLIENT LIST", user)
	}
	_ = s.Close()
	u.User = url.UserPassword(user, "wrong-pass")
	if _, err := redisbackend.NewFromURL(ctx, u.String(), redisbackend.Options{}); err == nil ||
		!errors.Is(err, idempotency.ErrStoreUnavailable) || strings.Contains(err.Error(), "wrong-pass") {
		t.Errorf("NewFromURL with a wrong password = %v", err)
	}
}

// Errors from Redis name the operation and wrap ErrStoreUnavailable; caller
// mistakes are ErrInvalidRequest and never reach Redis.
func TestErrors(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = down.Close() })
	s, err := redisbackend.New(down, redisbackend.Options{PollCap: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := ctxFor(t, 10*time.Second)
	checks := map[string]error{}
	_, checks["claim"] = s.Claim(ctx, claimReqs("k", 2))
	_, checks["complete"] = s.Complete(ctx, []idempotency.Completion{{Key: "k", Token: "t", Outcome: "ok", Retention: time.Minute}})
	_, _, checks["renew"] = s.Renew(ctx, "k", "t", time.Second)
	_, checks["release"] = s.Release(ctx, "k", "t", time.Second)
	_, checks["save step"] = s.SaveStep(ctx, "k", "t", "s", nil)
	_, checks["get"] = s.Get(ctx, "k")
	_, checks["delete"] = s.Delete(ctx, "k")
	checks["ping"] = s.Ping(ctx)
	_, checks["wait"] = s.Wait(ctx, "k", time.Second)
	for op, err := range checks {
		if !errors.Is(err, idempotency.ErrStoreUnavailable) || !strings.HasPrefix(err.Error(), "dedup: redis "+op+": ") {
			t.Errorf("%s on a down Redis: %v; want ErrStoreUnavailable, prefixed %q", op, err, "dedup: redis "+op+": ")
		}
	}
	lease := idempotency.ClaimRequest{Key: "k", Fingerprint: "f", FingerprintVersion: 1}
	for name, err := range map[string]error{
		"empty key":    second(s.Claim(ctx, []idempotency.ClaimRequest{{Lease: time.Second}})),
		"zero lease":   second(s.Claim(ctx, []idempotency.ClaimRequest{lease})),
		"duplicate":    second(s.Claim(ctx, append(claimReqs("k", 2), claimReqs("k", 1)...))),
		"no retention": second(s.Complete(ctx, []idempotency.Completion{{Key: "k", Token: "t", Outcome: "ok"}})),
		"bad outcome":  second(s.Complete(ctx, []idempotency.Completion{{Key: "k", Token: "t", Outcome: "", Retention: time.Minute}})),
		"empty step":   second(s.SaveStep(ctx, "k", "t", "", nil)),
	} {
		if !errors.Is(err, redisbackend.ErrInvalidRequest) || errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Errorf("%s: %v; want ErrInvalidRequest only", name, err)
		}
	}
	// A context error is still recognisable as one.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	live := newStore(t, testenv.RedisClient(t), redisbackend.Options{})
	if _, err := live.Get(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Get with a cancelled context: %v; want context.Canceled in the chain", err)
	}
}

func second[T any](_ T, err error) error { return err }

// A recovered value that still carries a numeric fence continues it when it
// is ahead of the server's clock, so a downstream system that saw fence N
// never sees a smaller one from the next owner; any other recovered value
// gets the clock's fence, as a key without a record does.
func TestRecoveredContinuesFence(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, redisbackend.Options{})
	ctx := ctxFor(t, 10*time.Second)
	const ahead = 8_000_000_000_000_000 // µs: the year 2223, below 2^53
	for raw, want := range map[string]int64{
		`{"state":"BROKEN","fence":8000000000000000,"attempts":3}`: ahead + 1,
		`{"state":"BROKEN","fence":7,"attempts":3}`:                0, // the clock
		`{"fence":"7"}`: 0,
		`[7]`:           0,
		`garbage`:       0,
	} {
		key := "k-" + testenv.RandID()
		if err := client.Set(ctx, s.RedisKey(key), raw, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		before := serverMicros(t, client)
		res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}})
		if err != nil || res[0].Outcome != idempotency.ClaimRecovered {
			t.Fatalf("%s: Claim = %+v, %v", raw, res, err)
		}
		got := res[0].Claim.Fence
		switch {
		case want != 0 && got != want:
			t.Errorf("%s: recovered fence %d, want %d", raw, got, want)
		case want == 0 && (got < before || got > serverMicros(t, client)):
			t.Errorf("%s: recovered fence %d, want the server's time in µs (%d or a little later)", raw, got, before)
		}
	}
}

// serverMicros is the Redis server's clock (TIME) in microseconds.
func serverMicros(t testing.TB, client redis.UniversalClient) int64 {
	t.Helper()
	now, err := client.Time(ctxFor(t, 5*time.Second)).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now.UnixMicro()
}
