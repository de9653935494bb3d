package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/config"
)

// The worker's logs write durations as text in both formats, at the top
// level, in groups and through With.
func TestLoggerDurationsAsText(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := newLogger(&buf, config.Log{Level: "info", Format: "json"})
	log.With("lease", config.Duration(30*time.Second)).Info("x",
		"ack_wait", 30*time.Second,
		slog.Group("backoff", "max", 5*time.Minute, "initial", config.Duration(time.Second)),
		"count", 3)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	backoff, _ := line["backoff"].(map[string]any)
	if line["ack_wait"] != "30s" || line["lease"] != "30s" || backoff["max"] != "5m0s" || backoff["initial"] != "1s" || line["count"] != float64(3) {
		t.Errorf("JSON log line %s: want ack_wait and lease \"30s\", backoff.max \"5m0s\", backoff.initial \"1s\", count 3", buf.String())
	}

	buf.Reset()
	newLogger(&buf, config.Log{Level: "info", Format: "text"}).Info("x", "ack_wait", 90*time.Second)
	if !strings.Contains(buf.String(), "ack_wait=1m30s") {
		t.Errorf("text log line %q: want ack_wait=1m30s", buf.String())
	}
}
