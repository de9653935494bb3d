package app

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// partitionCountTTL is how long partitionCounts answers a topic's metadata
// from its last answer: a partition added to the output topic is written
// to within it.
const partitionCountTTL = time.Second

// partitionCounts is the forward writer's RoundTripper. kafka.Writer asks
// its transport for the topic's metadata once for every message it writes
// (its balancer needs the partition count), and a kafka.Transport answers
// each from its cache with a filtered copy of the cluster's metadata. This
// answers a request for one topic's metadata with the last answer for that
// topic, while it is younger than ttl and its topic has no error, and
// passes everything else (produce requests, errors, other topics) on.
// kafka.Writer only reads the answers. A timer drops each answer ttl after
// it was kept, so that a lookup, paid once per message, reads no clock: it
// is one atomic load and a comparison of the topic.
type partitionCounts struct {
	kafka.RoundTripper
	ttl  time.Duration
	last atomic.Pointer[topicMetadata]
}

// topicMetadata is one metadata answer for one topic.
type topicMetadata struct {
	topic string
	auto  bool // the request's AllowAutoTopicCreation
	res   *metadataAPI.Response
}

// RoundTrip answers req from the last answer when it can, else sends it.
func (c *partitionCounts) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	m, ok := req.(*metadataAPI.Request)
	if !ok || len(m.TopicNames) != 1 {
		return c.RoundTripper.RoundTrip(ctx, addr, req)
	}
	topic := m.TopicNames[0]
	if l := c.last.Load(); l != nil && l.topic == topic && l.auto == m.AllowAutoTopicCreation {
		return l.res, nil
	}
	res, err := c.RoundTripper.RoundTrip(ctx, addr, req)
	if err != nil {
		return res, err
	}
	if r, ok := res.(*metadataAPI.Response); ok && len(r.Topics) == 1 && r.Topics[0].Name == topic && r.Topics[0].ErrorCode == 0 {
		l := &topicMetadata{topic: topic, auto: m.AllowAutoTopicCreation, res: r}
		c.last.Store(l)
		// The timer's function only drops l, unless a later answer has
		// replaced it, and ends; it holds c for at most ttl.
		time.AfterFunc(c.ttl, func() { c.last.CompareAndSwap(l, nil) })
	}
	return res, nil
}
