package actions

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// BenchmarkForwardNATS measures forward.nats alone on the real nats-server:
// runs of 64 messages of 100 bytes, 8 runs in flight, to an in-memory
// stream. Beside ns/op (a run) it reports the process's CPU per message
// (user + system, from getrusage), which the server's latency does not move.
//
//	go test ./internal/actions -run '^$' -bench ForwardNATS -benchmem
func BenchmarkForwardNATS(b *testing.B) {
	js := natsJetStream(b, testenv.NATS(b))
	name := "ACTBENCH" + strings.ToUpper(randomSuffix(b))
	subject := "actbench." + name
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage, MaxMsgs: 100000,
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	fwd := ForwardNATS("relay", js, subject, nil)
	const run = 64
	payload := make([]byte, 100)
	var before syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &before); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(4) // 4 × GOMAXPROCS runs in flight
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ms := make([]*consumer.Message, run)
		for i := range ms {
			ms[i] = &consumer.Message{Payload: payload, Header: consumer.Header{"Traceparent": {"00-abc"}}}
		}
		results := make([]consumer.Result, run)
		for pb.Next() {
			clear(results)
			fwd(ctx, ms, results)
			for i, r := range results {
				if r.Err != nil {
					b.Errorf("message %d: %v", i, r.Err)
					return
				}
			}
		}
	})
	b.StopTimer()
	var after syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &after); err != nil {
		b.Fatal(err)
	}
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*run), "cpu-µs/msg")
}
