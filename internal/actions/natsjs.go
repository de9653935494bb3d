package actions

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
)

// publishAckTimeout bounds the wait for a batch's JetStream PubAcks when the
// handler's context has no earlier deadline: the default timeout of a
// synchronous JetStream publish.
const publishAckTimeout = 5 * time.Second

// NATSJetStream is a jetstream.JetStream whose asynchronous publishes answer
// the ForwardNATS runs that wait for them, without a jetstream.PubAckFuture
// per message. jetstream calls the context's ack and error handlers with the
// *nats.Msg that was published; a run registers each of its messages before
// publishing it and is answered by those handlers, so it waits on one
// channel for the whole run instead of on two per message (a future's Ok
// and Err channels are each made when first asked for). Every error
// jetstream reports for an async publish reaches the handler: an error
// PubAck, no responders after its retries, the context's
// WithPublishAsyncTimeout, a reconnect (nats.ErrDisconnected for every
// message then pending) and CleanupPublisher.
//
// Other async publishes on the context (with futures) work as on any
// jetstream.JetStream; the handlers ignore the messages no run registered.
type NATSJetStream struct {
	jetstream.JetStream
	acks *pubAcks
}

// NewNATSJetStream makes a JetStream context on nc as jetstream.New does,
// with opts, and with its async ack and error handlers set to answer
// ForwardNATS's runs: a WithPublishAsyncAckHandler or
// WithPublishAsyncErrHandler in opts is replaced.
func NewNATSJetStream(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (*NATSJetStream, error) {
	a := &pubAcks{pending: map[*nats.Msg]pubSlot{}}
	all := make([]jetstream.JetStreamOpt, 0, len(opts)+2)
	all = append(all, opts...)
	all = append(all, jetstream.WithPublishAsyncAckHandler(a.acked), jetstream.WithPublishAsyncErrHandler(a.failed))
	js, err := jetstream.New(nc, all...)
	if err != nil {
		return nil, err
	}
	return &NATSJetStream{JetStream: js, acks: a}, nil
}

// pubAcks routes the answers of a JetStream context's async publishes to
// the runs that registered their messages. A run's message is registered
// from before its publish until its answer or the end of the run's wait,
// whichever is first; an answer for a message not registered (a later
// answer, or another publisher's message) is dropped.
type pubAcks struct {
	mu      sync.Mutex
	pending map[*nats.Msg]pubSlot
}

// pubSlot is where a registered message's answer goes: its index in run.
type pubSlot struct {
	run *pubRun
	i   int
}

// pubRun is one ForwardNATS run's wait for its answers. answers and left
// are guarded by pubAcks.mu until done is closed or the run's messages are
// unregistered (pubAcks.drop); the run reads answers only after that.
type pubRun struct {
	answers []pubAnswer
	left    int           // registered messages still unanswered
	done    chan struct{} // closed when left reaches 0
}

// pubAnswer is a message's PubAck or its error; neither means no answer.
type pubAnswer struct {
	ack *jetstream.PubAck
	err error
}

// register records msgs as run's messages, each unanswered.
func (a *pubAcks) register(run *pubRun, msgs []nats.Msg) {
	a.mu.Lock()
	for i := range msgs {
		a.pending[&msgs[i]] = pubSlot{run: run, i: i}
	}
	run.left = len(msgs)
	a.mu.Unlock()
}

// answer gives m's run its answer, once: it unregisters m.
func (a *pubAcks) answer(m *nats.Msg, ans pubAnswer) {
	a.mu.Lock()
	if s, ok := a.pending[m]; ok {
		delete(a.pending, m)
		s.run.answers[s.i] = ans
		s.run.left--
		if s.run.left == 0 {
			close(s.run.done)
		}
	}
	a.mu.Unlock()
}

// acked is the context's MsgAckHandler. jetstream calls it on the goroutine
// that reads PubAcks: it takes only a.mu, which is never held while calling
// into jetstream.
func (a *pubAcks) acked(_ jetstream.JetStream, m *nats.Msg, ack *jetstream.PubAck) {
	a.answer(m, pubAnswer{ack: ack})
}

// failed is the context's MsgErrHandler. jetstream may call it with its own
// publisher lock held (an ack timeout), so it too takes only a.mu.
func (a *pubAcks) failed(_ jetstream.JetStream, m *nats.Msg, err error) {
	a.answer(m, pubAnswer{err: err})
}

// drop unregisters the messages of run still unanswered: answers that come
// later are not run's.
func (a *pubAcks) drop(run *pubRun, msgs []nats.Msg) {
	a.mu.Lock()
	if run.left > 0 {
		for i := range msgs {
			delete(a.pending, &msgs[i]) // run's own: msgs is its array
		}
		run.left = 0
	}
	a.mu.Unlock()
}

// publishRun publishes msgs asynchronously and writes each one's result
// into results: "<stream>:<sequence>" once its PubAck is in, its own error,
// or "no PubAck" when neither came within ctx's deadline or
// publishAckTimeout.
func (js *NATSJetStream) publishRun(ctx context.Context, subject string, msgs []nats.Msg, results []consumer.Result) {
	if len(msgs) == 0 {
		return
	}
	run := &pubRun{answers: make([]pubAnswer, len(msgs)), done: make(chan struct{})}
	// Registered before the first publish: a PubAck can come before
	// PublishMsgAsync returns.
	js.acks.register(run, msgs)
	for i := range msgs {
		if _, err := js.PublishMsgAsync(&msgs[i]); err != nil {
			// Nothing was sent (jetstream dropped the message's
			// registration), so no other answer comes for it.
			js.acks.answer(&msgs[i], pubAnswer{err: err})
		}
	}
	wctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
	defer cancel()
	select {
	case <-run.done:
	case <-wctx.Done():
		js.acks.drop(run, msgs)
	}
	res := resultBlock{left: len(msgs)}
	for i, ans := range run.answers {
		switch {
		case ans.ack != nil:
			results[i].Value = res.add(ans.ack)
		case ans.err != nil:
			res.left--
			results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, ans.err)
		default:
			res.left--
			results[i].Err = fmt.Errorf("forward to nats %s: no PubAck: %w", subject, context.Cause(wctx))
		}
	}
}
