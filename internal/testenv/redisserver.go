package testenv

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a private redis-server process a test may stop and start
// again on the same port and directory, to cut the store away from a worker
// or to restart Redis with or without its data.
type RedisServer struct {
	t    testing.TB
	bin  string
	port int
	cfg  RedisServerConfig
	out  SyncBuffer // the server's stdout and stderr, all runs

	mu  sync.Mutex
	cmd *exec.Cmd
}

// RedisServerConfig is how NewRedisServer runs redis-server. The zero value
// is a plain server without persistence.
type RedisServerConfig struct {
	// ConfigFile, when set, is the configuration file redis-server reads
	// before its arguments; with "--sentinel" in Args it runs a Sentinel,
	// which rewrites the file, so it must be writable.
	ConfigFile string
	// Args are more redis-server arguments, given after the defaults
	// (--port, --bind 127.0.0.1, --dir, --save "", --appendonly no), which
	// they override: "--appendonly", "yes" turns persistence on.
	Args []string
	// Dir is the server's working directory (its append-only file and
	// dump); a new temporary directory when empty.
	Dir string
	// Env is added to the server's environment (LD_PRELOAD=...).
	Env []string
	// TLS, when set, makes the server speak only TLS on its port, with the
	// server certificate of this CA and no client certificates.
	TLS *TestCA
	// Port is the server's port; a free loopback port when 0. A caller
	// that needs more ports for the server (a Cluster bus) takes them
	// with this one from one FreePorts, so that they differ.
	Port int
}

// StartRedisServer runs a private redis-server on a free loopback port with
// the default configuration and args added (see RedisServerConfig.Args),
// stopped at the end of the test.
func StartRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	return NewRedisServer(t, RedisServerConfig{Args: args})
}

// NewRedisServer runs a private redis-server on a free loopback port as c
// says, waits until it answers PING, and stops it at the end of the test,
// showing its output when the test failed. Without a redis-server binary
// the test is skipped (or failed, see Unavailable).
func NewRedisServer(t testing.TB, c RedisServerConfig) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server binary", err.Error())
	}
	if c.Dir == "" {
		c.Dir = t.TempDir()
	} else if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		t.Fatalf("testenv: redis-server directory: %v", err)
	}
	port := c.Port
	if port == 0 {
		port = FreePort(t)
	}
	s := &RedisServer{t: t, bin: bin, port: port, cfg: c}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("private redis-server on %s:\n%s", s.Addr(), s.out.String())
		}
	})
	s.Start()
	return s
}

// Addr is host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is the redis:// (with TLS, rediss://) URL of database 0.
func (s *RedisServer) URL() string {
	if s.cfg.TLS != nil {
		return "rediss://" + s.Addr() + "/0"
	}
	return "redis://" + s.Addr() + "/0"
}

// Dir is the server's working directory.
func (s *RedisServer) Dir() string { return s.cfg.Dir }

// Output is what the server has written to stdout and stderr so far.
func (s *RedisServer) Output() string { return s.out.String() }

// Options returns client options for the server: its address and, with
// TLS, a configuration that trusts the test CA.
func (s *RedisServer) Options() *redis.Options {
	o := &redis.Options{Addr: s.Addr(), DialTimeout: 500 * time.Millisecond}
	if s.cfg.TLS != nil {
		o.TLSConfig = &tls.Config{RootCAs: s.cfg.TLS.Pool, ServerName: "127.0.0.1"}
	}
	return o
}

// Client returns a client on the server, closed at the end of the test.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(s.Options())
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start starts the server (again) and waits until it answers PING.
func (s *RedisServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	port := strconv.Itoa(s.port)
	args := []string{"--port", port, "--bind", "127.0.0.1", "--dir", s.cfg.Dir, "--save", "", "--appendonly", "no"}
	if ca := s.cfg.TLS; ca != nil {
		args = append(args, "--port", "0", "--tls-port", port, "--tls-cert-file", ca.CertFile, "--tls-key-file", ca.KeyFile,
			"--tls-ca-cert-file", ca.CAFile, "--tls-auth-clients", "no")
	}
	args = append(args, s.cfg.Args...)
	if s.cfg.ConfigFile != "" {
		args = append([]string{s.cfg.ConfigFile}, args...)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = &s.out, &s.out
	if len(s.cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), s.cfg.Env...)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("testenv: starting redis-server: %v", err)
	}
	s.cmd = cmd
	if err := awaitPing(s.Options(), 10*time.Second); err != nil {
		s.t.Fatalf("testenv: private redis-server on %s does not answer: %v\n%s", s.Addr(), err, s.out.String())
	}
}

// awaitPing waits up to d until the Redis server (or Sentinel) that o
// names answers PING, and returns the last error if it does not.
func awaitPing(o *redis.Options, d time.Duration) error {
	o = &redis.Options{Addr: o.Addr, TLSConfig: o.TLSConfig, DialTimeout: 200 * time.Millisecond, MaxRetries: -1}
	c := redis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(d)
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-poll.C
	}
}

// Stop kills the server (SIGKILL, as a crash) and waits for it to exit; a
// no-op when stopped.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// StartReplicatedRedis runs a private primary that the store health checks
// find nothing wrong with (append-only file on, noeviction) and a replica
// connected to it, both stopped at the end of the test. It returns once the
// primary counts the replica as connected.
func StartReplicatedRedis(t testing.TB) (primary, replica *RedisServer) {
	t.Helper()
	primary = StartRedisServer(t, "--appendonly", "yes", "--maxmemory-policy", "noeviction")
	replica = StartRedisServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, rc := primary.Client(t), replica.Client(t)
	if err := rc.ReplicaOf(ctx, "127.0.0.1", strconv.Itoa(primary.port)).Err(); err != nil {
		t.Fatalf("testenv: REPLICAOF: %v", err)
	}
	EventuallyNil(t, 20*time.Second, "the replica connected to the primary", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		info, err := pc.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "connected_slaves:1") {
			return errors.New("connected_slaves is not 1")
		}
		return nil
	})
	return primary, replica
}
