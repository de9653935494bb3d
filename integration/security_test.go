package integration_test

// Security (issue 8): Redis over TLS with a least-privilege ACL user, NATS
// with user/password over TLS, Kafka with SASL/SCRAM, all through the
// binary's configuration; and no secret in logs, validate --print or
// /metrics.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// SecACL is the least-privilege ACL of a dedupworker Redis user, for the
// namespace NS: its keys, its notification channel, and the commands the
// store and its scripts run (docs/SECURITY.md, "Redis"). Found by running the
// store conformance suite under it and removing what nothing needed; +info
// is for the store health checks and the eviction count,
// which read INFO where CONFIG GET is refused; +scan and +pttl are for
// dedupworker records and forget --state, +memory|usage for stats
// (records_security_test.go runs them as this user).
const secACL = "reset on >%s ~%s:* resetchannels &%s:dedup:done &%s:dedup:forget -@all " +
	"+evalsha +eval +script|load +get +set +del +publish +time +ping +subscribe +unsubscribe +info +scan +pttl +memory|usage"

// secACLStore starts a TLS Redis with its own CA, makes the ACL user
// "dedup" of secACLUser for namespace ns, and returns the CA, the Redis's
// address, an admin client and a store as that user.
func secACLStore(t *testing.T, ns, pw string) (*testenv.TestCA, string, *redis.Client, *redisbackend.Store) {
	t.Helper()
	ca := testenv.NewTestCA(t)
	addr, admin := secTLSRedis(t, ca)
	secACLUser(t, admin, "dedup", pw, ns)
	return ca, addr, admin, secUserStore(t, addr, ca, ns, pw)
}

