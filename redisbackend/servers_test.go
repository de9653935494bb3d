package redisbackend_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
)

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startRedis runs redis-server with args (plus no persistence, a log file
// and a working directory in dir) for the test, stopping it at the end and
// showing its log when the test failed.
func startRedis(t *testing.T, dir string, args ...string) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "redis-server", "no redis-server binary on PATH to start a server for the test")
	}
	logf := filepath.Join(dir, "redis.log")
	args = append(args, "--save", "", "--appendonly", "no", "--dir", dir, "--logfile", logf)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		testenv.Unavailable(t, "redis-server", "cannot start it: "+err.Error())
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(logf)
			t.Logf("%s log:\n%s", args[0], log)
		}
	})
}

// waitFor polls ping until it succeeds, or ends the test as Unavailable.
func waitFor(t *testing.T, what string, ping func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			testenv.Unavailable(t, what, "not answering within 10s: "+err.Error())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The store on Sentinel: a FailoverClient that asks a real redis-sentinel
// for the master passes the whole suite.
func TestStoreSentinel(t *testing.T) {
	dir := t.TempDir()
	master := testenv.StartRedisServer(t)
	sentinel := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte("port "+strconv.Itoa(sentinel)+"\nbind 127.0.0.1\n"+
		"sentinel monitor dedupmaster "+strings.Replace(master.Addr(), ":", " ", 1)+" 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startRedis(t, dir, conf, "--sentinel")
	sc := redis.NewSentinelClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(sentinel)})
	t.Cleanup(func() { _ = sc.Close() })
	waitFor(t, "redis-sentinel", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return sc.GetMasterAddrByName(ctx, "dedupmaster").Err()
	})
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    "dedupmaster",
		SentinelAddrs: []string{"127.0.0.1:" + strconv.Itoa(sentinel)},
	})
	t.Cleanup(func() { _ = client.Close() })
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness { return newHarness(t, client) })
}
