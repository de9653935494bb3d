package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// KafkaNodes is the 3-node KRaft cluster of .ci/kafka.sh, for rebalance and
// fault tests: its brokers, and each node's process, which a test may kill
// and start again.
type KafkaNodes struct {
	// Brokers are the PLAINTEXT listeners of nodes 1-3, in order.
	Brokers []string
	// CutBrokers are the advertised addresses of each node's CUT
	// listener: a client that bootstraps from one of them follows those
	// addresses, so proxies on them (CutProxies) cut every connection.
	CutBrokers []string
	dir        string
}

// kafkaDir is where .ci/kafka.sh keeps its nodes.
func kafkaDir() string {
	if d := os.Getenv("DEDUP_KAFKA_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "dedup-kafka")
}

// KafkaCluster returns the 3-node real Kafka cluster: $KAFKA_CLUSTER_BROKERS
// when set, else 127.0.0.1:19092-19094. Without it the test is skipped, or
// failed under DEDUP_REQUIRE_SERVICES=1: what these tests check (leader
// moves, broker kills) needs real brokers. Killing nodes needs the local
// cluster, whose pids .ci/kafka.sh records.
func KafkaCluster(t testing.TB) *KafkaNodes {
	t.Helper()
	if why := onlyContainersWhy("a 3-node Kafka cluster", ".ci/kafka.sh start cluster"); why != "" {
		Unavailable(t, "kafka cluster", why)
	}
	brokers, why := kafkaCluster.find("KAFKA_CLUSTER_BROKERS", localKafkaCluster,
		"containers provide no 3-node Kafka cluster: run .ci/kafka.sh start cluster", false)
	if why != "" {
		Unavailable(t, "kafka cluster", why)
	}
	return &KafkaNodes{
		Brokers:    brokers,
		CutBrokers: []string{"127.0.0.1:19392", "127.0.0.1:19393", "127.0.0.1:19394"},
		dir:        filepath.Join(kafkaDir(), "cluster"),
	}
}

// CutProxies starts a proxy on each node's advertised CUT address in front
// of its CUT listener (127.0.0.1:19292-19294). Only one test at a time may
// hold them.
func (k *KafkaNodes) CutProxies(t testing.TB) []*Proxy {
	t.Helper()
	var ps []*Proxy
	for i, adv := range k.CutBrokers {
		ps = append(ps, NewProxyOn(t, adv, "127.0.0.1:"+strconv.Itoa(19292+i)))
	}
	return ps
}

// LockFaults makes the test the only one, across test binaries, that kills
// nodes of the cluster until it ends: two killed nodes of three would lose
// the KRaft quorum. It waits for the lock.
func (k *KafkaNodes) LockFaults(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(k.dir, "faults.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("testenv: kafka fault lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("testenv: kafka fault lock: %v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}

func (k *KafkaNodes) nodeDir(id int) string { return filepath.Join(k.dir, "node"+strconv.Itoa(id)) }

// Pid is node id's (1-3) process id.
func (k *KafkaNodes) Pid(t testing.TB, id int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k.nodeDir(id), "pid"))
	if err != nil {
		t.Fatalf("testenv: kafka node %d: %v (the cluster must be the one .ci/kafka.sh started)", id, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("testenv: kafka node %d pid: %v", id, err)
	}
	return pid
}

// Kill kills node id with SIGKILL and waits until its process is gone.
func (k *KafkaNodes) Kill(t testing.TB, id int) {
	t.Helper()
	pid := k.Pid(t, id)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("testenv: killing kafka node %d (pid %d): %v", id, pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("testenv: kafka node %d (pid %d) still runs 10s after SIGKILL", id, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Start starts node id again (its start.sh) and waits up to 60s until its
// PLAINTEXT listener answers Metadata.
func (k *KafkaNodes) Start(t testing.TB, id int) {
	t.Helper()
	if err := k.StartErr(id); err != nil {
		t.Fatal(err)
	}
}

// StartErr is Start for a goroutine that is not the test's: it returns
// what went wrong instead of failing the test.
func (k *KafkaNodes) StartErr(id int) error {
	cmd := exec.Command("bash", filepath.Join(k.nodeDir(id), "start.sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("testenv: starting kafka node %d: %v: %s", id, err, out)
	}
	addr := []string{k.Brokers[id-1]}
	deadline := time.Now().Add(60 * time.Second)
	for {
		why := probeKafka(addr)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: kafka node %d did not answer within 60s of its start: %s", id, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// KafkaSecurity names the SASL and TLS listeners of the single node of
// .ci/kafka.sh and the users it was formatted with.
type KafkaSecurity struct {
	// SASL is a SASL_PLAINTEXT listener taking PLAIN, SCRAM-SHA-256 and
	// SCRAM-SHA-512.
	SASL []string
	// SASLTLS is a SASL_SSL listener taking SCRAM-SHA-256; its server
	// certificate is signed by the CA in CAFile.
	SASLTLS []string
	CAFile  string
	// Users by mechanism: "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512".
	Users map[string][2]string
}

// RealKafkaSecurity returns the security listeners of the Kafka node
// [RealKafka] found: a container's own, or those of the local single node
// ($KAFKA_SASL_BROKERS and $KAFKA_SASL_TLS_BROKERS override the addresses),
// skipping or failing (DEDUP_REQUIRE_SERVICES=1) the test without them.
func RealKafkaSecurity(t testing.TB) *KafkaSecurity {
	t.Helper()
	RealKafka(t)
	if n := kafkaSingle.node; n != nil {
		return &KafkaSecurity{SASL: []string{n.sasl}, SASLTLS: []string{n.saslTLS}, CAFile: n.caFile, Users: kafkaUsers}
	}
	s := &KafkaSecurity{
		SASL:    []string{"127.0.0.1:9094"},
		SASLTLS: []string{"127.0.0.1:9095"},
		CAFile:  filepath.Join(kafkaDir(), "tls", "ca.pem"),
		Users:   kafkaUsers,
	}
	if v := os.Getenv("KAFKA_SASL_BROKERS"); v != "" {
		s.SASL = splitAddrs(v)
	}
	if v := os.Getenv("KAFKA_SASL_TLS_BROKERS"); v != "" {
		s.SASLTLS = splitAddrs(v)
	}
	if v := os.Getenv("KAFKA_TLS_CA_FILE"); v != "" {
		s.CAFile = v
	}
	if _, err := os.Stat(s.CAFile); err != nil {
		Unavailable(t, "kafka TLS listener", err.Error())
	}
	for _, a := range [][]string{s.SASL, s.SASLTLS} {
		if err := dialTCP(a[0]); err != nil {
			Unavailable(t, "kafka security listener", err.Error())
		}
	}
	return s
}

// KafkaCut is a proxy on the single node's advertised CUT address
// (127.0.0.1:9097 for .ci/kafka.sh's node; ports of its own for a
// container) in front of its CUT listener (9096): a client that
// bootstraps from addr reaches the broker only through the proxy, whose
// Cut closes every connection. Only one test at a time may hold it.
func KafkaCut(t testing.TB) (addr string, p *Proxy) {
	t.Helper()
	RealKafka(t)
	if n := kafkaSingle.node; n != nil {
		return n.cutAdvertised, NewProxyOn(t, n.cutAdvertised, n.cut)
	}
	return "127.0.0.1:9097", NewProxyOn(t, "127.0.0.1:9097", "127.0.0.1:9096")
}
