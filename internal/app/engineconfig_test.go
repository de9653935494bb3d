package app

import (
	"log/slog"
	"testing"
	"time"

	"github.com/idemkit/dedupworker"
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
		if got := workerConfig(&config.Config{Redis: config.Redis{CompletionLinger: c.set}}, nil, nil, nil).CompletionLinger; got != c.want {
			t.Errorf("completion_linger %s: worker's CompletionLinger %s, want %s", c.name, got, c.want)
		}
	}
	log, hooks := slog.New(slog.DiscardHandler), []dedupworker.Hook{&metricsless{}}
	if wc := workerConfig(&config.Config{}, log, hooks, nil); wc.Logger != log || len(wc.Hooks) != 1 {
		t.Errorf("workerConfig dropped the logger or the hooks: %+v", wc)
	}
	for y, want := range map[string]time.Duration{
		"":                                  idempotency.DefaultCompletionLinger,
		"redis:\n  completion_linger: 0s\n": -1,
	} {
		cfg, err := config.Parse([]byte(y+"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x]}}\n"), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		if got := workerConfig(cfg, nil, nil, nil).CompletionLinger; got != want {
			t.Errorf("parsed %q: worker's CompletionLinger %s, want %s", y, got, want)
		}
	}
}

// metricsless is a hook that counts nothing.
type metricsless struct{}

func (*metricsless) OnInflight(string, int) {}
