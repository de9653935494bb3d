package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

// The variables that steer the container path; doc.go describes them.
const (
	envContainers       = "DEDUP_TEST_CONTAINERS"
	envContainerNetwork = "DEDUP_TEST_CONTAINER_NETWORK"
	envRedisImage       = "DEDUP_REDIS_IMAGE"
	envNATSImage        = "DEDUP_NATS_IMAGE"
	envKafkaImage       = "DEDUP_KAFKA_IMAGE"
	// envReaper marks the process that removes a test binary's containers
	// when the binary exits (see startReaper).
	envReaper = "DEDUP_TESTENV_REAPER"
)

// Each container is labelled as testenv's, with the host name and the pid
// of the test binary that started it.
const (
	labelTestenv = "dedupworker.testenv"
	labelPid     = "dedupworker.testenv.pid"
	labelHost    = "dedupworker.testenv.host"
)

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// The default images: the official ones, at the versions CI's own servers
// run (Debian's redis-server and nats-server, Kafka's Maven Central jars).
const (
	DefaultRedisImage = "redis:7.0.15"
	DefaultNATSImage  = "nats:2.9.10"
	DefaultKafkaImage = "apache/kafka:3.9.2"
)

// Deadlines of the container path: pulling an image and starting a
// container, and a started server's first answer.
const (
	containerStartWithin = 5 * time.Minute
	containerReadyWithin = 90 * time.Second
	dockerProbeWithin    = 5 * time.Second
)

// containerMode is DEDUP_TEST_CONTAINERS: "" (containers when nothing else
// answers), "only" (containers for Redis, NATS and Kafka, whatever the
// environment names or the local defaults answer) or "off" (never).
func containerMode() (string, error) {
	switch v := os.Getenv(envContainers); v {
	case "", "only", "off":
		return v, nil
	default:
		return "", fmt.Errorf("%s=%q: want only, off or unset", envContainers, v)
	}
}

// containersOnly reports whether DEDUP_TEST_CONTAINERS=only: Redis, NATS
// and Kafka come from containers, and a container that cannot be started
// fails the test instead of skipping it.
func containersOnly() bool {
	m, _ := containerMode()
	return m == "only"
}

// onlyContainersWhy is why a topology is missing under
// DEDUP_TEST_CONTAINERS=only, or "" when containers are not forced.
func onlyContainersWhy(topology, script string) string {
	if !containersOnly() {
		return ""
	}
	return envContainers + "=only: containers provide one Redis, one NATS and one Kafka node, not " +
		topology + " (start it with " + script + " and unset " + envContainers + ")"
}

// requireContainer fails t when DEDUP_TEST_CONTAINERS=only and the container
// of service could not be started: forcing containers means expecting them.
func requireContainer(t interface {
	Helper()
	Fatalf(string, ...any)
}, service, why string) {
	t.Helper()
	if why != "" && containersOnly() {
		t.Fatalf("testenv: %s unavailable (%s=only): %s", service, envContainers, why)
	}
}

func imageOf(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// hostNetwork reports whether containers run with the host's network
// (DEDUP_TEST_CONTAINER_NETWORK=host), each server on a free loopback port
// of its own, instead of Docker's default bridge and mapped ports.
func hostNetwork() bool { return os.Getenv(envContainerNetwork) == "host" }

var (
	dockerOnce sync.Once
	dockerWhy  string
)

// dockerAvailable returns why no container can be started, or "": the
// mode forbids it, or no Docker engine answers. It asks the engine once.
func dockerAvailable() string {
	mode, err := containerMode()
	if err != nil {
		return err.Error()
	}
	if mode == "off" {
		return envContainers + "=off"
	}
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dockerProbeWithin)
		defer cancel()
		cli, err := testcontainers.NewDockerClientWithOpts(ctx)
		if err != nil {
			dockerWhy = "no Docker engine found by testcontainers-go (start one, or set DOCKER_HOST): " + err.Error()
			return
		}
		defer cli.Close()
		if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
			dockerWhy = "no Docker engine answers: " + err.Error()
			return
		}
		removeOrphans(ctx, cli)
	})
	return dockerWhy
}

