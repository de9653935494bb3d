package kafka_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafka"
)

// TestTLS consumes over TLS, and fails Run with the cause when the broker's
// certificate does not verify.
func TestTLS(t *testing.T) {
	t.Parallel()
	ca := testenv.NewTestCA(t)
	cert, pool := ca.Server, ca.Pool
	_, brokers := testenv.KafkaCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}}), kfake.SeedTopics(1, "tls"))
	clientTLS := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	w := &kafkago.Writer{Addr: kafkago.TCP(brokers...), Topic: "tls", BatchTimeout: time.Millisecond, Transport: &kafkago.Transport{TLS: clientTLS}}
	if err := w.WriteMessages(context.Background(), kafkago.Message{Value: []byte("secret")}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	src, err := kafka.New(kafka.Config{Brokers: brokers, Topic: "tls", GroupID: "g", TLS: clientTLS, SessionTimeout: time.Second, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	r := run(t, worker(t, "tls", src, consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		select {
		case got <- string(m.Payload):
		default:
		}
		return nil, nil
	})))
	select {
	case p := <-got:
		if p != "secret" {
			t.Errorf("payload %q", p)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("nothing consumed over TLS")
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	untrusted, err := kafka.New(kafka.Config{Brokers: brokers, Topic: "tls", GroupID: "g2", TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = worker(t, "tls", untrusted, consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })).Run(ctx)
	if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Run with an untrusted broker certificate = %v, want an error naming the certificate", err)
	}
}
