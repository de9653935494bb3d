package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

func testRedis(url, ns string) config.Redis {
	return config.Redis{URL: url, Namespace: ns, Grace: config.Duration(time.Minute), ConnectTimeout: config.Duration(2 * time.Second)}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// claimAndComplete runs keys of handler through the store's public API:
// each is claimed NEW and completed, and then reads as COMPLETED.
func claimAndComplete(ctx context.Context, s *redisbackend.Store, handler string, keys []string) error {
	reqs := make([]idempotency.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey(handler, k), Fingerprint: "fp", FingerprintVersion: 1, Lease: 30 * time.Second}
	}
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	cs := make([]idempotency.Completion, len(res))
	for i, r := range res {
		if r.Outcome != idempotency.ClaimNew {
			return fmt.Errorf("claim %s: %s, want NEW", reqs[i].Key, r.Outcome)
		}
		cs[i] = idempotency.Completion{Key: reqs[i].Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("r"), Retention: time.Hour}
	}
	ok, err := s.Complete(ctx, cs)
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	for i, done := range ok {
		if !done {
			return fmt.Errorf("complete %s: refused", cs[i].Key)
		}
		rec, err := s.Get(ctx, cs[i].Key)
		if err != nil {
			return fmt.Errorf("get %s: %w", cs[i].Key, err)
		}
		if rec == nil || rec.State != idempotency.StateCompleted {
			return fmt.Errorf("get %s: %+v, want COMPLETED", cs[i].Key, rec)
		}
	}
	return nil
}

func keysN(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k-" + strconv.Itoa(i)
	}
	return keys
}

// A redis.url naming one Cluster node gets a Cluster client: keys of every
// slot are written through it (a plain client would get MOVED for the
// slots other nodes own), read back through an independent ClusterClient,
// and the store claims and completes over all three masters.
func TestRedisURLOfAClusterNodeGetsAClusterClient(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisCluster(t)
	ctx := testCtx(t)
	ns := "cl-url-" + testenv.RandID()
	rc := testRedis("redis://"+addrs[0]+"/0", ns)
	c, err := RedisClient(ctx, &rc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("redis.url %s (a Cluster node) got a %T, want *redis.ClusterClient", rc.URL, c)
	}
	other := testenv.RedisClusterClient(t)
	for _, k := range keysN(30) {
		key := ns + ":" + k
		if err := c.Set(ctx, key, "v-"+k, time.Minute).Err(); err != nil {
			t.Fatalf("SET %s through the url's client: %v", key, err)
		}
		if got, err := other.Get(ctx, key).Result(); err != nil || got != "v-"+k {
			t.Fatalf("GET %s through a ClusterClient: %q, %v", key, got, err)
		}
		other.Del(ctx, key)
	}

	var logged testenv.SyncBuffer
	s, closeStore, err := OpenStore(ctx, &rc, slog.New(slog.NewJSONHandler(&logged, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	if !strings.Contains(logged.String(), `"deployment":"cluster"`) {
		t.Errorf("OpenStore's log does not say it found a Cluster:\n%s", logged.String())
	}
	if err := claimAndComplete(ctx, s, "orders", keysN(30)); err != nil {
		t.Fatal(err)
	}

	rc.URL = "redis://" + addrs[0] + "/3"
	if _, err := RedisClient(ctx, &rc); err == nil || !strings.Contains(err.Error(), "database 0") {
		t.Fatalf("a Cluster node URL with /3: %v, want an error about database 0", err)
	}
}

// A standalone server's URL stays a plain client.
func TestRedisURLOfAStandaloneServer(t *testing.T) {
	t.Parallel()
	rc := testRedis(testenv.Redis(t), "sa-url-"+testenv.RandID())
	c, err := RedisClient(testCtx(t), &rc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := c.(*redis.Client); !ok {
		t.Fatalf("got a %T, want *redis.Client", c)
	}
}

// redis.addrs is a Cluster seed list: a standalone server there fails,
// naming the field, rather than running without slot routing.
func TestRedisAddrsIsForClusterSeeds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	rc := testRedis("", "addrs-"+testenv.RandID())
	rc.Addrs = testenv.RedisCluster(t)[:1]
	s, closeStore, err := OpenStore(ctx, &rc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	if err := claimAndComplete(ctx, s, "orders", keysN(10)); err != nil {
		t.Fatal(err)
	}
	u, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	rc.Addrs = []string{u.Addr}
	if _, err := RedisClient(ctx, &rc); err == nil || !strings.Contains(err.Error(), "redis.addrs") || !strings.Contains(err.Error(), "as redis.url") {
		t.Fatalf("redis.addrs of a standalone server: %v, want an error naming redis.addrs and redis.url", err)
	}
}

// The worker's store through redis.sentinel on the Sentinel deployment:
// claim and complete reach the primary, where a client of the test's own
// reads them. Retried within a deadline: another test may be failing the
// primary over.
func TestOpenStoreThroughSentinel(t *testing.T) {
	t.Parallel()
	sen := testenv.RedisSentinel(t)
	ns := "sen-" + testenv.RandID()
	rc := testRedis("", ns)
	rc.Sentinel = &config.Sentinel{Master: sen.Master, Addrs: sen.Addrs}
	direct := sen.Client(t)
	deadline := time.Now().Add(40 * time.Second)
	for attempt := 0; ; attempt++ {
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, closeStore, err := OpenStore(ctx, &rc, slog.New(slog.DiscardHandler))
			if err != nil {
				return err
			}
			defer closeStore()
			key := "order-" + strconv.Itoa(attempt)
			if err := claimAndComplete(ctx, s, "orders", []string{key}); err != nil {
				return err
			}
			raw, err := direct.Get(ctx, s.RedisKey(idempotency.EffectiveKey("orders", key))).Result()
			if err != nil || !strings.Contains(raw, `"COMPLETED"`) {
				return fmt.Errorf("the primary holds %q, %v", raw, err)
			}
			return nil
		}()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("through redis.sentinel %v: %v", sen.Addrs, err)
		}
		t.Logf("attempt %d: %v (retrying)", attempt, err)
	}
}

// startAuthSentinel starts a private data node with requirepass dataPW
// and a private redis-sentinel with requirepass sentinelPW monitoring it
// as master, and returns the Sentinel's address.
func startAuthSentinel(t *testing.T, master, dataPW, sentinelPW string) string {
	t.Helper()
	data := testenv.StartRedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: data.Addr(), DialTimeout: time.Second, MaxRetries: -1})
	defer admin.Close()
	ctx := testCtx(t)
	if err := admin.ConfigSet(ctx, "requirepass", dataPW).Err(); err != nil {
		t.Fatal(err)
	}
	bin, err := exec.LookPath("redis-sentinel")
	if err != nil {
		testenv.Unavailable(t, "redis-sentinel binary", err.Error())
	}
	addr := testenv.FreeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	dhost, dport, _ := net.SplitHostPort(data.Addr())
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("port %s\nbind %s\ndir %s\nrequirepass %s\nsentinel monitor %s %s %s 1\nsentinel auth-pass %s %s\n",
		port, host, dir, sentinelPW, master, dhost, dport, master, dataPW)), 0o600); err != nil {
		t.Fatal(err)
	}
	var out testenv.SyncBuffer
	cmd := exec.Command(bin, conf)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr, Password: sentinelPW, DialTimeout: time.Second, MaxRetries: -1})
	defer sc.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		hp, err := sc.GetMasterAddrByName(cctx, master).Result()
		cancel()
		if err == nil && len(hp) == 2 && net.JoinHostPort(hp[0], hp[1]) == data.Addr() {
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("private redis-sentinel on %s does not name %s: %v, %v\n%s", addr, data.Addr(), hp, err, out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a process's start: nothing to wait on
	}
}