// secUserStore is a store on the TLS Redis at addr (its CA ca) as the ACL
// user "dedup" of secACLUser, closed when the test ends.
func secUserStore(t *testing.T, addr string, ca *testenv.TestCA, ns, pw string) *redisbackend.Store {
	t.Helper()
	user := redis.NewClient(&redis.Options{Addr: addr, Username: "dedup", Password: pw,
		TLSConfig: &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}, DialTimeout: time.Second})
	t.Cleanup(func() { user.Close() })
	s, err := redisbackend.New(user, redisbackend.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// secTLSRedis starts a private redis-server that speaks only TLS, with a
// certificate of ca, and returns its address and an admin client (the
// default user) over TLS.
func secTLSRedis(t *testing.T, ca *testenv.TestCA) (string, *redis.Client) {
	t.Helper()
	srv := testenv.NewRedisServer(t, testenv.RedisServerConfig{TLS: ca})
	return srv.Addr(), srv.Client(t)
}

func secACLUser(t *testing.T, admin *redis.Client, user, pw, ns string, extra ...string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", user}
	for _, f := range strings.Fields(fmt.Sprintf(secACL, pw, ns, ns, ns)) {
		args = append(args, f)
	}
	for _, e := range extra {
		args = append(args, e)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
}

// The store runs its whole conformance suite over rediss:// (a CA the test
// makes) as an ACL user restricted to the namespace's keys and channel and
// to the commands of secACL; without one of those permissions it fails with
// a clear NOPERM error; and the user can reach nothing outside the
// namespace.
func TestSecurityRedisTLSLeastPrivilege(t *testing.T) {
	t.Parallel()
	ca := testenv.NewTestCA(t)
	addr, admin := secTLSRedis(t, ca)
	const ns = "secns"
	secACLUser(t, admin, "dedup", "acl-pw", ns)
	withCA := func(o *redis.Options) {
		if o.TLSConfig != nil {
			o.TLSConfig.RootCAs = ca.Pool
		}
	}
	url := "rediss://dedup:acl-pw@" + addr + "/0"
	open := func(t *testing.T, url string) (*redisbackend.Store, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return redisbackend.NewFromURL(ctx, url, redisbackend.Options{Namespace: ns, Grace: 2 * time.Second}, withCA)
	}

	t.Run("conformance", func(t *testing.T) {
		storetest.RunHarness(t, func(t *testing.T) *storetest.Harness {
			s, err := open(t, url)
			if err != nil {
				t.Fatalf("NewFromURL as the ACL user: %v", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return &storetest.Harness{
				Store: s, Grace: 2 * time.Second,
				TTL: func(t *testing.T, key string) time.Duration {
					return admin.PTTL(context.Background(), s.RedisKey(key)).Val()
				},
				SetRaw: func(t *testing.T, key string, raw []byte) {
					if err := admin.Set(context.Background(), s.RedisKey(key), raw, time.Minute).Err(); err != nil {
						t.Fatal(err)
					}
				},
				FlushScripts: func(t *testing.T) { admin.ScriptFlush(context.Background()) },
			}
		})
	})

	// The local cache answers only while its forget subscription stands:
	// the ACL's second channel is what lets it subscribe.
	t.Run("local cache subscribes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := redisbackend.NewFromURL(ctx, url, redisbackend.Options{Namespace: ns, Grace: 2 * time.Second,
			LocalCache: redisbackend.LocalCache{Entries: 10, TTL: time.Second}}, withCA)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		deadline := time.Now().Add(10 * time.Second)
		for !s.LocalCacheStats().Subscribed {
			if time.Now().After(deadline) {
				t.Fatal("the local cache's forget subscription never stood as the ACL user")
			}
			poll := time.NewTimer(20 * time.Millisecond) // the subscriber reports nothing to wait on
			<-poll.C
		}
	})

	t.Run("outside the ACL", func(t *testing.T) {
		ctx := context.Background()
		c := redis.NewClient(&redis.Options{Addr: addr, Username: "dedup", Password: "acl-pw",
			TLSConfig: &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}})
		defer c.Close()
		for name, err := range map[string]error{
			"GET of another namespace": c.Get(ctx, "other:key").Err(),
			"SET of another namespace": c.Set(ctx, "other:key", "x", 0).Err(),
			"KEYS":                     c.Keys(ctx, ns+":*").Err(),
			"FLUSHALL":                 c.FlushAll(ctx).Err(),
			"CONFIG GET":               c.ConfigGet(ctx, "*").Err(),
			"FLUSHALL inside EVAL":     c.Eval(ctx, "return redis.call('FLUSHALL')", nil).Err(),
			"GET elsewhere in EVAL":    c.Eval(ctx, "return redis.call('GET', KEYS[1])", []string{"other:key"}).Err(),
			"PUBLISH elsewhere":        c.Publish(ctx, "other", "x").Err(),
		} {
			if !secRefused(err) {
				t.Errorf("%s as the ACL user: %v, want a refusal", name, err)
			}
		}
		// Without the password, or in plain text, nothing at all.
		if _, err := open(t, "rediss://dedup:wrong@"+addr+"/0"); err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Errorf("wrong password: %v, want WRONGPASS", err)
		}
		if _, err := open(t, "redis://dedup:acl-pw@"+addr+"/0?dial_timeout=1s"); err == nil {
			t.Error("plain text to the TLS port: no error")
		}
	})

	// Each permission of the ACL is needed: without it a store operation
	// fails with an error that names the refusal. EVAL is the fallback
	// after NOSCRIPT (a restart or failover empties the script cache), so
	// the scripts are flushed first.
	for _, missing := range []string{"-evalsha", "-eval", "-set", "-get", "-publish", "-time"} {
		t.Run("without "+missing[1:], func(t *testing.T) {
			err := secRoundAs(t, admin, addr, ns, missing, open)
			if !secRefused(err) {
				t.Fatalf("claim/renew/complete/get/wait without %s: %v, want the refusal", missing[1:], err)
			}
			if !errors.Is(err, idempotency.ErrStoreUnavailable) {
				t.Errorf("error %v does not wrap ErrStoreUnavailable (fail-closed)", err)
			}
		})
	}
	// SCRIPT LOAD only saves EVAL's cost: without it every call after a
	// NOSCRIPT runs by EVAL, and still works.
	t.Run("without script|load", func(t *testing.T) {
		if err := secRoundAs(t, admin, addr, ns, "-script|load", open); err != nil {
			t.Fatalf("without script|load: %v, want the EVAL fallback to work", err)
		}
	})
}

