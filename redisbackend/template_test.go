package redisbackend

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

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
	ns := fmt.Sprintf("tmpl%d", time.Now().UnixNano())
	s, err := New(client, Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
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
