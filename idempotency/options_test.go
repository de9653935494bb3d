package idempotency_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// Every invalid handler option is a *consumer.ConfigError naming the
// option, wrapping ErrInvalidOption.
func TestValidateOptionsNamesTheOption(t *testing.T) {
	t.Parallel()
	cases := []struct {
		field string
		opt   idempotency.Option
	}{
		{"KeySources", idempotency.WithKeySources()},
		{"KeySources[1]", idempotency.WithKeySources(idempotency.HeaderKey("K"), idempotency.KeySource{})},
		{"MissingKey", idempotency.WithMissingKey("drop")},
		{"Mismatch", idempotency.WithMismatch("overwrite")},
		{"Lease", idempotency.WithLease(99 * time.Millisecond)},
		{"Retention", idempotency.WithRetention(999 * time.Millisecond)},
		{"MaxAttempts", idempotency.WithMaxAttempts(0)},
		{"Backoff.Initial", idempotency.WithBackoff(0, time.Second)},
		{"Backoff.Max", idempotency.WithBackoff(time.Minute, time.Second)},
		{"InFlightWait", idempotency.WithInFlightWait(-time.Second)},
		{"StoreRetry.Initial", idempotency.WithStoreRetry(-time.Second, time.Second)},
		{"StoreRetry.Max", idempotency.WithStoreRetry(time.Second, time.Millisecond)},
	}
	for _, tc := range cases {
		err := idempotency.ValidateOptions(tc.opt)
		var ce *consumer.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || ce.Reason == "" {
			t.Errorf("%s: ValidateOptions = %v, want a ConfigError for %s", tc.field, err, tc.field)
			continue
		}
		if !errors.Is(err, idempotency.ErrInvalidOption) {
			t.Errorf("%s: %v does not wrap ErrInvalidOption", tc.field, err)
		}
	}
	valid := []idempotency.Option{
		idempotency.WithLease(100 * time.Millisecond), idempotency.WithRetention(time.Second),
		idempotency.WithMaxAttempts(1), idempotency.WithBackoff(time.Second, time.Second),
		idempotency.WithMissingKey(idempotency.MissingKeyPassthrough), idempotency.WithMismatch(idempotency.MismatchIgnore),
	}
	if err := idempotency.ValidateOptions(valid...); err != nil {
		t.Errorf("the smallest valid values: %v", err)
	}
	if err := idempotency.ValidateOptions(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}
