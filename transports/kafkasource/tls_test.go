package kafkasource_test

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestTLS consumes from a real broker's SASL_SSL listener, and fails Run
// with the cause when the broker's certificate does not verify.
func TestTLS(t *testing.T) {
	t.Parallel()
	sec := testenv.RealKafkaSecurity(t)
	e := newEnv(t, 1)
	brokers := sec.SASLTLS
	pem, err := os.ReadFile(sec.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatalf("no certificate in %s", sec.CAFile)
	}
	user := sec.Users["SCRAM-SHA-256"]
	auth := &kafkasource.SASL{Mechanism: kafkasource.SASLScramSHA256, Username: user[0], Password: user[1]}
	mech, err := scram.Mechanism(scram.SHA256, user[0], user[1])
	if err != nil {
		t.Fatal(err)
	}
	clientTLS := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	produceOne(t, brokers, e.topic, &kafka.Transport{TLS: clientTLS, SASL: mech}, "secret")

	src, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topic: e.topic, GroupID: e.group, TLS: clientTLS, SASL: auth,
		SessionTimeout: time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if p := firstPayload(t, "over TLS", "tls", src); p != "secret" {
		t.Errorf("payload %q", p)
	}

	untrusted, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topic: e.topic, GroupID: e.group + "-untrusted", SASL: auth,
		TLS: &tls.Config{MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	if err := runToError(t, "an untrusted broker certificate", "tls", untrusted); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Run with an untrusted broker certificate = %v, want an error naming the certificate", err)
	}
}
