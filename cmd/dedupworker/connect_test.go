package main

// inspect and forget connect through app.OpenStore, as run does: with the
// config's credentials, to a Cluster from one node's URL, and through
// Sentinel.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// storeHandler is a handler section that validates without connecting.
const storeHandler = `handlers:
  - name: orders
    source: {nats: {url: "nats://127.0.0.1:4222", stream: S}}
    action: {exec: {command: [cat]}}
`

// completeKeys claims and completes keys of handler "orders" on client,
// independently of the binary's own connection code.
func completeKeys(t *testing.T, client redis.UniversalClient, ns string, keys ...string) {
	t.Helper()
	s, err := redisbackend.New(client, redisbackend.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reqs := make([]idempotency.ClaimRequest, len(keys))
	for i, k := range keys {
		reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey("orders", k), Fingerprint: "fp", FingerprintVersion: 1, Lease: 30 * time.Second}
	}
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]idempotency.Completion, len(res))
	for i, r := range res {
		if r.Claim == nil {
			t.Fatalf("claim %s: %s", reqs[i].Key, r.Outcome)
		}
		cs[i] = idempotency.Completion{Key: reqs[i].Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("receipt"), Retention: time.Hour}
	}
	if ok, err := s.Complete(ctx, cs); err != nil || len(ok) != len(cs) {
		t.Fatalf("complete: %v %v", ok, err)
	}
}

// inspectJSON runs inspect with args and the flags after the key, as
// #18 asks: inspect -c F --handler H KEY -o json.
func inspectJSON(t *testing.T, key string, args ...string) recordView {
	t.Helper()
	code, out, stderr := runCmd(t, append(append(append([]string{"inspect"}, args...), "--handler", "orders", key), "-o", "json")...)
	var v recordView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil {
		t.Fatalf("inspect %v --handler orders %s -o json: exit %d\n%s\n%s", args, key, code, out, stderr)
	}
	return v
}

func forgetYes(t *testing.T, key string, args ...string) {
	t.Helper()
	code, out, stderr := runCmd(t, append(append(append([]string{"forget"}, args...), "--handler", "orders", key), "--yes")...)
	if code != 0 || !strings.Contains(out, "deleted orders:"+key) {
		t.Fatalf("forget %v --handler orders %s --yes: exit %d %q %q", args, key, code, out, stderr)
	}
}

// A password-protected Redis (requirepass for the default user, an ACL
// user for the worker): inspect and forget -c FILE log in with the file's
// username and password_file, flags before and after the key; without
// the password they fail, exit 1, naming redis.url and showing no
// password; --redis URL with the credentials in it still works.
func TestInspectAndForgetWithTheConfigsCredentials(t *testing.T) {
	t.Parallel()
	const adminPW, userPW = "Admin-Pw-8086", "User-Pw-6502"
	srv := testenv.StartRedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: time.Second, MaxRetries: -1})
	t.Cleanup(func() { _ = admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns := "cred-" + testenv.RandID()
	if err := admin.Do(ctx, "ACL", "SETUSER", "worker", "reset", "on", ">"+userPW, "~"+ns+":*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "requirepass", adminPW).Err(); err != nil {
		t.Fatal(err)
	}
	user := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "worker", Password: userPW})
	t.Cleanup(func() { _ = user.Close() })
	completeKeys(t, user, ns, "order-1", "order-2")

	pwFile := filepath.Join(t.TempDir(), "redis-password")
	if err := os.WriteFile(pwFile, []byte(userPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, "redis: {url: %q, username: worker, password_file: %q, namespace: %s}\n"+storeHandler, srv.URL(), pwFile, ns)
	if v := inspectJSON(t, "order-1", "-c", cfg); !v.Found || v.State != "COMPLETED" || v.ResultBytes != len("receipt") {
		t.Fatalf("inspect -c FILE: %+v, want COMPLETED", v)
	}
	forgetYes(t, "order-1", "-c", cfg)
	if v := inspectJSON(t, "order-1", "-c", cfg); v.Found {
		t.Fatalf("after forget: %+v, want absent", v)
	}
	if n, err := admin.Exists(ctx, ns+":orders:order-2").Result(); err != nil || n != 1 {
		t.Fatalf("forget deleted more than its key: EXISTS order-2 = %d, %v", n, err)
	}

	noPW := writeConfig(t, "redis: {url: %q, username: worker, namespace: %s}\n"+storeHandler, srv.URL(), ns)
	for _, cmd := range []string{"inspect", "forget"} {
		code, out, stderr := runCmd(t, cmd, "-c", noPW, "--handler", "orders", "order-2", "--yes")
		if cmd == "inspect" {
			code, out, stderr = runCmd(t, cmd, "-c", noPW, "--handler", "orders", "order-2")
		}
		if code != exitRuntime || !strings.Contains(stderr, "redis.url") || !strings.Contains(stderr, "NOAUTH") {
			t.Errorf("%s without the password: exit %d %q %q, want 1 naming redis.url and NOAUTH", cmd, code, out, stderr)
		}
		if strings.Contains(stderr, userPW) || strings.Contains(stderr, adminPW) {
			t.Errorf("%s: stderr shows a password: %s", cmd, stderr)
		}
	}
	withCreds := fmt.Sprintf("redis://worker:%s@%s/0", userPW, srv.Addr())
	if v := inspectJSON(t, "order-2", "--redis", withCreds, "--namespace", ns); v.State != "COMPLETED" {
		t.Fatalf("inspect --redis URL: %+v, want COMPLETED", v)
	}
	code, out, stderr := runCmd(t, "inspect", "-c", cfg, "--handler", "ordres", "order-2")
	if want := `warning: --handler "ordres" is not a handler of ` + cfg + ` (it has orders)`; code != 0 || !strings.Contains(stderr, want) || !strings.Contains(out, "absent") {
		t.Errorf("inspect with a misspelt handler: exit %d %q %q, want 0, absent and %q", code, out, stderr, want)
	}
	if code, _, stderr := runCmd(t, "inspect", "-c", cfg, "--namespace", ns, "--handler", "orders", "order-2"); code != exitUsage || !strings.Contains(stderr, "redis.namespace") {
		t.Errorf("-c FILE with --namespace: exit %d %q, want 2 naming redis.namespace", code, stderr)
	}
}

