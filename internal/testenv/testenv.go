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