// secRefused: err is Redis refusing a command or key to the user, directly
// (NOPERM) or inside a script.
func secRefused(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "NOPERM") ||
		strings.Contains(err.Error(), "user executing the script can't run this command"))
}

func secRoundAs(t *testing.T, admin *redis.Client, addr, ns, missing string, open func(*testing.T, string) (*redisbackend.Store, error)) error {
	t.Helper()
	user := "dedup" + strings.NewReplacer("|", "", "-", "").Replace(missing)
	secACLUser(t, admin, user, "pw", ns, missing)
	if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := open(t, "rediss://"+user+":pw@"+addr+"/0")
	if err != nil {
		t.Fatalf("NewFromURL: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return secStoreRound(ctx, s, "s:"+user+testenv.RandID())
}

// secStoreRound runs what a worker runs for one key: claim, renew,
// complete (which publishes), get, and a wait on the completed key.
func secStoreRound(ctx context.Context, s *redisbackend.Store, key string) error {
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: 5 * time.Second}})
	if err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	if res[0].Claim == nil {
		return fmt.Errorf("claim: outcome %s", res[0].Outcome)
	}
	tok := res[0].Claim.Token
	if _, ok, err := s.Renew(ctx, key, tok, 5*time.Second); err != nil {
		return fmt.Errorf("renew: %w", err)
	} else if !ok {
		return errors.New("renew: the claim reads as lost")
	}
	ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: tok, Outcome: idempotency.RecordOutcomeOK, Retention: time.Minute}})
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	} else if !ok[0] {
		return errors.New("complete: the claim reads as lost")
	}
	if rec, err := s.Get(ctx, key); err != nil {
		return fmt.Errorf("get: %w", err)
	} else if rec == nil {
		return errors.New("get: no record")
	}
	if _, err := s.Wait(ctx, key, time.Second); err != nil {
		return fmt.Errorf("wait: %w", err)
	}
	return nil
}

// secNATS starts an embedded nats-server with JetStream that requires TLS
// (a certificate of ca) and a user and password.
func secNATS(t *testing.T, ca *testenv.TestCA, user, pw string) string {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
		Users:     []*natsserver.User{{Username: user, Password: pw}},
		TLS:       true,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Server}, MinVersion: tls.VersionTLS12},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	return fmt.Sprintf("tls://127.0.0.1:%d", s.Addr().(*net.TCPAddr).Port)
}

// secProc is a running binary whose output the test reads.
type secProc struct{ *testenv.Process }

func secStart(t *testing.T, env []string, args ...string) *secProc {
	t.Helper()
	return &secProc{testenv.StartProcess(t, env, hostileBinary(t), args...)}
}

// metricsAddr waits for the log line that names the metrics server.
func (p *secProc) metricsAddr(t *testing.T) string {
	t.Helper()
	var addr string
	testenv.EventuallyNil(t, 30*time.Second, "the metrics address in the log", func() error {
		sc := bufio.NewScanner(strings.NewReader(p.Output.String()))
		for sc.Scan() {
			var l struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && strings.HasPrefix(l.Msg, "serving /metrics") {
				addr = l.Addr
				return nil
			}
		}
		select {
		case <-p.Done():
			t.Fatalf("dedupworker exited: %v\n%s", p.Err(), p.Output.String())
		default:
		}
		return errors.New("log so far:\n" + p.Output.String())
	})
	return addr
}

// secLedgerFull waits until the exec ledger at path has a line per key.
func secLedgerFull(t *testing.T, within time.Duration, path string, keys int) {
	t.Helper()
	testenv.EventuallyNil(t, within, "a ledger line per key", func() error {
		if n := len(secLedger(path)); n < keys {
			return fmt.Errorf("ledger has %d of %d keys", n, keys)
		}
		return nil
	})
}

