package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// createStreamMaxAge creates a stream keeping messages for maxAge (shorter
// than the handlers' retention, so the horizon check stays quiet) and
// deletes it when the test ends.
func createStreamMaxAge(t *testing.T, js jetstream.JetStream, name, subject string, maxAge time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, MaxAge: maxAge}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
}

// createTopic creates a Kafka topic and deletes it when the test ends (a
// real cluster from $KAFKA_BROKERS keeps it otherwise).
func createTopic(t *testing.T, brokers []string, topic string) {
	t.Helper()
	testenv.CreateKafkaTopic(t, brokers, topic, 1)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
		_, _ = cl.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
}

func TestValidateOnlineNATSDeadLetterSubject(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := safeRedis(t) // --strict: a store the health checks pass
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VDL_"+id, "vdl."+id, time.Minute)
	createStreamMaxAge(t, js, "VDLQ_"+id, "vdlq."+id, time.Minute)
	config := func(subject string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: VDL_%s}}
    retention: 1h
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: {subject: %s}}
`, redis, url, id, subject)
	}

	captured := config("vdlq." + id)
	if code, _, stderr := runCmd(t, "validate", "-c", captured, "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Fatalf("dead-letter subject captured by stream VDLQ_%s: exit %d, stderr %q; want exit 0 and no warning", id, code, stderr)
	}

	lost := config("vdl.nowhere." + id)
	want := `handlers[0] (orders): dead_letter.nats.subject "vdl.nowhere.` + id + `" is not captured by any JetStream stream: dead letters are published on core NATS and lost`
	code, _, stderr := runCmd(t, "validate", "-c", lost)
	if code != 0 || strings.Contains(stderr, "dead_letter") {
		t.Fatalf("offline validate must not ask the broker: exit %d %q", code, stderr)
	}
	code, _, stderr = runCmd(t, "validate", "-c", lost, "--online")
	if code != 0 || !strings.Contains(stderr, "warning: "+want) {
		t.Fatalf("dead-letter subject no stream captures: exit %d, stderr %q; want exit 0 and a warning containing %q", code, stderr, want)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", lost, "--online", "--strict"); code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("--strict with the dead-letter warning: exit %d, stderr %q; want 2", code, stderr)
	}
}

func TestValidateOnlineNATSForwardSubject(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := safeRedis(t) // --strict: a store the health checks pass
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VFW_"+id, "vfw."+id, time.Minute)
	createStreamMaxAge(t, js, "VFWO_"+id, "vfwo."+id, time.Minute)
	config := func(subject string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: VFW_%s}}
    retention: 1h
    missing_key: passthrough
    action: {forward: {nats: {subject: %s}}}
`, redis, url, id, subject)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", config("vfwo."+id), "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Fatalf("forward subject captured by stream VFWO_%s: exit %d, stderr %q; want exit 0 and no warning", id, code, stderr)
	}
	want := `handlers[0] (relay): action.forward.nats.subject "vfw.nowhere.` + id + `" is not captured by any JetStream stream: forwarded messages`
	code, _, stderr := runCmd(t, "validate", "-c", config("vfw.nowhere."+id), "--online")
	if code != 0 || !strings.Contains(stderr, "warning: "+want) {
		t.Fatalf("forward subject no stream captures: exit %d, stderr %q; want exit 0 and a warning containing %q", code, stderr, want)
	}

	// A server without JetStream captures no subject either.
	plain, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	plain.Start()
	t.Cleanup(func() { plain.Shutdown(); plain.WaitForShutdown() })
	if !plain.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server without JetStream not ready after 10s")
	}
	path := writeConfig(t, `
redis: {url: %q}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: VFW_%s}}
    retention: 1h
    action: {forward: {nats: {url: %q, subject: vfwo.%s}}}
`, redis, url, id, plain.ClientURL(), id)
	want = `handlers[0] (relay): action.forward.nats.subject "vfwo.` + id + `" is not captured by any JetStream stream`
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online"); code != 0 || !strings.Contains(stderr, "warning: "+want) {
		t.Fatalf("forward to a server without JetStream: exit %d, stderr %q; want exit 0 and a warning containing %q", code, stderr, want)
	}
}

