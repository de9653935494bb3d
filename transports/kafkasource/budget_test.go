package kafkasource

import (
	"testing"

	"github.com/segmentio/kafka-go"
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
	if got, want := messageCost(m), recordOverhead+110+3+14+headerEntry+headerMapSmall; got != want {
		t.Fatalf("messageCost with one header = %d, want %d", got, want)
	}
	for _, n := range []int{mapGroupSlots, mapGroupSlots + 1, 4 * mapGroupSlots} {
		m.Headers = make([]kafka.Header, n)
		perHeader := (messageCost(m) - recordOverhead - 110 - headerMapCost(n)) / int64(n)
		if perHeader != headerEntry {
			t.Errorf("%d empty headers cost %d a header beside their map, want headerEntry %d", n, perHeader, headerEntry)
		}
	}
	if small, large := headerMapCost(mapGroupSlots), headerMapCost(mapGroupSlots+1); large <= small {
		t.Errorf("a header map of %d keys costs %d, of %d keys %d: want it to grow past one group", mapGroupSlots, small, mapGroupSlots+1, large)
	}
}
