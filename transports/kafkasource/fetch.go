package kafkasource

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// Control record types (the second int16 of a control record's key).
const controlAbort = 0

// transport returns a kafka-go Transport for fetch requests, with the
// dialer's TLS, SASL, client id, resolver and dial function. A fetcher makes a new one
// on every reconnect, so its first request reads fresh metadata and is routed
// to the current leader.
func (s *Source) transport() *kafka.Transport {
	d := s.dialer
	dial := d.DialFunc
	if dial == nil {
		nd := &net.Dialer{Timeout: s.cfg.NetworkTimeout, KeepAlive: d.KeepAlive, LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay}
		if !d.DualStack {
			nd.FallbackDelay = -1
		}
		dial = nd.DialContext
	}
	if r := d.Resolver; r != nil {
		// As kafka.Dialer does: the resolver's first answer replaces the
		// host; the address's own port wins over the resolver's.
		base := dial
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			resolved, err := r.LookupHost(ctx, host)
			if err != nil {
				return nil, fmt.Errorf("dedup: kafka: resolving %s: %w", host, err)
			}
			if len(resolved) > 0 {
				rh, rp, serr := net.SplitHostPort(resolved[0])
				if serr != nil {
					rh, rp = resolved[0], ""
				}
				host = rh
				if port == "" {
					port = rp
				}
			}
			return base(ctx, network, net.JoinHostPort(host, port))
		}
	}
	return &kafka.Transport{
		Dial:           dial,
		DialTimeout:    s.cfg.NetworkTimeout,
		ClientID:       d.ClientID,
		TLS:            d.TLS,
		SASL:           d.SASLMechanism,
		MetadataTopics: []string{s.cfg.Topic},
	}
}

// lastStable returns the partition's last stable offset: the first offset of
// its oldest open transaction, or its end when none is open.
func (p *partition) lastStable(ctx context.Context, tr *kafka.Transport) (int64, error) {
	ends, err := p.g.m.s.listEnds(ctx, tr, []int{p.id}, kafka.ReadCommitted)
	if err != nil {
		return 0, err
	}
	end, ok := ends[p.id]
	if !ok {
		return 0, fmt.Errorf("dedup: kafka: list offsets response without partition %d", p.id)
	}
	return end, nil
}

// listEnds asks the partitions' leaders, through tr, for the partitions'
// ends: the offset the next record will have, or under read_committed the
// last stable offset. A partition the answer leaves out or reports an error
// for is missing from the map; the call fails only when no partition was
// answered.
func (s *Source) listEnds(ctx context.Context, tr *kafka.Transport, ids []int, level kafka.IsolationLevel) (map[int]int64, error) {
	cl := &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Transport: tr, Timeout: s.cfg.NetworkTimeout}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.NetworkTimeout)
	defer cancel()
	reqs := make([]kafka.OffsetRequest, len(ids))
	for i, id := range ids {
		reqs[i] = kafka.LastOffsetOf(id)
	}
	res, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{s.cfg.Topic: reqs},
		IsolationLevel: level,
	})
	if err != nil {
		return nil, err
	}
	ends := make(map[int]int64, len(ids))
	var first error
	for _, po := range res.Topics[s.cfg.Topic] {
		if po.Error != nil {
			first = cmp.Or(first, po.Error)
			continue
		}
		ends[po.Partition] = po.LastOffset
	}
	if len(ends) == 0 && first != nil {
		return nil, first
	}
	return ends, nil
}

