package actions

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// BenchmarkForwardKafkaWriter compares ways of writing the runs of eight
// concurrent lanes (one per input partition) to an 8-partition topic on
// real Kafka: kafka-go's writer lingering 2ms for more messages,
// NewKafkaWriter's without the linger, and that writer behind
// coalescingWriter (what ForwardKafka uses). Run with -count to alternate
// them:
//
//	go test -run '^$' -bench ForwardKafkaWriter -benchtime 1x -count 3 ./internal/actions
//
// backlog-* write runs of 100 back to back and report msgs/s, with one key
// per lane (every run to one output partition) or a key per message (every
// run spread over all partitions); paced writes one message per lane every
// 4ms (2 000 msgs/s) and reports the write's p50 and p99.
func BenchmarkForwardKafkaWriter(b *testing.B) {
	brokers := testenv.RealKafka(b)
	writers := []struct {
		name string
		make func(topic string) (KafkaWriter, func())
	}{
		{"linger2ms", func(topic string) (KafkaWriter, func()) {
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, BatchTimeout: 2 * time.Millisecond}
			return w, func() { w.Close() }
		}},
		{"nolinger", func(topic string) (KafkaWriter, func()) {
			w := NewKafkaWriter(kafka.TCP(brokers...), topic, nil, 10*time.Second)
			return w, func() { w.Close() }
		}},
		{"coalesced", func(topic string) (KafkaWriter, func()) {
			w := NewKafkaWriter(kafka.TCP(brokers...), topic, nil, 10*time.Second)
			return newCoalescingWriter(w), func() { w.Close() }
		}},
	}
	const lanes = 8
	for _, sc := range []string{"backlog-keyed", "backlog-diverse", "paced"} {
		for _, wr := range writers {
			b.Run(sc+"/"+wr.name, func(b *testing.B) {
				topic := "actions-bench-" + randomSuffix(b)
				testenv.CreateKafkaTopic(b, brokers, topic, lanes)
				w, closeW := wr.make(topic)
				defer closeW()
				// Warm up: metadata and connections to every partition.
				warm := make([]kafka.Message, lanes*4)
				for i := range warm {
					warm[i] = kafka.Message{Key: fmt.Appendf(nil, "warm-%d", i), Value: []byte("w")}
				}
				if err := w.WriteMessages(context.Background(), warm...); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				switch sc {
				case "paced":
					benchPaced(b, w, lanes)
				default:
					benchBacklog(b, w, lanes, sc == "backlog-diverse")
				}
			})
		}
	}
}

func benchBacklog(b *testing.B, w KafkaWriter, lanes int, diverse bool) {
	const run, runsPerLane = 100, 50
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, lanes)
	for l := range lanes {
		wg.Go(func() {
			msgs := make([]kafka.Message, run)
			for r := range runsPerLane {
				for i := range msgs {
					key := fmt.Appendf(nil, "lane-%d", l)
					if diverse {
						key = fmt.Appendf(nil, "lane-%d-%d-%d", l, r, i)
					}
					msgs[i] = kafka.Message{Key: key, Value: []byte(`{"id":1}`)}
				}
				if err := w.WriteMessages(context.Background(), msgs...); err != nil {
					errs[l] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(lanes*run*runsPerLane)/time.Since(start).Seconds(), "msgs/s")
}

func benchPaced(b *testing.B, w KafkaWriter, lanes int) {
	const every, writes = 4 * time.Millisecond, 500
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	errs := make([]error, lanes)
	for l := range lanes {
		wg.Go(func() {
			t := time.NewTicker(every)
			defer t.Stop()
			for i := range writes {
				<-t.C
				start := time.Now()
				err := w.WriteMessages(context.Background(), kafka.Message{Key: fmt.Appendf(nil, "lane-%d", l), Value: fmt.Appendf(nil, "%d", i)})
				d := time.Since(start)
				if err != nil {
					errs[l] = err
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
