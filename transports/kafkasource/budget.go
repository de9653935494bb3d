package kafkasource

import (
	"unsafe"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/bytebudget"
)

// kafkaGoRecord approximates what kafka-go's decoding of a record holds
// beside its key, value and headers until the source has converted it: its
// offset, time and two page references into the decompressed batch.
const kafkaGoRecord = 128

// recordOverhead is what a fetched message costs beside its bytes: its
// kafka.Message in its fetch's block, its delivery (which references it
// there) and kafka-go's decoded record.
const recordOverhead = int64(unsafe.Sizeof(kafka.Message{})+unsafe.Sizeof(delivery{})) + kafkaGoRecord

// A message's headers are held twice: kafka-go decodes each into its own
// key and value allocations, which the kafka.Message keeps, and the
// delivery's consumer.Header is a map whose values are copies
// (headerSpace), which costs bytebudget.HeaderMapCost beside its entries.
// headerEntry is one header beside its key and value bytes: its
// kafka.Header in kafka-go's slice, the string of the copied value, and the
// size-class rounding of kafka-go's two allocations.
// TestFetchBudgetCountsHeapHeld checks these figures against the heap a
// source holds.
const headerEntry = int64(unsafe.Sizeof(kafka.Header{})+unsafe.Sizeof("")) + 16

// messageCost is what the budget counts for m: its key, value and header
// bytes (each held by kafka-go's decoding and copied by the source) and
// recordOverhead.
func messageCost(m *kafka.Message) int64 {
	n := int64(len(m.Key)+len(m.Value)) + recordOverhead
	if len(m.Headers) == 0 {
		return n
	}
	for _, h := range m.Headers {
		n += int64(len(h.Key)+2*len(h.Value)) + headerEntry
	}
	return n + bytebudget.HeaderMapCost(len(m.Headers))
}