// fetchOnce fetches the partition at offset in the next round to its leader
// (rounds), which the broker holds up to wait for records to arrive, and
// returns the records a handler may see, in offset order, and the offset to
// fetch next. It reads the response with kafka-go's protocol/fetch types rather
// than Conn.ReadBatch, because only they expose what isolation needs: the
// batch attributes (control, transactional), the producer id of each batch
// and the partition's aborted transactions (kafka-go's Conn reads and drops
// both). Control batches (transaction markers) are never returned; under
// read_committed neither are the batches of aborted transactions. The
// offsets they occupy still count: next moves past them.
func (p *partition) fetchOnce(ctx context.Context, leader *leaderRounds, offset int64, wait time.Duration) (blocks, int64, error) {
	s := p.g.m.s
	part, err := p.g.rounds.fetch(ctx, leader, p.id, offset, wait)
	if err != nil {
		return nil, offset, err
	}
	if part.ErrorCode != 0 {
		return nil, offset, kafka.Error(part.ErrorCode)
	}
	end := part.HighWatermark
	if s.cfg.Isolation == IsolationReadCommitted && part.LastStableOffset >= 0 {
		end = part.LastStableOffset
	}
	p.seeEnd(end)
	if part.RecordSet.Records == nil {
		return nil, offset, nil
	}
	var batches []protocol.RecordReader
	if st, ok := part.RecordSet.Records.(*protocol.RecordStream); ok {
		batches = st.Records
	} else {
		batches = []protocol.RecordReader{part.RecordSet.Records}
	}
	f := filter{
		readCommitted: s.cfg.Isolation == IsolationReadCommitted, aborted: part.AbortedTransactions,
		block: s.cfg.BatchSize, expect: p.lastFetched,
	}
	msgs, next, err := f.read(s.cfg.Topic, p.id, part.HighWatermark, offset, batches)
	p.lastFetched = msgs.len()
	return msgs, next, err
}

// blocks is a fetch's messages in offset order, in blocks of at most the
// dispatcher's chunk (Config.BatchSize) each: a block is one chunk, and its
// deliveries reference their messages in it (newDeliveries), so a block
// lives exactly as long as its chunk runs, and a fetch's messages are never
// copied to grow one slice.
type blocks [][]kafka.Message

// len is how many messages b holds.
func (b blocks) len() int {
	n := 0
	for _, m := range b {
		n += len(m)
	}
	return n
}

// filter walks the record batches of one fetch response.
type filter struct {
	readCommitted bool
	aborted       []fetchapi.ResponseTransaction // not yet reached, by first offset
	abortedPIDs   map[int64]bool                 // producers inside an aborted transaction
	bytes         arena                          // the returned records' keys and values
	// block is the most messages a returned block holds (0: no bound).
	block int
	// expect is how many records the fetch is likely to return (the last
	// fetch's count): the first block starts with room for that many, at
	// most block, so a small fetch does not take a whole block's room.
	expect int
}

// read returns the records at or after offset that a handler may see, in
// blocks of at most f.block (see blocks), and the offset after the last
// batch. Batches are contiguous in offset space, so a batch ends where the
// next one begins; the last batch ends after its last record. A response whose records all lie before offset (the tail of a
// batch removed by compaction, or an empty batch a compacted transactional
// producer left) advances by one offset: nothing is stored there. kafka-go
// keeps no batch's last offset, which would let it jump the whole gap.
func (f *filter) read(topic string, partition int, hwm, offset int64, batches []protocol.RecordReader) (blocks, int64, error) {
	sort.Slice(f.aborted, func(i, j int) bool { return f.aborted[i].FirstOffset < f.aborted[j].FirstOffset })
	var msgs blocks
	var cur []kafka.Message // the block being filled
	done := func() blocks {
		if len(cur) > 0 {
			msgs = append(msgs, cur)
		}
		return msgs
	}
	next := offset
	for i, b := range batches {
		base := batchOffset(b)
		if base > next {
			// Nothing is stored between the fetch offset and the first
			// batch the broker returned.
			next = base
		}
		if i+1 < len(batches) {
			if end := batchOffset(batches[i+1]); end > next {
				next = end
			}
		}
		skip := false
		switch rb := b.(type) {
		case *protocol.ControlBatch:
			// One marker record, at the batch's base offset.
			f.control(rb)
			if base+1 > next {
				next = base + 1
			}
			continue
		case *protocol.RecordBatch:
			skip = f.readCommitted && f.inAborted(rb.ProducerID, base, rb.Attributes.Transactional())
		}
		for {
			r, err := b.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return done(), next, err
			}
			if r.Offset+1 > next {
				next = r.Offset + 1
			}
			if skip || r.Offset < offset {
				closeRecord(r)
				continue
			}
			m, err := message(&f.bytes, topic, partition, hwm, r)
			if err != nil {
				return done(), next, err
			}
			switch {
			case cur == nil:
				room := max(f.expect, 1)
				if f.block > 0 {
					room = min(room, f.block)
				}
				cur = make([]kafka.Message, 0, room)
			case len(cur) == f.block:
				// Full: a fetch that filled one block is likely to fill
				// the next.
				msgs = append(msgs, cur)
				cur = make([]kafka.Message, 0, f.block)
			case len(cur) == cap(cur) && f.block > 0:
				// The first block grows as append would, but never past
				// a chunk.
				cur = append(make([]kafka.Message, 0, min(2*cap(cur), f.block)), cur...)
			}
			cur = append(cur, m)
		}
	}
	if next == offset && len(batches) > 0 {
		next = offset + 1
	}
	return done(), next, nil
}

