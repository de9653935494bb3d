package idempotency_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
)

// A key whose max_attempts runs all died with their worker (each claimed,
// none completed, released or dead-lettered) is dead-lettered on its next
// claim without running the handler again, and the
// engine's claims ask the store to keep an abandoned claim for the
// handler's retention, so the count is there however late that claim comes.
func TestClaimPastMaxAttemptsDeadLettersWithoutRunning(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const lease = 100 * time.Millisecond
	h := &countingHandler{}
	p := f.processor(t, h, idempotency.WithMaxAttempts(3), idempotency.WithLease(lease))
	ctx := context.Background()
	key := idempotency.EffectiveKey("orders", "crasher")
	fp := idempotency.Fingerprint(consumertest.NewDelivery(consumertest.NewMessage("crasher", "x"), 1).Message(), nil)

	// Three runs whose worker died: claims nobody settles, each found
	// after its lease ran out. The wait is the dead worker's downtime.
	for run := 1; run <= 3; run++ {
		res, err := f.store.Claim(ctx, []idempotency.ClaimRequest{{
			Key: key, Fingerprint: fp, FingerprintVersion: idempotency.FingerprintVersion, Lease: lease, Retention: time.Hour,
		}})
		if err != nil || res[0].Claim == nil || res[0].Claim.Attempts != run {
			t.Fatalf("run %d: claim %+v, %v; want owned with attempts %d", run, res, err, run)
		}
		timer := time.NewTimer(lease + 50*time.Millisecond)
		<-timer.C
	}

	d := consumertest.NewDelivery(consumertest.NewMessage("crasher", "x"), 1)
	p.Process(ctx, d)
	dl := d.ExpectDeadLettered(t)
	if n := h.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times on a key past max_attempts, want 0", n)
	}
	if dl.Reason != "max_attempts" || dl.Attempts != 3 || !strings.Contains(dl.Err, "without an outcome") {
		t.Fatalf("dead letter %+v: want reason max_attempts, 3 attempts, saying the runs ended without an outcome", dl)
	}
	rec, err := f.store.Get(ctx, key)
	if err != nil || rec == nil || rec.State != idempotency.StateCompleted || rec.Outcome != idempotency.RecordOutcomeDeadLettered {
		t.Fatalf("record %+v, %v: want COMPLETED dead_lettered", rec, err)
	}
	if f.oc.get(consumer.OutcomeDeadLettered) != 1 {
		t.Fatalf("outcomes %v, want one dead-lettered", f.oc.m)
	}
}
