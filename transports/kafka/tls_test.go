package kafka_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafka"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestTLS consumes over TLS, and fails Run with the cause when the broker's
// certificate does not verify.
func TestTLS(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
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
