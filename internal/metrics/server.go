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
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
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

func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	type result struct {
		Name  string `json:"name"`
		OK    bool   `json:"ok"`
		Error string `json:"error,omitempty"`
	}
	results := make([]result, len(s.checks))
	var wg sync.WaitGroup
	for i, c := range s.checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), checkTimeout)
			defer cancel()
			results[i] = result{Name: c.Name, OK: true}
			if err := c.Fn(ctx); err != nil {
				results[i] = result{Name: c.Name, Error: err.Error()}
			}
		})
	}
	wg.Wait()
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
