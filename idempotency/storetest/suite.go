package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// Harness is a store under test and the hooks the suite uses to reach past
// the Store interface. Only Store is required; a check whose hook is nil is
// not run.
type Harness struct {
	// Store is the store under test, fresh and isolated from every other
	// Harness (e.g. its own namespace).
	Store idempotency.Store
	// Grace is the store's grace: a CLAIMED key lives lease + max(grace,
	// the request's Retention), a released one at least grace. Needed with
	// TTL.
	Grace time.Duration
	// TTL returns how long the stored value of key has left to live (PTTL
	// in Redis), or a negative duration when it has no TTL or is absent.
	TTL func(t *testing.T, key string) time.Duration
	// SetRaw stores raw as the value of key, bypassing the store: it
	// corrupts a record, or writes one by hand.
	SetRaw func(t *testing.T, key string, raw []byte)
	// SetWrongType makes key hold a value of another kind than the store's
	// records (a Redis list). Optional.
	SetWrongType func(t *testing.T, key string)
	// CompleteSilently marks the CLAIMED record of key COMPLETED with
	// result, keeping its TTL, without notifying waiters: a lost
	// notification.
	CompleteSilently func(t *testing.T, key string, result []byte)
	// FlushScripts empties the server's script cache (Redis SCRIPT FLUSH),
	// as a restart or failover does.
	FlushScripts func(t *testing.T)
	// BrokenKey returns a new effective key that the store cannot write:
	// every call naming it fails as the store being unavailable (for Redis,
	// the user the store connects as is not allowed the key). With it the
	// suite checks how a batch reports the failure of one of its keys.
	BrokenKey func(t *testing.T) string
	// SplitBatches says the store sends a batch's keys to several servers
	// apart (a Redis Cluster): the failure of a key fails that key alone,
	// in an idempotency.BatchError, and the other keys of its batch
	// succeed. Unset, the store may instead fail the whole batch.
	SplitBatches bool
}

// Run runs the store-neutral checks against stores made by newStore. Prefer
// RunHarness when the store can offer hooks.
func Run(t *testing.T, newStore func(t *testing.T) idempotency.Store) {
	RunHarness(t, func(t *testing.T) *Harness { return &Harness{Store: newStore(t)} })
}

// check is one conformance check; needs names the hooks it uses.
type check struct {
	name  string
	needs func(h *Harness) bool
	run   func(t *testing.T, h *Harness)
}

// RunHarness runs every check against harnesses made by newHarness, one per
// check, in parallel.
func RunHarness(t *testing.T, newHarness func(t *testing.T) *Harness) {
	for _, c := range checks() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h == nil || h.Store == nil {
				t.Fatal("storetest: newHarness returned no Store")
			}
			if c.needs != nil && !c.needs(h) {
				t.Logf("storetest: %s not run: the harness lacks a hook it needs", c.name)
				return
			}
			c.run(t, h)
		})
	}
}

func checks() []check {
	var all []check
	all = append(all, claimChecks()...)
	all = append(all, fenceChecks()...)
	all = append(all, ttlChecks()...)
	all = append(all, corruptChecks()...)
	all = append(all, scriptChecks()...)
	all = append(all, waitChecks()...)
	all = append(all, batchChecks()...)
	return all
}

// ---- helpers ----

// opTimeout bounds every single store call of the suite.
const opTimeout = 5 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

var keySeq atomic.Int64

// runID keeps keys of two runs of the suite on one server apart.
var runID = func() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

// newKey returns an effective key no other check uses: "<scope>:<key>".
func newKey(t *testing.T) string {
	return fmt.Sprintf("storetest:%s-%d", runID, keySeq.Add(1))
}

// fp returns a version-1 fingerprint for content.
func fp(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "1:" + hex.EncodeToString(sum[:])
}

func req(key, fingerprint string, lease time.Duration) idempotency.ClaimRequest {
	return idempotency.ClaimRequest{Key: key, Fingerprint: fingerprint, FingerprintVersion: 1, Lease: lease}
}

const (
	longLease  = 30 * time.Second
	shortLease = 300 * time.Millisecond
	// expiry is how long to sleep for a shortLease to be over on the
	// server's clock: the lease and a margin.
	expiry    = shortLease + 200*time.Millisecond
	retention = 10 * time.Minute
)

// claim1 claims one key and returns its result.
func claim1(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(ctxT(t), []idempotency.ClaimRequest{r})
	if err != nil {
		t.Fatalf("Claim(%s): %v", r.Key, err)
	}
	if len(res) != 1 {
		t.Fatalf("Claim(%s): %d results for 1 request", r.Key, len(res))
	}
	return res[0]
}

// mustOwn claims and requires outcome want with an owned claim.
func mustOwn(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest, want idempotency.ClaimOutcome) *idempotency.Claim {
	t.Helper()
	res := claim1(t, s, r)
	if res.Outcome != want {
		t.Fatalf("Claim(%s) = %s (record %+v), want %s", r.Key, res.Outcome, res.Record, want)
	}
	if res.Claim == nil {
		t.Fatalf("Claim(%s) = %s without a Claim", r.Key, res.Outcome)
	}
	if res.Record != nil {
		t.Errorf("Claim(%s) = %s with a Record %+v; Record is only for DUPLICATE, IN_FLIGHT, MISMATCH", r.Key, res.Outcome, res.Record)
	}
	c := res.Claim
	if c.Key != r.Key {
		t.Errorf("Claim.Key = %q, want %q", c.Key, r.Key)
	}
	if b, err := hex.DecodeString(c.Token); err != nil || len(b) != 16 {
		t.Errorf("Claim.Token = %q, want 128 bits of hex", c.Token)
	}
	return c
}

