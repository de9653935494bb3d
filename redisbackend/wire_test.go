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
	ns := "wire" + testenv.RandID()
	s, err := New(client, Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
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

	// claim.lua's short form: version, lease, retention and durable once,
	// then token and fingerprint a key.
	uniform := []idempotency.ClaimRequest{req("u:1", "3:aa", time.Minute), req("u:2", "3:bb", time.Minute)}
	res := claim(uniform)
	if !log.sent("evalsha", claimSHA, "2", s.RedisKey("u:1"), s.RedisKey("u:2"), grace, "=", "3", "60000", "3600000", "0",
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
