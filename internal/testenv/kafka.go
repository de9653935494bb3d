package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// The local Kafka that .ci/kafka.sh starts.
var (
	localKafka        = []string{"127.0.0.1:9092"}
	localKafkaCluster = []string{"127.0.0.1:19092", "127.0.0.1:19093", "127.0.0.1:19094"}
)

type found struct {
	once  sync.Once
	addrs []string
	why   string
	// node is set when the addresses are a container's.
	node *kafkaNode
}

var kafkaSingle, kafkaCluster found

// find resolves env (comma-separated) or, when it is unset, the local
// default, once; why is non-empty when nothing answers. With container set,
// a Kafka container is the last resort, and under DEDUP_TEST_CONTAINERS=only
// the only one.
func (f *found) find(env string, local []string, hint string, container bool) ([]string, string) {
	f.once.Do(func() {
		if container && containersOnly() {
			f.fromContainer("")
			return
		}
		if v := os.Getenv(env); v != "" {
			f.addrs = splitAddrs(v)
			if why := probeKafka(f.addrs); why != "" {
				f.why = env + " is set but " + why
			}
			return
		}
		f.addrs = local
		if why := probeKafka(local); why != "" {
			f.why = env + " is not set and " + why + "; " + hint
			if container {
				f.fromContainer(f.why)
			}
		}
	})
	return append([]string(nil), f.addrs...), f.why
}

func (f *found) fromContainer(before string) {
	var node kafkaNode
	node, f.why = fromContainer("kafka", "KAFKA_BROKERS", before, startKafkaContainer,
		func(n kafkaNode) string { return strings.Join(n.brokers, ",") }, kafkaNode.String, parseKafkaNode)
	f.addrs = node.brokers
	if f.why == "" {
		f.node = &node
	}
}

func splitAddrs(v string) []string {
	var out []string
	for a := range strings.SplitSeq(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Kafka returns the addresses of a real Apache Kafka for a test, found once
// per test binary: $KAFKA_BROKERS (comma-separated) when set; else
// 127.0.0.1:9092 (the single KRaft node of .ci/kafka.sh) when it answers;
// else one Kafka node in a container when a Docker engine answers (see the
// package documentation). Without one, the test runs on an in-process
// kfake broker instead, except under DEDUP_REQUIRE_SERVICES=1 or
// DEDUP_TEST_CONTAINERS=only, where a missing Kafka fails the test. Topics
// are made with CreateKafkaTopic; the broker creates none by itself.
func Kafka(t testing.TB) []string {
	t.Helper()
	brokers, why := findKafka()
	if why == "" {
		return brokers
	}
	requireContainer(t, "kafka", why)
	if os.Getenv("DEDUP_REQUIRE_SERVICES") == "1" {
		Unavailable(t, "kafka", why)
	}
	t.Logf("testenv: no real Kafka (%s): using in-process kfake", why)
	_, brokers = KFake(t)
	return brokers
}

// RealKafka is Kafka for a test that only means something on Apache Kafka
// (the group coordinator's behaviour, a broker's own limits): without one
// it is skipped, or failed under DEDUP_REQUIRE_SERVICES=1 or
// DEDUP_TEST_CONTAINERS=only.
func RealKafka(t testing.TB) []string {
	t.Helper()
	brokers, why := findKafka()
	if why != "" {
		requireContainer(t, "kafka", why)
		Unavailable(t, "kafka", why)
	}
	return brokers
}

func findKafka() ([]string, string) {
	return kafkaSingle.find("KAFKA_BROKERS", localKafka, "run .ci/kafka.sh start", true)
}

// probeKafka returns why brokers do not answer, or "".
func probeKafka(brokers []string) string {
	var errs []error
	for _, b := range brokers {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		conn, err := (&kafka.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", b)
		cancel()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		_, err = conn.Brokers()
		conn.Close()
		if err == nil {
			return ""
		}
		errs = append(errs, err)
	}
	// One line, so a skip message shows the hint after it in a summary.
	msgs := make([]string, len(errs))
	for i, err := range errs {
		msgs[i] = err.Error()
	}
	return "nothing answers on " + strings.Join(brokers, ",") + ": " + strings.Join(msgs, "; ")
}

// KFake starts an in-process Kafka-protocol broker (franz-go's kfake) on
// loopback for the test and closes it when the test ends: for fast unit
// tests of the protocol handling, never as a stand-in for the group
// coordinator's behaviour. Defaults: one broker on a random port and a group
// minimum session timeout of 100ms (kfake's own is 6s). opts come after the
// defaults and override them; seed topics with kfake.SeedTopics.
func KFake(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, []string) {
	t.Helper()
	all := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		Unavailable(t, "kafka", "starting an in-process kfake cluster: "+err.Error())
	}
	t.Cleanup(c.Close)
	return c, c.ListenAddrs()
}

// CreateKafkaTopic creates topic with the given number of partitions and a
// replication factor of 1, and waits until every partition has a leader. An
// existing topic is an error: tests use fresh names.
func CreateKafkaTopic(t testing.TB, brokers []string, topic string, partitions int) {
	t.Helper()
	CreateKafkaTopicRF(t, brokers, topic, partitions, 1)
}

// CreateKafkaTopicRF is CreateKafkaTopic with a replication factor.
func CreateKafkaTopicRF(t testing.TB, brokers []string, topic string, partitions, rf int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	// A broker just started again (a fault test's) may close a request's
	// connection while it loads: such a failure is retried until the
	// deadline; an answer from the broker (the topic exists, a bad
	// setting) is not.
	for retried := false; ; retried = true {
		resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
			Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: rf}},
		})
		if err == nil {
			// A retried request may find the topic its lost first try made.
			if err := resp.Errors[topic]; err != nil && !(retried && errors.Is(err, kafka.TopicAlreadyExists)) {
				t.Fatalf("testenv: creating topic %q: %v", topic, err)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: creating topic %q: %v", topic, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	WaitKafkaLeaders(t, brokers, topic, partitions)
}

// WaitKafkaLeaders waits up to 30s until every one of the topic's
// partitions has a leader.
func WaitKafkaLeaders(t testing.TB, brokers []string, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Host != ""
			}
			if ready {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: topic %q has no leaders after 30s (last error: %v)", topic, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
