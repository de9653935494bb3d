package main

import (
	"context"
	"net/http"
	"net/http/httptest"
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

// A dead-letter subject that no stream captures is refused by validate
// --online and by run (a dead letter is acked: on core NATS with no
// subscriber it would be gone), unless dead_letter.nats.core says core
// delivery is meant.
func TestDeadLetterNATSSubjectMustBeStored(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := safeRedis(t) // --strict: a store the health checks pass
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VDL_"+id, "vdl."+id, time.Minute)
	createStreamMaxAge(t, js, "VDLQ_"+id, "vdlq."+id, time.Minute)
	config := func(deadLetter string) string {
		return writeConfig(t, `
redis: {url: %q}
http: {addr: ""}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: VDL_%s}}
    retention: 1h
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: %s}
`, redis, url, id, deadLetter)
	}

	captured := config("{subject: vdlq." + id + "}")
	if code, _, stderr := runCmd(t, "validate", "-c", captured, "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Fatalf("dead-letter subject captured by stream VDLQ_%s: exit %d, stderr %q; want exit 0 and no warning", id, code, stderr)
	}

	lost := config("{subject: vdl.nowhere." + id + "}")
	want := `handlers[0].dead_letter.nats.subject "vdl.nowhere.` + id + `": no JetStream stream captures it, so a dead letter would be acked and kept nowhere: create a stream that captures it ('dedupworker setup -c FILE' does), or, if core NATS subscribers are meant to receive the dead letters, say so with dead_letter: {nats: {subject: vdl.nowhere.` + id + `, core: true}}`
	if code, _, stderr := runCmd(t, "validate", "-c", lost); code != 0 || strings.Contains(stderr, "dead_letter") {
		t.Fatalf("offline validate must not ask the broker: exit %d %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", lost, "--online"); code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("validate --online, dead-letter subject no stream captures: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	// run refuses it before consuming anything.
	if code, _, stderr := runCmd(t, "run", "-c", lost); code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("run, dead-letter subject no stream captures: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}

	core := config("{subject: vdl.nowhere." + id + ", core: true}")
	if code, _, stderr := runCmd(t, "validate", "-c", core, "--online", "--strict"); code != 0 || strings.Contains(stderr, "warning") {
		t.Fatalf("core: true: exit %d, stderr %q; want exit 0 and no warning", code, stderr)
	}
	p := start(t, nil, "run", "-c", core)
	testenv.Eventually(t, 30*time.Second, "run with core: true starts", func() bool {
		return strings.Contains(p.stderr.String(), "dedupworker running")
	})
	if code := p.term(30 * time.Second); code != 0 {
		t.Fatalf("run with core: true: exit %d after SIGTERM\n%s", code, p.stderr.String())
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

// A dead-letter topic that does not exist is refused by validate --online
// and by run.
func TestDeadLetterKafkaTopicMustExist(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	redis := testenv.Redis(t)
	id := testenv.RandID()
	in, dlq := "vin-"+id, "vdlq-"+id
	createTopic(t, brokers, in)
	path := writeConfig(t, `
redis: {url: %q}
http: {addr: ""}
handlers:
  - name: orders
    source: {kafka: {brokers: [%q], topic: %s, group: g-%s}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {kafka: {topic: %s}}
`, redis, brokers[0], in, id, dlq)
	want := `handlers[0].dead_letter.kafka.topic "` + dlq + `" does not exist: create it ('dedupworker setup -c FILE' does)`
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online"); code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("validate --online, missing dead-letter topic: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	if code, _, stderr := runCmd(t, "run", "-c", path); code != exitUsage || !strings.Contains(stderr, want) {
		t.Fatalf("run, missing dead-letter topic: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	createTopic(t, brokers, dlq)
	if code, _, stderr := runCmd(t, "validate", "-c", path, "--online"); code != 0 || strings.Contains(stderr, "dead_letter") {
		t.Fatalf("existing dead-letter topic: exit %d, stderr %q; want exit 0 and no dead_letter warning", code, stderr)
	}
}

// An http action's host must accept a TCP connection: validate --online
// names the url and the fix when nothing listens, and passes when a server
// does.
func TestValidateOnlineHTTPAction(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := testenv.Redis(t)
	id := testenv.RandID()
	createStreamMaxAge(t, js, "VHT_"+id, "vht."+id, time.Minute)
	config := func(target string) string {
		return writeConfig(t, `
redis: {url: %q}
handlers:
  - name: hook
    source: {nats: {url: %q, stream: VHT_%s}}
    retention: 1h
    missing_key: passthrough
    action: {http: {url: %q}}
`, redis, url, id, target)
	}
	closed := testenv.FreeAddr(t)
	path := config("http://user:s3cret@" + closed + "/charge")
	code, _, stderr := runCmd(t, "validate", "-c", path, "--online")
	want := `handlers[0].action.http.url "http://` + closed + `/charge": connecting to ` + closed + `:`
	if code != exitRuntime || !strings.Contains(stderr, want) || !strings.Contains(stderr, "start the server the action posts to, or correct the url") {
		t.Fatalf("http action nobody listens on: exit %d, stderr %q; want 1 and %q", code, stderr, want)
	}
	if strings.Contains(stderr, "s3cret") {
		t.Fatalf("the error shows the URL's password: %q", stderr)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	if code, _, stderr := runCmd(t, "validate", "-c", config(srv.URL+"/charge"), "--online"); code != 0 || strings.Contains(stderr, "action.http") {
		t.Fatalf("http action with a listening server: exit %d, stderr %q; want 0", code, stderr)
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

// TestValidateOnlineNATSDurableAndWindows: --online warns on an
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
