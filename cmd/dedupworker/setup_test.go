package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// deleteStreamsAtEnd deletes the named streams when the test ends: setup
// creates them, and the shared server keeps them otherwise.
func deleteStreamsAtEnd(t *testing.T, js jetstream.JetStream, names ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			_ = js.DeleteStream(ctx, n)
		}
	})
}

// The five-minute relay with nothing but the binary: setup creates the
// source, forward and dead-letter streams with settings that fit the
// config, a second setup leaves them alone, publish sends the same key
// twice and a keyless message, and run forwards the key once and
// dead-letters the keyless message into the stream setup created.
func TestSetupPublishRunNATS(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	redis := safeRedis(t) // validate --strict: a store the health checks pass
	id := testenv.RandID()
	in, fwd, dlq := "SU_"+id, "SU_"+strings.ToUpper(id)+"_UNIQUE", "SU_"+strings.ToUpper(id)+"_DLQ" // setup names the last two after their subjects
	deleteStreamsAtEnd(t, js, in, fwd, dlq)
	cfg := writeConfig(t, `
redis: {url: %q, namespace: su-%s}
http: {addr: ""}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: %s, subject: su.%s.new}}
    key: [header:Idempotency-Key, json:id]
    retention: 1h
    lease: 20s
    action: {forward: {nats: {subject: su.%s.unique}}}
    dead_letter: {nats: {subject: su.%s.dlq}}
`, redis, id, url, in, id, id, id)

	if code, _, stderr := runCmd(t, "run", "-c", cfg); code != exitUsage || !strings.Contains(stderr, "dead_letter.nats.subject") {
		t.Fatalf("run before setup: exit %d, stderr %q; want 2 naming the dead-letter subject", code, stderr)
	}
	code, out, stderr := runCmd(t, "setup", "-c", cfg)
	for _, want := range []string{
		"handlers[0] (orders): source stream " + in + " created (subjects su." + id + ".new, max_age 1h: the retention)",
		"handlers[0] (orders): dead_letter stream " + dlq + " created (subjects su." + id + ".dlq, no age limit)",
		"handlers[0] (orders): action.forward stream " + fwd + " created (subjects su." + id + ".unique, no age limit, duplicate window 2m",
		"setup: 3 created, 0 already there",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("setup: exit %d, stdout lacks %q:\n%s%s", code, want, out, stderr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info := func(name string) jetstream.StreamConfig {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		return st.CachedInfo().Config
	}
	if c := info(in); c.MaxAge != time.Hour || len(c.Subjects) != 1 || c.Subjects[0] != "su."+id+".new" {
		t.Errorf("source stream: max_age %s, subjects %v; want 1h (the retention) and su.%s.new", c.MaxAge, c.Subjects, id)
	}
	if c := info(fwd); c.Duplicates < 2*time.Minute {
		t.Errorf("forward stream: duplicate window %s, want at least 2m (lease 20s + retry horizon 18s, at least JetStream's default)", c.Duplicates)
	}
	if c := info(dlq); c.Subjects[0] != "su."+id+".dlq" || c.MaxAge != 0 {
		t.Errorf("dead-letter stream: subjects %v max_age %s, want su.%s.dlq without an age limit", c.Subjects, c.MaxAge, id)
	}

	// Idempotent: a second run creates nothing and says so.
	code, out, _ = runCmd(t, "setup", "-c", cfg)
	if code != 0 || !strings.Contains(out, "setup: 0 created, 3 already there") || !strings.Contains(out, "source stream "+in+" exists") || strings.Contains(out, "note:") {
		t.Fatalf("second setup: exit %d:\n%s", code, out)
	}
	if code, _, stderr := runCmd(t, "validate", "-c", cfg, "--online", "--strict"); code != 0 {
		t.Fatalf("validate --online --strict after setup: exit %d\n%s", code, stderr)
	}

	for _, args := range [][]string{
		{"--key", "order-1", `{"n":1}`},
		{"--key", "order-1", `{"n":1}`},      // the same order again
		{"--header", "Trace=t-3", `{"n":3}`}, // no key: dead-lettered
	} {
		code, out, stderr := runCmd(t, append([]string{"publish", "-c", cfg, "--handler", "orders"}, args...)...)
		if code != 0 || !strings.Contains(out, "published to su."+id+".new: stream "+in+", sequence ") {
			t.Fatalf("publish %v: exit %d\n%s%s", args, code, out, stderr)
		}
	}
	cons, err := js.OrderedConsumer(ctx, in, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if first.Headers().Get("Idempotency-Key") != "order-1" || string(first.Data()) != `{"n":1}` {
		t.Fatalf("first published message: headers %v payload %q", first.Headers(), first.Data())
	}

	p := start(t, nil, "run", "-c", cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("run's output:\n%s", p.stderr.String())
		}
	})
	msgs := func(name string) uint64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		return st.CachedInfo().State.Msgs
	}
	testenv.Eventually(t, 30*time.Second, "the keyless message in the dead-letter stream", func() bool { return msgs(dlq) == 1 })
	testenv.Eventually(t, 30*time.Second, "order-1 forwarded", func() bool { return msgs(fwd) >= 1 })
	if code := p.term(30 * time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.stderr.String())
	}
	if n := msgs(fwd); n != 1 {
		t.Errorf("forward stream holds %d messages, want 1: order-1 once", n)
	}
	// setup, run again, shows how many messages each stream holds.
	code, out, _ = runCmd(t, "setup", "-c", cfg)
	for _, want := range []string{
		"source stream " + in + " exists (subjects su." + id + ".new, max_age 1h, 3 messages): left alone",
		"action.forward subject su." + id + ".unique is captured by stream " + fwd + " (1 message): left alone",
		"dead_letter subject su." + id + ".dlq is captured by stream " + dlq + " (1 message): left alone",
	} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("setup after the run: exit %d, stdout lacks %q:\n%s", code, want, out)
		}
	}
	dead, err := js.OrderedConsumer(ctx, dlq, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := dead.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Data()) != `{"n":3}` || m.Headers().Get("Trace") != "t-3" {
		t.Errorf("dead letter: payload %q headers %v, want the keyless message", m.Data(), m.Headers())
	}
}

