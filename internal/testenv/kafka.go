package testenv

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka returns the addresses of Kafka brokers for a test: $KAFKA_BROKERS
// (comma-separated) when set, which must answer (else the test is skipped,
// or failed under DEDUP_REQUIRE_SERVICES=1); otherwise an in-process kfake
// cluster started for the test (see KafkaCluster). Create topics with
// CreateKafkaTopic: a real cluster has none of the test's topics.
func Kafka(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		var brokers []string
		for b := range strings.SplitSeq(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		if why := probeKafka(brokers); why != "" {
			Unavailable(t, "kafka", why)
		}
		return brokers
	}
	_, brokers := KafkaCluster(t)
	return brokers
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
	return "KAFKA_BROKERS=" + strings.Join(brokers, ",") + ": " + errors.Join(errs...).Error()
}

// KafkaCluster starts an in-process Kafka-protocol broker (franz-go's kfake)
// on loopback for the test and closes it when the test ends. Defaults: one
// broker on a random port and a group minimum session timeout of 100ms, so
// tests can use short session timeouts (kfake's own minimum is 6s). opts
// come after the defaults and override them; seed topics with
// kfake.SeedTopics(partitions, names...).
func KafkaCluster(t testing.TB, opts ...kfake.Opt) (*kfake.Cluster, []string) {
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

// CreateKafkaTopic creates topic with the given number of partitions (a
// replication factor of 1) and waits until every partition has a leader. An
// existing topic is an error: tests use fresh names.
func CreateKafkaTopic(t testing.TB, brokers []string, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}},
	})
	if err != nil {
		t.Fatalf("testenv: creating topic %q: %v", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		t.Fatalf("testenv: creating topic %q: %v", topic, err)
	}
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
