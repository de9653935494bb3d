package actions

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
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

// The no-responders retries of an async publish, as jetstream makes them
// (jetstream.DefaultPubRetryAttempts after jetstream.DefaultPubRetryWait):
// a stream whose leader is being elected has no responder for a moment.
const (
	pubRetryAttempts = jetstream.DefaultPubRetryAttempts
	pubRetryWait     = jetstream.DefaultPubRetryWait
)

// NATSJetStream is a jetstream.JetStream that publishes ForwardNATS's runs
// asynchronously itself, on the connection's core API. jetstream's own
// async publish costs each message a PubAckFuture, an entry in a map keyed
// by reply token, and an encoding/json decode of its PubAck; here a run
// registers its messages under reply ids of one subscription of its own,
// waits on one channel for the whole run, and reads each PubAck with a
// scanner for the objects nats-server writes (keys "stream", "seq",
// "domain", "duplicate"), leaving any other answer, errors included, to
// encoding/json as jetstream decodes it. jetstream's guarantees for an
// async publish hold:
//   - a no-responders answer is published again pubRetryAttempts times,
//     pubRetryWait apart, then fails with jetstream.ErrNoStreamResponse;
//   - an error answer fails its message with the *jetstream.APIError, an
//     answer that is no PubAck with jetstream.ErrInvalidJSAck;
//   - the connection's RECONNECTING fails every message then waiting with
//     nats.ErrDisconnected (its subscription may have lost answers), and
//     CLOSED with nats.ErrConnectionClosed; an answer that comes later is
//     dropped;
//   - a message whose publish fails at once fails with that error.
//
// The context's own async publish options (WithPublishAsyncMaxPending and
// the like) do not bound the runs' publishes: ForwardNATS's callers bound
// them by their concurrency. The goroutine that watches the connection's
// status ends when the connection closes.
type NATSJetStream struct {
	jetstream.JetStream
	nc     *nats.Conn
	prefix string // reply subjects: prefix + id in base 36

	mu      sync.Mutex
	pending map[uint64]pubSlot // the registered messages by reply id
	next    uint64             // the next reply id
	stream  string             // the last PubAck's stream name, reused while it repeats
}

// NewNATSJetStream makes a JetStream context on nc as jetstream.New does,
// with opts, subscribes to the reply subjects of its runs' publishes, and
// watches nc's status for disconnects.
func NewNATSJetStream(nc *nats.Conn, opts ...jetstream.JetStreamOpt) (*NATSJetStream, error) {
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		return nil, err
	}
	n := &NATSJetStream{JetStream: js, nc: nc, prefix: nc.NewInbox() + ".", pending: map[uint64]pubSlot{}}
	// Listening before subscribing: no disconnect of the subscription's
	// lifetime goes unseen.
	status := nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	if _, err := nc.Subscribe(n.prefix+"*", n.reply); err != nil {
		nc.RemoveStatusListener(status)
		return nil, fmt.Errorf("nats: subscribing to the PubAcks of forward.nats: %w", err)
	}
	go n.failOnDisconnect(status)
	return n, nil
}

// pubSlot is where a registered message's answer goes: its index in run,
// and how many no-responders answers it was republished after.
type pubSlot struct {
	run     *pubRun
	i       int
	retries int
}

// pubRun is one ForwardNATS run's wait for its answers. answers and left
// are guarded by NATSJetStream.mu until done is closed or the run's
// messages are unregistered (drop); the run reads answers only after that.
type pubRun struct {
	msgs    []nats.Msg
	base    uint64 // msgs[i]'s reply id is base+i
	answers []pubAnswer
	left    int           // registered messages still unanswered
	done    chan struct{} // closed when left reaches 0
}

// pubAnswer is a message's PubAck (its stream, with seq) or its error;
// neither means no answer.
type pubAnswer struct {
	stream string
	seq    uint64
	err    error
}

// register gives msgs their reply ids and reply subjects and records them
// as run's, each unanswered.
func (js *NATSJetStream) register(run *pubRun) {
	n := len(run.msgs)
	js.mu.Lock()
	run.base = js.next
	js.next += uint64(n)
	for i := range n {
		js.pending[run.base+uint64(i)] = pubSlot{run: run, i: i}
	}
	run.left = n
	js.mu.Unlock()
	// The run's reply subjects share one string.
	var b strings.Builder
	b.Grow(n * (len(js.prefix) + 13)) // 13: the base-36 digits of the largest uint64
	ends := make([]int, n)
	for i := range n {
		b.WriteString(js.prefix)
		var digits [13]byte
		b.Write(strconv.AppendUint(digits[:0], run.base+uint64(i), 36))
		ends[i] = b.Len()
	}
	all, start := b.String(), 0
	for i := range n {
		run.msgs[i].Reply = all[start:ends[i]]
		start = ends[i]
	}
}

