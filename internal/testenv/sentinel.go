package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The local Sentinel deployment of .ci/redis-sentinel.sh.
const (
	localSentinelMaster = "dedup"
)

var (
	localSentinelAddrs = []string{"127.0.0.1:26390", "127.0.0.1:26391", "127.0.0.1:26392"}
	localSentinelData  = []string{"127.0.0.1:6390", "127.0.0.1:6391"}

	sentinelOnce sync.Once
	sentinelSet  *Sentinel
	sentinelWhy  string
)

// Sentinel is a Redis primary with a replica, watched by Sentinels.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Addrs are the Sentinels.
	Addrs []string
	// Data are the data nodes, primary and replica, in no set order.
	Data []string
	dir  string

	// private deployments (StartSentinel) only: the processes and how to
	// start each data node again.
	mu    sync.Mutex
	procs map[string]*exec.Cmd
	args  map[string][]string
}

// RedisSentinel returns the Sentinel deployment: $REDIS_SENTINEL_ADDRS
// (comma-separated) and $REDIS_SENTINEL_MASTER when set, else the local one
// (sentinels 127.0.0.1:26390-26392, master "dedup"). It must name a primary
// with at least one connected replica; otherwise the test is skipped, or
// failed under DEDUP_REQUIRE_SERVICES=1.
func RedisSentinel(t testing.TB) *Sentinel {
	t.Helper()
	if why := onlyContainersWhy("a Redis Sentinel deployment", ".ci/redis-sentinel.sh"); why != "" {
		Unavailable(t, "redis sentinel", why)
	}
	sentinelOnce.Do(func() {
		s := &Sentinel{Master: localSentinelMaster, Addrs: localSentinelAddrs, Data: localSentinelData, dir: sentinelDir()}
		hint := "; containers provide no Sentinel deployment: run .ci/redis-sentinel.sh or set REDIS_SENTINEL_ADDRS"
		if v := os.Getenv("REDIS_SENTINEL_ADDRS"); v != "" {
			s.Addrs, s.Data, hint = splitAddrs(v), nil, ""
		}
		if v := os.Getenv("REDIS_SENTINEL_MASTER"); v != "" {
			s.Master = v
		}
		sentinelSet = s
		if err := s.healthy(context.Background()); err != nil {
			sentinelWhy = "sentinel " + strings.Join(s.Addrs, ",") + ": " + err.Error() + hint
		}
	})
	if sentinelWhy != "" {
		Unavailable(t, "redis sentinel", sentinelWhy)
	}
	return sentinelSet
}

func sentinelDir() string {
	if d := os.Getenv("DEDUP_SENTINEL_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "dedup-redis-sentinel")
}

// Primary asks the Sentinels for the current primary's address.
func (s *Sentinel) Primary(ctx context.Context) (string, error) {
	var last error
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: redisProbe, MaxRetries: -1})
		cctx, cancel := context.WithTimeout(ctx, redisProbe)
		hp, err := c.GetMasterAddrByName(cctx, s.Master).Result()
		cancel()
		_ = c.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
		last = err
	}
	return "", fmt.Errorf("no sentinel names a primary for %q: %v", s.Master, last)
}

// WaitFailover waits up to d until every Sentinel names the same primary,
// other than old, and that node says it is a primary; it returns its
// address. Start the old primary again only after this: a node without
// persistence that comes back while a Sentinel still names it the primary
// is made the primary again, empty, and the promoted replica resyncs from
// it and loses every write (seen with Redis 7.0 and down-after 1s).
func (s *Sentinel) WaitFailover(old string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		p, err := s.agreedPrimary()
		if err == nil && p != old {
			return p, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("testenv: no agreed primary other than %s within %v (last: %q, %v)", old, d, p, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// agreedPrimary is the primary every Sentinel names, when they agree and
// the node says it is a primary.
func (s *Sentinel) agreedPrimary() (string, error) {
	var agreed string
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a, DialTimeout: redisProbe, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), redisProbe)
		hp, err := c.GetMasterAddrByName(ctx, s.Master).Result()
		cancel()
		_ = c.Close()
		if err != nil || len(hp) != 2 {
			return "", fmt.Errorf("sentinel %s: %v", a, err)
		}
		p := net.JoinHostPort(hp[0], hp[1])
		if agreed != "" && p != agreed {
			return "", fmt.Errorf("sentinels disagree: %s and %s", agreed, p)
		}
		agreed = p
	}
	c := redis.NewClient(&redis.Options{Addr: agreed, DialTimeout: redisProbe, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), redisProbe)
	defer cancel()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return agreed, err
	}
	if !strings.Contains(info, "role:master") {
		return agreed, fmt.Errorf("%s is not a primary yet", agreed)
	}
	return agreed, nil
}

// healthy: the Sentinels agree on a primary that answers and has a replica
// in sync (state=online: a replica still loading the primary's snapshot
// acknowledges no WAIT).
func (s *Sentinel) healthy(ctx context.Context) error {
	p, err := s.Primary(ctx)
	if err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: p, DialTimeout: redisProbe, MaxRetries: -1})
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, redisProbe)
	defer cancel()
	info, err := c.Info(cctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("primary %s: %v", p, err)
	}
	if !strings.Contains(info, "role:master") {
		return fmt.Errorf("%s is named primary but is not one", p)
	}
	if !strings.Contains(info, ",state=online,") {
		return fmt.Errorf("primary %s has no replica in sync", p)
	}
	return nil
}

