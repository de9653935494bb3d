package app

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// countingTransport counts the metadata requests that reach the transport.
type countingTransport struct {
	kafka.RoundTripper
	mu       sync.Mutex
	metadata int
}

func (c *countingTransport) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	if _, ok := req.(*metadataAPI.Request); ok {
		c.mu.Lock()
		c.metadata++
		c.mu.Unlock()
	}
	return c.RoundTripper.RoundTrip(ctx, addr, req)
}

func (c *countingTransport) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metadata
}

// The forward writer's metadata lookups, one per message in kafka.Writer,
// reach the broker's transport once per partitionCounts' TTL; every message
// still lands in the partition its key hashes to (the partition count is
// right), and a topic that does not exist is asked about again at every
// write, never answered from the cache.
func TestPartitionCountsAnswersRepeatedLookups(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := "app-pcount-" + testenv.RandID()
	testenv.CreateKafkaTopic(t, brokers, topic, 4)
	inner := &countingTransport{RoundTripper: &kafka.Transport{DialTimeout: 10 * time.Second}}
	pc := &partitionCounts{RoundTripper: inner, ttl: time.Hour}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, Transport: pc}
	t.Cleanup(func() { w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs := make([]kafka.Message, 200)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprintf("k%d", i%16)), Value: []byte("v")}
	}
	for range 3 {
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if n := inner.count(); n != 1 {
		t.Errorf("%d metadata requests reached the transport for 600 messages in 3 writes, want 1 (the rest answered from the cache)", n)
	}

	// Every key went to the partition the hash balancer gives it over 4.
	want := map[string]int{}
	var h kafka.Hash
	for i := 0; i < 16; i++ {
		k := fmt.Sprintf("k%d", i)
		want[k] = h.Balance(kafka.Message{Key: []byte(k)}, 0, 1, 2, 3)
	}
	for p := range 4 {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
		conn, err := kafka.DialLeader(ctx, "tcp", brokers[0], topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		for range last {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want[string(m.Key)] != p {
				t.Fatalf("key %s in partition %d, want %d", m.Key, p, want[string(m.Key)])
			}
		}
		r.Close()
	}

	// An error answer is never cached: each write to a missing topic asks.
	missing := &countingTransport{RoundTripper: &kafka.Transport{DialTimeout: 10 * time.Second}}
	mw := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: "app-pcount-missing-" + testenv.RandID(), Transport: &partitionCounts{RoundTripper: missing, ttl: time.Hour}}
	t.Cleanup(func() { mw.Close() })
	for i := 1; i <= 2; i++ {
		if err := mw.WriteMessages(ctx, kafka.Message{Value: []byte("v")}); err == nil {
			t.Fatal("writing to a topic that does not exist: no error")
		}
		if n := missing.count(); n != i {
			t.Fatalf("after %d writes to a missing topic %d metadata requests reached the transport, want %d", i, n, i)
		}
	}
}

// The cache answers for up to its TTL, then asks again.
func TestPartitionCountsExpires(t *testing.T) {
	res := &metadataAPI.Response{Topics: []metadataAPI.ResponseTopic{{Name: "t", Partitions: make([]metadataAPI.ResponsePartition, 3)}}}
	inner := &countingTransport{RoundTripper: fixedTransport{res}}
	pc := &partitionCounts{RoundTripper: inner, ttl: 50 * time.Millisecond}
	req := &metadataAPI.Request{TopicNames: []string{"t"}}
	ask := func() {
		t.Helper()
		got, err := pc.RoundTrip(context.Background(), kafka.TCP("127.0.0.1:1"), req)
		if err != nil || got != kafka.Response(res) {
			t.Fatalf("RoundTrip: %v, %v; want the transport's answer", got, err)
		}
	}
	ask()
	ask()
	if n := inner.count(); n != 1 {
		t.Fatalf("two lookups within the TTL reached the transport %d times, want 1", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for inner.count() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the cache still answered 5s after its 50ms TTL")
		}
		time.Sleep(10 * time.Millisecond)
		ask()
	}
	if _, err := pc.RoundTrip(context.Background(), kafka.TCP("127.0.0.1:1"), &metadataAPI.Request{TopicNames: []string{"other"}}); err != nil {
		t.Fatal(err)
	}
	if n := inner.count(); n != 3 {
		t.Fatalf("a lookup of another topic: %d requests reached the transport, want 3 (it is not answered for t's)", n)
	}
}

// fixedTransport answers every request with res.
type fixedTransport struct{ res *metadataAPI.Response }

func (f fixedTransport) RoundTrip(context.Context, net.Addr, kafka.Request) (kafka.Response, error) {
	return f.res, nil
}

// BenchmarkPartitionCountsLookup is the per-message metadata lookup of the
// forward writer answered from partitionCounts' cache, with the request
// kafka.Writer builds for it (its two allocations are kafka-go's):
//
//	go test -run '^$' -bench PartitionCountsLookup ./internal/app
func BenchmarkPartitionCountsLookup(b *testing.B) {
	res := &metadataAPI.Response{Topics: []metadataAPI.ResponseTopic{{Name: "t", Partitions: make([]metadataAPI.ResponsePartition, 8)}}}
	pc := &partitionCounts{RoundTripper: fixedTransport{res}, ttl: time.Hour}
	ctx, addr := context.Background(), kafka.TCP("127.0.0.1:1")
	b.ReportAllocs()
	for b.Loop() {
		r, err := pc.RoundTrip(ctx, addr, &metadataAPI.Request{TopicNames: []string{"t"}})
		if err != nil || r != kafka.Response(res) {
			b.Fatalf("RoundTrip: %v, %v; want the cached answer", r, err)
		}
	}
}