// A config whose redis.url names one Cluster node: inspect and forget
// reach keys on every master (a plain client would get MOVED for the
// slots other nodes own).
func TestInspectAndForgetOnAClusterFromOneURL(t *testing.T) {
	t.Parallel()
	addrs := testenv.RedisCluster(t)
	cc := testenv.RedisClusterClient(t)
	ns := "clinsp-" + testenv.RandID()
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%d", i)
	}
	completeKeys(t, cc, ns, keys...)
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, "redis://"+addrs[0]+"/0", ns)
	for _, k := range keys {
		if v := inspectJSON(t, k, "-c", cfg); v.State != "COMPLETED" {
			t.Fatalf("inspect %s: %+v, want COMPLETED", k, v)
		}
	}
	for _, k := range keys[:4] {
		forgetYes(t, k, "-c", cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, k := range keys {
		n, err := cc.Exists(ctx, ns+":orders:"+k).Result()
		if err != nil || (n == 0) != (i < 4) {
			t.Errorf("after forgetting the first 4: EXISTS %s = %d, %v", k, n, err)
		}
	}
	t.Cleanup(func() {
		for _, k := range keys {
			cc.Del(context.Background(), ns+":orders:"+k)
		}
	})
}

// The worker runs on redis.sentinel: it claims and completes through the
// Sentinels' primary, and inspect and forget -c on the same file find and
// delete the record there.
func TestRunInspectForgetThroughSentinel(t *testing.T) {
	t.Parallel()
	sen := testenv.RedisSentinel(t)
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "SEN_"+id, "sen."+id)
	ns := "sen-" + id
	cfg := writeConfig(t, `
redis:
  namespace: %s
  sentinel: {master: %s, addrs: [%s]}
http: {addr: ""}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: SEN_%s, consumer: c}}
    action: {exec: {command: [sh, -c, "printf receipt"]}}
`, ns, sen.Master, strings.Join(sen.Addrs, ", "), url, id)
	p := start(t, nil, "run", "-c", cfg)
	publishNATS(t, js, "sen."+id, []string{"order-1"})
	testenv.Eventually(t, 30*time.Second, "order-1 COMPLETED, read by inspect through redis.sentinel", func() bool {
		_, out, _ := runCmd(t, "inspect", "-c", cfg, "--handler", "orders", "order-1", "-o", "json")
		return strings.Contains(out, `"state": "COMPLETED"`)
	})
	if code := p.term(20 * time.Second); code != 0 {
		t.Fatalf("run: exit %d after SIGTERM", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	primary := sen.Client(t)
	if raw, err := primary.Get(ctx, ns+":orders:order-1").Result(); err != nil || !strings.Contains(raw, `"COMPLETED"`) {
		t.Fatalf("the primary holds %q, %v", raw, err)
	}
	forgetYes(t, "order-1", "-c", cfg)
	if n, err := primary.Exists(ctx, ns+":orders:order-1").Result(); err != nil || n != 0 {
		t.Fatalf("after forget the primary still holds the record: %d, %v", n, err)
	}
}

// validate --online reaches each kind of deployment as run does: a
// Cluster from one node's URL and Sentinel; a Sentinel that knows no such
// master fails, exit 1, naming redis.sentinel.
func TestValidateOnlineThroughClusterURLAndSentinel(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VCS_"+id, "vcs."+id, time.Minute)
	handler := fmt.Sprintf(`handlers:
  - name: orders
    source: {nats: {url: %q, stream: VCS_%s}}
    retention: 1h
    action: {exec: {command: [/bin/true]}}
`, url, id)
	sen := testenv.RedisSentinel(t)
	addrs := testenv.RedisCluster(t)
	for name, section := range map[string]string{
		"cluster url": fmt.Sprintf("redis: {url: %q}\n", "redis://"+addrs[0]+"/0"),
		"sentinel":    fmt.Sprintf("redis: {sentinel: {master: %s, addrs: [%s]}}\n", sen.Master, strings.Join(sen.Addrs, ", ")),
	} {
		cfg := writeConfig(t, "%s", section+handler)
		if code, _, stderr := runCmd(t, "validate", "-c", cfg, "--online"); code != 0 {
			t.Errorf("%s: validate --online: exit %d %q, want 0", name, code, stderr)
		}
	}
	cfg := writeConfig(t, "redis: {sentinel: {master: no-such-master-%s, addrs: [%s]}, connect_timeout: 1s}\n%s", id, strings.Join(sen.Addrs, ", "), handler)
	if code, _, stderr := runCmd(t, "validate", "-c", cfg, "--online"); code != exitRuntime || !strings.Contains(stderr, "redis.sentinel") {
		t.Errorf("an unknown master: validate --online: exit %d %q, want 1 naming redis.sentinel", code, stderr)
	}
}

// validate --print shows redis.sentinel with its password redacted, and
// the old redis.master_name fails with where it moved, exit 2.
func TestValidatePrintRedactsTheSentinelPassword(t *testing.T) {
	t.Parallel()
	const pw = "Sentinel-Print-9000"
	cfg := writeConfig(t, "redis: {sentinel: {master: dedup, addrs: [127.0.0.1:26390], username: sen, password: %s}}\n"+storeHandler, pw)
	code, out, stderr := runCmd(t, "validate", "-c", cfg, "--print")
	if code != 0 || strings.Contains(out+stderr, pw) || !strings.Contains(out, "master: dedup") || !strings.Contains(out, "<redacted>") {
		t.Fatalf("validate --print: exit %d\n%s\n%s", code, out, stderr)
	}
	old := writeConfig(t, "redis:\n  addrs: [127.0.0.1:26390]\n  master_name: dedup\n"+storeHandler)
	code, _, stderr = runCmd(t, "validate", "-c", old)
	if want := "redis.master_name (line 3): moved to redis.sentinel.master"; code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("validate with redis.master_name: exit %d %q, want 2 and %q", code, stderr, want)
	}
}

// What go-redis logs on its own while validate --online reaches the
// Sentinels (here: the first one listed does not answer) comes out as the
// command's warnings, one "warning: go-redis: " line each, not as go-redis's
// raw text; the command still succeeds through the others.
func TestValidateOnlineGoRedisLinesAreWarnings(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VGR_"+id, "vgr."+id, time.Minute)
	sen := testenv.RedisSentinel(t)
	addrs := append([]string{testenv.FreeAddr(t)}, sen.Addrs...)
	cfg := writeConfig(t, `redis: {sentinel: {master: %s, addrs: [%s]}}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: VGR_%s}}
    retention: 1h
    action: {exec: {command: [/bin/true]}}
`, sen.Master, strings.Join(addrs, ", "), url, id)
	code, _, stderr := runCmd(t, "validate", "-c", cfg, "--online")
	if code != 0 {
		t.Fatalf("validate --online with one Sentinel down: exit %d %q, want 0", code, stderr)
	}
	var fromRedis int
	for _, line := range strings.Split(stderr, "\n") {
		if !strings.Contains(line, "sentinel: ") {
			continue
		}
		fromRedis++
		if !strings.HasPrefix(line, "warning: go-redis: ") {
			t.Errorf("stderr line %q: want it as \"warning: go-redis: …\"", line)
		}
	}
	if fromRedis == 0 {
		t.Fatalf("no go-redis line about the Sentinel that does not answer:\n%s", stderr)
	}
}