// WaitHealthy waits up to d for a primary with a connected replica, as
// after a failover and the old primary's return.
func (s *Sentinel) WaitHealthy(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := s.healthy(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: sentinel deployment not healthy after %v: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// KillPrimary kills the current primary with SIGKILL (the data nodes must
// be private, or the local ones whose pids .ci/redis-sentinel.sh records)
// and returns its address; after WaitFailover, RestartNode brings it back
// as a replica.
func (s *Sentinel) KillPrimary(t testing.TB) string {
	t.Helper()
	p, err := s.Primary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.kill(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *Sentinel) kill(addr string) error {
	if s.procs != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		cmd := s.procs[addr]
		if cmd == nil {
			return fmt.Errorf("testenv: redis %s is not running", addr)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		delete(s.procs, addr)
		return nil
	}
	_, port, _ := net.SplitHostPort(addr)
	b, err := os.ReadFile(filepath.Join(s.dir, port, "redis.pid"))
	if err != nil {
		return fmt.Errorf("testenv: pid of redis %s: %v (the deployment must be the one .ci/redis-sentinel.sh started)", addr, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("testenv: pid of redis %s: %v", addr, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("testenv: killing redis %s (pid %d): %v", addr, pid, err)
	}
	for i := 0; syscall.Kill(pid, 0) == nil; i++ {
		if i > 500 {
			return fmt.Errorf("testenv: redis %s (pid %d) still runs 10s after SIGKILL", addr, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// RestartNode starts the data node at addr again, as a replica of the
// primary every Sentinel names when they agree on one other than addr. A
// node without persistence that came back as a primary, even until the
// Sentinels reconfigure it, could be elected again with an empty dataset
// under load; started as a replica it never holds that role.
func (s *Sentinel) RestartNode(addr string) error {
	var follow []string
	if p, err := s.agreedPrimary(); err == nil && p != addr {
		host, port, _ := net.SplitHostPort(p)
		follow = []string{"--replicaof", host, port}
	}
	if s.procs != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.procs[addr] != nil {
			return nil
		}
		return s.spawn(addr, follow...)
	}
	_, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("bash", filepath.Join(s.dir, port, "start.sh")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: restarting redis %s: %v: %s", addr, err, out)
	}
	if len(follow) == 0 {
		return nil
	}
	// The shared deployment's start.sh takes no arguments: turn the node
	// into a replica as soon as it answers.
	if err := awaitPing(&redis.Options{Addr: addr}, 10*time.Second); err != nil {
		return fmt.Errorf("testenv: redis %s does not answer after its restart: %v", addr, err)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: redisProbe, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), redisProbe)
	defer cancel()
	if err := c.Do(ctx, "REPLICAOF", follow[1], follow[2]).Err(); err != nil {
		return fmt.Errorf("testenv: making the restarted %s a replica of %s:%s: %v", addr, follow[1], follow[2], err)
	}
	return nil
}

// Client is a failover client on the deployment, closed when the test ends.
func (s *Sentinel) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// StartSentinel starts a private Sentinel deployment for a test that kills
// its nodes (the shared one of .ci/redis-sentinel.sh serves the tests that
// do not): a primary and a replica without persistence and three Sentinels
// (quorum 2, down-after 1s), on free loopback ports, all stopped when the
// test ends. Without the redis-server and redis-sentinel binaries the test
// is skipped, or failed under DEDUP_REQUIRE_SERVICES=1.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		Unavailable(t, "redis-server binary", err.Error())
	}
	sentinel, err := exec.LookPath("redis-sentinel")
	if err != nil {
		Unavailable(t, "redis-sentinel binary", err.Error())
	}
	dir := t.TempDir()
	s := &Sentinel{Master: "dedup-private", dir: dir, procs: map[string]*exec.Cmd{}, args: map[string][]string{}}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
		s.procs = map[string]*exec.Cmd{}
	})
	ports := FreePorts(t, 5)
	for i, p := range ports[:2] {
		addr := "127.0.0.1:" + strconv.Itoa(p)
		args := []string{server, "--port", strconv.Itoa(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--repl-diskless-sync-delay", "0", "--dir", dir, "--dbfilename", "dump-" + strconv.Itoa(p) + ".rdb"}
		if i == 1 {
			args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(ports[0]))
		}
		s.args[addr] = args
		s.Data = append(s.Data, addr)
	}
	for _, p := range ports[2:] {
		addr := "127.0.0.1:" + strconv.Itoa(p)
		conf := filepath.Join(dir, "sentinel-"+strconv.Itoa(p)+".conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel resolve-hostnames no\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s 1000\n"+
			"sentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
			p, dir, s.Master, ports[0], s.Master, s.Master, s.Master)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		s.args[addr] = []string{sentinel, conf}
		s.Addrs = append(s.Addrs, addr)
	}
	s.mu.Lock()
	for _, addr := range append(append([]string(nil), s.Data...), s.Addrs...) {
		if err := s.spawn(addr); err != nil {
			s.mu.Unlock()
			t.Fatal(err)
		}
	}
	s.mu.Unlock()
	s.WaitHealthy(t, 30*time.Second)
	return s
}

// spawn starts the process of addr; s.mu is held.
func (s *Sentinel) spawn(addr string, extra ...string) error {
	args := append(slices.Clone(s.args[addr]), extra...)
	cmd := exec.Command(args[0], args[1:]...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testenv: starting %s: %v", args[0], err)
	}
	s.procs[addr] = cmd
	if err := awaitPing(&redis.Options{Addr: addr}, 10*time.Second); err != nil {
		return fmt.Errorf("testenv: %s on %s does not answer: %v", args[0], addr, err)
	}
	return nil
}
