package kafkasource_test

import (
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/sourcetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// The Kafka Source passes the Source conformance suite on a topic of one
// partition.
func TestSourceConformance(t *testing.T) {
	sourcetest.Run(t, func(t *testing.T) *sourcetest.Env {
		e := newEnv(t, 1)
		dlq := e.topic + "-dlq"
		testenv.CreateKafkaTopic(t, e.brokers, dlq, 1)
		return &sourcetest.Env{
			Transport: "kafka",
			NewSource: func(t *testing.T) consumer.Source {
				return e.source(func(c *kafkasource.Config) { c.DeadLetterTopic = dlq })
			},
			Publish: func(t *testing.T, ms ...sourcetest.Msg) {
				out := make([]msg, len(ms))
				for i, m := range ms {
					out[i] = msg{value: m.Payload}
					for k, vs := range m.Header {
						for _, v := range vs {
							out[i].headers = append(out[i].headers, kafka.Header{Key: k, Value: []byte(v)})
						}
					}
				}
				e.produce(e.topic, out)
			},
			DeadLetters: func(t *testing.T) []*consumer.Message {
				var out []*consumer.Message
				for _, m := range e.readAll(dlq, 1) {
					h := consumer.Header{}
					for _, kv := range m.Headers {
						h[kv.Key] = append(h[kv.Key], string(kv.Value))
					}
					out = append(out, &consumer.Message{Key: m.Key, Payload: m.Value, Header: h})
				}
				return out
			},
		}
	})
}
