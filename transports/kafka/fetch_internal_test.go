package kafka

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go/protocol"
)

// TestFilterPositions: the offset after a fetch covers batches whose records
// compaction removed, so the fetcher never asks for the same batch forever,
// and never passes a record it has not returned.
func TestFilterPositions(t *testing.T) {
	t.Parallel()
	batch := func(base int64, offs ...int64) protocol.RecordReader {
		rs := make([]protocol.Record, len(offs))
		for i, o := range offs {
			rs[i] = protocol.Record{Offset: o, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes([]byte("v"))}
		}
		return &protocol.RecordBatch{BaseOffset: base, Records: protocol.NewRecordReader(rs...)}
	}
	cases := []struct {
		name    string
		offset  int64
		batches func() []protocol.RecordReader
		offs    []int64
		next    int64
	}{
		{"records from the fetch offset", 3, func() []protocol.RecordReader { return []protocol.RecordReader{batch(0, 0, 2, 3, 4)} }, []int64{3, 4}, 5},
		// An empty batch (a compacted transactional producer's) ends where
		// the next batch begins.
		{"empty batch then records", 10, func() []protocol.RecordReader { return []protocol.RecordReader{batch(10), batch(20, 20)} }, []int64{20}, 21},
		// Only records before the fetch offset: the tail of the batch was
		// compacted away; step forward.
		{"compacted tail", 7, func() []protocol.RecordReader { return []protocol.RecordReader{batch(0, 0, 5)} }, nil, 8},
		{"no batches", 7, func() []protocol.RecordReader { return nil }, nil, 7},
	}
	for _, tc := range cases {
		f := filter{readCommitted: true}
		msgs, next, err := f.read("t", 0, 100, tc.offset, tc.batches())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var offs []int64
		for _, m := range msgs {
			offs = append(offs, m.Offset)
		}
		if !slices.Equal(offs, tc.offs) || next != tc.next {
			t.Errorf("%s: offsets %v next %d, want %v next %d", tc.name, offs, next, tc.offs, tc.next)
		}
	}
}