// Usage mistakes of publish and setup are exit 2 naming what to fix.
func TestPublishUsage(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, `
handlers:
  - name: orders
    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}
    key: [json:id]
    action: {exec: {command: [/bin/true]}}
`)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"publish", "-c", cfg, "--handler", "orders"}, "one PAYLOAD argument"},
		{[]string{"publish", "-c", cfg, "--handler", "other", "x"}, `--handler "other" is not a handler of`},
		{[]string{"publish", "-c", cfg, "--handler", "orders", "--header", "novalue", "x"}, `"novalue": want NAME=VALUE`},
		{[]string{"publish", "-c", cfg, "--handler", "orders", "--key", "k", "x"}, "--key: handlers[0] (orders) reads its key from json:id"},
		{[]string{"publish", "-c", cfg, "--handler", "orders", "x"}, "handlers[0].source.nats.subject is not set: give --subject"},
		{[]string{"setup", "-c", cfg}, "handlers[0].source.nats.subject: stream S does not exist, and setup needs the subject"},
	} {
		if c.args[0] == "setup" {
			// S must not exist on the shared server for this case.
			_, js := natsSetup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := js.Stream(ctx, "S")
			cancel()
			if err == nil {
				continue
			}
		}
		code, _, stderr := runCmd(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args[1:], code, stderr, c.want)
		}
	}
}

