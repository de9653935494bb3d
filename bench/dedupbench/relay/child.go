package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// child is a relay process the benchmark started. Its owner stops it with
// stop, which also waits for it; the kernel kills it if the benchmark dies
// first (Pdeathsig).
type child struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited
	err    error         // Wait's result, set before done closes
	output *tailBuffer
}

// startChild starts argv[0] with argv[1:] and env added to the benchmark's
// environment.
func startChild(name string, argv []string, env []string) (*child, error) {
	c := &child{name: name, done: make(chan struct{}), output: &tailBuffer{max: 8 << 10}}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Env = append(c.cmd.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.output, c.output
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, argv[0], err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports an error when the process has already ended.
func (c *child) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("%s exited early (%v); its last output:\n%s", c.name, c.err, c.output.String())
	default:
		return nil
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs and waits. It
// returns an error when the process had to be killed or exited non-zero
// after SIGTERM.
func (c *child) stop(grace time.Duration) error {
	select {
	case <-c.done:
		return c.exitErr()
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.done:
		return c.exitErr()
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not stop within %v of SIGTERM and was killed", c.name, grace)
	}
}

func (c *child) exitErr() error {
	if c.err != nil {
		return fmt.Errorf("%s: %w; its last output:\n%s", c.name, c.err, c.output.String())
	}
	return nil
}

// children is a set of relay processes measured together.
type children []*child

func (cs children) stop(grace time.Duration) error {
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	for i, c := range cs {
		wg.Go(func() { errs[i] = c.stop(grace) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (cs children) exited() error {
	for _, c := range cs {
		if err := c.exited(); err != nil {
			return err
		}
	}
	return nil
}

// cpu returns the CPU time all of them used so far.
func (cs children) cpu() (time.Duration, error) {
	var sum time.Duration
	for _, c := range cs {
		d, err := procCPU(c.pid())
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
		sum += d
	}
	return sum, nil
}

// peakRSS returns the largest VmHWM among them.
func (cs children) peakRSS() (int64, error) {
	var peak int64
	for _, c := range cs {
		n, err := procPeakRSS(c.pid())
		if err != nil {
			return 0, fmt.Errorf("%s: %w", c.name, err)
		}
		peak = max(peak, n)
	}
	return peak, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// buildBinary runs go build in dir and returns the binary's path in outDir.
func buildBinary(ctx context.Context, dir, pkg, outDir, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out := outDir + "/" + name
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s: %w\n%s", pkg, dir, err, b)
	}
	return out, nil
}

func execOutput(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return string(out), err
}

// startRedis starts a private redis-server on a free loopback port,
// without persistence, and waits until it answers. stop ends it.
func startRedis(ctx context.Context, bin, dir string) (url string, stop func() error, err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	c, err := startChild("redis-server", []string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, nil)
	if err != nil {
		return "", nil, fmt.Errorf("-redis-server: %w", err)
	}
	stop = func() error { return c.stop(10 * time.Second) }
	url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		d := net.Dialer{Timeout: time.Second}
		conn, err := d.DialContext(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			_ = conn.Close()
			return url, stop, nil
		}
		if err := c.exited(); err != nil {
			return "", nil, err
		}
		if time.Now().After(deadline) {
			_ = stop()
			return "", nil, fmt.Errorf("-redis-server: nothing answers on port %d after 10s: %w", port, err)
		}
		select {
		case <-ctx.Done():
			_ = stop()
			return "", nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
