package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check is one readiness probe: the store, or a transport. It must honour
// ctx's deadline.
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	srv    *http.Server
	ln     net.Listener
	checks []Check
	log    *slog.Logger
	wg     sync.WaitGroup
}

// checkTimeout bounds each readiness check.
const checkTimeout = 2 * time.Second

// Listen binds addr and returns a Server ready to Serve. gatherer is the
// registry behind /metrics.
func Listen(addr string, gatherer prometheus.Gatherer, checks []Check, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{ln: ln, checks: checks, log: log}
	// dedup_ready comes from a registry of its own, beside gatherer's.
	ready := prometheus.NewRegistry()
	if len(checks) > 0 {
		if err := ready.Register(&readyCollector{desc: readyDesc, checks: checks}); err != nil {
			_ = ln.Close()
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(prometheus.Gatherers{gatherer, ready}, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.ready)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Start serves in a goroutine that Shutdown waits for.
func (s *Server) Start() {
	s.wg.Go(func() {
		if err := s.srv.Serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("metrics server stopped", "err", err)
		}
	})
}

// Shutdown stops the server and waits for it.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.wg.Wait()
	return err
}

// checkResult is one readiness check's outcome.
type checkResult struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// runChecks runs every check at once, each bounded by checkTimeout.
func runChecks(ctx context.Context, checks []Check) []checkResult {
	results := make([]checkResult, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, checkTimeout)
			defer cancel()
			results[i] = checkResult{Name: c.Name, OK: true}
			if err := c.Fn(ctx); err != nil {
				results[i] = checkResult{Name: c.Name, Error: err.Error()}
			}
		})
	}
	wg.Wait()
	return results
}

// readyDesc is dedup_ready{check}.
var readyDesc = prometheus.NewDesc("dedup_ready",
	"1 when the readiness check (the store, or a transport) passed, else 0: the checks of /readyz, run at each scrape, each bounded by 2s.",
	[]string{"check"}, nil)

// readyCollector exports dedup_ready: /readyz's checks run at each scrape,
// so that Prometheus sees a worker that is up but not ready, whether or not
// anything probes /readyz.
type readyCollector struct {
	desc   *prometheus.Desc
	checks []Check
}

// Describe sends dedup_ready's description.
func (c *readyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect runs the checks and sends one series for each.
func (c *readyCollector) Collect(ch chan<- prometheus.Metric) {
	for _, r := range runChecks(context.Background(), c.checks) {
		v := 0.0
		if r.OK {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, r.Name)
	}
}

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	results := runChecks(r.Context(), s.checks)
	status := http.StatusOK
	for _, res := range results {
		if !res.OK {
			status = http.StatusServiceUnavailable
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": status == http.StatusOK, "checks": results})
}