func (p *secProc) stop(t *testing.T) int {
	t.Helper()
	return p.Stop(t, os.Interrupt, 30*time.Second)
}

func secGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// secLedger returns the distinct keys the exec action wrote to path.
func secLedger(path string) (lines []string) {
	b, _ := os.ReadFile(path)
	for l := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

func secNoSecrets(t *testing.T, where, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Errorf("%s shows the secret %q:\n%s", where, s, text)
		}
	}
}

// secRunCLI runs the binary with args to completion, within a minute,
// fails t where its stdout or stderr shows one of secrets, and returns its
// exit code, stdout and stderr.
func secRunCLI(t *testing.T, secrets []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, hostileBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	secNoSecrets(t, args[0], out.String(), secrets...)
	secNoSecrets(t, args[0]+" (stderr)", errOut.String(), secrets...)
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%v: %v", args, err)
	}
	return testenv.ExitCode(err), out.String(), errOut.String()
}

// The binary runs a NATS handler with the Redis store over TLS as the
// least-privilege ACL user (password from a file) and NATS over TLS with a
// user and password (from the environment): it processes every key once,
// and neither its logs, nor validate --print, nor /metrics or /readyz show
// a password — including those written inside the Redis and NATS URLs.
func TestSecurityBinaryTLSAndACL(t *testing.T) {
	t.Parallel()
	ca := testenv.NewTestCA(t)
	raddr, admin := secTLSRedis(t, ca)
	ns := "secbin"
	const redisPW, natsPW = "redis-Secret-4711", "nats-Secret-0815"
	secACLUser(t, admin, "dedup", redisPW, ns)
	natsURL := secNATS(t, ca, "worker", natsPW)

	_, js := testenv.NATSConnect(t, natsURL, nats.UserInfo("worker", natsPW), nats.RootCAs(ca.CAFile))
	ctx := natsCtx(t, 60*time.Second)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SEC", Subjects: []string{"sec.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := nats.Connect(natsURL, nats.UserInfo("worker", "wrong"), nats.RootCAs(ca.CAFile)); err == nil {
		t.Fatal("nats-server accepted a wrong password")
	}

	dir := t.TempDir()
	pwFile := filepath.Join(dir, "redis-password")
	if err := os.WriteFile(pwFile, []byte(redisPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ledger := filepath.Join(dir, "ledger")
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `
redis:
  url: rediss://%s/0
  username: dedup
  password_file: %s
  namespace: %s
  tls: {ca_file: %s}
http: {addr: "127.0.0.1:0"}
log: {level: debug}
handlers:
  - name: sec
    source:
      nats: {url: %s, stream: SEC, subject: sec.>, user: worker, password: "${NATS_PW}", tls: {ca_file: %s}}
    lease: 5s
    action:
      exec: {command: [/bin/sh, -c, 'cat >/dev/null; echo "$DEDUP_KEY" >> %s']}
`, raddr, pwFile, ns, ca.CAFile, natsURL, ca.CAFile, ledger), 0o600); err != nil {
		t.Fatal(err)
	}
	// The same config with the passwords also written inside the URLs,
	// which is what the worker runs.
	inline := filepath.Join(dir, "inline.yaml")
	text, _ := os.ReadFile(cfg)
	text = bytes.Replace(text, []byte("rediss://"+raddr), []byte("rediss://dedup:"+redisPW+"@"+raddr), 1)
	text = bytes.Replace(text, []byte("url: "+natsURL), []byte("url: tls://worker:"+natsPW+"@"+strings.TrimPrefix(natsURL, "tls://")), 1)
	if err := os.WriteFile(inline, text, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"NATS_PW=" + natsPW}
	p := secStart(t, env, "run", "-c", inline)
	maddr := p.metricsAddr(t)
	keys := natsPlanWithDuplicates(20, 10)
	for _, k := range keys {
		m := nats.NewMsg("sec.in")
		m.Data = []byte("x")
		m.Header.Set("Idempotency-Key", k)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	secLedgerFull(t, 30*time.Second, ledger, keys.unique())
	testenv.Eventually(t, 10*time.Second, "the consumer drained", func() bool {
		c, err := js.Consumer(ctx, "SEC", "sec-dedup")
		if err != nil {
			return false
		}
		i, err := c.Info(ctx)
		return err == nil && i.NumAckPending == 0 && i.NumPending == 0
	})
	if got := secLedger(ledger); len(got) != keys.unique() {
		t.Fatalf("exec ran %d times for %d keys", len(got), keys.unique())
	}
	metrics := secGet(t, "http://"+maddr+"/metrics")
	if !strings.Contains(metrics, `dedup_messages_total{handler="sec",outcome="duplicate",transport="nats"} 10`) {
		t.Errorf("metrics lack the 10 duplicates:\n%s", metrics)
	}
	secNoSecrets(t, "/metrics", metrics, redisPW, natsPW)
	secNoSecrets(t, "/readyz", secGet(t, "http://"+maddr+"/readyz"), redisPW, natsPW)
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGINT", code)
	}
	secNoSecrets(t, "the log", p.Output.String(), redisPW, natsPW)

	// validate --print: passwords from the environment, from the file, and
	// written inside URLs are all redacted.
	for _, c := range []string{cfg, inline} {
		cmd := exec.Command(hostileBinary(t), "validate", "-c", c, "--print")
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("validate --print %s: %v\n%s", c, err, out)
		}
		if !strings.Contains(string(out), "<redacted>") {
			t.Errorf("validate --print shows no redaction:\n%s", out)
		}
		secNoSecrets(t, "validate --print", string(out), redisPW, natsPW)
	}

	// A wrong Redis password fails the start with exit 1 and says why,
	// without the password.
	bad := filepath.Join(dir, "bad-password")
	if err := os.WriteFile(bad, []byte("Wrong-Guess-99"), 0o600); err != nil {
		t.Fatal(err)
	}
	badCfg := filepath.Join(dir, "bad.yaml")
	text, _ = os.ReadFile(cfg)
	if err := os.WriteFile(badCfg, bytes.Replace(text, []byte(pwFile), []byte(bad), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	pb := secStart(t, env, "run", "-c", badCfg)
	select {
	case <-pb.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("dedupworker with a wrong Redis password did not exit")
	}
	var ee *exec.ExitError
	if !errors.As(pb.Err(), &ee) || ee.ExitCode() != 1 || !strings.Contains(pb.Output.String(), "WRONGPASS") {
		t.Errorf("wrong Redis password: %v, output %s; want exit 1 naming WRONGPASS", pb.Err(), pb.Output.String())
	}
	secNoSecrets(t, "the log of a failed start", pb.Output.String(), "Wrong-Guess-99", natsPW)
}

// The binary consumes from a real Kafka SASL_PLAINTEXT listener that
// requires SASL/SCRAM-SHA-256, with the password from the environment, and
// never shows it; a wrong password fails the run with exit 1.
func TestSecurityBinaryKafkaSCRAM(t *testing.T) {
	t.Parallel()
	sec := testenv.RealKafkaSecurity(t)
	user, pw := sec.Users["SCRAM-SHA-256"][0], sec.Users["SCRAM-SHA-256"][1]
	brokers := sec.SASL
	topic := "sec-in-" + testenv.RandID()
	testenv.CreateKafkaTopic(t, testenv.RealKafka(t), topic, 2)
	mech, err := scram.Mechanism(scram.SHA256, user, pw)
	if err != nil {
		t.Fatal(err)
	}
	keys := natsPlanWithDuplicates(20, 10)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond,
		Transport: &kafka.Transport{SASL: mech}}
	var msgs []kafka.Message
	for _, k := range keys {
		msgs = append(msgs, kafka.Message{Value: []byte("x"), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(k)}}})
	}
	if err := w.WriteMessages(natsCtx(t, 30*time.Second), msgs...); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()

	dir := t.TempDir()
	ledger := filepath.Join(dir, "ledger")
	write := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, fmt.Appendf(nil, `
redis: {url: %s, namespace: seckafka-%s}
http: {addr: "127.0.0.1:0"}
handlers:
  - name: sec
    source:
      kafka: {brokers: [%s], topic: %s, session_timeout: 2s, sasl: {mechanism: scram-sha-256, username: %s, password: "${KAFKA_PW}"}}
    action:
      exec: {command: [/bin/sh, -c, 'cat >/dev/null; echo "$DEDUP_KEY" >> %s']}
`, testenv.Redis(t), testenv.RandID(), strings.Join(brokers, ", "), topic, user, ledger), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := write("config.yaml")
	p := secStart(t, []string{"KAFKA_PW=" + pw}, "run", "-c", cfg)
	maddr := p.metricsAddr(t)
	secLedgerFull(t, 60*time.Second, ledger, keys.unique())
	metrics := secGet(t, "http://"+maddr+"/metrics")
	testenv.EventuallyNil(t, 30*time.Second, "the 10 duplicates on /metrics", func() error {
		metrics = secGet(t, "http://"+maddr+"/metrics")
		if strings.Contains(metrics, `dedup_messages_total{handler="sec",outcome="duplicate",transport="kafka"} 10`) {
			return nil
		}
		return errors.New("not yet:\n" + metrics)
	})
	if n := len(secLedger(ledger)); n != keys.unique() {
		t.Fatalf("exec ran %d times for %d keys", n, keys.unique())
	}
	secNoSecrets(t, "/metrics", metrics, pw)
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGINT", code)
	}
	secNoSecrets(t, "the log", p.Output.String(), pw)
	cmd := exec.Command(hostileBinary(t), "validate", "-c", cfg, "--print")
	cmd.Env = append(os.Environ(), "KAFKA_PW="+pw)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("validate --print: %v\n%s", err, out)
	}
	secNoSecrets(t, "validate --print", string(out), pw)

	pb := secStart(t, []string{"KAFKA_PW=Wrong-Guess-77"}, "run", "-c", cfg)
	select {
	case <-pb.Done():
	case <-time.After(60 * time.Second):
		t.Fatal("dedupworker with a wrong SASL password did not exit")
	}
	var ee *exec.ExitError
	if !errors.As(pb.Err(), &ee) || ee.ExitCode() != 1 {
		t.Errorf("wrong SASL password: %v, want exit 1; output %s", pb.Err(), pb.Output.String())
	}
	secNoSecrets(t, "the log of a failed start", pb.Output.String(), "Wrong-Guess-77", pw)
}

