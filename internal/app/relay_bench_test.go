package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// relayMessages is how many messages one iteration of BenchmarkRelay moves.
const relayMessages = 50000

// BenchmarkRelay measures the binary's forward relay end to end, as
// `dedupworker run` wires it: a fresh input of relayMessages messages, each
// with its own Idempotency-Key (no duplicates), relayed by a forward action
// with concurrency 64 and lease 30s. The time runs from Run until the output
// holds every message ("msgs/s"); "steady-msgs/s" counts from the first
// message in the output, leaving out the start (a Kafka group join).
//
//	go test ./internal/app -run '^$' -bench Relay -benchtime 1x
func BenchmarkRelay(b *testing.B) {
	b.Run("kafka-8-partitions", benchKafkaRelay)
	b.Run("nats", benchNATSRelay)
}

// runRelay runs the relay until count reports relayMessages in the output,
// and returns the time from Run and the time from the first output message.
func runRelay(b *testing.B, yaml string, count func() int64) (total, steady time.Duration) {
	b.Helper()
	cfg, err := config.Parse([]byte(yaml), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := Build(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		b.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- a.Run(rctx) }()
	deadline := time.Now().Add(5 * time.Minute)
	var first time.Time
	for {
		n := count()
		if n > 0 && first.IsZero() {
			first = time.Now()
		}
		if n >= relayMessages {
			break
		}
		if time.Now().After(deadline) {
			stop()
			b.Fatal("the relay did not forward every message within 5 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	total, steady = time.Since(start), time.Since(first)
	stop()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return total, steady
}

func benchKafkaRelay(b *testing.B) {
	brokers := testenv.RealKafka(b)
	var elapsed, steady time.Duration
	for i := 0; i < b.N; i++ {
		id := "relay-" + testenv.RandID()
		testenv.DropNamespace(b, id)
		in, out := "in-"+id, "out-"+id
		testenv.CreateKafkaTopic(b, brokers, in, 8)
		testenv.CreateKafkaTopic(b, brokers, out, 8)
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: in, Balancer: &kafka.RoundRobin{}, BatchSize: 1000, BatchTimeout: time.Millisecond}
		msgs := make([]kafka.Message, relayMessages)
		for j := range msgs {
			k := fmt.Sprintf("k-%d", j)
			msgs[j] = kafka.Message{Value: []byte(`{"id":"` + k + `"}`), Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(k)}}}
		}
		if err := w.WriteMessages(context.Background(), msgs...); err != nil {
			b.Fatal(err)
		}
		w.Close()
		cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
		written := func() int64 {
			req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
			for p := range 8 {
				req.Topics[out] = append(req.Topics[out], kafka.LastOffsetOf(p))
			}
			resp, err := cl.ListOffsets(context.Background(), req)
			if err != nil {
				return 0
			}
			var n int64
			for _, po := range resp.Topics[out] {
				n += po.LastOffset
			}
			return n
		}
		total, st := runRelay(b, fmt.Sprintf(`
redis: {url: %q, namespace: %s}
http: {addr: ""}
handlers:
  - name: relay
    source: {kafka: {brokers: [%q], topic: %s, group: g-%s, commit_interval: 200ms}}
    lease: 30s
    concurrency: 64
    action: {forward: {kafka: {brokers: [%q], topic: %s}}}
`, testenv.Redis(b), id, brokers[0], in, id, brokers[0], out), written)
		elapsed, steady = elapsed+total, steady+st
	}
	b.ReportMetric(float64(relayMessages*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(relayMessages*b.N)/steady.Seconds(), "steady-msgs/s")
}

func benchNATSRelay(b *testing.B) {
	url := testenv.NATS(b)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	var elapsed, steady time.Duration
	for i := 0; i < b.N; i++ {
		id := strings.ReplaceAll("relay-"+testenv.RandID(), "-", "_")
		testenv.DropNamespace(b, id)
		in, out := "IN_"+id, "OUT_"+id
		ctx := context.Background()
		for _, s := range []string{in, out} {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: s, Subjects: []string{strings.ToLower(s)}, Duplicates: 2 * time.Minute}); err != nil {
				b.Fatal(err)
			}
			defer js.DeleteStream(context.Background(), s)
		}
		for j := range relayMessages {
			m := nats.NewMsg(strings.ToLower(in))
			k := fmt.Sprintf("k-%d", j)
			m.Header.Set("Idempotency-Key", k)
			m.Data = []byte(`{"id":"` + k + `"}`)
			if _, err := js.PublishMsgAsync(m); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(time.Minute):
			b.Fatal("publishing the input did not complete")
		}
		outStream, err := js.Stream(ctx, out)
		if err != nil {
			b.Fatal(err)
		}
		written := func() int64 {
			info, err := outStream.Info(context.Background())
			if err != nil {
				return 0
			}
			return int64(info.State.Msgs)
		}
		total, st := runRelay(b, fmt.Sprintf(`
redis: {url: %q, namespace: %s}
http: {addr: ""}
handlers:
  - name: relay
    source: {nats: {url: %q, stream: %s, consumer: relay, ack_wait: 30s}}
    lease: 30s
    concurrency: 64
    action: {forward: {nats: {url: %q, subject: %s}}}
`, testenv.Redis(b), id, url, in, url, strings.ToLower(out)), written)
		elapsed, steady = elapsed+total, steady+st
	}
	b.ReportMetric(float64(relayMessages*b.N)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(relayMessages*b.N)/steady.Seconds(), "steady-msgs/s")
}
