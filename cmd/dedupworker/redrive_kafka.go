package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
)

// kafkaDLQ reads the dead letters of a Kafka handler from its dead-letter
// topic, partition by partition up to the high watermarks of the start,
// and produces them back to the handler's topic.
type kafkaDLQ struct {
	client *kafka.Client
	tr     *kafka.Transport
	field  string // handlers[i].dead_letter.kafka.topic, for errors
	topic  string // the dead-letter topic
	group  string // the redrive group whose offsets say what is done
	source string // the handler's topic
	// sourceParts are the source topic's partitions: a dead letter goes
	// back to the one it came from.
	sourceParts []int
	parts       []kafkaPart // the dead-letter topic's partitions left to read
	buf         []kafkaRecord
	given       []string
}

// kafkaPart is a dead-letter partition's position and end for this run.
type kafkaPart struct {
	id       int
	pos, end int64
}

// kafkaRecord is a fetched dead letter, copied out of the fetch response.
type kafkaRecord struct {
	partition int
	offset    int64
	key       []byte
	value     []byte
	time      time.Time
	headers   []kafka.Header
	back      int // the source partition it goes back to, -1 if unknown
}

// openKafkaDLQ opens the dead-letter topic of handler h (handlers[idx]).
// A dry run reads it the same way: only committing changes the group, and
// the run does not commit in a dry run.
func openKafkaDLQ(ctx context.Context, idx int, h *config.Handler) (*kafkaDLQ, error) {
	k := h.Source.Kafka
	// Dead letters are on the source's cluster, with its credentials
	// (config validation refuses others), so one client reads and writes.
	tr, err := app.KafkaTransport(fmt.Sprintf("handlers[%d].source.kafka", idx), k.SASL, k.TLS)
	if err != nil {
		return nil, usageError{err}
	}
	s := &kafkaDLQ{
		client: &kafka.Client{Addr: kafka.TCP(k.Brokers...), Transport: tr, Timeout: redriveCallTimeout},
		tr:     tr,
		field:  fmt.Sprintf("handlers[%d].dead_letter.kafka.topic", idx),
		topic:  h.DeadLetter.Kafka.Topic,
		group:  k.Group + "-redrive",
		source: k.Topic,
	}
	if err := s.plan(ctx); err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	return s, nil
}

// plan reads the partitions of both topics, the dead-letter topic's first
// offsets and high watermarks, and the redrive group's committed offsets.
func (s *kafkaDLQ) plan(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	md, err := s.client.Metadata(cctx, &kafka.MetadataRequest{Topics: []string{s.topic, s.source}})
	if err != nil {
		return fmt.Errorf("kafka metadata of %q and %q: %w", s.topic, s.source, err)
	}
	var dlParts []int
	for _, t := range md.Topics {
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		switch t.Name {
		case s.topic:
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				s.given = append(s.given, fmt.Sprintf("%s %q does not exist: nothing was dead-lettered", s.field, s.topic))
				return nil
			}
			if t.Error != nil {
				return fmt.Errorf("%s %q: %w", s.field, s.topic, t.Error)
			}
			dlParts = ids
		case s.source:
			if t.Error != nil {
				return fmt.Errorf("source topic %q: %w", s.source, t.Error)
			}
			s.sourceParts = ids
		}
	}
	if len(dlParts) == 0 {
		return nil
	}
	reqs := make([]kafka.OffsetRequest, 0, 2*len(dlParts))
	for _, p := range dlParts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	lo, err := s.client.ListOffsets(cctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{s.topic: reqs}})
	if err != nil {
		return fmt.Errorf("%s %q: listing offsets: %w", s.field, s.topic, err)
	}
	of, err := s.client.OffsetFetch(cctx, &kafka.OffsetFetchRequest{GroupID: s.group, Topics: map[string][]int{s.topic: dlParts}})
	if err != nil {
		return fmt.Errorf("group %q: reading its committed offsets of %q: %w", s.group, s.topic, err)
	}
	if of.Error != nil {
		return fmt.Errorf("group %q: reading its committed offsets of %q: %w", s.group, s.topic, of.Error)
	}
	committed := map[int]int64{}
	for _, p := range of.Topics[s.topic] {
		if p.Error != nil {
			return fmt.Errorf("group %q: committed offset of %s[%d]: %w", s.group, s.topic, p.Partition, p.Error)
		}
		committed[p.Partition] = p.CommittedOffset
	}
	for _, p := range lo.Topics[s.topic] {
		if p.Error != nil {
			return fmt.Errorf("%s %q partition %d: listing offsets: %w", s.field, s.topic, p.Partition, p.Error)
		}
		pos := p.FirstOffset
		if c, ok := committed[p.Partition]; ok && c > pos {
			pos = c
		}
		if pos < p.LastOffset {
			s.parts = append(s.parts, kafkaPart{id: p.Partition, pos: pos, end: p.LastOffset})
		}
	}
	slices.SortFunc(s.parts, func(a, b kafkaPart) int { return a.id - b.id })
	return nil
}

func (s *kafkaDLQ) describe() (string, string) {
	return fmt.Sprintf("topic %s (group %s)", s.topic, s.group), "topic " + s.source
}

