package kafkasource

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
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
		{"empty batch after the fetch offset", 5, func() []protocol.RecordReader { return []protocol.RecordReader{batch(10)} }, nil, 10},
		{"empty batch at the fetch offset", 10, func() []protocol.RecordReader { return []protocol.RecordReader{batch(10)} }, nil, 11},
		{"no batches", 7, func() []protocol.RecordReader { return nil }, nil, 7},
	}
	for _, tc := range cases {
		f := filter{readCommitted: true}
		msgs, next, err := f.read("t", 0, 100, tc.offset, tc.batches())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var offs []int64
		for _, b := range msgs {
			for _, m := range b {
				offs = append(offs, m.Offset)
			}
		}
		if !slices.Equal(offs, tc.offs) || next != tc.next {
			t.Errorf("%s: offsets %v next %d, want %v next %d", tc.name, offs, next, tc.offs, tc.next)
		}
	}
}

// TestFilterAborted: under read_committed a producer's batches are skipped
// from the first offset the broker lists for its aborted transaction up to
// its abort marker, and only those: not its committed transaction before,
// nor its next one, nor another producer's batches in between. Markers are
// skipped under both levels.
func TestFilterAborted(t *testing.T) {
	t.Parallel()
	data := func(base, pid int64, txn bool) protocol.RecordReader {
		var a protocol.Attributes
		if txn {
			a = protocol.Transactional
		}
		r := protocol.Record{Offset: base, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes([]byte("v"))}
		return &protocol.RecordBatch{BaseOffset: base, ProducerID: pid, Attributes: a, Records: protocol.NewRecordReader(r)}
	}
	marker := func(base, pid int64, typ byte) protocol.RecordReader {
		r := protocol.Record{Offset: base, Key: protocol.NewBytes([]byte{0, 0, 0, typ}), Value: protocol.NewBytes(make([]byte, 6))}
		return &protocol.ControlBatch{BaseOffset: base, ProducerID: pid, Attributes: protocol.Control | protocol.Transactional, Records: protocol.NewRecordReader(r)}
	}
	batches := func() []protocol.RecordReader {
		return []protocol.RecordReader{
			data(0, 1, true), marker(1, 1, 1), // producer 1: committed
			data(2, 1, true), data(3, 2, true), data(4, 1, true), marker(5, 1, 0), // 1 aborts, 2 interleaved
			data(6, 1, true), marker(7, 2, 1), // 1's next transaction; 2 commits
			data(8, -1, false),
		}
	}
	for _, tc := range []struct {
		readCommitted bool
		want          []int64
	}{
		{true, []int64{0, 3, 6, 8}},
		{false, []int64{0, 2, 3, 4, 6, 8}},
	} {
		f := filter{readCommitted: tc.readCommitted, aborted: []fetchapi.ResponseTransaction{{ProducerID: 1, FirstOffset: 2}}}
		msgs, next, err := f.read("t", 0, 9, 0, batches())
		if err != nil {
			t.Fatal(err)
		}
		var offs []int64
		for _, b := range msgs {
			for _, m := range b {
				offs = append(offs, m.Offset)
			}
		}
		if !slices.Equal(offs, tc.want) || next != 9 {
			t.Errorf("readCommitted=%v: offsets %v next %d, want %v next 9", tc.readCommitted, offs, next, tc.want)
		}
	}
}

// TestFilterBlocks: a fetch's messages come in blocks of at most the
// dispatcher's chunk, in offset order, each with no room beyond it (a
// chunk's deliveries keep their block, and nothing of another chunk may
// share it); the first block starts with the room the last fetch's count
// asks for.
func TestFilterBlocks(t *testing.T) {
	t.Parallel()
	var rs []protocol.Record
	for o := range int64(8) {
		rs = append(rs, protocol.Record{Offset: o, Key: protocol.NewBytes([]byte("k")), Value: protocol.NewBytes([]byte("v"))})
	}
	for _, tc := range []struct {
		expect int
		lens   []int
	}{
		{expect: 0, lens: []int{3, 3, 2}},
		{expect: 8, lens: []int{3, 3, 2}},
	} {
		f := filter{block: 3, expect: tc.expect}
		msgs, next, err := f.read("t", 0, 8, 0, []protocol.RecordReader{&protocol.RecordBatch{Records: protocol.NewRecordReader(rs...)}})
		if err != nil || next != 8 {
			t.Fatalf("expect %d: next %d, %v", tc.expect, next, err)
		}
		var lens []int
		var offs []int64
		for _, b := range msgs {
			lens = append(lens, len(b))
			if cap(b) > f.block {
				t.Errorf("expect %d: a block has room for %d messages, more than a chunk (%d)", tc.expect, cap(b), f.block)
			}
			for _, m := range b {
				offs = append(offs, m.Offset)
			}
		}
		if !slices.Equal(lens, tc.lens) || !slices.Equal(offs, []int64{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("expect %d: blocks of %v holding offsets %v, want blocks of %v holding 0..7", tc.expect, lens, offs, tc.lens)
		}
		if msgs.len() != 8 {
			t.Errorf("expect %d: len %d, want 8", tc.expect, msgs.len())
		}
	}
}
