package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestReadyMetric: /metrics carries dedup_ready{check} for each readiness
// check, 1 when it passes and 0 when it fails, as /readyz reports them.
func TestReadyMetric(t *testing.T) {
	_, reg := newMetrics(t)
	failing := errors.New("connection refused")
	var fail atomic.Bool
	checks := []Check{
		{Name: "redis", Fn: func(context.Context) error {
			if fail.Load() {
				return failing
			}
			return nil
		}},
		{Name: "kafka orders", Fn: func(context.Context) error { return nil }},
	}
	srv, err := Listen("127.0.0.1:0", reg, checks, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	get := func(path string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		fail      bool
		redis     string
		readyCode int
	}{{false, "1", http.StatusOK}, {true, "0", http.StatusServiceUnavailable}} {
		fail.Store(tc.fail)
		_, body := get("/metrics")
		for _, want := range []string{`dedup_ready{check="redis"} ` + tc.redis, `dedup_ready{check="kafka orders"} 1`, "go_goroutines"} {
			if !strings.Contains(body, want) {
				t.Errorf("redis failing=%v: /metrics has no %s", tc.fail, want)
			}
		}
		if code, body := get("/readyz"); code != tc.readyCode {
			t.Errorf("redis failing=%v: /readyz %d %s, want %d", tc.fail, code, body, tc.readyCode)
		}
	}
}

// TestReadyMetricNoChecks: without checks there is no dedup_ready series.
func TestReadyMetricNoChecks(t *testing.T) {
	srv, err := Listen("127.0.0.1:0", prometheus.NewRegistry(), nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown(context.Background())
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + srv.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(b), "dedup_ready") {
		t.Errorf("/metrics without checks has dedup_ready:\n%s", b)
	}
}
