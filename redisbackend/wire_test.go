package redisbackend

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/lua"
)

// wireLog keeps every byte a client writes to Redis.
type wireLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

type loggedConn struct {
	net.Conn
	log *wireLog
}

func (c loggedConn) Write(p []byte) (int, error) {
	c.log.mu.Lock()
	c.log.buf.Write(p)
	c.log.mu.Unlock()
	return c.Conn.Write(p)
}

// sent reports whether the client wrote the command args, as RESP.
func (l *wireLog) sent(args ...string) bool {
	var want bytes.Buffer
	fmt.Fprintf(&want, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&want, "$%d\r\n%s\r\n", len(a), a)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.buf.Bytes(), want.Bytes())
}

func (l *wireLog) reset() {
	l.mu.Lock()
	l.buf.Reset()
	l.mu.Unlock()
}

// TestScriptArgumentsOnTheWire pins the bytes Claim and Complete write to
// Redis for each form of their scripts' arguments (lua/claim.lua,
// lua/complete.lua): the command, its keys and every argument, in order,
// as RESP. The scripts read their arguments by position, so any change of
// what the client sends is a change of what the scripts do.
func TestScriptArgumentsOnTheWire(t *testing.T) {
	opt, err := redis.ParseURL(testenv.Redis(t))
	if err != nil {
		t.Fatal(err)
	}
	log := &wireLog{}
	opt.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return loggedConn{Conn: c, log: log}, nil
	}
	client := redis.NewClient(opt)
	defer client.Close()
	s, ctx := scriptStore(t, client, "wire")
	claimSHA := redis.NewScript(lua.Claim).Hash()
	completeSHA := redis.NewScript(lua.Complete).Hash()
	grace := strconv.FormatInt(s.graceMs, 10)
	var keys []string
	defer func() {
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
	}()
	claim := func(reqs []idempotency.ClaimRequest) []idempotency.ClaimResult {
		t.Helper()
		log.reset()
		res, err := s.Claim(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			if r.Outcome != idempotency.ClaimNew {
				t.Fatalf("%s: %s, want NEW", reqs[i].Key, r.Outcome)
			}
			keys = append(keys, s.RedisKey(reqs[i].Key))
		}
		return res
	}
	req := func(key, fp string, lease time.Duration) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Key: key, Fingerprint: fp, FingerprintVersion: 3, Lease: lease, Retention: time.Hour}
	}

	// claim.lua's short form: version, lease, the claims' key TTL and
	// durable once, then token and fingerprint a key.
	uniform := []idempotency.ClaimRequest{req("u:1", "3:aa", time.Minute), req("u:2", "3:bb", time.Minute)}
	res := claim(uniform)
	ttl := strconv.FormatInt(60000+max(s.graceMs, 3600000), 10) // lease + max(grace, retention)
	if !log.sent("evalsha", claimSHA, "2", s.RedisKey("u:1"), s.RedisKey("u:2"), "=", "3", "60000", ttl, "0",
		res[0].Claim.Token, "3:aa", res[1].Claim.Token, "3:bb") {
		t.Errorf("the short form of a claim is not on the wire as claim.lua reads it:\n%q", log.buf.String())
	}

	// The long form: token, fingerprint, version, lease, retention a key.
	mixed := []idempotency.ClaimRequest{req("m:1", "3:aa", time.Minute), req("m:2", `3:a"b`, 1500*time.Microsecond)}
	resMixed := claim(mixed)
	if !log.sent("evalsha", claimSHA, "2", s.RedisKey("m:1"), s.RedisKey("m:2"), grace,
		resMixed[0].Claim.Token, "3:aa", "3", "60000", "3600000",
		resMixed[1].Claim.Token, `3:a"b`, "3", "2", "3600000") {
		t.Errorf("the long form of a claim is not on the wire as claim.lua reads it:\n%q", log.buf.String())
	}

	complete := func(cs []idempotency.Completion) {
		t.Helper()
		log.reset()
		ok, err := s.Complete(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range ok {
			if !v {
				t.Fatalf("%s: completion not owned", cs[i].Key)
			}
		}
	}
	b64 := base64.StdEncoding.EncodeToString
	long := bytes.Repeat([]byte("0123456789"), 100) // encoded in more than one piece
	// complete.lua's short form: outcome and retention once, then token
	// and result a key.
	complete([]idempotency.Completion{
		{Key: "u:1", Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte(`{"a":1}`), Retention: time.Minute},
		{Key: "u:2", Token: res[1].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: long, Retention: time.Minute},
	})
	if !log.sent("evalsha", completeSHA, "2", s.RedisKey("u:1"), s.RedisKey("u:2"), s.Channel(), "=", string(idempotency.RecordOutcomeOK), "60000",
		res[0].Claim.Token, b64([]byte(`{"a":1}`)), res[1].Claim.Token, b64(long)) {
		t.Errorf("the short form of a completion is not on the wire as complete.lua reads it:\n%q", log.buf.String())
	}

	// The long form: token, outcome, result, meta, retention a key.
	complete([]idempotency.Completion{
		{Key: "m:1", Token: resMixed[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("r1"), Meta: map[string]string{"b": "2", "a": "1"}, Retention: time.Minute},
		{Key: "m:2", Token: resMixed[1].Claim.Token, Outcome: idempotency.RecordOutcomeDeadLettered, Retention: 2500 * time.Microsecond},
	})
	if !log.sent("evalsha", completeSHA, "2", s.RedisKey("m:1"), s.RedisKey("m:2"), s.Channel(),
		resMixed[0].Claim.Token, string(idempotency.RecordOutcomeOK), b64([]byte("r1")), `{"a":"1","b":"2"}`, "60000",
		resMixed[1].Claim.Token, string(idempotency.RecordOutcomeDeadLettered), "", "", "3") {
		t.Errorf("the long form of a completion is not on the wire as complete.lua reads it:\n%q", log.buf.String())
	}
}

// TestScriptRepliesOnTheWire pins the replies of claim.lua and complete.lua
// (which claimReply and completeReply read) on a real Redis: the claim's
// one string of per-key codes, then a record only for each key not coded
// n, then the call's TIME; the completion's one string of per-key codes
// followed by the completion time. A key the claim wrote from the template
// costs the reply one code and no record.
func TestScriptRepliesOnTheWire(t *testing.T) {
	client := testenv.RedisClient(t)
	s, ctx := scriptStore(t, client, "reply")
	kNew, kDone, kLive, kOther := s.RedisKey("r:new"), s.RedisKey("r:done"), s.RedisKey("r:live"), s.RedisKey("r:other")
	defer client.Del(context.Background(), kNew, kDone, kLive, kOther)
	const fp = "1:abc"
	done := `{"v":1,"state":"COMPLETED","fp":"1:abc","fpv":1,"token":"dddd","fence":5,"claimed_at_ms":1000,"lease_until_ms":31000,"attempts":1,"completed_at_ms":2000,"outcome":"ok","result":""}`
	live := `{"v":1,"state":"CLAIMED","fp":"1:abc","fpv":1,"token":"llll","fence":7,"claimed_at_ms":1000,"lease_until_ms":99999999999999,"attempts":2}`
	other := `{"v":1,"state":"CLAIMED","fp":"1:xyz","fpv":1,"token":"oooo","fence":9,"claimed_at_ms":1000,"lease_until_ms":99999999999999,"attempts":1}`
	for k, v := range map[string]string{kDone: done, kLive: live, kOther: other} {
		if err := client.Set(ctx, k, v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The short form: '=', version, lease, the claims' key TTL, durable,
	// then token and fingerprint a key.
	claimArgs := []any{"evalsha", redis.NewScript(lua.Claim).Hash(), 4, kNew, kDone, kLive, kOther,
		"=", 1, 60000, 60000 + max(s.graceMs, 3600000), 0, "nnnn", fp, "nnnn", fp, "nnnn", fp, "nnnn", fp}
	cmd := redis.NewStringSliceCmd(ctx, claimArgs...)
	_ = client.Process(ctx, cmd)
	if isNoScript(cmd.Err()) {
		claimArgs[0], claimArgs[1] = "eval", lua.Claim
		cmd = redis.NewStringSliceCmd(ctx, claimArgs...)
		_ = client.Process(ctx, cmd)
	}
	got, err := cmd.Result()
	if err != nil {
		t.Fatal(err)
	}
	// NEW from the template (no record), DUPLICATE, IN_FLIGHT and
	// MISMATCH, each with the stored value, then TIME in µs.
	if len(got) != 5 || got[0] != "nDIM" || got[1] != done || got[2] != live || got[3] != other {
		t.Fatalf("claim reply %q, want [nDIM, the 3 stored records, time]", got)
	}
	nowUs, err := strconv.ParseInt(got[4], 10, 64)
	if err != nil || nowUs < time.Now().Add(-time.Hour).UnixMicro() {
		t.Fatalf("claim reply's time %q, want the server's TIME in µs", got[4])
	}
	vals, err := claimReply(redis.NewStringSliceResult(got, nil), 4)
	if err != nil {
		t.Fatal(err)
	}
	rec := 0
	for j, want := range []struct{ o, js string }{{"NEW", ""}, {"DUPLICATE", done}, {"IN_FLIGHT", live}, {"MISMATCH", other}} {
		if o, js := vals.next(j, &rec); o != want.o || js != want.js {
			t.Errorf("key %d: claimReply gives %s %q, want %s %q", j, o, js, want.o, want.js)
		}
	}
	for _, bad := range [][]string{
		{"nD", got[4]},              // a record missing
		{"nx", got[1], got[4]},      // an unknown code
		{"n", got[4]},               // fewer codes than keys
		{"nD", got[1], got[2], "1"}, // a record too many
	} {
		if _, err := claimReply(redis.NewStringSliceResult(bad, nil), 2); err == nil {
			t.Errorf("claimReply(%q) for 2 keys: no error", bad)
		}
	}

	// The completion's short form: channel, '=', outcome, retention, then
	// token and result a key. The new key's claim is completed (1), the
	// completed key under its own token is a retry (2), the live claim of
	// another token is not owned (0).
	reply, err := client.EvalSha(ctx, redis.NewScript(lua.Complete).Hash(), []string{kNew, kDone, kLive},
		s.channel, "=", "ok", 60000, "nnnn", "", "dddd", "", "nnnn", "").Text()
	if err != nil && isNoScript(err) {
		reply, err = client.Eval(ctx, lua.Complete, []string{kNew, kDone, kLive},
			s.channel, "=", "ok", 60000, "nnnn", "", "dddd", "", "nnnn", "").Text()
	}
	if err != nil {
		t.Fatal(err)
	}
	codes, atMs, err := completeReply(redis.NewStringResult(reply, nil), 3)
	if err != nil || codes != "120" || atMs < nowUs/1000 || atMs > nowUs/1000+60_000 {
		t.Fatalf("completion reply %q: codes %q, time %d, %v; want 120 and the server's time in ms", reply, codes, atMs, err)
	}
	if stored, err := client.Get(ctx, kLive).Result(); err != nil || stored != live {
		t.Fatalf("the not-owned key holds %q, %v; want it unchanged", stored, err)
	}
	for _, bad := range []string{"12", "1x5", "125x", "1"} {
		if _, _, err := completeReply(redis.NewStringResult(bad, nil), 2); err == nil {
			t.Errorf("completeReply(%q) for 2 keys: no error", bad)
		}
	}
}