// answerLocked gives message id its answer, once: it unregisters the
// message. js.mu is held.
func (js *NATSJetStream) answerLocked(id uint64, ans pubAnswer) {
	s, ok := js.pending[id]
	if !ok {
		return
	}
	delete(js.pending, id)
	s.run.answers[s.i] = ans
	s.run.left--
	if s.run.left == 0 {
		close(s.run.done)
	}
}

func (js *NATSJetStream) answer(id uint64, ans pubAnswer) {
	js.mu.Lock()
	js.answerLocked(id, ans)
	js.mu.Unlock()
}

// drop unregisters the messages of run still unanswered: answers that come
// later are not run's.
func (js *NATSJetStream) drop(run *pubRun) {
	js.mu.Lock()
	if run.left > 0 {
		for i := range run.msgs {
			delete(js.pending, run.base+uint64(i))
		}
		run.left = 0
	}
	js.mu.Unlock()
}

// reply is the handler of the reply subscription: a PubAck, an error
// PubAck, or a no-responders status for one registered message.
func (js *NATSJetStream) reply(m *nats.Msg) {
	if len(m.Subject) <= len(js.prefix) {
		return
	}
	id, err := strconv.ParseUint(m.Subject[len(js.prefix):], 36, 64)
	if err != nil {
		return
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		js.noResponders(id)
		return
	}
	stream, seq, ok := fastPubAck(m.Data)
	if !ok {
		js.answer(id, decodePubAck(m.Data))
		return
	}
	js.mu.Lock()
	defer js.mu.Unlock()
	if string(stream) != js.stream {
		js.stream = string(stream)
	}
	js.answerLocked(id, pubAnswer{stream: js.stream, seq: seq})
}

// noResponders republishes message id after pubRetryWait, or fails it with
// jetstream.ErrNoStreamResponse once it was retried pubRetryAttempts times.
// The timer publishes only if the message is still registered then.
func (js *NATSJetStream) noResponders(id uint64) {
	js.mu.Lock()
	defer js.mu.Unlock()
	s, ok := js.pending[id]
	if !ok {
		return
	}
	if s.retries >= pubRetryAttempts {
		js.answerLocked(id, pubAnswer{err: jetstream.ErrNoStreamResponse})
		return
	}
	s.retries++
	js.pending[id] = s
	time.AfterFunc(pubRetryWait, func() {
		js.mu.Lock()
		_, ok := js.pending[id]
		js.mu.Unlock()
		if !ok {
			return
		}
		if err := js.nc.PublishMsg(&s.run.msgs[s.i]); err != nil {
			js.answer(id, pubAnswer{err: err})
		}
	})
}

// failOnDisconnect fails every registered message when the connection
// starts reconnecting (its subscription's answers may be lost) or closes,
// until it closes.
func (js *NATSJetStream) failOnDisconnect(status chan nats.Status) {
	for st := range status {
		err := nats.ErrDisconnected
		if st == nats.CLOSED {
			err = nats.ErrConnectionClosed
		}
		js.mu.Lock()
		for id := range js.pending {
			js.answerLocked(id, pubAnswer{err: err})
		}
		js.mu.Unlock()
		if st == nats.CLOSED {
			js.nc.RemoveStatusListener(status)
			return
		}
	}
}

// fastPubAck reads the PubAck nats-server writes for a stored message: an
// object of "stream" and "seq", maybe "domain" and "duplicate", strings
// without escapes, any JSON whitespace between tokens (2.9 writes
// {"stream":S, "seq":N}, 2.10 and later without the space). ok is false for
// anything else, which encoding/json then reads (decodePubAck).
func fastPubAck(data []byte) (stream []byte, seq uint64, ok bool) {
	p := pubAckScanner{b: data}
	if !p.byte('{') {
		return nil, 0, false
	}
	var haveSeq bool
	for first := true; ; first = false {
		if p.byte('}') {
			p.space()
			return stream, seq, !first && len(p.b) == 0 && len(stream) > 0 && haveSeq
		}
		if !first && !p.byte(',') {
			return nil, 0, false
		}
		key, ok := p.str()
		if !ok || !p.byte(':') {
			return nil, 0, false
		}
		switch string(key) {
		case "stream":
			if stream, ok = p.str(); !ok {
				return nil, 0, false
			}
		case "domain":
			if _, ok = p.str(); !ok {
				return nil, 0, false
			}
		case "seq":
			if seq, ok = p.uint(); !ok {
				return nil, 0, false
			}
			haveSeq = true
		case "duplicate":
			if !p.word("true") && !p.word("false") {
				return nil, 0, false
			}
		default:
			return nil, 0, false
		}
	}
}

