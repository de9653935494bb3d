package kafkasource

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
)

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
