package kafkasource_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"

	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestSASL consumes from a real broker's SASL_PLAINTEXT listener, with
// PLAIN and SCRAM, and fails Run with the cause when the password is wrong.
func TestSASL(t *testing.T) {
	t.Parallel()
	sec := testenv.RealKafkaSecurity(t)
	e := newEnv(t, 1)
	brokers := sec.SASL
	plainUser := sec.Users["PLAIN"]
	produceOne(t, brokers, e.topic, &kafka.Transport{SASL: plain.Mechanism{Username: plainUser[0], Password: plainUser[1]}}, "hello")

	var mechs []kafkasource.SASL
	for _, m := range []string{kafkasource.SASLPlain, kafkasource.SASLScramSHA256, kafkasource.SASLScramSHA512} {
		u := sec.Users[m]
		mechs = append(mechs, kafkasource.SASL{Mechanism: m, Username: u[0], Password: u[1]})
	}
	for _, c := range mechs {
		src, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topic: e.topic, GroupID: e.group + "-" + c.Username, SASL: &c,
			SessionTimeout: time.Second, MaxWait: 100 * time.Millisecond, Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if p := firstPayload(t, c.Mechanism, "sasl", src); p != "hello" {
			t.Errorf("%s: payload %q", c.Mechanism, p)
		}
	}

	src, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topic: e.topic, GroupID: e.group + "-bad",
		SASL: &kafkasource.SASL{Mechanism: kafkasource.SASLScramSHA256, Username: sec.Users["SCRAM-SHA-256"][0], Password: "wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := runToError(t, "a wrong password", "sasl", src); err == nil || !strings.Contains(strings.ToLower(err.Error()), "sasl") {
		t.Fatalf("Run with a wrong password = %v, want an error naming SASL authentication", err)
	}
}

// TestUnknownTopic: Consume fails, naming the topic, when it does not exist.
func TestUnknownTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	missing := fmt.Sprintf("missing-%d", time.Now().UnixNano())
	src, err := kafkasource.New(kafkasource.Config{Brokers: brokers, Topic: missing, GroupID: missing + "-g"})
	if err != nil {
		t.Fatal(err)
	}
	if err := runToError(t, "a missing topic", "unknown", src); err == nil || !strings.Contains(err.Error(), `"`+missing+`"`) || !strings.Contains(err.Error(), "Unknown Topic") {
		t.Fatalf("Run on a missing topic = %v, want an error naming the topic", err)
	}
}

// TestBrokersDown: brokers that do not answer are waited for, not a failure;
// cancelling stops the wait and Run returns nil.
func TestBrokersDown(t *testing.T) {
	t.Parallel()
	addr := testenv.FreeAddr(t)
	src, err := kafkasource.New(kafkasource.Config{Brokers: []string{addr}, Topic: "t", GroupID: "g", NetworkTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, worker(t, "down", src, ignore))
	select {
	case <-r.Done():
		t.Fatalf("Run returned %v while the brokers were down; want it to wait", r.Wait(t, time.Second))
	case <-time.After(time.Second):
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v after cancel, want nil", err)
	}
}