// redis.sentinel's username and password are the Sentinels' own, apart
// from the data nodes': with both right the store works; without the
// Sentinel's, or with the data node's password given to the Sentinel, it
// fails naming redis.sentinel and showing neither password.
func TestSentinelHasItsOwnAuth(t *testing.T) {
	t.Parallel()
	const dataPW, sentinelPW = "Data-Pw-5150", "Sentinel-Pw-2112"
	addr := startAuthSentinel(t, "authm", dataPW, sentinelPW)
	pwFile := filepath.Join(t.TempDir(), "sentinel-password")
	if err := os.WriteFile(pwFile, []byte(sentinelPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	rc := testRedis("", "senauth-"+testenv.RandID())
	rc.Password = dataPW
	rc.Sentinel = &config.Sentinel{Master: "authm", Addrs: []string{addr}, PasswordFile: pwFile}
	s, closeStore, err := OpenStore(ctx, &rc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := claimAndComplete(ctx, s, "orders", keysN(3)); err != nil {
		t.Fatal(err)
	}
	closeStore()

	for name, change := range map[string]func(r *config.Redis){
		"no sentinel password": func(r *config.Redis) { r.Sentinel = &config.Sentinel{Master: "authm", Addrs: []string{addr}} },
		"data password for sentinel": func(r *config.Redis) {
			r.Sentinel = &config.Sentinel{Master: "authm", Addrs: []string{addr}, Password: dataPW}
		},
	} {
		r := rc
		change(&r)
		_, err := RedisClient(ctx, &r)
		if err == nil || !strings.Contains(err.Error(), "redis.sentinel") || !errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Errorf("%s: %v, want an error naming redis.sentinel", name, err)
		} else if strings.Contains(err.Error(), dataPW) || strings.Contains(err.Error(), sentinelPW) {
			t.Errorf("%s: the error shows a password: %v", name, err)
		}
	}
}
