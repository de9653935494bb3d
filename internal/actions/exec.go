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

	"github.com/idemkit/dedupworker/consumer"
)

// ExecConfig configures the exec action.
type ExecConfig struct {
	Handler        string
	Command        []string
	Timeout        time.Duration
	MaxOutputBytes int
	// Env is added to the worker's own environment.
	Env map[string]string
}

// ExitDataErr is the exit status that makes a failure permanent (EX_DATAERR
// from sysexits.h).
const ExitDataErr = 65

// Exec runs the command with the payload on stdin and DEDUP_KEY,
// DEDUP_FENCE, DEDUP_ATTEMPT, DEDUP_HANDLER and DEDUP_SOURCE in its
// environment (SPEC §9.3). Exit 0 succeeds and stdout (up to MaxOutputBytes)
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
		env := os.Environ()
		for k, v := range cfg.Env {
			env = append(env, k+"="+v)
		}
		cmd.Env = append(env,
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
				return nil, consumer.Permanent(e)
			}
			return nil, e
		}
		return nil, fmt.Errorf("exec %s: %w", cfg.Command[0], err)
	})
}