// mustNotOwn claims and requires outcome want with the stored record.
func mustNotOwn(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest, want idempotency.ClaimOutcome) *idempotency.Record {
	t.Helper()
	res := claim1(t, s, r)
	if res.Outcome != want {
		t.Fatalf("Claim(%s) = %s (claim %+v), want %s", r.Key, res.Outcome, res.Claim, want)
	}
	if res.Claim != nil {
		t.Errorf("Claim(%s) = %s with a Claim %+v", r.Key, res.Outcome, res.Claim)
	}
	if res.Record == nil {
		t.Fatalf("Claim(%s) = %s without the stored Record", r.Key, res.Outcome)
	}
	if res.Record.Key != r.Key {
		t.Errorf("Record.Key = %q, want %q", res.Record.Key, r.Key)
	}
	return res.Record
}

func complete1(t *testing.T, s idempotency.Store, c idempotency.Completion) bool {
	t.Helper()
	ok, err := s.Complete(ctxT(t), []idempotency.Completion{c})
	if err != nil {
		t.Fatalf("Complete(%s): %v", c.Key, err)
	}
	if len(ok) != 1 {
		t.Fatalf("Complete(%s): %d results for 1 completion", c.Key, len(ok))
	}
	return ok[0]
}

func completion(cl *idempotency.Claim, result string) idempotency.Completion {
	return idempotency.Completion{
		Key: cl.Key, Token: cl.Token, Outcome: idempotency.RecordOutcomeOK,
		Result: []byte(result), Meta: map[string]string{"by": "storetest"}, Retention: retention,
	}
}

func mustComplete(t *testing.T, s idempotency.Store, cl *idempotency.Claim, result string) {
	t.Helper()
	if !complete1(t, s, completion(cl, result)) {
		t.Fatalf("Complete(%s) with the owning token = false", cl.Key)
	}
}

func get(t *testing.T, s idempotency.Store, key string) *idempotency.Record {
	t.Helper()
	rec, err := s.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	if rec != nil && rec.Key != key {
		t.Errorf("Get(%s).Key = %q", key, rec.Key)
	}
	return rec
}

func mustGet(t *testing.T, s idempotency.Store, key string) *idempotency.Record {
	t.Helper()
	rec := get(t, s, key)
	if rec == nil {
		t.Fatalf("Get(%s) = nil, want a record", key)
	}
	return rec
}

func renew(t *testing.T, s idempotency.Store, key, token string, lease time.Duration) (time.Time, bool) {
	t.Helper()
	until, ok, err := s.Renew(ctxT(t), key, token, lease)
	if err != nil {
		t.Fatalf("Renew(%s): %v", key, err)
	}
	return until, ok
}

func release(t *testing.T, s idempotency.Store, key, token string, keep time.Duration) bool {
	t.Helper()
	ok, err := s.Release(ctxT(t), key, token, keep)
	if err != nil {
		t.Fatalf("Release(%s): %v", key, err)
	}
	return ok
}

func saveStep(t *testing.T, s idempotency.Store, key, token, step string, result []byte) bool {
	t.Helper()
	ok, err := s.SaveStep(ctxT(t), key, token, step, result)
	if err != nil {
		t.Fatalf("SaveStep(%s, %s): %v", key, step, err)
	}
	return ok
}

// sameRecord reports the differences between two records, "" when none.
func sameRecord(a, b *idempotency.Record) string {
	switch {
	case a == nil && b == nil:
		return ""
	case a == nil || b == nil:
		return fmt.Sprintf("%+v vs %+v", a, b)
	}
	var diffs []string
	add := func(field string, x, y any) { diffs = append(diffs, fmt.Sprintf("%s: %v vs %v", field, x, y)) }
	if a.Key != b.Key {
		add("Key", a.Key, b.Key)
	}
	if a.State != b.State {
		add("State", a.State, b.State)
	}
	if a.Fingerprint != b.Fingerprint || a.FingerprintVersion != b.FingerprintVersion {
		add("Fingerprint", a.Fingerprint, b.Fingerprint)
	}
	if a.Token != b.Token {
		add("Token", a.Token, b.Token)
	}
	if a.Fence != b.Fence {
		add("Fence", a.Fence, b.Fence)
	}
	if !a.ClaimedAt.Equal(b.ClaimedAt) {
		add("ClaimedAt", a.ClaimedAt, b.ClaimedAt)
	}
	if !a.LeaseUntil.Equal(b.LeaseUntil) {
		add("LeaseUntil", a.LeaseUntil, b.LeaseUntil)
	}
	if a.Released != b.Released {
		add("Released", a.Released, b.Released)
	}
	if !a.CompletedAt.Equal(b.CompletedAt) {
		add("CompletedAt", a.CompletedAt, b.CompletedAt)
	}
	if a.Outcome != b.Outcome {
		add("Outcome", a.Outcome, b.Outcome)
	}
	if a.Attempts != b.Attempts {
		add("Attempts", a.Attempts, b.Attempts)
	}
	if !bytes.Equal(a.Result, b.Result) {
		add("Result", a.Result, b.Result)
	}
	if !maps.Equal(a.Meta, b.Meta) {
		add("Meta", a.Meta, b.Meta)
	}
	if !maps.EqualFunc(a.Steps, b.Steps, bytes.Equal) {
		add("Steps", a.Steps, b.Steps)
	}
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprint(diffs)
}

// unchanged fails when the record of key is no longer before.
func unchanged(t *testing.T, s idempotency.Store, before *idempotency.Record, what string) {
	t.Helper()
	if d := sameRecord(before, get(t, s, before.Key)); d != "" {
		t.Errorf("%s changed the record: %s", what, d)
	}
}