// secValidateOnline runs validate --online on cfg with env and returns its
// exit code and combined output.
func secValidateOnline(t *testing.T, env []string, cfg string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, hostileBinary(t), "validate", "-c", cfg, "--online")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee) && ctx.Err() == nil:
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("validate --online %s: %v\n%s", cfg, err, out)
	return 0, ""
}

// validate --online connects as run does: to Redis over TLS with the CA of
// redis.tls as the ACL user of redis.username/password_file (or of the
// URL), and to NATS over TLS with the CA of its tls section as the user of
// user/password (or of the URL). With a wrong password or CA it fails
// (exit 1) naming the field and the refusal, and never shows a password.
func TestSecurityValidateOnlineTLSAndACL(t *testing.T) {
	t.Parallel()
	ca, otherCA := testenv.NewTestCA(t), testenv.NewTestCA(t)
	raddr, admin := secTLSRedis(t, ca)
	const ns = "secval"
	const redisPW, natsPW = "redis-Valid-3141", "nats-Valid-2718"
	const wrongPW = "Wrong-Guess-55"
	secACLUser(t, admin, "dedup", redisPW, ns)
	secACLUser(t, admin, "elsewhere", redisPW, "otherns") // may connect, not read secval's keys
	natsURL := secNATS(t, ca, "worker", natsPW)
	_, js := testenv.NATSConnect(t, natsURL, nats.UserInfo("worker", natsPW), nats.RootCAs(ca.CAFile))
	if _, err := js.CreateStream(natsCtx(t, 30*time.Second), jetstream.StreamConfig{Name: "SECV", Subjects: []string{"secv.>"}, MaxAge: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	pwFile, badFile := filepath.Join(dir, "redis-password"), filepath.Join(dir, "bad-password")
	if err := os.WriteFile(pwFile, []byte(redisPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(badFile, []byte(wrongPW+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	natsHost := strings.TrimPrefix(natsURL, "tls://")
	type conf struct{ redisURL, redisAuth, redisCA, natsURL, natsAuth, natsCA string }
	good := conf{"rediss://" + raddr + "/0", "username: dedup, password_file: " + pwFile + ",", ca.CAFile,
		natsURL, `user: worker, password: "${NATS_PW}",`, ca.CAFile}
	write := func(name string, c conf) string {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, `
redis: {url: %q, %s namespace: %s, tls: {ca_file: %s}}
handlers:
  - name: v
    source:
      nats: {url: %q, stream: SECV, subject: secv.>, %s tls: {ca_file: %s}}
    retention: 1h
    action:
      exec: {command: [/bin/true]}
`, c.redisURL, c.redisAuth, ns, c.redisCA, c.natsURL, c.natsAuth, c.natsCA), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := []string{"NATS_PW=" + natsPW}
	secrets := []string{redisPW, natsPW, wrongPW}

	ok := map[string]conf{
		"credentials in fields": good,
		"credentials in the URLs": {"rediss://dedup:" + redisPW + "@" + raddr + "/0", "", ca.CAFile,
			"tls://worker:" + natsPW + "@" + natsHost, "", ca.CAFile},
	}
	for name, c := range ok {
		t.Run(name, func(t *testing.T) {
			code, out := secValidateOnline(t, env, write(strings.ReplaceAll(name, " ", "-"), c))
			if code != 0 || !strings.Contains(out, "ok (1 handlers)") {
				t.Fatalf("validate --online: exit %d, want 0:\n%s", code, out)
			}
			// The stream's max_age was read over the authenticated TLS
			// connection: the horizon warning names it.
			if !strings.Contains(out, "stream SECV max_age 2h") {
				t.Errorf("no warning naming the stream's max_age 2h:\n%s", out)
			}
			// The store health checks ran from INFO as this user, and
			// say what CONFIG GET would have shown.
			if !strings.Contains(out, `store risk "replicas"`) || !strings.Contains(out, "note: redis ") ||
				!strings.Contains(out, "could not read save, appendfsync (CONFIG GET: NOPERM") {
				t.Errorf("no replicas risk from INFO, or no note naming what CONFIG GET refused:\n%s", out)
			}
			secNoSecrets(t, "validate --online", out, secrets...)
		})
	}

	bad := []struct {
		name string
		c    conf
		env  string
		want []string
	}{
		{"wrong redis password_file", conf{good.redisURL, "username: dedup, password_file: " + badFile + ",", ca.CAFile, good.natsURL, good.natsAuth, good.natsCA},
			"", []string{"redis.url", "WRONGPASS"}},
		{"wrong redis password in the URL", conf{"rediss://dedup:" + wrongPW + "@" + raddr + "/0", "", ca.CAFile, good.natsURL, good.natsAuth, good.natsCA},
			"", []string{"redis.url", "WRONGPASS"}},
		{"redis user of another namespace", conf{good.redisURL, "username: elsewhere, password_file: " + pwFile + ",", ca.CAFile, good.natsURL, good.natsAuth, good.natsCA},
			"", []string{`redis.namespace "secval"`, "NOPERM"}},
		{"another redis CA", conf{good.redisURL, good.redisAuth, otherCA.CAFile, good.natsURL, good.natsAuth, good.natsCA},
			"", []string{"redis.url", "certificate"}},
		{"wrong nats password", good, wrongPW, []string{"handlers[0].source.nats.url", "uthorization"}},
		{"wrong nats password in the URL", conf{good.redisURL, good.redisAuth, good.redisCA, "tls://worker:" + wrongPW + "@" + natsHost, "", ca.CAFile},
			"", []string{"handlers[0].source.nats.url", "uthorization"}},
		{"another nats CA", conf{good.redisURL, good.redisAuth, good.redisCA, good.natsURL, good.natsAuth, otherCA.CAFile},
			"", []string{"handlers[0].source.nats.url", "certificate"}},
	}
	for _, b := range bad {
		t.Run(b.name, func(t *testing.T) {
			env := env
			if b.env != "" {
				env = []string{"NATS_PW=" + b.env}
			}
			code, out := secValidateOnline(t, env, write(strings.ReplaceAll(b.name, " ", "-"), b.c))
			t.Logf("validate --online: exit %d: %s", code, out)
			if code != 1 {
				t.Errorf("validate --online: exit %d, want 1:\n%s", code, out)
			}
			for _, w := range b.want {
				if !strings.Contains(out, w) {
					t.Errorf("validate --online does not say %q:\n%s", w, out)
				}
			}
			secNoSecrets(t, "validate --online", out, secrets...)
		})
	}
}

// validate --online asks a real Kafka SASL_SSL listener (TLS and
// SASL/SCRAM-SHA-256) for the topic's retention.ms (DescribeConfigs) with
// the sasl and tls settings run uses; with a wrong password or CA it fails
// naming the field, and never shows the password.
func TestSecurityValidateOnlineKafkaSCRAMOverTLS(t *testing.T) {
	t.Parallel()
	const wrongPW = "Wrong-Guess-66"
	sec := testenv.RealKafkaSecurity(t)
	user, pw := sec.Users["SCRAM-SHA-256"][0], sec.Users["SCRAM-SHA-256"][1]
	otherCA := testenv.NewTestCA(t)
	brokers := sec.SASLTLS
	topic := "secv-in-" + testenv.RandID()
	testenv.CreateKafkaTopic(t, testenv.RealKafka(t), topic, 1)
	dir := t.TempDir()
	redisURL := testenv.Redis(t)
	write := func(name, caFile string) string {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, `
redis: {url: %q, namespace: secvk-%s}
handlers:
  - name: v
    source:
      kafka: {brokers: [%s], topic: %s, sasl: {mechanism: scram-sha-256, username: %s, password: "${KAFKA_PW}"}, tls: {ca_file: %s}}
    retention: 1h
    action:
      exec: {command: [/bin/true]}
`, redisURL, testenv.RandID(), strings.Join(brokers, ", "), topic, user, caFile), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, otherCAcfg := write("good", sec.CAFile), write("other-ca", otherCA.CAFile)

	code, out := secValidateOnline(t, []string{"KAFKA_PW=" + pw}, good)
	if code != 0 || !strings.Contains(out, "ok (1 handlers)") {
		t.Fatalf("validate --online: exit %d, want 0:\n%s", code, out)
	}
	// DescribeConfigs answered: the horizon warning names the topic's
	// retention.ms (set or unlimited).
	if !strings.Contains(out, "topic "+topic+" retention.ms") {
		t.Errorf("no warning naming the topic's retention.ms:\n%s", out)
	}
	secNoSecrets(t, "validate --online", out, pw)

	for name, c := range map[string]struct {
		cfg, pw string
		want    []string
	}{
		"wrong password": {good, wrongPW, []string{"handlers[0].source.kafka", "SASL"}},
		"another CA":     {otherCAcfg, pw, []string{"handlers[0].source.kafka", "certificate"}},
	} {
		t.Run(name, func(t *testing.T) {
			code, out := secValidateOnline(t, []string{"KAFKA_PW=" + c.pw}, c.cfg)
			t.Logf("validate --online: exit %d: %s", code, out)
			if code != 1 {
				t.Errorf("validate --online: exit %d, want 1:\n%s", code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("validate --online does not say %q:\n%s", w, out)
				}
			}
			secNoSecrets(t, "validate --online", out, pw, wrongPW)
		})
	}
}