// control handles a transaction marker: an abort marker ends the producer's
// aborted transaction.
func (f *filter) control(b *protocol.ControlBatch) {
	cr, err := b.ReadControlRecord()
	if err == nil && cr.Type == controlAbort {
		delete(f.abortedPIDs, b.ProducerID)
	}
}

// inAborted reports whether a data batch of producer pid at base belongs to
// an aborted transaction: the broker lists, for the fetched range, every
// aborted transaction by producer and first offset, and the transaction
// lasts until the producer's abort marker.
func (f *filter) inAborted(pid, base int64, transactional bool) bool {
	for len(f.aborted) > 0 && f.aborted[0].FirstOffset <= base {
		if f.abortedPIDs == nil {
			f.abortedPIDs = make(map[int64]bool)
		}
		f.abortedPIDs[f.aborted[0].ProducerID] = true
		f.aborted = f.aborted[1:]
	}
	return transactional && f.abortedPIDs[pid]
}

func batchOffset(b protocol.RecordReader) int64 {
	switch rb := b.(type) {
	case *protocol.RecordBatch:
		return rb.BaseOffset
	case *protocol.ControlBatch:
		return rb.BaseOffset
	case *protocol.MessageSet:
		return rb.BaseOffset
	}
	return -1
}

func message(a *arena, topic string, partition int, hwm int64, r *protocol.Record) (kafka.Message, error) {
	defer closeRecord(r)
	m := kafka.Message{
		Topic:         topic,
		Partition:     partition,
		Offset:        r.Offset,
		HighWaterMark: hwm,
		Headers:       r.Headers,
		Time:          r.Time,
	}
	var err error
	if r.Key != nil {
		if m.Key, err = a.read(r.Key); err != nil {
			return m, err
		}
	}
	if r.Value != nil {
		if m.Value, err = a.read(r.Value); err != nil {
			return m, err
		}
	}
	return m, nil
}

// arenaBlock is the size of an arena's blocks: a block is freed when no
// message it holds is referenced, so it must be small beside what a
// partition holds unfinished, and large beside most keys and payloads.
const arenaBlock = 32 << 10

// arena copies the keys and values of a fetch's records into shared blocks:
// one allocation per block instead of two per record. A key or value of a
// quarter of a block or more gets an allocation of its own. Each slice it returns is capped at its
// length, so appending to one never writes into the next.
type arena struct {
	block []byte
}

// read returns the remaining bytes of b (non-nil, as protocol.ReadAll's).
func (a *arena) read(b protocol.Bytes) ([]byte, error) {
	n := b.Len()
	if n == 0 {
		return []byte{}, nil
	}
	if n > cap(a.block)-len(a.block) {
		if n >= arenaBlock/4 {
			return protocol.ReadAll(b)
		}
		a.block = make([]byte, 0, arenaBlock)
	}
	start := len(a.block)
	a.block = a.block[:start+n]
	if _, err := io.ReadFull(b, a.block[start:]); err != nil {
		return nil, err
	}
	return a.block[start : start+n : start+n], nil
}

func closeRecord(r *protocol.Record) {
	if r.Key != nil {
		r.Key.Close()
	}
	if r.Value != nil {
		r.Value.Close()
	}
}
