package app

import (
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/config"
)

// redis.completion_linger reaches the engine: omitted as the library's
// default (0), 0s as off (negative), a duration as itself; and what Parse
// fills in for an omitted one is the library's default too.
func TestEngineConfigCompletionLinger(t *testing.T) {
	dur := func(d time.Duration) *config.Duration { c := config.Duration(d); return &c }
	for _, c := range []struct {
		name string
		set  *config.Duration
		want time.Duration
	}{
		{"omitted", nil, 0},
		{"0s", dur(0), -1},
		{"5ms", dur(5 * time.Millisecond), 5 * time.Millisecond},
	} {
		if got := engineConfig(&config.Redis{CompletionLinger: c.set}, nil, nil).CompletionLinger; got != c.want {
			t.Errorf("completion_linger %s: engine's CompletionLinger %s, want %s", c.name, got, c.want)
		}
	}
	log, hooks := slog.New(slog.DiscardHandler), consumer.Hooks{struct{}{}}
	if ec := engineConfig(&config.Redis{}, log, hooks); ec.Logger != log || len(ec.Hooks) != 1 {
		t.Errorf("engineConfig dropped the logger or the hooks: %+v", ec)
	}
	for y, want := range map[string]time.Duration{
		"":                                  idempotency.DefaultCompletionLinger,
		"redis:\n  completion_linger: 0s\n": -1,
	} {
		cfg, err := config.Parse([]byte(y+"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x]}}\n"), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		if got := engineConfig(&cfg.Redis, nil, nil).CompletionLinger; got != want {
			t.Errorf("parsed %q: engine's CompletionLinger %s, want %s", y, got, want)
		}
	}
}
