package testenv

import (
	"os"
	"testing"
)

// Unavailable reports that service cannot be reached, and why: the test is
// skipped, or failed when DEDUP_REQUIRE_SERVICES=1 (as CI sets it), so a
// missing service never passes silently there.
func Unavailable(t testing.TB, service, why string) {
	t.Helper()
	if os.Getenv("DEDUP_REQUIRE_SERVICES") == "1" {
		t.Fatalf("testenv: %s unavailable (DEDUP_REQUIRE_SERVICES=1): %s", service, why)
	}
	t.Skipf("testenv: %s unavailable: %s", service, why)
}

// Long marks t as a test that runs for a while (what, in the skip
// message): -short skips it, except under DEDUP_REQUIRE_SERVICES=1, where
// every test runs, so CI never passes one silently.
func Long(t testing.TB, what string) {
	t.Helper()
	if testing.Short() && os.Getenv("DEDUP_REQUIRE_SERVICES") != "1" {
		t.Skipf("-short: %s", what)
	}
}
