package redisbackend

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// setCalls is how many SET commands the server has run (INFO commandstats),
// scripts' included.
func setCalls(t *testing.T, ctx context.Context, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	m := regexp.MustCompile(`cmdstat_set:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// A claim or a completion sent again with the same token (go-redis resends
// a script whose reply was lost, maybe on another connection) writes the
// record back unchanged, so that a WAIT after it on its connection also
// covers the first write (Options.Durability). The server is a private
// one: nothing else runs SETs on it.
func TestRetriedWriteIsWrittenAgain(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	const key, token = "orders:1", "0123456789abcdef0123456789abcdef"
	claimOnce := func() idempotency.ClaimResult {
		t.Helper()
		c := &call{script: s.claim, keys: []string{s.RedisKey(key)}, reply: replyStrings, args: []any{s.graceMs, token, "1:f", 1, int64(60_000), int64(0)}}
		if err := s.exec(ctx, "claim", []*call{c}); err != nil {
			t.Fatal(err)
		}
		vals, err := claimReply(c.strs, 1)
		if err != nil {
			t.Fatalf("claim reply %v, %v", c.strs.Val(), err)
		}
		r := idempotency.ClaimRequest{Key: key, Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}
		rec := 0
		o, js := vals.next(0, &rec)
		res, _, err := claimResult(&r, token, vals.nowUs, o, js, new(idempotency.Claim))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	stored := func() string {
		t.Helper()
		raw, err := client.Get(ctx, s.RedisKey(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}

	first := claimOnce()
	if first.Outcome != idempotency.ClaimNew {
		t.Fatalf("first claim: %s", first.Outcome)
	}
	before, sets := stored(), setCalls(t, ctx, client)
	again := claimOnce()
	if again.Outcome != idempotency.ClaimNew || again.Claim == nil || again.Claim.Fence != first.Claim.Fence {
		t.Fatalf("the same claim again: %+v, want the first claim, owned", again)
	}
	// SET NX … GET, which finds the key, and the record written back; a
	// claim that finds another owner's live claim runs only the first.
	if n := setCalls(t, ctx, client) - sets; n != 2 {
		t.Errorf("the repeated claim ran %d SETs, want 2 (SET NX, and the record written back)", n)
	}
	if after := stored(); after != before {
		t.Errorf("the repeated claim changed the record:\n%s\n%s", before, after)
	}

	done := []idempotency.Completion{{Key: key, Token: token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Minute}}
	if ok, err := s.Complete(ctx, done); err != nil || !ok[0] {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	before, sets = stored(), setCalls(t, ctx, client)
	if ok, err := s.Complete(ctx, done); err != nil || !ok[0] {
		t.Fatalf("Complete again = %v, %v", ok, err)
	}
	if n := setCalls(t, ctx, client) - sets; n != 1 {
		t.Errorf("the repeated completion ran %d SETs, want 1 (the record written back)", n)
	}
	if after := stored(); after != before {
		t.Errorf("the repeated completion changed the record:\n%s\n%s", before, after)
	}
}

// With Durability, a claim that finds the key completed writes the record
// back unchanged, so that the WAIT after it covers the completion the
// engine will ack the duplicate on, wherever it was written; without, a
// duplicate costs no write.
func TestDurableDuplicateIsWrittenAgain(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: time.Second})
	t.Cleanup(func() { _ = client.Close() })
	plain, err := New(client, Options{Namespace: "dup"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	// No replica: every WAIT falls short, but the script has run.
	durable, err := New(client, Options{Namespace: "dup", Durability: Durability{Replicas: 1, Timeout: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = durable.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := []idempotency.ClaimRequest{{Key: "orders:1", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Minute}}
	res, err := plain.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	done := []idempotency.Completion{{Key: "orders:1", Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Minute}}
	if ok, err := plain.Complete(ctx, done); err != nil || !ok[0] {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	before, err := client.Get(ctx, plain.RedisKey("orders:1")).Result()
	if err != nil {
		t.Fatal(err)
	}

	sets := setCalls(t, ctx, client)
	if res, err := plain.Claim(ctx, req); err != nil || res[0].Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("plain claim of a completed key = %+v, %v", res, err)
	}
	if n := setCalls(t, ctx, client) - sets; n != 1 {
		t.Errorf("a plain duplicate ran %d SETs, want 1 (the SET NX that found the key)", n)
	}
	sets = setCalls(t, ctx, client)
	if _, err := durable.Claim(ctx, req); !errors.Is(err, ErrReplicaShortfall) {
		t.Fatalf("durable claim on a Redis without replicas = %v, want a shortfall", err)
	}
	if n := setCalls(t, ctx, client) - sets; n != 2 {
		t.Errorf("a durable duplicate ran %d SETs, want 2 (SET NX, and the record written back)", n)
	}
	if after, err := client.Get(ctx, plain.RedisKey("orders:1")).Result(); err != nil || after != before {
		t.Errorf("the durable duplicate changed the record:\n%s\n%s (%v)", before, after, err)
	}
}
