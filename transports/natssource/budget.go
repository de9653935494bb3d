package natssource

import (
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/bytebudget"
)

// msgOverhead is what a received message costs beside its bytes: its
// nats.Msg, the jetstream message wrapping it, its delivery, and the
// size-class rounding of the allocations of its bytes and subjects.
const msgOverhead = int64(unsafe.Sizeof(nats.Msg{})+unsafe.Sizeof(delivery{})) + 96

// headerEntry is one decoded header value beside its bytes: its string and
// its []string in the header map, and the header line's ": " and CRLF as
// received.
const headerEntry = int64(unsafe.Sizeof("")+unsafe.Sizeof([]string(nil))) + 4

// messageCost is what the bound counts for m: its payload, its subject and
// reply subject, its headers twice (the client keeps the bytes as received
// beside the decoded map) and msgOverhead.
func messageCost(m jetstream.Msg) int64 {
	n := int64(len(m.Data())+len(m.Subject())+len(m.Reply())) + msgOverhead
	h := m.Headers()
	if len(h) == 0 {
		return n
	}
	for k, vs := range h {
		for _, v := range vs {
			n += 2*int64(len(k)+len(v)) + headerEntry
		}
	}
	return n + bytebudget.HeaderMapCost(len(h))
}

// pullSlack is what a pull request's bytes allow beside the server's
// max_payload: the server counts a message's subject and reply (ack)
// subject too, and both are bounded by its max_control_line (4 KiB by
// default).
const pullSlack = 8 << 10

// unknownMaxPayload is the max_payload assumed while the connection has
// not told it: the most a server allows.
const unknownMaxPayload = 64 << 20

// pullBytes is the most bytes one pull request asks for: an eighth of
// Config.FetchBufferBytes, so that the client's pull buffer (about two
// requests) adds at most a quarter of the bound to what the bound holds,
// and never less than the largest message the
// server can send, since a request whose bytes cannot take the next
// message is ended by the server (409 Message Size Exceeds MaxBytes) and
// the library asks again, for ever, without a word. A consumer's
// MaxRequestMaxBytes caps it (the server refuses larger requests).
func (s *Source) pullBytes(cons jetstream.Consumer) int {
	largest := s.js.Conn().MaxPayload()
	if largest <= 0 {
		largest = unknownMaxPayload
	}
	n := max(s.cfg.FetchBufferBytes/8, int(largest)+pullSlack)
	if info := cons.CachedInfo(); info != nil && info.Config.MaxRequestMaxBytes > 0 && info.Config.MaxRequestMaxBytes < n {
		if info.Config.MaxRequestMaxBytes < int(largest)+pullSlack {
			s.log.Warn("the consumer's MaxRequestMaxBytes is below the server's max_payload: a message larger than it stops this consumer's deliveries; raise it (nats consumer edit) or unset it",
				"max_request_max_bytes", info.Config.MaxRequestMaxBytes, "max_payload", largest)
		}
		n = info.Config.MaxRequestMaxBytes
	}
	return n
}
