package actions

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/idemkit/dedupworker/consumer"
)

// ExecConfig configures the exec action.
type ExecConfig struct {
	Handler        string
	Command        []string
	Timeout        time.Duration
	MaxOutputBytes int
	// Env names the variables of the worker's environment the command also
	// sees, on top of BaseEnv; a name not set in the worker is left out.
	// Nothing else of the worker's environment reaches the command: the
	// worker's own secrets (a Redis password, a SASL password expanded into
	// the config) stay in the worker.
	Env []string
}

// BaseEnv is the part of the worker's environment every command sees,
// besides the DEDUP_* variables the action sets and the names in
// ExecConfig.Env.
var BaseEnv = []string{"PATH", "HOME", "LANG", "TZ"}

// ExitDataErr is the exit status that makes a failure permanent (EX_DATAERR
// from sysexits.h).
const ExitDataErr = 65

// Exec runs the command with the payload on stdin and DEDUP_KEY,
// DEDUP_FENCE, DEDUP_ATTEMPT, DEDUP_HANDLER and DEDUP_SOURCE in its
// environment; of the worker's own environment it sees only
// BaseEnv and cfg.Env. Exit 0 succeeds and stdout (up to MaxOutputBytes)
// is the result; exit 65 is permanent; anything else is transient. The
// process and its children are killed on timeout or when the handler's
// context ends (shutdown, lease lost).
func Exec(cfg ExecConfig) consumer.Handler {
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		ci := claimOf(ctx, cfg.Handler)
		if cfg.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
		}
		cmd := exec.CommandContext(ctx, cfg.Command[0], cfg.Command[1:]...)
		// Its own process group, killed whole on timeout or lease loss; and
		// killed by the kernel if this worker dies (kill -9), so a command
		// never outlives the claim it runs under.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error {
			// Kill the whole process group: a shell's children too.
			return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		cmd.WaitDelay = 2 * time.Second
		cmd.Stdin = bytes.NewReader(m.Payload)
		stdout := &capped{n: cfg.MaxOutputBytes}
		stderr := &capped{n: 4 << 10}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.Env = append(allowedEnv(cfg.Env),
			"DEDUP_KEY="+ci.Key,
			"DEDUP_FENCE="+strconv.FormatInt(ci.Fence, 10),
			"DEDUP_ATTEMPT="+strconv.Itoa(ci.Attempt),
			"DEDUP_HANDLER="+ci.Handler,
			"DEDUP_SOURCE="+sourceName(m),
		)
		err := cmd.Run()
		if err == nil {
			return stdout.buf, nil
		}
		detail := strings.TrimSpace(string(stderr.buf))
		if ctx.Err() != nil {
			return nil, fmt.Errorf("exec %s: killed: %w", cfg.Command[0], context.Cause(ctx))
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			e := fmt.Errorf("exec %s: exit %d: %s", cfg.Command[0], ee.ExitCode(), detail)
			if ee.ExitCode() == ExitDataErr {
				return nil, dedupworker.Permanent(e)
			}
			return nil, e
		}
		return nil, fmt.Errorf("exec %s: %w", cfg.Command[0], err)
	})
}

// allowedEnv returns NAME=value for each of BaseEnv and names that the
// worker's environment sets.
func allowedEnv(names []string) []string {
	var env []string
	seen := map[string]bool{}
	for _, list := range [][]string{BaseEnv, names} {
		for _, k := range list {
			if seen[k] {
				continue
			}
			seen[k] = true
			if v, ok := os.LookupEnv(k); ok {
				env = append(env, k+"="+v)
			}
		}
	}
	return env
}