// containerOpts are the options every container of testenv starts with:
// quiet, labelled, registered with the reaper as soon as it exists, and on
// the host's network when hostNetwork says so.
func containerOpts() []testcontainers.ContainerCustomizer {
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithLogger(tclog.NewNoopLogger()),
		testcontainers.WithLabels(map[string]string{labelTestenv: "1", labelPid: strconv.Itoa(os.Getpid()), labelHost: hostname()}),
		testcontainers.WithAdditionalLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostCreates: []testcontainers.ContainerHook{func(_ context.Context, c testcontainers.Container) error {
				return reap(c.GetContainerID())
			}},
		}),
	}
	if hostNetwork() {
		opts = append(opts, testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
			hc.PortBindings = nil
			hc.PublishAllPorts = false
		}))
	}
	return opts
}

// started handles what testcontainers.Run returned: a container that was
// created but failed to start is removed at once.
func started(ctr testcontainers.Container, err error, what string) error {
	if err == nil {
		return nil
	}
	if ctr != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = ctr.Terminate(ctx)
	}
	return fmt.Errorf("starting a %s container: %w", what, err)
}

// freeLoopbackPort returns a port nothing listens on at 127.0.0.1 now.
func freeLoopbackPort() (int, error) {
	ps, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ps[0], nil
}

// untilReady calls probe until it returns "" or the deadline passes.
func untilReady(what string, probe func() string) error {
	deadline := time.Now().Add(containerReadyWithin)
	for {
		why := probe()
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %s", what, containerReadyWithin, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startRedisContainer starts a Redis container without persistence and
// returns its URL.
func startRedisContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), containerStartWithin)
	defer cancel()
	image := imageOf(envRedisImage, DefaultRedisImage)
	args := []string{"redis-server", "--save", "", "--appendonly", "no"}
	port := 0
	if hostNetwork() {
		var err error
		if port, err = freeLoopbackPort(); err != nil {
			return "", err
		}
		args = append(args, "--port", strconv.Itoa(port), "--bind", "127.0.0.1")
	} else {
		args = append(args, "--protected-mode", "no")
	}
	opts := append(containerOpts(),
		testcontainers.WithCmd(args...),
		// The log line, not the port: with the host's network the port
		// the module probes (6379) may be another server's.
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections").WithStartupTimeout(containerReadyWithin)),
	)
	ctr, err := tcredis.Run(ctx, image, opts...)
	if err := started(ctr, err, "redis ("+image+")"); err != nil {
		return "", err
	}
	url := "redis://127.0.0.1:" + strconv.Itoa(port) + "/0"
	if !hostNetwork() {
		if url, err = ctr.ConnectionString(ctx); err != nil {
			return "", fmt.Errorf("redis container address: %w", err)
		}
	}
	return url, untilReady("the redis container at "+url, func() string {
		if err := pingRedisURL(url); err != nil {
			return err.Error()
		}
		return ""
	})
}

// startNATSContainer starts a nats-server container with JetStream and
// returns its URL.
func startNATSContainer() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), containerStartWithin)
	defer cancel()
	image := imageOf(envNATSImage, DefaultNATSImage)
	args := []string{"-js", "-sd", "/data"}
	opts := containerOpts()
	port := 0
	if hostNetwork() {
		var err error
		if port, err = freeLoopbackPort(); err != nil {
			return "", err
		}
		args = append(args, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	} else {
		args = append(args, "-p", "4222")
		opts = append(opts, testcontainers.WithExposedPorts("4222/tcp"))
	}
	opts = append(opts,
		testcontainers.WithCmd(args...),
		testcontainers.WithWaitStrategy(wait.ForLog("Server is ready").WithStartupTimeout(containerReadyWithin)),
	)
	ctr, err := testcontainers.Run(ctx, image, opts...)
	if err := started(ctr, err, "nats ("+image+")"); err != nil {
		return "", err
	}
	url := "nats://127.0.0.1:" + strconv.Itoa(port)
	if !hostNetwork() {
		if url, err = ctr.PortEndpoint(ctx, "4222/tcp", "nats"); err != nil {
			return "", fmt.Errorf("nats container address: %w", err)
		}
	}
	return url, untilReady("the nats container at "+url, func() string { return probeNATS(url) })
}

