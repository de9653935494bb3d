package redisbackend_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency/storetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// privateCluster is a Redis Cluster of this test's own redis-server
// processes, on free loopback ports, which the test may stop, pause and
// reconfigure: the shared cluster of .ci/redis-cluster.sh is never touched.
type privateCluster struct {
	masters  []*clusterNode
	replicas []*clusterNode // replicas[i] replicates masters[i]
}

type clusterNode struct {
	srv    *testenv.RedisServer
	client *redis.Client
	id     string
	bus    int // the cluster bus port
}

func (n *clusterNode) addr() string { return n.srv.Addr() }

// startPrivateCluster starts masters primaries, each with one replica when
// replicas is set, and args added to every node's (e.g.
// "--cluster-require-full-coverage", "no"). It returns once every node
// sees the cluster as ok and every replica is in sync.
func startPrivateCluster(t testing.TB, masters int, replicas bool, args ...string) *privateCluster {
	t.Helper()
	start := func() *clusterNode {
		// The port and the bus port from one FreePorts: two FreePort calls
		// may return the same port, which the bus then fails to bind.
		ports := testenv.FreePorts(t, 2)
		bus := ports[1]
		srv := testenv.NewRedisServer(t, testenv.RedisServerConfig{Port: ports[0], Args: append([]string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "10000", "--maxmemory-policy", "noeviction",
		}, args...)})
		n := &clusterNode{srv: srv, client: srv.Client(t), bus: bus}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := n.client.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", n.addr(), err)
		}
		n.id = id
		return n
	}
	c := &privateCluster{}
	for range masters {
		c.masters = append(c.masters, start())
	}
	if replicas {
		for range masters {
			c.replicas = append(c.replicas, start())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, m := range c.masters {
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		if err := m.client.Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			t.Fatalf("CLUSTER ADDSLOTSRANGE on %s: %v", m.addr(), err)
		}
	}
	all := c.nodes()
	for _, n := range all[1:] {
		host, port, _ := strings.Cut(all[0].addr(), ":")
		if err := n.client.Do(ctx, "cluster", "meet", host, port, all[0].bus).Err(); err != nil {
			t.Fatalf("CLUSTER MEET from %s: %v", n.addr(), err)
		}
	}
	known := func(n *clusterNode) bool {
		out, err := n.client.ClusterNodes(ctx).Result()
		return err == nil && strings.Count(out, "\n") >= len(all) && !strings.Contains(out, "handshake")
	}
	testenv.Eventually(t, 20*time.Second, "every cluster node knows every other", func() bool {
		for _, n := range all {
			if !known(n) {
				return false
			}
		}
		return true
	})
	for i, r := range c.replicas {
		if err := r.client.Do(ctx, "cluster", "replicate", c.masters[i].id).Err(); err != nil {
			t.Fatalf("CLUSTER REPLICATE on %s: %v", r.addr(), err)
		}
	}
	testenv.Eventually(t, 30*time.Second, "the private cluster is ok with its replicas in sync", func() bool {
		for _, n := range all {
			info, err := n.client.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
		}
		for _, r := range c.replicas {
			info, err := r.client.Info(ctx, "replication").Result()
			if err != nil || !strings.Contains(info, "master_link_status:up") {
				return false
			}
		}
		for _, n := range all {
			out, err := n.client.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(out, "slave") != len(c.replicas) {
				return false
			}
		}
		return true
	})
	return c
}

func (c *privateCluster) nodes() []*clusterNode {
	return append(append([]*clusterNode(nil), c.masters...), c.replicas...)
}

func (c *privateCluster) masterAddrs() []string {
	var out []string
	for _, m := range c.masters {
		out = append(out, m.addr())
	}
	return out
}

// clusterClient returns a ClusterClient on c with the worker's I/O
// timeouts, closed when the test ends; user, when set, is the ACL user it
// logs in as (password "dedup-test").
func (c *privateCluster) clusterClient(t testing.TB, user string) *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.masterAddrs(), Username: user, Password: password(user),
		DialTimeout: time.Second, ReadTimeout: redisbackend.DefaultIOTimeout, WriteTimeout: redisbackend.DefaultIOTimeout,
	})
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

func password(user string) string {
	if user == "" {
		return ""
	}
	return "dedup-test"
}

// pid is the node's process id, as INFO server reports it.
func (n *clusterNode) pid(t *testing.T) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := n.client.Info(ctx, "server").Result()
	if err != nil {
		t.Fatalf("INFO server on %s: %v", n.addr(), err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err == nil {
				return pid
			}
		}
	}
	t.Fatalf("INFO server on %s has no process_id", n.addr())
	return 0
}

// pause stops the node's process (SIGSTOP) until resume; the test's end
// resumes it, so that it can be stopped.
func (n *clusterNode) pause(t *testing.T) (resume func()) {
	pid := n.pid(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", n.addr(), err)
	}
	done := false
	resume = func() {
		if !done {
			done = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// TestStoreClusterPerKeyFailure runs the store conformance suite on a
// private cluster where the store logs in as a user that may not write the
// suite's broken keys, so a batch's key fails on its own slot's call.
func TestStoreClusterPerKeyFailure(t *testing.T) {
	testenv.Long(t, "starts a private cluster")
	c := startPrivateCluster(t, 3, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range c.nodes() {
		if err := n.client.Do(ctx, "acl", "setuser", "dedup", "on", ">dedup-test", "~*:storetest:*", "&*", "+@all").Err(); err != nil {
			t.Fatalf("ACL SETUSER on %s: %v", n.addr(), err)
		}
	}
	client := c.clusterClient(t, "dedup")
	storetest.RunHarness(t, func(t *testing.T) *storetest.Harness {
		h := newHarness(t, client)
		h.BrokenKey = func(*testing.T) string { return "denied:" + testenv.RandID() }
		h.SplitBatches = true
		return h
	})
}

// slotOwner returns the index in c.masters of the primary that owns rkey's
// slot.
func (c *privateCluster) slotOwner(rkey string) int {
	slot := int(redisbackend.HashSlot(rkey))
	n := len(c.masters)
	for i := range n {
		if slot <= (i+1)*16384/n-1 {
			return i
		}
	}
	return n - 1
}