func TestValidateOnlineKafkaDeadLetterTopic(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	redis := testenv.Redis(t)
	id := testenv.RandID()
	in, dlq := "vin-"+id, "vdlq-"+id
	createTopic(t, brokers, in)
	config := func(topic string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: orders
    source: {kafka: {brokers: [%q], topic: %s, group: g-%s}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {kafka: {topic: %s}}
`, redis, brokers[0], in, id, topic)
	}
	path := config(dlq)
	want := `handlers[0] (orders): dead_letter.kafka.topic "` + dlq + `" does not exist: writes fail unless the brokers auto-create topics`
	code, _, stderr := runCmd(t, "validate", "-c", path, "--online")
	if code != 0 || !strings.Contains(stderr, "warning: "+want) {
		t.Fatalf("missing dead-letter topic: exit %d, stderr %q; want exit 0 and a warning containing %q", code, stderr, want)
	}
	createTopic(t, brokers, dlq)
	code, _, stderr = runCmd(t, "validate", "-c", path, "--online")
	if code != 0 || strings.Contains(stderr, "dead_letter") {
		t.Fatalf("existing dead-letter topic: exit %d, stderr %q; want exit 0 and no dead_letter warning", code, stderr)
	}
}

func TestValidateOnlineKafkaForwardTopic(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	brokers := testenv.Kafka(t)
	redis := safeRedis(t) // --strict: a store the health checks pass
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VKF_"+id, "vkf."+id, time.Minute)
	out := "vout-" + id
	path := writeConfig(t, `
redis: {url: %q}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: VKF_%s}}
    retention: 1h
    missing_key: passthrough
    action: {forward: {kafka: {brokers: [%q], topic: %s}}}
`, redis, url, id, brokers[0], out)
	want := `handlers[0] (relay): action.forward.kafka.topic "` + out + `" does not exist`
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online"); code != 0 || !strings.Contains(stderr, "warning: "+want) {
		t.Fatalf("missing forward topic: exit %d, stderr %q; want exit 0 and a warning containing %q", code, stderr, want)
	}
	createTopic(t, brokers, out)
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Fatalf("existing forward topic: exit %d, stderr %q; want exit 0 and no warning", code, stderr)
	}
}

// TestValidateOnlineUnreachableOutput: a destination nothing listens on
// fails validation, naming its field and no secret, without waiting out
// the whole online deadline.
func TestValidateOnlineUnreachableOutput(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := testenv.Redis(t)
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VUN_"+id, "vun."+id, time.Minute)
	closed := testenv.FreeAddr(t) // nothing listens once freePort returns
	for _, tc := range []struct {
		name, action, field string
	}{
		{"nats", `{forward: {nats: {url: "nats://relay:s3cret@` + closed + `", subject: out.` + id + `}}}`, "handlers[0].action.forward.nats.url"},
		{"kafka", `{forward: {kafka: {brokers: ["` + closed + `"], topic: out-` + id + `, sasl: {mechanism: plain, username: relay, password: s3cret}}}}`, "handlers[0].action.forward.kafka.brokers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeConfig(t, `
redis: {url: %q}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: VUN_%s}}
    retention: 1h
    action: %s
`, redis, url, id, tc.action)
			began := time.Now()
			code, _, stderr := runCmd(t, "validate", "-c", path, "--online")
			took := time.Since(began)
			if code != exitRuntime || !strings.Contains(stderr, tc.field) {
				t.Fatalf("unreachable forward destination: exit %d, stderr %q; want 1 naming %s", code, stderr, tc.field)
			}
			if strings.Contains(stderr, "s3cret") {
				t.Fatalf("the error shows the password: %q", stderr)
			}
			if took > 15*time.Second {
				t.Fatalf("validate --online took %s to report a closed port", took)
			}
		})
	}
	// A dead-letter destination is on the source's server or cluster: one
	// elsewhere is a config error before any connection.
	path := writeConfig(t, `
