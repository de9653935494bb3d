package natssource_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/sourcetest"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/natssource"
)

// The NATS Source passes the Source conformance suite on every NATS server the
// tests use (docs/TESTING.md), with dead letters captured by a stream of their own and an
// AckWait short enough that the heartbeat check outlasts it.
func TestSourceConformance(t *testing.T) {
	forEachServer(t, func(t *testing.T, e *env) {
		const ackWait = time.Second
		dlSubj := e.subj + "_dlq"
		e.createStream(t, e.stream+"_DLQ", dlSubj+".>")
		sourcetest.Run(t, func(t *testing.T) *sourcetest.Env {
			// Each check has a subject and a durable of its own on the
			// stream: a filter keeps it to its own messages.
			id := testenv.RandID()
			subj := e.subj + "." + id
			return &sourcetest.Env{
				Transport: "nats",
				AckWait:   ackWait,
				NewSource: func(t *testing.T) consumer.Source {
					return newSource(t, e, natssource.Config{
						Consumer: "c" + id, Subject: subj, AckWait: ackWait, DeadLetterSubject: dlSubj + "." + id,
					})
				},
				Publish: func(t *testing.T, ms ...sourcetest.Msg) {
					ctx := ctxT(t, 10*time.Second)
					for _, m := range ms {
						nm := nats.NewMsg(subj)
						nm.Data = []byte(m.Payload)
						for k, vs := range m.Header {
							for _, v := range vs {
								nm.Header.Add(k, v)
							}
						}
						if _, err := e.js.PublishMsg(ctx, nm); err != nil {
							t.Fatalf("publish: %v", err)
						}
					}
				},
				DeadLetters: func(t *testing.T) []*consumer.Message {
					ctx := ctxT(t, 5*time.Second)
					st, err := e.js.Stream(ctx, e.stream+"_DLQ")
					if err != nil {
						t.Fatal(err)
					}
					var out []*consumer.Message
					for seq := uint64(1); ; seq++ {
						raw, err := st.GetMsg(ctx, seq)
						if errors.Is(err, jetstream.ErrMsgNotFound) {
							return out
						}
						if err != nil {
							t.Fatalf("reading dead letter %d: %v", seq, err)
						}
						if raw.Subject != dlSubj+"."+id {
							continue
						}
						h := consumer.Header{}
						for k, vs := range raw.Header {
							h[k] = append(h[k], vs...)
						}
						out = append(out, &consumer.Message{Payload: raw.Data, Header: h})
					}
				},
			}
		})
	})
}
