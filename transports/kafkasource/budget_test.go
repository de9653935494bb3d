package kafkasource

import (
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/bytebudget"
)

// TestMessageCostCountsBytesAndOverhead: a message's cost grows with its
// key, value and headers, over a fixed overhead; a header's value counts
// twice (kafka-go's and the source's copy), and a message with headers
// counts its header map, which grows past one group of slots.
func TestMessageCostCountsBytesAndOverhead(t *testing.T) {
	empty := messageCost(&kafka.Message{})
	if empty != recordOverhead || empty < 256 {
		t.Fatalf("an empty message costs %d, want recordOverhead %d (at least 256)", empty, recordOverhead)
	}
	m := &kafka.Message{Key: make([]byte, 10), Value: make([]byte, 100)}
	if got, want := messageCost(m), recordOverhead+110; got != want {
		t.Fatalf("messageCost without headers = %d, want %d", got, want)
	}
	m.Headers = []kafka.Header{{Key: "abc", Value: make([]byte, 7)}}
	if got, want := messageCost(m), recordOverhead+110+3+14+headerEntry+bytebudget.HeaderMapCost(1); got != want {
		t.Fatalf("messageCost with one header = %d, want %d", got, want)
	}
	for _, n := range []int{8, 9, 32} {
		m.Headers = make([]kafka.Header, n)
		perHeader := (messageCost(m) - recordOverhead - 110 - bytebudget.HeaderMapCost(n)) / int64(n)
		if perHeader != headerEntry {
			t.Errorf("%d empty headers cost %d a header beside their map, want headerEntry %d", n, perHeader, headerEntry)
		}
	}
}
