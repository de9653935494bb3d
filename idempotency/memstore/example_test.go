package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/idempotency/memstore"
)

// A key claimed and completed once is a duplicate on its next delivery, with
// the stored result; a different payload under the same key is a mismatch.
func Example() {
	ctx := context.Background()
	s := memstore.New(memstore.Options{})
	key := idempotency.EffectiveKey("orders", "order-42")
	req := idempotency.ClaimRequest{Key: key, Fingerprint: "fp-1", FingerprintVersion: 1, Lease: 30 * time.Second}

	res, _ := s.Claim(ctx, []idempotency.ClaimRequest{req})
	fmt.Println("first delivery:", res[0].Outcome, "attempt", res[0].Claim.Attempts)
	_, _ = s.Complete(ctx, []idempotency.Completion{{
		Key: key, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK,
		Result: []byte("shipped"), Retention: 24 * time.Hour,
	}})

	res, _ = s.Claim(ctx, []idempotency.ClaimRequest{req})
	fmt.Printf("redelivery: %s, result %q\n", res[0].Outcome, res[0].Record.Result)

	req.Fingerprint = "fp-2"
	res, _ = s.Claim(ctx, []idempotency.ClaimRequest{req})
	fmt.Println("other payload:", res[0].Outcome)
	// Output:
	// first delivery: NEW attempt 1
	// redelivery: DUPLICATE, result "shipped"
	// other payload: MISMATCH
}
