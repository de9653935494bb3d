package redisbackend

import (
	"testing"

	"github.com/idemkit/dedupworker/idempotency"
)

const storedClaim = `{"v":1,"state":"CLAIMED","fp":"1:f","fpv":1,"token":"aaaa","fence":3,"claimed_at_ms":1000,"lease_until_ms":31000,"attempts":3,"steps":{"s":"AA=="}}`

// A claim script retried by the client after a lost reply finds this
// request's own token: the claim is owned, not IN_FLIGHT.
func TestClaimResultOwnRetriedClaim(t *testing.T) {
	res, _, err := claimResult("k", "aaaa", "IN_FLIGHT", storedClaim)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != idempotency.ClaimReclaimed || res.Claim == nil || res.Claim.Token != "aaaa" ||
		res.Claim.Fence != 3 || res.Claim.Attempts != 3 || len(res.Claim.Steps["s"]) != 1 || res.Record != nil {
		t.Errorf("own claim found again: %+v %+v", res, res.Claim)
	}
	res, _, err = claimResult("k", "bbbb", "IN_FLIGHT", storedClaim)
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
		if _, _, err := claimResult("k", tc[0], tc[1], tc[2]); err == nil {
			t.Errorf("claimResult(%q, %q, %q): no error", tc[0], tc[1], tc[2])
		}
	}
}