// kafkaClusterID is the KRaft cluster id the Kafka container is formatted
// with (base64 of "dedupworker-test").
const kafkaClusterID = "ZGVkdXB3b3JrZXItdGVzdA"

// kafkaNode is the Kafka container's PLAINTEXT address, its CUT listener
// with the address that listener advertises, its SASL_PLAINTEXT and
// SASL_SSL listeners, and the file of the CA that signed its certificate.
type kafkaNode struct {
	brokers            []string
	cut, cutAdvertised string
	sasl, saslTLS      string
	caFile             string
}

// String is the node as DEDUP_TESTENV_KAFKA_CONTAINER holds it: its fields
// separated by ";", the brokers by ",".
func (n kafkaNode) String() string {
	return strings.Join([]string{strings.Join(n.brokers, ","), n.cut, n.cutAdvertised, n.sasl, n.saslTLS, n.caFile}, ";")
}

// parseKafkaNode is the inverse of kafkaNode.String.
func parseKafkaNode(s string) kafkaNode {
	f := strings.SplitN(s, ";", 6)
	for len(f) < 6 {
		f = append(f, "")
	}
	return kafkaNode{brokers: splitAddrs(f[0]), cut: f[1], cutAdvertised: f[2], sasl: f[3], saslTLS: f[4], caFile: f[5]}
}

// The users of the container's SASL listeners, as .ci/kafka.sh formats its
// node with.
var kafkaUsers = map[string][2]string{
	"PLAIN":         {"dedup-plain", "dedup-plain-pw"},
	"SCRAM-SHA-256": {"dedup-scram256", "dedup-scram256-pw"},
	"SCRAM-SHA-512": {"dedup-scram512", "dedup-scram512-pw"},
}

