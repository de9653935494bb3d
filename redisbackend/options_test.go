package redisbackend_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/redisbackend"
)

// optionField is the Field of err's *consumer.ConfigError when err wraps
// ErrInvalidOptions, else "".
func optionField(err error) string {
	var ce *consumer.ConfigError
	if !errors.As(err, &ce) || !errors.Is(err, redisbackend.ErrInvalidOptions) || ce.Reason == "" {
		return ""
	}
	return ce.Field
}

// New and Options.Validate refuse each bad field with the same ConfigError,
// naming it by its Go path, and accept the zero value.
func TestOptionsNameTheField(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	for _, tc := range []struct {
		opts  redisbackend.Options
		field string
	}{
		{redisbackend.Options{Namespace: "{dedup}"}, "Namespace"},
		{redisbackend.Options{Grace: -time.Second}, "Grace"},
		{redisbackend.Options{Grace: time.Microsecond}, "Grace"},
		{redisbackend.Options{PollFloor: -time.Second}, "PollFloor"},
		{redisbackend.Options{PollCap: -time.Second}, "PollCap"},
		{redisbackend.Options{PollFloor: time.Second, PollCap: time.Millisecond}, "PollCap"},
		{redisbackend.Options{Durability: redisbackend.Durability{Replicas: -1}}, "Durability.Replicas"},
		{redisbackend.Options{Durability: redisbackend.Durability{Replicas: 1}}, "Durability.Timeout"},
		{redisbackend.Options{Durability: redisbackend.Durability{Replicas: 1, Timeout: 500 * time.Microsecond}}, "Durability.Timeout"},
		{redisbackend.Options{LocalCache: redisbackend.LocalCache{Entries: -1, TTL: time.Second}}, "LocalCache.Entries"},
		{redisbackend.Options{LocalCache: redisbackend.LocalCache{Entries: 10}}, "LocalCache.TTL"},
		{redisbackend.Options{LocalCache: redisbackend.LocalCache{Entries: 10, TTL: -time.Second}}, "LocalCache.TTL"},
		{redisbackend.Options{LocalCache: redisbackend.LocalCache{TTL: time.Second}}, "LocalCache.Entries"},
	} {
		_, err := redisbackend.New(client, tc.opts)
		if got := optionField(err); got != tc.field {
			t.Errorf("New(%+v) = %v, want a ConfigError for %s", tc.opts, err, tc.field)
		}
		if verr := tc.opts.Validate(); verr == nil || err == nil || verr.Error() != err.Error() {
			t.Errorf("%+v: Validate = %v, New = %v; want the same error", tc.opts, verr, err)
		}
	}
	if err := (redisbackend.Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v", err)
	}
}
