package lua_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/lua"
)

// Every script compiles on a real Redis (SCRIPT LOAD) and carries the
// shared helpers; none reaches for keys it was not given or for the
// caller's clock.
func TestScriptsLoad(t *testing.T) {
	client := testenv.RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for name, src := range map[string]string{
		"claim": lua.Claim, "complete": lua.Complete, "renew": lua.Renew, "release": lua.Release, "step": lua.Step,
		"forget": lua.Forget, "forget_if": lua.ForgetIf,
	} {
		if !strings.Contains(src, "local function owned(") || !strings.Contains(src, "local function now_ms(") {
			t.Errorf("%s: the helpers of lib.lua are missing", name)
		}
		for _, banned := range []string{"'KEYS'", "'SCAN'", "os.time", "os.clock"} {
			if strings.Contains(src, banned) {
				t.Errorf("%s uses %s", name, banned)
			}
		}
		if err := client.ScriptLoad(ctx, src).Err(); err != nil {
			t.Errorf("SCRIPT LOAD %s: %v", name, err)
		}
	}
}
