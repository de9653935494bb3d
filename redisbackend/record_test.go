package redisbackend

import (
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

const storedClaim = `{"v":1,"state":"CLAIMED","fp":"1:f","fpv":1,"token":"aaaa","fence":3,"claimed_at_ms":1000,"lease_until_ms":31000,"attempts":3,"steps":{"s":"AA=="}}`

// A claim script retried by the client after a lost reply finds this
// request's own token: the claim is owned, not IN_FLIGHT.
func TestClaimResultOwnRetriedClaim(t *testing.T) {
	r := &idempotency.ClaimRequest{Key: "k", Fingerprint: "1:f", FingerprintVersion: 1, Lease: 30 * time.Second}
	res, _, err := claimResult(r, "aaaa", 2_000_000, "IN_FLIGHT", storedClaim, new(idempotency.Claim))
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != idempotency.ClaimReclaimed || res.Claim == nil || res.Claim.Token != "aaaa" ||
		res.Claim.Fence != 3 || res.Claim.Attempts != 3 || len(res.Claim.Steps["s"]) != 1 || res.Record != nil {
		t.Errorf("own claim found again: %+v %+v", res, res.Claim)
	}
	res, _, err = claimResult(r, "bbbb", 2_000_000, "IN_FLIGHT", storedClaim, new(idempotency.Claim))
	if err != nil || res.Outcome != idempotency.ClaimInFlight || res.Claim != nil || res.Record.Token != "aaaa" {
		t.Errorf("another owner's claim: %+v, %v", res, err)
	}
}

func TestClaimResultRejectsWhatItCannotRead(t *testing.T) {
	for _, tc := range [][3]string{
		{"aaaa", "DUPLICATE", "not json"},
		{"aaaa", "SOMETHING", storedClaim},
		{"cccc", "NEW", storedClaim}, // a claim under another token
	} {
		r := &idempotency.ClaimRequest{Key: "k", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Second}
		if _, _, err := claimResult(r, tc[0], 2_000_000, tc[1], tc[2], new(idempotency.Claim)); err == nil {
			t.Errorf("claimResult(%q, %q, %q): no error", tc[0], tc[1], tc[2])
		}
	}
}

// A NEW claim the script left out of its reply is the template it wrote:
// fence the call's time in microseconds, claimed at that time in
// milliseconds, the lease (rounded up to milliseconds, as it was sent) on
// top, attempt 1.
func TestClaimResultFreshFromTheCallsTime(t *testing.T) {
	r := &idempotency.ClaimRequest{Key: "k", Fingerprint: "1:f", FingerprintVersion: 1, Lease: 1500*time.Millisecond + time.Microsecond}
	const nowUs = 1_764_000_000_123_456
	res, claimedAt, err := claimResult(r, "aaaa", nowUs, "NEW", "", new(idempotency.Claim))
	if err != nil {
		t.Fatal(err)
	}
	c := res.Claim
	if res.Outcome != idempotency.ClaimNew || c == nil || res.Record != nil {
		t.Fatalf("fresh claim: %+v", res)
	}
	if c.Key != "k" || c.Token != "aaaa" || c.Fence != nowUs || c.Attempts != 1 || c.Steps != nil {
		t.Errorf("fresh claim %+v, want key k, token aaaa, fence %d, attempt 1, no steps", c, nowUs)
	}
	if want := time.UnixMilli(1_764_000_000_123); !claimedAt.Equal(want) {
		t.Errorf("claimed at %v, want %v", claimedAt, want)
	}
	if want := time.UnixMilli(1_764_000_000_123 + 1501); !c.LeaseUntil.Equal(want) {
		t.Errorf("lease until %v, want %v", c.LeaseUntil, want)
	}
	// '' stands for the fresh claim only with NEW: any other outcome needs
	// its record.
	if _, _, err := claimResult(r, "aaaa", nowUs, "RECLAIMED", "", new(idempotency.Claim)); err == nil {
		t.Error("RECLAIMED without a record: no error")
	}
}

func TestJSONPlain(t *testing.T) {
	for s, want := range map[string]bool{
		"1:5e884898": true, "": true, "a b/c~!": true,
		`a"b`: false, `a\b`: false, "a\nb": false, "\x7f": false, "é": false,
	} {
		if got := jsonPlain(s); got != want {
			t.Errorf("jsonPlain(%q) = %v, want %v", s, got, want)
		}
	}
}