// On Kafka, setup creates the source topic with retention.ms at the
// retention, the dead-letter and forward topics, and leaves them alone the
// second time; publish writes the message key and headers.
func TestSetupPublishKafka(t *testing.T) {
	t.Parallel()
	brokers := testenv.Kafka(t)
	id := testenv.RandID()
	in, dlq, out := "su-"+id, "su-"+id+".dlq", "su-"+id+".out"
	// A transport of its own: kafka-go's default one caches the metadata
	// other tests' clients read before these topics existed.
	tr := &kafka.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = c.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{in, dlq, out}})
	})
	cfg := writeConfig(t, `
handlers:
  - name: payments
    source: {kafka: {brokers: [%q], topic: %s}}
    key: [header:Idempotency-Key]
    retention: 2h
    action: {forward: {kafka: {topic: %s}}}
    dead_letter: {kafka: {topic: %s}}
`, brokers[0], in, out, dlq)
	code, stdout, stderr := runCmd(t, "setup", "-c", cfg, "--partitions", "2")
	for _, want := range []string{
		"source topic " + in + " created (2 partition(s), replication factor 1, retention.ms 2h: the retention)",
		"dead_letter topic " + dlq + " created (2 partition(s), replication factor 1)",
		"action.forward topic " + out + " created",
		"setup: 3 created, 0 already there",
	} {
		if code != 0 || !strings.Contains(stdout, want) {
			t.Errorf("setup: exit %d, stdout lacks %q:\n%s%s", code, want, stdout, stderr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keep, err := kafkaRetention(ctx, c, in)
	if err != nil || keep != 2*time.Hour {
		t.Errorf("source topic retention.ms: %s, %v; want 2h", keep, err)
	}
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{in, dlq, out}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range md.Topics {
		if tp.Error != nil || len(tp.Partitions) != 2 {
			t.Errorf("topic %s: %v, %d partitions; want 2", tp.Name, tp.Error, len(tp.Partitions))
		}
	}
	if code, stdout, _ := runCmd(t, "setup", "-c", cfg); code != 0 || !strings.Contains(stdout, "setup: 0 created, 3 already there") || strings.Contains(stdout, "note:") {
		t.Fatalf("second setup: exit %d\n%s", code, stdout)
	}

	if code, stdout, stderr := runCmd(t, "publish", "-c", cfg, "--handler", "payments", "--key", "pay-1", "--header", "Trace=t1", "payload-1"); code != 0 || !strings.Contains(stdout, "published to topic "+in) {
		t.Fatalf("publish: exit %d\n%s%s", code, stdout, stderr)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: in, Partition: partitionOf(t, c, in), MaxWait: time.Second})
	defer r.Close()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for _, h := range m.Headers {
		headers[h.Key] = string(h.Value)
	}
	if string(m.Key) != "pay-1" || string(m.Value) != "payload-1" || headers["Idempotency-Key"] != "pay-1" || headers["Trace"] != "t1" {
		t.Errorf("published message: key %q value %q headers %v", m.Key, m.Value, headers)
	}
}

// partitionOf is the one partition of topic that holds a message.
func partitionOf(t *testing.T, c *kafka.Client, topic string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range md.Topics {
		for _, p := range tp.Partitions {
			offs, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(p.ID)}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, po := range offs.Topics[topic] {
				if po.LastOffset > 0 {
					return po.Partition
				}
			}
		}
	}
	t.Fatalf("no partition of %s holds a message", topic)
	return 0
}

// runCmdEnv is runCmd with env added to the environment.
func runCmdEnv(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binPath, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return testenv.ExitCode(err), stdout.String(), stderr.String()
}

// After the steps the examples' comments give (setup), every example's
// dead-letter destination stores what it is sent: validate --online, which
// refuses one that does not, passes. Each runs on servers of its own (an
// embedded nats-server, kfake), so the examples' fixed names disturb no
// other test; the Kafka example's HTTP service is a local test server.
func TestExampleConfigsSetUp(t *testing.T) {
	t.Parallel()
	_, brokers := testenv.KFake(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	t.Cleanup(srv.Close)
	for _, c := range []struct{ file, stores string }{
		{"nats-relay.yaml", "dead_letter stream DLQ_ORDERS created"},
		{"exec.yaml", "dead_letter stream DLQ_INVOICES created"},
		{"kafka-http.yaml", "dead_letter topic payments.dlq created"},
	} {
		t.Run(c.file, func(t *testing.T) {
			t.Parallel()
			env := []string{
				"REDIS_URL=" + testenv.Redis(t),
				"NATS_URL=" + testenv.EmbeddedNATS(t),
				"KAFKA_BROKER=" + brokers[0],
				"CHARGE_URL=" + srv.URL + "/charge",
			}
			path := filepath.Join("..", "..", "examples", "config", c.file)
			if code, _, stderr := runCmdEnv(t, env, "validate", "-c", path, "--online"); code == 0 || !strings.Contains(stderr, "'dedupworker setup -c FILE' does") {
				t.Fatalf("validate --online before setup: exit %d, stderr %q; want a failure pointing at setup", code, stderr)
			}
			code, out, stderr := runCmdEnv(t, env, "setup", "-c", path)
			if code != 0 || !strings.Contains(out, c.stores) {
				t.Fatalf("setup: exit %d, stdout lacks %q\n%s%s", code, c.stores, out, stderr)
			}
			if code, _, stderr := runCmdEnv(t, env, "validate", "-c", path, "--online"); code != 0 {
				t.Fatalf("validate --online after setup: exit %d\n%s", code, stderr)
			}
		})
	}
}
