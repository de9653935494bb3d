package redisbackend

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestScriptsWriteTemplates pins the agreement between the scripts'
// templates (lua/lib.lua claim_json, done_json) and decodeFresh: a claim, a
// renewed claim and a completion, as a real Redis stores them, are each read
// by the fast path. Should the scripts fall back to cjson (their field order
// differs from the templates'), or the templates and decodeFresh drift
// apart, this fails.
func TestScriptsWriteTemplates(t *testing.T) {
	client := testenv.RedisClient(t)
	s, ctx := scriptStore(t, client, "tmpl")
	defer client.Del(context.Background(), s.RedisKey("s:k"))

	raw := func(stage string, state idempotency.State) *idempotency.Record {
		t.Helper()
		b, err := client.Get(ctx, s.RedisKey("s:k")).Bytes()
		if err != nil {
			t.Fatalf("%s: GET: %v", stage, err)
		}
		rec, ok := decodeFresh("s:k", b)
		if !ok {
			t.Fatalf("%s: the stored record is not in template form: %s", stage, b)
		}
		if rec.State != state {
			t.Fatalf("%s: state %s, want %s", stage, rec.State, state)
		}
		return rec
	}
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: "s:k", Fingerprint: "1:abc", FingerprintVersion: 1, Lease: time.Minute}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("claim: %v %+v", err, res)
	}
	cl := res[0].Claim
	raw("claim", idempotency.StateClaimed)
	until, ok, err := s.Renew(ctx, "s:k", cl.Token, 2*time.Minute)
	if err != nil || !ok {
		t.Fatalf("renew: %v %v", ok, err)
	}
	if got := raw("renew", idempotency.StateClaimed).LeaseUntil; !got.Equal(until) {
		t.Fatalf("renewed lease %v, Renew reported %v", got, until)
	}
	result := []byte(`{"status":"shipped"}`)
	done, err := s.Complete(ctx, []idempotency.Completion{{Key: "s:k", Token: cl.Token, Outcome: idempotency.RecordOutcomeOK, Result: result, Retention: time.Minute}})
	if err != nil || !done[0] {
		t.Fatalf("complete: %v %v", done, err)
	}
	rec := raw("complete", idempotency.StateCompleted)
	if !bytes.Equal(rec.Result, result) || rec.Outcome != idempotency.RecordOutcomeOK || rec.Token != cl.Token || rec.Fence != cl.Fence {
		t.Fatalf("completed record %+v", rec)
	}
	res, err = s.Claim(ctx, []idempotency.ClaimRequest{{Key: "s:k", Fingerprint: "1:abc", FingerprintVersion: 1, Lease: time.Minute}})
	if err != nil || res[0].Outcome != idempotency.ClaimDuplicate || !bytes.Equal(res[0].Record.Result, result) {
		t.Fatalf("claim again: %v %+v", err, res)
	}
	res, err = s.Claim(ctx, []idempotency.ClaimRequest{{Key: "s:k", Fingerprint: "1:abd", FingerprintVersion: 1, Lease: time.Minute}})
	if err != nil || res[0].Outcome != idempotency.ClaimMismatch {
		t.Fatalf("claim with another fingerprint: %v %+v", err, res)
	}
}

