package kafkasource

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
)

// newHeader converts one message's headers as the dispatcher does.
func newHeader(hs []kafka.Header) consumer.Header {
	s := newHeaderSpace([]kafka.Message{{Headers: hs}})
	return s.header(hs)
}

// TestNewHeader: every value is kept, in order, also for a repeated key and
// an empty value, and values do not overwrite each other in the shared
// backing slice.
func TestNewHeader(t *testing.T) {
	h := newHeader([]kafka.Header{
		{Key: "Idempotency-Key", Value: []byte("k1")},
		{Key: "trace", Value: []byte("a")},
		{Key: "trace", Value: []byte("b")},
		{Key: "empty", Value: nil},
		{Key: "last", Value: []byte("z")},
	})
	want := map[string][]string{"Idempotency-Key": {"k1"}, "trace": {"a", "b"}, "empty": {""}, "last": {"z"}}
	if len(h) != len(want) {
		t.Fatalf("header %v, want %v", h, want)
	}
	for k, vs := range want {
		if !slices.Equal(h[k], vs) {
			t.Fatalf("header %q = %q, want %q (whole: %v)", k, h[k], vs, h)
		}
	}
	if newHeader(nil) != nil {
		t.Fatal("no headers must give a nil Header")
	}
}

// TestHeaderSpaceAcrossMessages: the headers of a chunk share their
// backing, yet each message gets its own values in order, a message
// without headers gets nil, and appending to one message's value list
// leaves the next message's values alone.
func TestHeaderSpaceAcrossMessages(t *testing.T) {
	ms := []kafka.Message{
		{Headers: []kafka.Header{{Key: "k", Value: []byte("one")}, {Key: "t", Value: []byte("a")}}},
		{},
		{Headers: []kafka.Header{{Key: "k", Value: []byte("two")}, {Key: "t", Value: []byte("b")}, {Key: "t", Value: []byte("c")}}},
		{Headers: []kafka.Header{{Key: "k", Value: []byte("three")}}},
	}
	s := newHeaderSpace(ms)
	hs := make([]consumer.Header, len(ms))
	for i := range ms {
		hs[i] = s.header(ms[i].Headers)
	}
	want := []map[string][]string{
		{"k": {"one"}, "t": {"a"}},
		nil,
		{"k": {"two"}, "t": {"b", "c"}},
		{"k": {"three"}},
	}
	hs[0]["k"] = append(hs[0]["k"], "appended")
	hs[0]["t"] = append(hs[0]["t"], "appended")
	want[0]["k"] = append(want[0]["k"], "appended")
	want[0]["t"] = append(want[0]["t"], "appended")
	for i, w := range want {
		if w == nil {
			if hs[i] != nil {
				t.Fatalf("message %d: header %v, want nil (no headers)", i, hs[i])
			}
			continue
		}
		if len(hs[i]) != len(w) {
			t.Fatalf("message %d: header %v, want %v", i, hs[i], w)
		}
		for k, vs := range w {
			if !slices.Equal(hs[i][k], vs) {
				t.Fatalf("message %d: header %q = %q, want %q", i, k, hs[i][k], vs)
			}
		}
	}
}
