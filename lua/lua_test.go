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

// The patterns of lib.lua, written out whole, are the composition their
// comment describes.
func TestPatternsAreTheirComposition(t *testing.T) {
	client := testenv.RedisClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const composed = `
local NAME, INT = '"([%w%-%.:_]*)"', '([1-9]%d*)'
local TAIL = ',"fpv":' .. INT .. ',"token":' .. NAME .. ',"fence":' .. INT
  .. ',"claimed_at_ms":' .. INT .. ',"lease_until_ms":' .. INT .. ',"attempts":' .. INT
local claimed = '^{"v":1,"state":"CLAIMED","fp":' .. NAME .. TAIL .. '}$'
local done = '^{"v":1,"state":"COMPLETED","fp":' .. NAME .. TAIL
  .. ',"completed_at_ms":' .. INT .. ',"outcome":' .. NAME .. ',"result":"([%w+/]*=?=?)"}$'
return { tostring(claimed == CLAIMED_PAT), tostring(done == DONE_PAT) }`
	got, err := client.Eval(ctx, lua.Claim[:strings.Index(lua.Claim, "-- claim: claims")]+composed, nil).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != "true" || got[1] != "true" {
		t.Fatalf("CLAIMED_PAT, DONE_PAT equal their composition: %v", got)
	}
}