// startKafkaContainer starts one combined broker and controller of Apache
// Kafka in KRaft mode, configured through the official image's KAFKA_*
// variables as .ci/kafka.sh configures its single node, and returns its
// addresses. The broker listens on the same ports inside the container and
// on the host, so the addresses it advertises are the ones clients dial.
// Besides PLAINTEXT it has a CUT listener advertised on another port, where
// KafkaCut puts a proxy.
func startKafkaContainer() (kafkaNode, error) {
	ctx, cancel := context.WithTimeout(context.Background(), containerStartWithin)
	defer cancel()
	image := imageOf(envKafkaImage, DefaultKafkaImage)
	ports, err := freePorts(6)
	if err != nil {
		return kafkaNode{}, err
	}
	port, cut, cutAdv := ports[0], strconv.Itoa(ports[2]), strconv.Itoa(ports[3])
	sasl, saslTLS := strconv.Itoa(ports[4]), strconv.Itoa(ports[5])
	keystore, caFile, err := kafkaTLS()
	if err != nil {
		return kafkaNode{}, err
	}
	host, listen, controller := "127.0.0.1", "127.0.0.1", "127.0.0.1:"+strconv.Itoa(ports[1])
	opts := containerOpts()
	if !hostNetwork() {
		provider, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(tclog.NewNoopLogger()))
		if err != nil {
			return kafkaNode{}, fmt.Errorf("docker provider: %w", err)
		}
		host, err = provider.DaemonHost(ctx)
		_ = provider.Close()
		if err != nil {
			return kafkaNode{}, fmt.Errorf("docker host: %w", err)
		}
		listen, controller = "0.0.0.0", "localhost:9093"
		p := network.MustParsePort(strconv.Itoa(port) + "/tcp")
		bindings := network.PortMap{p: {{HostPort: strconv.Itoa(port)}}}
		exposed := []string{p.String()}
		for _, other := range []string{cut, sasl, saslTLS} {
			o := network.MustParsePort(other + "/tcp")
			bindings[o] = []network.PortBinding{{HostPort: other}}
			exposed = append(exposed, o.String())
		}
		opts = append(opts,
			testcontainers.WithExposedPorts(exposed...),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.PortBindings = bindings }))
	}
	addr := host + ":" + strconv.Itoa(port)
	env := map[string]string{
		"CLUSTER_ID":          kafkaClusterID,
		"KAFKA_NODE_ID":       "1",
		"KAFKA_PROCESS_ROLES": "broker,controller",
		"KAFKA_LISTENERS": "PLAINTEXT://" + listen + ":" + strconv.Itoa(port) + ",CONTROLLER://" + controller +
			",CUT://" + listen + ":" + cut + ",SASL_PLAINTEXT://" + listen + ":" + sasl + ",SASL_SSL://" + listen + ":" + saslTLS,
		"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://" + addr + ",CUT://" + host + ":" + cutAdv +
			",SASL_PLAINTEXT://" + host + ":" + sasl + ",SASL_SSL://" + host + ":" + saslTLS,
		"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,CUT:PLAINTEXT," +
			"SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
		// The SASL listeners of .ci/kafka.sh's node: PLAIN and both SCRAMs
		// in clear, SCRAM-SHA-256 over TLS. ___ is "-" and __ is "_" in a
		// setting's name.
		"KAFKA_SASL_ENABLED_MECHANISMS": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
		"KAFKA_LISTENER_NAME_SASL__PLAINTEXT_PLAIN_SASL_JAAS_CONFIG": "org.apache.kafka.common.security.plain.PlainLoginModule required user_" +
			kafkaUsers["PLAIN"][0] + "=\"" + kafkaUsers["PLAIN"][1] + "\";",
		"KAFKA_LISTENER_NAME_SASL__PLAINTEXT_SCRAM___SHA___256_SASL_JAAS_CONFIG": scramJAAS,
		"KAFKA_LISTENER_NAME_SASL__PLAINTEXT_SCRAM___SHA___512_SASL_JAAS_CONFIG": scramJAAS,
		"KAFKA_LISTENER_NAME_SASL__SSL_SASL_ENABLED_MECHANISMS":                  "SCRAM-SHA-256",
		"KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___256_SASL_JAAS_CONFIG":       scramJAAS,
		"KAFKA_LISTENER_NAME_SASL__SSL_SSL_KEYSTORE_TYPE":                        "PEM",
		"KAFKA_LISTENER_NAME_SASL__SSL_SSL_KEYSTORE_LOCATION":                    kafkaKeystorePath,
		"KAFKA_CONTROLLER_LISTENER_NAMES":                                        "CONTROLLER",
		"KAFKA_CONTROLLER_QUORUM_VOTERS":                                         "1@" + controller,
		"KAFKA_INTER_BROKER_LISTENER_NAME":                                       "PLAINTEXT",
		"KAFKA_LOG_DIRS":                                                         "/tmp/kraft-combined-logs",
		"KAFKA_NUM_PARTITIONS":                                                   "1",
		"KAFKA_DEFAULT_REPLICATION_FACTOR":                                       "1",
		"KAFKA_MIN_INSYNC_REPLICAS":                                              "1",
		"KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS":                                     "4",
		"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":                                 "1",
		"KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS":                             "4",
		"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR":                         "1",
		"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":                                    "1",
		"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":                                 "0",
		"KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS":                                     "500",
		"KAFKA_LOG_SEGMENT_BYTES":                                                "16777216",
		"KAFKA_LOG_CLEANER_DEDUPE_BUFFER_SIZE":                                   "2097152",
		"KAFKA_NUM_NETWORK_THREADS":                                              "2",
		"KAFKA_NUM_IO_THREADS":                                                   "2",
		"KAFKA_NUM_RECOVERY_THREADS_PER_DATA_DIR":                                "1",
		"KAFKA_BACKGROUND_THREADS":                                               "2",
		"KAFKA_AUTO_CREATE_TOPICS_ENABLE":                                        "false",
		"KAFKA_DELETE_TOPIC_ENABLE":                                              "true",
		// A fast start and little CPU, as .ci/kafka.sh's test nodes.
		"KAFKA_HEAP_OPTS":            "-Xms128m -Xmx512m",
		"KAFKA_JVM_PERFORMANCE_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
	}
	opts = append(opts,
		testcontainers.WithEnv(env),
		testcontainers.WithFiles(testcontainers.ContainerFile{Reader: bytes.NewReader(keystore), ContainerFilePath: kafkaKeystorePath, FileMode: 0o644}),
		testcontainers.WithWaitStrategy(wait.ForLog("Kafka Server started").WithStartupTimeout(containerStartWithin)),
	)
	ctr, err := testcontainers.Run(ctx, image, opts...)
	if err := started(ctr, err, "kafka ("+image+")"); err != nil {
		return kafkaNode{}, err
	}
	node := kafkaNode{brokers: []string{addr}, cut: host + ":" + cut, cutAdvertised: host + ":" + cutAdv,
		sasl: host + ":" + sasl, saslTLS: host + ":" + saslTLS, caFile: caFile}
	return node, untilReady("the kafka container at "+addr, func() string {
		if why := probeKafka(node.brokers); why != "" {
			return why
		}
		if why := kafkaCoordinatorWhy(node.brokers); why != "" {
			return why
		}
		return kafkaScramUsersWhy(node.brokers)
	})
}

