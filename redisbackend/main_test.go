package redisbackend_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestMain skips the examples, which cannot skip themselves, when no Redis
// answers — unless DEDUP_REQUIRE_SERVICES=1, where they fail as tests do.
func TestMain(m *testing.M) {
	flag.Parse()
	if _, why := testenv.FindRedis(); why != "" && os.Getenv("DEDUP_REQUIRE_SERVICES") != "1" {
		if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
			_ = f.Value.Set("^Example")
			fmt.Fprintln(os.Stderr, "redisbackend: examples skipped, no Redis:", why)
		}
	}
	os.Exit(m.Run())
}
