package kafkasource_test

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestKcatEndToEnd drives the source with an independent client: kcat
// (librdkafka) produces messages with headers, a worker forwards each one
// with its headers to an output topic and acks it, and kcat reads the
// results back.
func TestKcatEndToEnd(t *testing.T) {
	t.Parallel()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		testenv.Unavailable(t, "kcat", "kcat is not installed (apt-get install -y kcat)")
	}
	e := newEnv(t, 3)
	out := e.topic + ".out"
	testenv.CreateKafkaTopic(t, e.brokers, out, 1)
	broker := e.brokers[0]

	inputs := []struct{ key, value, idem string }{
		{"order-1", "created", "k-1"},
		{"order-2", "created", "k-2"},
		{"order-1", "paid", "k-3"},
	}
	for _, in := range inputs {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, kcat, "-P", "-b", broker, "-t", e.topic, "-K", ":",
			"-H", "Idempotency-Key="+in.idem, "-H", "Source=kcat")
		cmd.Stdin = strings.NewReader(in.key + ":" + in.value + "\n")
		b, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("kcat produce: %v\n%s", err, b)
		}
	}

	fw := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: out, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer fw.Close()
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		hs := []kafka.Header{{Key: "Forwarded-By", Value: []byte("dedupworker")}}
		for k, vs := range m.Header {
			for _, v := range vs {
				hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
			}
		}
		return nil, fw.WriteMessages(ctx, kafka.Message{Key: m.Key, Value: m.Payload, Headers: hs})
	})
	r := run(t, worker(t, "kcat", e.source(nil), h))
	ends := e.ends(e.topic, e.parts)
	testenv.Eventually(t, 30*time.Second, "all input committed", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := exec.CommandContext(ctx, kcat, "-C", "-b", broker, "-t", out, "-o", "beginning", "-e", "-q",
		"-f", "%k|%s|%h\n").Output()
	if err != nil {
		t.Fatalf("kcat consume: %v", err)
	}
	var got []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, "|", 3)
		if len(f) != 3 {
			t.Fatalf("kcat output line %q", line)
		}
		hs := strings.Split(f[2], ",")
		slices.Sort(hs)
		got = append(got, f[0]+"|"+f[1]+"|"+strings.Join(hs, ","))
	}
	slices.Sort(got)
	want := []string{
		"order-1|created|Forwarded-By=dedupworker,Idempotency-Key=k-1,Source=kcat",
		"order-1|paid|Forwarded-By=dedupworker,Idempotency-Key=k-3,Source=kcat",
		"order-2|created|Forwarded-By=dedupworker,Idempotency-Key=k-2,Source=kcat",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("kcat read back\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
