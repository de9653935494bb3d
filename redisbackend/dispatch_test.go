package redisbackend

import (
	"log/slog"
	"testing"
)

// dispatch wakes the waiters of every key of a completion call's payload
// (a bare key, or "\n" key "\n" ... "\n"), keys holding a newline
// included, and no waiter of a key that is only part of a published one.
func TestDispatchBatchPayload(t *testing.T) {
	n := newNotifier(nil, "ch", slog.New(slog.DiscardHandler))
	keys := []string{"ns:a", "ns:b", "ns:multi\nline", "ns:a:b", "ns:c"}
	wakes := map[string]chan struct{}{}
	for _, k := range keys {
		wake := make(chan struct{}, 1)
		n.waiters[k] = map[chan struct{}]struct{}{wake: {}}
		wakes[k] = wake
	}
	woken := func() map[string]bool {
		got := map[string]bool{}
		for k, w := range wakes {
			select {
			case <-w:
				got[k] = true
			default:
			}
		}
		return got
	}
	for _, tc := range []struct {
		payload string
		want    []string
	}{
		{"ns:a", []string{"ns:a"}},
		{"\nns:b\nns:multi\nline\nns:a:b\n", []string{"ns:b", "ns:multi\nline", "ns:a:b"}},
		{"\nns:a:bc\nns:cc\n", nil},
	} {
		n.dispatch(tc.payload)
		got := woken()
		if len(got) != len(tc.want) {
			t.Errorf("payload %q woke %v, want %v", tc.payload, got, tc.want)
			continue
		}
		for _, k := range tc.want {
			if !got[k] {
				t.Errorf("payload %q did not wake %q (woke %v)", tc.payload, k, got)
			}
		}
	}
}
