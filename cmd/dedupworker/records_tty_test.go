package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// runOnTerminal runs dedupworker with stdin, stdout and stderr on a
// pseudo-terminal (util-linux script), typing input, and returns all it
// wrote there.
func runOnTerminal(t *testing.T, input string, args ...string) string {
	t.Helper()
	scriptBin, err := exec.LookPath("script")
	if err != nil {
		testenv.Unavailable(t, "script(1) (util-linux) to give the command a terminal", err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	line := binPath
	for _, a := range args {
		line += " '" + a + "'"
	}
	cmd := exec.CommandContext(ctx, scriptBin, "-qec", line, "/dev/null")
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if _, ok := err.(*exec.ExitError); !ok {
			t.Fatalf("script %v: %v", args, err)
		}
	}
	return string(out)
}

// On a terminal records shows its progress on stderr, and forget --state
// without --yes asks; "n" deletes nothing, "y" deletes.
func TestRecordsAndForgetOnATerminal(t *testing.T) {
	t.Parallel()
	client := testenv.RedisClient(t)
	ns := "rectty-" + testenv.RandID()
	seedRecords(t, client, ns, 5, 0)
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, testenv.Redis(t), ns)
	if out := runOnTerminal(t, "", "records", "-c", cfg, "--handler", "orders"); !strings.Contains(out, "\rscanned ") || !strings.Contains(out, "20 records of handler") {
		t.Errorf("records on a terminal: no progress line:\n%q", out)
	}
	out := runOnTerminal(t, "n\n", "forget", "-c", cfg, "--handler", "orders", "--state", "completed")
	if !strings.Contains(out, "Delete 5 completed records of handler \"orders\"? ") || !strings.Contains(out, "not confirmed; nothing deleted") {
		t.Errorf("forget answered n:\n%q", out)
	}
	if n := len(recordsJSON(t, "-c", cfg, "--handler", "orders", "--state", string(redisbackend.ClassCompleted))); n != 5 {
		t.Errorf("after answering n: %d completed records, want 5", n)
	}
	if out := runOnTerminal(t, "y\n", "forget", "-c", cfg, "--handler", "orders", "--state", "completed"); !strings.Contains(out, "deleted 5,") {
		t.Errorf("forget answered y:\n%q", out)
	}
}
