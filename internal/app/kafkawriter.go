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
// kafka.Writer only reads the answers.
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
	until time.Time
}

// RoundTrip answers req from the last answer when it can, else sends it.
func (c *partitionCounts) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	m, ok := req.(*metadataAPI.Request)
	if !ok || len(m.TopicNames) != 1 {
		return c.RoundTripper.RoundTrip(ctx, addr, req)
	}
	topic, now := m.TopicNames[0], time.Now()
	if l := c.last.Load(); l != nil && l.topic == topic && l.auto == m.AllowAutoTopicCreation && now.Before(l.until) {
		return l.res, nil
	}
	res, err := c.RoundTripper.RoundTrip(ctx, addr, req)
	if err != nil {
		return res, err
	}
	if r, ok := res.(*metadataAPI.Response); ok && len(r.Topics) == 1 && r.Topics[0].Name == topic && r.Topics[0].ErrorCode == 0 {
		c.last.Store(&topicMetadata{topic: topic, auto: m.AllowAutoTopicCreation, res: r, until: now.Add(c.ttl)})
	}
	return res, nil
}
