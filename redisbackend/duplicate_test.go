package redisbackend_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// TestDuplicateFromARecordsStart: claim.lua's short form answers DUPLICATE
// from the start of a completion of the same fingerprint. A value that
// starts so but is not a record is still recovered, within the
// same Claim call as the keys beside it; a stored fingerprint that only
// begins with the request's is a mismatch, not a duplicate.
func TestDuplicateFromARecordsStart(t *testing.T) {
	client := testenv.RedisClient(t)
	s := newStore(t, client, redisbackend.Options{})
	ctx := ctxFor(t, 10*time.Second)
	const fp = "1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
	req := func(key string) idempotency.ClaimRequest {
		return idempotency.ClaimRequest{Key: key, Fingerprint: fp, FingerprintVersion: 1, Lease: time.Minute, Retention: time.Hour}
	}

	done := "done-" + testenv.RandID()
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{req(done)})
	if err != nil || res[0].Claim == nil {
		t.Fatalf("first claim: %+v, %v", res, err)
	}
	if ok, err := s.Complete(ctx, []idempotency.Completion{{
		Key: done, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("shipped"), Retention: time.Hour,
	}}); err != nil || !ok[0] {
		t.Fatalf("Complete = %v, %v", ok, err)
	}

	head := `{"v":1,"state":"COMPLETED","fp":"` + fp + `"`
	tail := `,"fpv":1,"token":"0123456789abcdef","fence":4,"claimed_at_ms":1700000000000,"lease_until_ms":1700000030000,"attempts":1,"completed_at_ms":1700000001000,"outcome":"ok"`
	raws := map[string]string{
		"truncated":      head + `,"fpv":1,"token":"0123`,
		"fields missing": head + `}`,
		"not base64":     head + tail + `,"result":"!!"}`,
		"fence a string": head + strings.Replace(tail, `"fence":4`, `"fence":"4"`, 1) + `}`,
	}
	keys := map[string]string{}
	batch := []idempotency.ClaimRequest{req(done)}
	names := []string{"duplicate"}
	for name, raw := range raws {
		key := "corrupt-" + testenv.RandID()
		keys[name] = key
		if err := client.Set(ctx, s.RedisKey(key), raw, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, req(key))
		names = append(names, name)
	}
	fresh := "new-" + testenv.RandID()
	batch = append(batch, req(fresh))
	names = append(names, "new")

	res, err = s.Claim(ctx, batch)
	if err != nil {
		t.Fatalf("Claim of a batch with values that start like a completion: %v", err)
	}
	for i, r := range res {
		switch names[i] {
		case "duplicate":
			if r.Outcome != idempotency.ClaimDuplicate || r.Record == nil || string(r.Record.Result) != "shipped" {
				t.Errorf("the completed key: %+v, want DUPLICATE with its result", r)
			}
		case "new":
			if r.Outcome != idempotency.ClaimNew || r.Claim == nil {
				t.Errorf("the new key: %+v, want NEW", r)
			}
		default:
			if r.Outcome != idempotency.ClaimRecovered || r.Claim == nil {
				t.Errorf("%s: %+v, want RECOVERED", names[i], r)
				continue
			}
			stored, err := client.Get(ctx, s.RedisKey(batch[i].Key)).Result()
			if err != nil || !strings.HasPrefix(stored, `{"v":1,"state":"CLAIMED"`) || !strings.Contains(stored, r.Claim.Token) {
				t.Errorf("%s: stored %q, %v after RECOVERED; want the new claim", names[i], stored, err)
			}
		}
	}

	// A stored fingerprint that the request's is a prefix of.
	longer := "longer-" + testenv.RandID()
	raw := `{"v":1,"state":"COMPLETED","fp":"` + fp + `0"` + tail + `,"result":""}`
	if err := client.Set(ctx, s.RedisKey(longer), raw, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	res, err = s.Claim(ctx, []idempotency.ClaimRequest{req(longer)})
	if err != nil || res[0].Outcome != idempotency.ClaimMismatch {
		t.Fatalf("a completion of fingerprint %s0 claimed with %s: %+v, %v; want MISMATCH", fp, fp, res, err)
	}
}
