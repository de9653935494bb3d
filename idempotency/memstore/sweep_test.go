package memstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// The sweep drops expired records that nobody touches again.
func TestSweep(t *testing.T) {
	now := time.Unix(1e9, 0)
	s := New(Options{Grace: time.Second, Now: func() time.Time { return now }})
	ctx := context.Background()
	for i := range sweepEvery / 2 {
		if _, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: "h:" + strconv.Itoa(i), Fingerprint: "f", Lease: time.Second}}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(3 * time.Second)
	for range sweepEvery / 2 {
		if _, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: "h:live", Fingerprint: "f", Lease: time.Hour}}); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	n := len(s.recs)
	s.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d records held after the sweep, want the 1 live one", n)
	}
}