handlers:
  - name: orders
    source: {nats: {url: %q, stream: VUN_%s}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: {url: "nats://%s", subject: dlq.%s}}
`, url, id, closed, id)
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online"); code != exitUsage || !strings.Contains(stderr, "handlers[0].dead_letter.nats.url") {
		t.Fatalf("dead_letter.nats.url elsewhere: exit %d, stderr %q; want 2 naming the field", code, stderr)
	}
}

// TestValidateOnlineNATSDurableAndWindows (SPEC §11.5): --online warns on an
// existing durable whose AckWait is shorter than lease/3 plus one renewal,
// on a configured ack_wait as short, on a forward stream whose duplicate
// window is shorter than the lease plus the retry horizon, and on
// missing_key: reject without a dead_letter; a config clear of all four
// passes --strict.
func TestValidateOnlineNATSDurableAndWindows(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := safeRedis(t) // --strict: a store the health checks pass
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VDW_"+id, "vdw."+id, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for name, dw := range map[string]time.Duration{"VDWS_": 10 * time.Second, "VDWL_": 5 * time.Minute} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name + id, Subjects: []string{strings.ToLower(name) + id}, MaxAge: 10 * time.Minute, Duplicates: dw}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = js.DeleteStream(ctx, name+id)
		})
	}
	if _, err := js.CreateConsumer(ctx, "VDW_"+id, jetstream.ConsumerConfig{Durable: "short", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "VDW_"+id, jetstream.ConsumerConfig{Durable: "long", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	config := func(consumer, ackWait, missingKey, out string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: VDW_%s, consumer: %s, ack_wait: %s}}
    retention: 1h
    lease: 30s
    missing_key: %s
    action: {forward: {nats: {subject: %s}}}
`, redis, url, id, consumer, ackWait, missingKey, out)
	}
	// lease 30s: a heartbeat gap of 10s + 1s jitter + 5s renewal = 16s;
	// retry horizon (5 attempts, backoff 1s..5m) 1.2+2.4+4.8+9.6 = 18s.
	code, _, stderr := runCmd(t, "validate", "-c", config("short", "30s", "reject", "vdws_"+id), "--online")
	for _, want := range []string{
		`warning: handlers[0] (relay): the existing durable "short" has AckWait 2s, shorter than lease/3 plus one renewal (16s for lease 30s): until run updates it to ack_wait 30s`,
		`warning: handlers[0] (relay): stream VDWS_` + id + `, which captures action.forward.nats.subject "vdws_` + id + `", has a duplicate window of 10s, shorter than lease 30s plus the retry horizon 18s (max_attempts 5, backoff 1s..5m0s)`,
		`raise the stream's duplicate_window to at least 48s`,
		`warning: handlers[0] (relay): missing_key: reject without a dead_letter: a message without a key is acked and lost`,
	} {
		if code != 0 || !strings.Contains(stderr, want) {
			t.Errorf("exit %d, stderr lacks %q:\n%s", code, want, stderr)
		}
	}
	code, _, stderr = runCmd(t, "validate", "-c", config("long", "5s", "passthrough", "vdwl_"+id), "--online")
	if want := `warning: handlers[0] (relay): source.nats.ack_wait 5s is shorter than lease/3 plus one renewal (16s for lease 30s)`; code != 0 || !strings.Contains(stderr, want) {
		t.Errorf("exit %d, stderr lacks %q:\n%s", code, want, stderr)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", config("long", "30s", "passthrough", "vdwl_"+id), "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Errorf("a durable, stream and config clear of the checks: exit %d, stderr %q; want exit 0 and no warning", code, stderr)
	}
}