func (s *kafkaDLQ) next(ctx context.Context) (*deadLetter, error) {
	for len(s.buf) == 0 {
		if len(s.parts) == 0 {
			return nil, nil
		}
		if err := s.fill(ctx); err != nil {
			return nil, err
		}
	}
	r := s.buf[0]
	s.buf = s.buf[1:]
	h := consumer.Header{}
	for _, kh := range r.headers {
		h[kh.Key] = append(h[kh.Key], string(kh.Value))
	}
	dl := &deadLetter{
		ID:      fmt.Sprintf("partition %d offset %d", r.partition, r.offset),
		Key:     h.Get(consumer.HeaderDeadLetterKey),
		Reason:  h.Get(consumer.HeaderDeadLetterReason),
		Handler: h.Get(consumer.HeaderDeadLetterHandler),
		Payload: r.value,
		handle:  r,
	}
	// The partition it came from, -1 when unknown (republish then fails).
	r.back = -1
	if p, err := strconv.Atoi(h.Get(consumer.HeaderDeadLetterPartition)); err == nil && slices.Contains(s.sourceParts, p) {
		r.back = p
	}
	dl.Origin = fmt.Sprintf("%s[%d]", s.source, r.back)
	r.headers = slices.DeleteFunc(r.headers, func(kh kafka.Header) bool { return isDLQHeader(kh.Key) })
	dl.handle = r
	dl.Header = stripDLQHeaders(h)
	return dl, nil
}

// fill fetches the next records of the first partition left; a partition
// is done at the end it had when the run started.
func (s *kafkaDLQ) fill(ctx context.Context) error {
	p := &s.parts[0]
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout+redriveIdle)
	defer cancel()
	res, err := s.client.Fetch(cctx, &kafka.FetchRequest{
		Topic: s.topic, Partition: p.id, Offset: p.pos,
		MinBytes: 1, MaxBytes: 8 << 20, MaxWait: redriveIdle,
		IsolationLevel: kafka.ReadCommitted,
	})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		return fmt.Errorf("%s %q partition %d offset %d: fetching: %w", s.field, s.topic, p.id, p.pos, err)
	}
	got := 0
	for {
		rec, err := res.Records.ReadRecord()
		if err != nil {
			break // io.EOF, or a batch cut at MaxBytes: the next fetch goes on from pos
		}
		if rec.Offset < p.pos {
			continue // a compressed batch starts before the offset asked for
		}
		if rec.Offset >= p.end {
			break
		}
		r := kafkaRecord{partition: p.id, offset: rec.Offset, time: rec.Time, headers: slices.Clone(rec.Headers)}
		if r.key, err = kafka.ReadAll(rec.Key); err == nil {
			r.value, err = kafka.ReadAll(rec.Value)
		}
		if err != nil {
			return fmt.Errorf("%s %q partition %d offset %d: reading the record: %w", s.field, s.topic, p.id, rec.Offset, err)
		}
		s.buf = append(s.buf, r)
		p.pos = rec.Offset + 1
		got++
	}
	if p.pos >= p.end {
		s.parts = s.parts[1:]
	} else if got == 0 {
		// Nothing between pos and the end within the wait: transaction
		// markers or a compacted log. What is committed stays.
		s.given = append(s.given, fmt.Sprintf("%s %q partition %d: no record between offset %d and the high watermark %d within %s; left for the next run", s.field, s.topic, p.id, p.pos, p.end, redriveIdle))
		s.parts = s.parts[1:]
	}
	return nil
}

func (s *kafkaDLQ) republish(ctx context.Context, dl *deadLetter) error {
	r := dl.handle.(kafkaRecord)
	p := r.back
	if p < 0 {
		return fmt.Errorf("the dead letter's %s header names no partition of %q, so where it came from is unknown", consumer.HeaderDeadLetterPartition, s.source)
	}
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	res, err := s.client.Produce(cctx, &kafka.ProduceRequest{
		Topic: s.source, Partition: p, RequiredAcks: kafka.RequireAll,
		Records: kafka.NewRecordReader(kafka.Record{Time: r.time, Key: kafka.NewBytes(r.key), Value: kafka.NewBytes(r.value), Headers: r.headers}),
	})
	if err == nil {
		err = res.Error
		for _, e := range res.RecordErrors {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		return fmt.Errorf("producing to %s[%d]: %w", s.source, p, err)
	}
	return nil
}

func (s *kafkaDLQ) settle(ctx context.Context, dl *deadLetter) error {
	r := dl.handle.(kafkaRecord)
	cctx, cancel := context.WithTimeout(ctx, redriveCallTimeout)
	defer cancel()
	// Generation -1 and no member: a commit of a group nobody has joined,
	// which the broker refuses while the group has members.
	res, err := s.client.OffsetCommit(cctx, &kafka.OffsetCommitRequest{
		GroupID: s.group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{s.topic: {{Partition: r.partition, Offset: r.offset + 1}}},
	})
	if err == nil {
		for _, p := range res.Topics[s.topic] {
			err = errors.Join(err, p.Error)
		}
	}
	if err != nil {
		return fmt.Errorf("group %q: committing %s[%d] offset %d: %w", s.group, s.topic, r.partition, r.offset+1, err)
	}
	return nil
}

// leave keeps dl for the next run: nothing past it is committed, since a
// run stops at it.
func (s *kafkaDLQ) leave(context.Context, *deadLetter) {}

func (s *kafkaDLQ) notes() []string { return s.given }

func (s *kafkaDLQ) close() { s.tr.CloseIdleConnections() }
