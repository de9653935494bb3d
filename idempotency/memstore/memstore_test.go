package memstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/memstore"
	"github.com/idemkit/dedupworker/idempotency/storetest"
)

func TestConformance(t *testing.T) {
	const grace = 2 * time.Second
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness {
		s := memstore.New(memstore.Options{Grace: grace})
		return &storetest.Harness{
			Store: s,
			Grace: grace,
			TTL:   func(t *testing.T, key string) time.Duration { return s.TTL(key) },
		}
	})
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// On a clock the test advances, a lease runs out, an expired claim is
// reclaimed with its attempt counted, and a completed record lives exactly
// its retention, with no waiting.
func TestOwnClock(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := memstore.New(memstore.Options{Grace: time.Minute, Now: clock.Now})
	req := idempotency.ClaimRequest{Key: "h:k", Fingerprint: "f", FingerprintVersion: 1, Lease: 30 * time.Second}

	first := claim(t, s, req)
	if first.Outcome != idempotency.ClaimNew {
		t.Fatalf("first claim %s, want NEW", first.Outcome)
	}
	clock.Add(29 * time.Second)
	if got := claim(t, s, req); got.Outcome != idempotency.ClaimInFlight {
		t.Fatalf("claim within the lease %s, want IN_FLIGHT", got.Outcome)
	}
	clock.Add(2 * time.Second)
	second := claim(t, s, req)
	if second.Outcome != idempotency.ClaimReclaimed || second.Claim.Attempts != 2 || second.Claim.Fence <= first.Claim.Fence {
		t.Fatalf("claim after the lease: %s attempts %d fence %d (first %d); want RECLAIMED, 2, larger",
			second.Outcome, second.Claim.Attempts, second.Claim.Fence, first.Claim.Fence)
	}
	if ok, err := s.Complete(ctx, []idempotency.Completion{{Key: "h:k", Token: first.Claim.Token, Outcome: idempotency.RecordOutcomeOK}}); err != nil || ok[0] {
		t.Fatalf("Complete by the reclaimed-from owner = %v, %v; want false", ok, err)
	}
	done := idempotency.Completion{Key: "h:k", Token: second.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("r"), Retention: time.Hour}
	if ok, err := s.Complete(ctx, []idempotency.Completion{done}); err != nil || !ok[0] {
		t.Fatalf("Complete by the owner = %v, %v", ok, err)
	}
	clock.Add(time.Hour - time.Millisecond)
	if got := claim(t, s, req); got.Outcome != idempotency.ClaimDuplicate || string(got.Record.Result) != "r" {
		t.Fatalf("claim within the retention: %s %q, want DUPLICATE \"r\"", got.Outcome, got.Record.Result)
	}
	clock.Add(time.Millisecond)
	if got := claim(t, s, req); got.Outcome != idempotency.ClaimNew || got.Claim.Attempts != 1 {
		t.Fatalf("claim after the retention: %s, want NEW with a fresh attempt count", got.Outcome)
	}
}

func TestDuplicateKeyInBatch(t *testing.T) {
	s := memstore.New(memstore.Options{})
	r := idempotency.ClaimRequest{Key: "h:k", Fingerprint: "f", Lease: time.Second}
	if _, err := s.Claim(context.Background(), []idempotency.ClaimRequest{r, r}); !errors.Is(err, memstore.ErrDuplicateKey) {
		t.Fatalf("Claim of a key twice: %v, want ErrDuplicateKey", err)
	}
}

func claim(t *testing.T, s idempotency.Store, r idempotency.ClaimRequest) idempotency.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), []idempotency.ClaimRequest{r})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}
