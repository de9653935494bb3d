// Package sourcetest is the conformance suite of consumer.Source: what a
// transport must do with acks, naks, heartbeats, dead letters, attempts, a
// stop while work is in flight, and prepared batches, checked against the
// real broker. Both transports of this module run it; a transport of your
// own runs it from its tests:
//
//	func TestConformance(t *testing.T) {
//		sourcetest.Run(t, func(t *testing.T) *sourcetest.Env {
//			topic := newTopic(t)
//			return &sourcetest.Env{
//				Transport:   "mybroker",
//				NewSource:   func(t *testing.T) consumer.Source { return newSource(t, topic) },
//				Publish:     func(t *testing.T, ms ...sourcetest.Msg) { publish(t, topic, ms) },
//				DeadLetters: func(t *testing.T) []*consumer.Message { return readDLQ(t, topic) },
//			}
//		})
//	}
//
// Every check runs in parallel with the others on an Env of its own, so each
// Env needs its own topic or stream and its own group or durable.
package sourcetest