// pubAckScanner reads the tokens of a PubAck from the front of b; each
// method skips the whitespace before its token and reports whether the
// token was there.
type pubAckScanner struct{ b []byte }

func (p *pubAckScanner) space() {
	for len(p.b) > 0 && (p.b[0] == ' ' || p.b[0] == '\t' || p.b[0] == '\n' || p.b[0] == '\r') {
		p.b = p.b[1:]
	}
}

func (p *pubAckScanner) byte(c byte) bool {
	p.space()
	if len(p.b) == 0 || p.b[0] != c {
		return false
	}
	p.b = p.b[1:]
	return true
}

func (p *pubAckScanner) word(w string) bool {
	p.space()
	if !bytes.HasPrefix(p.b, []byte(w)) {
		return false
	}
	p.b = p.b[len(w):]
	return true
}

// str is a string without escapes.
func (p *pubAckScanner) str() ([]byte, bool) {
	if !p.byte('"') {
		return nil, false
	}
	end := bytes.IndexByte(p.b, '"')
	if end < 0 || bytes.IndexByte(p.b[:end], '\\') >= 0 {
		return nil, false
	}
	s := p.b[:end]
	p.b = p.b[end+1:]
	return s, true
}

// uint is a non-negative integer that fits a uint64, without sign,
// fraction or exponent.
func (p *pubAckScanner) uint() (uint64, bool) {
	p.space()
	n := 0
	for n < len(p.b) && p.b[n] >= '0' && p.b[n] <= '9' {
		n++
	}
	if n == 0 || n > 1 && p.b[0] == '0' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.b[:n]), 10, 64)
	if err != nil {
		return 0, false
	}
	p.b = p.b[n:]
	return v, true
}

// pubAckReply is a PubAck or the error JetStream answered instead, as
// jetstream decodes it.
type pubAckReply struct {
	Error *jetstream.APIError `json:"error,omitempty"`
	*jetstream.PubAck
}

// decodePubAck is a PubAck's answer decoded with encoding/json, with the
// errors jetstream's async publish reports for it.
func decodePubAck(data []byte) pubAnswer {
	var r pubAckReply
	switch {
	case json.Unmarshal(data, &r) != nil:
		return pubAnswer{err: jetstream.ErrInvalidJSAck}
	case r.Error != nil:
		return pubAnswer{err: r.Error}
	case r.PubAck == nil || r.Stream == "":
		return pubAnswer{err: jetstream.ErrInvalidJSAck}
	}
	return pubAnswer{stream: r.Stream, seq: r.Sequence}
}

// publishRun publishes msgs asynchronously and writes each one's result
// into results: "<stream>:<sequence>" once its PubAck is in, its own error,
// or "no PubAck" when neither came within ctx's deadline or
// publishAckTimeout.
func (js *NATSJetStream) publishRun(ctx context.Context, subject string, msgs []nats.Msg, results []consumer.Result) {
	if len(msgs) == 0 {
		return
	}
	run := &pubRun{msgs: msgs, answers: make([]pubAnswer, len(msgs)), done: make(chan struct{})}
	// Registered before the first publish: a PubAck can come before
	// PublishMsg returns.
	js.register(run)
	for i := range msgs {
		if err := js.nc.PublishMsg(&msgs[i]); err != nil {
			js.answer(run.base+uint64(i), pubAnswer{err: err})
		}
	}
	wctx, cancel := context.WithTimeout(ctx, publishAckTimeout)
	defer cancel()
	select {
	case <-run.done:
	case <-wctx.Done():
		js.drop(run)
	}
	res := resultBlock{left: len(msgs)}
	for i, ans := range run.answers {
		switch {
		case ans.err != nil:
			res.left--
			results[i].Err = fmt.Errorf("forward to nats %s: %w", subject, ans.err)
		case ans.stream != "":
			results[i].Value = res.add(ans.stream, ans.seq)
		default:
			res.left--
			results[i].Err = fmt.Errorf("forward to nats %s: no PubAck: %w", subject, context.Cause(wctx))
		}
	}
}
