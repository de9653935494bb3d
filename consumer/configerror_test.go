package consumer_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
)

// A ConfigError is found by errors.As and its sentinel by errors.Is through
// a caller's wrapping and through errors.Join, and renders sentinel, field
// and reason.
func TestConfigErrorWrapsItsSentinel(t *testing.T) {
	errBad := errors.New("dedup: thing: invalid config")
	ce := &consumer.ConfigError{Field: "Durability.Timeout", Reason: "0s: must be positive", Err: errBad}
	if got, want := ce.Error(), "dedup: thing: invalid config: Durability.Timeout: 0s: must be positive"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	other := &consumer.ConfigError{Field: "Topic", Reason: "required", Err: errBad}
	for _, err := range []error{
		fmt.Errorf("handler %q: %w", "orders", ce),
		errors.Join(ce, other),
	} {
		var got *consumer.ConfigError
		if !errors.As(err, &got) || got != ce {
			t.Errorf("errors.As(%v) = %v, want the first ConfigError", err, got)
		}
		if !errors.Is(err, errBad) {
			t.Errorf("errors.Is(%v, sentinel) = false", err)
		}
	}
	if errors.Is(ce, errors.New("dedup: thing: invalid config")) {
		t.Error("errors.Is matched a different sentinel with the same text")
	}
	noSentinel := &consumer.ConfigError{Field: "Lease", Reason: "must be positive"}
	if got, want := noSentinel.Error(), "dedup: invalid config: Lease: must be positive"; got != want {
		t.Errorf("without a sentinel: Error() = %q, want %q", got, want)
	}
}
