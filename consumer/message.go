package consumer

import (
	"net/textproto"
	"strconv"
)

// Header holds message headers. Kafka headers may repeat a name, so a name
// maps to every value in arrival order. Lookups by Get are case-insensitive;
// the map keeps names as the transport delivered them.
type Header map[string][]string

// Get returns the first value of the named header, matching the name without
// regard to case, or "" when it is absent.
func (h Header) Get(name string) string {
	if v, ok := h[name]; ok && len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && equalFold(k, name) {
			return v[0]
		}
	}
	return ""
}

// Set replaces every header of the name (in any case) with the single value.
func (h Header) Set(name, value string) {
	h.Del(name)
	h[name] = []string{value}
}

// Del removes every header of the name, in any case.
func (h Header) Del(name string) {
	for k := range h {
		if equalFold(k, name) {
			delete(h, k)
		}
	}
}

// Clone returns a deep copy of h; the clone of nil is nil.
func (h Header) Clone() Header {
	if h == nil {
		return nil
	}
	c := make(Header, len(h))
	for k, v := range h {
		c[k] = append([]string(nil), v...)
	}
	return c
}

func equalFold(a, b string) bool {
	return len(a) == len(b) && textproto.CanonicalMIMEHeaderKey(a) == textproto.CanonicalMIMEHeaderKey(b)
}

// Origin says where a message came from. Transports fill it; dead-letter
// headers and logs name it.
type Origin struct {
	// Transport is "kafka" or "nats".
	Transport string
	// Topic is the Kafka topic or the JetStream stream.
	Topic string
	// Subject is the NATS subject the message was published to; empty for Kafka.
	Subject string
	// Partition is the Kafka partition; 0 for NATS.
	Partition int
	// Offset is the Kafka offset or the JetStream stream sequence.
	Offset int64
}

// String renders the origin for logs: "kafka orders/3@1042" or
// "nats ORDERS#17 (orders.eu)".
func (o Origin) String() string {
	if o.Transport == "kafka" {
		return "kafka " + o.Topic + "/" + strconv.Itoa(o.Partition) + "@" + strconv.FormatInt(o.Offset, 10)
	}
	s := o.Transport + " " + o.Topic + "#" + strconv.FormatInt(o.Offset, 10)
	if o.Subject != "" {
		s += " (" + o.Subject + ")"
	}
	return s
}

// Message is one message as a handler sees it. Handlers must treat it as
// read-only; it is shared with the transport until the delivery is settled.
type Message struct {
	// Key is the Kafka message key (usually an entity id, not a message id);
	// nil for NATS.
	Key []byte
	// Payload is the message body.
	Payload []byte
	// Header holds the message headers.
	Header Header
	// Origin names the topic/stream and position the message came from.
	Origin Origin
}