// fromContainer starts service's container with start, unless containers
// are forbidden or no Docker engine answers; why then joins before (what
// the earlier steps found) and the reason.
//
// A started container's address is also set as the service's variable
// (env: REDIS_URL, NATS_URL, KAFKA_BROKERS; text writes it), so that what
// reads the variable rather than asking testenv (a package's examples, a
// binary a test runs) uses the same server; and, whole (encode), as
// DEDUP_TESTENV_<SERVICE>_CONTAINER, which a test binary run by this one
// (a test's child process) takes instead of starting a container of its
// own, even under DEDUP_TEST_CONTAINERS=only: the two must share the
// server, and the container lives as long as the binary that started it.
func fromContainer[A any](service, env, before string, start func() (A, error), text, encode func(A) string, decode func(string) A) (addr A, why string) {
	inherited := "DEDUP_TESTENV_" + strings.ToUpper(service) + "_CONTAINER"
	if v := os.Getenv(inherited); v != "" {
		return decode(v), ""
	}
	join := func(reason string) string {
		if before == "" {
			return reason
		}
		return before + "; " + reason
	}
	if why := dockerAvailable(); why != "" {
		return addr, join("no " + service + " container: " + why)
	}
	addr, err := start()
	if err != nil {
		return addr, join(err.Error())
	}
	for name, value := range map[string]string{env: text(addr), inherited: encode(addr)} {
		if err := os.Setenv(name, value); err != nil {
			return addr, join("setting " + name + ": " + err.Error())
		}
	}
	return addr, ""
}

func sameString(s string) string { return s }

// removeOrphans removes the containers testenv started on this host for a
// test binary that no longer runs and whose reaper could not remove them
// (the reaper killed too, the engine busy past its deadline).
func removeOrphans(ctx context.Context, cli *testcontainers.DockerClient) {
	res, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", labelTestenv+"=1", labelHost+"="+hostname()),
	})
	if err != nil {
		return
	}
	for _, c := range res.Items {
		pid, err := strconv.Atoi(c.Labels[labelPid])
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		_, _ = cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	}
}

// Where the Kafka container finds its TLS key and certificates, and the
// JAAS setting of a SCRAM listener (the users are the broker's metadata).
const (
	kafkaKeystorePath = "/tmp/dedup-server.pem"
	scramJAAS         = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
)

// kafkaTLS makes a CA and a server certificate for 127.0.0.1 and
// localhost, valid for a day: the keystore (the key in PKCS#8 and the
// certificate chain, PEM) for the container, and the CA's PEM file on this
// host, in a directory the reaper removes with the container.
func kafkaTLS() (keystore []byte, caFile string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dedupworker test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, "", err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, "", err
	}
	keystore = append(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER})...)
	keystore = append(keystore, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})...)
	dir, err := os.MkdirTemp("", "dedupworker-testenv-kafka-")
	if err != nil {
		return nil, "", err
	}
	if err := reapDir(dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", err
	}
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644); err != nil {
		return nil, "", err
	}
	return keystore, caFile, nil
}