// Both argument forms of claim.lua write a fresh claim as the same
// template, which Claim rebuilds from its request and the call's time (the
// reply leaves it out): the stored bytes are exactly claim_json's. One
// batch shares version, lease and retention (the short form); the other
// mixes leases (five arguments a key); a fingerprint that needs a JSON
// escape takes the long form too, and reads back unchanged.
func TestClaimFormsWriteOneTemplate(t *testing.T) {
	client := testenv.RedisClient(t)
	s, ctx := scriptStore(t, client, "forms")
	req := func(key, fp string, lease time.Duration) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Key: key, Fingerprint: fp, FingerprintVersion: 1, Lease: lease, Retention: time.Hour}
	}
	uniform := []idempotency.ClaimRequest{req("u:1", "1:aa", time.Minute), req("u:2", "1:bb", time.Minute)}
	mixed := []idempotency.ClaimRequest{req("m:1", "1:aa", time.Minute), req("m:2", "1:bb", 2*time.Minute)}
	defer client.Del(context.Background(), s.RedisKey("u:1"), s.RedisKey("u:2"), s.RedisKey("m:1"), s.RedisKey("m:2"), s.RedisKey("e:1"))
	if !uniformClaims(uniform, []int{0, 1}) || uniformClaims(mixed, []int{0, 1}) {
		t.Fatal("uniformClaims does not tell the two batches apart")
	}
	for _, batch := range [][]idempotency.ClaimRequest{uniform, mixed} {
		res, err := s.Claim(ctx, batch)
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range res {
			c := r.Claim
			if r.Outcome != idempotency.ClaimNew || c == nil {
				t.Fatalf("%s: %s, want NEW", batch[i].Key, r.Outcome)
			}
			got, err := client.Get(ctx, s.RedisKey(batch[i].Key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			claimed := c.LeaseUntil.UnixMilli() - batch[i].Lease.Milliseconds()
			want := fmt.Sprintf(`{"v":1,"state":"CLAIMED","fp":"%s","fpv":1,"token":"%s","fence":%d,"claimed_at_ms":%d,"lease_until_ms":%d,"attempts":1}`,
				batch[i].Fingerprint, c.Token, c.Fence, claimed, c.LeaseUntil.UnixMilli())
			if got != want {
				t.Errorf("%s: stored\n%s\nwant the template of the claim Claim returned\n%s", batch[i].Key, got, want)
			}
			if claimed != c.Fence/1000 {
				t.Errorf("%s: claimed_at_ms %d is not the fence's time %dµs in ms", batch[i].Key, claimed, c.Fence)
			}
		}
	}
	escaped := []idempotency.ClaimRequest{req("e:1", `1:a"b\c`, time.Minute)}
	if uniformClaims(escaped, []int{0}) {
		t.Fatal(`uniformClaims takes a fingerprint with '"' and '\'`)
	}
	res, err := s.Claim(ctx, escaped)
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("claim with an escaped fingerprint: %v %+v", err, res)
	}
	if rec, err := s.Get(ctx, "e:1"); err != nil || rec == nil || rec.Fingerprint != `1:a"b\c` || rec.Fence != res[0].Claim.Fence {
		t.Fatalf("record of the escaped fingerprint: %+v, %v", rec, err)
	}
}

// The short form of claim.lua writes its version's text as sent, so it
// takes only versions whose text Lua's tostring gives back unchanged
// (fewer than 15 digits), and makes the version a number only for a key
// with a record: a record outside the templates (read by decoding) of the
// same version and another fingerprint is still a MISMATCH.
func TestClaimShortFormVersion(t *testing.T) {
	client := testenv.RedisClient(t)
	s, ctx := scriptStore(t, client, "version")
	req := func(key string, fpv int) []idempotency.ClaimRequest {
		return []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:aa", FingerprintVersion: fpv, Lease: time.Minute, Retention: time.Hour}}
	}
	for _, tc := range []struct {
		fpv   int
		short bool
	}{{1, true}, {99999999999999, true}, {-99999999999999, true}, {100000000000000, false}, {-100000000000000, false}} {
		if got := uniformClaims(req("k", tc.fpv), []int{0}); got != tc.short {
			t.Errorf("version %d: short form %v, want %v", tc.fpv, got, tc.short)
		}
	}

	key := "v:1"
	defer client.Del(context.Background(), s.RedisKey(key))
	// A COMPLETED record with its fields in another order than the
	// templates': only decoding reads it.
	other := `{"state":"COMPLETED","v":1,"fpv":1,"fp":"1:zz","token":"tttt","fence":3,"claimed_at_ms":1000,"lease_until_ms":31000,"attempts":1,"completed_at_ms":2000,"outcome":"ok"}`
	if err := client.Set(ctx, s.RedisKey(key), other, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Claim(ctx, req(key, 1))
	if err != nil || res[0].Outcome != idempotency.ClaimMismatch {
		t.Fatalf("short-form claim of version 1 against a decoded record of version 1 and another fingerprint: %v %+v, want MISMATCH", err, res)
	}
	res, err = s.Claim(ctx, req(key, 2))
	if err != nil || res[0].Outcome != idempotency.ClaimDuplicate {
		t.Fatalf("short-form claim of version 2 against the same record: %v %+v, want DUPLICATE (another version is never a mismatch)", err, res)
	}
}

// scriptStore is a Store on client in a namespace of its own, named after
// prefix, closed when the test ends, and a context for the test's calls.
func scriptStore(t *testing.T, client redis.UniversalClient, prefix string) (*Store, context.Context) {
	t.Helper()
	s, err := New(client, Options{Namespace: prefix + testenv.RandID()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return s, ctx
}