// kafkaScramUsersWhy makes the SCRAM users of kafkaUsers, and returns why
// they cannot be made, or "".
func kafkaScramUsersWhy(brokers []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ups []kafka.UserScramCredentialsUpsertion
	for mech, m := range map[string]struct {
		mech kafka.ScramMechanism
		hash func() hash.Hash
		size int
	}{"SCRAM-SHA-256": {kafka.ScramMechanismSha256, sha256.New, sha256.Size}, "SCRAM-SHA-512": {kafka.ScramMechanismSha512, sha512.New, sha512.Size}} {
		user := kafkaUsers[mech]
		salt := []byte("dedupworker-" + user[0])
		const iterations = 4096
		salted, err := pbkdf2.Key(m.hash, user[1], salt, iterations, m.size)
		if err != nil {
			return err.Error()
		}
		ups = append(ups, kafka.UserScramCredentialsUpsertion{Name: user[0], Mechanism: m.mech, Iterations: iterations, Salt: salt, SaltedPassword: salted})
	}
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.AlterUserScramCredentials(ctx, &kafka.AlterUserScramCredentialsRequest{Upsertions: ups})
	if err != nil {
		return "making the SCRAM users: " + err.Error()
	}
	for _, r := range resp.Results {
		if r.Error != nil {
			return "making the SCRAM user " + r.User + ": " + r.Error.Error()
		}
	}
	return ""
}

// kafkaCoordinatorWhy returns why the broker has no group coordinator yet,
// or "". A new broker makes its offsets topic on the first group request
// and answers such requests with an error until then; the local nodes of
// .ci/kafka.sh have long had one, so the container is made ready the same
// way before a test uses it.
func kafkaCoordinatorWhy(brokers []string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.FindCoordinator(ctx, &kafka.FindCoordinatorRequest{Key: "dedupworker-testenv", KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err == nil {
		err = resp.Error
	}
	if err != nil {
		return "group coordinator: " + err.Error()
	}
	return ""
}

// The reaper: a child process of the test binary that removes the binary's
// containers when the binary exits, however it exits (tests done, a
// panic, a timeout, a kill). It reads container ids, one a line, from a
// pipe whose other end only the test binary holds; the end of that input
// is the binary's exit. It runs in a process group of its own, so the
// interrupt that stops the tests does not stop it before its work.

var (
	reaperMu  sync.Mutex
	reaperIn  io.WriteCloser // kept for the life of the test binary
	reaperErr error
)

func init() {
	if os.Getenv(envReaper) == "1" {
		os.Exit(runReaper(os.Stdin))
	}
}

// reap hands the container id to the reaper, starting the reaper first if
// need be.
func reap(id string) error { return toReaper(id) }

// reapDir hands the reaper a directory of this host to remove with the
// containers.
func reapDir(dir string) error { return toReaper("dir " + dir) }

func toReaper(line string) error {
	reaperMu.Lock()
	defer reaperMu.Unlock()
	if reaperIn == nil && reaperErr == nil {
		reaperIn, reaperErr = startReaper()
	}
	if reaperErr != nil {
		return fmt.Errorf("testenv: starting the container reaper: %w", reaperErr)
	}
	_, err := fmt.Fprintln(reaperIn, line)
	return err
}

func startReaper() (io.WriteCloser, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envReaper+"=1")
	// What the reaper could not remove, it says in a log of its own.
	if f, err := os.OpenFile(filepath.Join(os.TempDir(), "dedupworker-testenv-reaper.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		cmd.Stderr = f
		defer f.Close() // the child has its own copy once started
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// The reaper outlives this process by design; nothing waits for it.
	go func() { _ = cmd.Wait() }()
	return in, nil
}

// runReaper reads container ids until in ends, then removes each
// container, with its volumes. It returns the exit code.
func runReaper(in io.Reader) int {
	parent := os.Getppid()
	var ids, dirs []string
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if dir, ok := strings.CutPrefix(line, "dir "); ok {
			dirs = append(dirs, dir)
		} else if line != "" {
			ids = append(ids, line)
		}
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
	if len(ids) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s testenv reaper (pid %d, for %d): "+format+"\n",
			append([]any{time.Now().Format(time.RFC3339), os.Getpid(), parent}, args...)...)
	}
	tclog.SetDefault(tclog.NewNoopLogger()) // its log is for failures only
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		fail("no Docker client, containers %v left: %v", ids, err)
		return 1
	}
	defer cli.Close()
	code := 0
	for _, id := range ids {
		_, err := cli.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err != nil && !isNotFound(err) {
			fail("removing container %s: %v", id, err)
			code = 1
		}
	}
	return code
}

func isNotFound(err error) bool {
	var nf interface{ NotFound() }
	return errors.As(err, &nf) || strings.Contains(err.Error(), "No such container")
}
