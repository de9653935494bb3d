package actions

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/dedupworker"

	"github.com/idemkit/dedupworker/consumer"
)

// HTTPConfig configures the http action.
type HTTPConfig struct {
	Handler        string
	URL            string
	Timeout        time.Duration
	MaxResultBytes int
	// Headers are added to every request.
	Headers map[string]string
	// Concurrency is how many requests the handler may have in flight at
	// once; the default client keeps that many idle connections to the
	// server (HTTPClient). Default 1.
	Concurrency int
	// Client defaults to HTTPClient(Timeout, Concurrency).
	Client *http.Client
	Logger *slog.Logger
	// Inject adds the trace context to the request.
	Inject Injector
}

// HTTPClient is the http action's client: requests time out after timeout,
// and the transport (net/http's default one's settings otherwise) keeps up to
// concurrency idle connections to a server, so that each of that many
// requests in flight reuses one. net/http keeps two a host by default: with
// more requests in flight than that, every other request would dial a new
// connection and close it after, which costs the worker and the server a
// TCP handshake a request and leaves a TIME_WAIT socket behind each, enough
// at a few thousand requests a second to run the host out of ports.
func HTTPClient(timeout time.Duration, concurrency int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	n := max(concurrency, 1)
	tr.MaxIdleConnsPerHost = n
	tr.MaxIdleConns = max(tr.MaxIdleConns, n)
	return &http.Client{Timeout: timeout, Transport: tr}
}

// HTTP POSTs the payload with the original headers plus Idempotency-Key,
// X-Dedup-Key, X-Dedup-Fence, X-Dedup-Attempt and X-Dedup-Handler
// headers. 2xx succeeds and its body (up to MaxResultBytes) is the
// result; 4xx other than 408 and 429 is permanent; 5xx, 408, 429, timeouts
// and connection errors are transient (a Retry-After in seconds is honoured).
func HTTP(cfg HTTPConfig) consumer.Handler {
	client := cfg.Client
	if client == nil {
		client = HTTPClient(cfg.Timeout, cfg.Concurrency)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		ci := claimOf(ctx, cfg.Handler)
		if cfg.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cfg.URL, bytes.NewReader(m.Payload))
		if err != nil {
			return nil, dedupworker.Permanent(fmt.Errorf("http action: %w", err))
		}
		h := m.Header.Clone()
		if h == nil {
			h = consumer.Header{}
		}
		cfg.Inject.into(ctx, h)
		for name, vs := range h {
			for _, v := range vs {
				req.Header.Add(name, v)
			}
		}
		for k, v := range cfg.Headers {
			req.Header.Set(k, v)
		}
		if ci.Key != "" {
			req.Header.Set(IdempotencyHeader, ci.Key)
		}
		for k, v := range dedupHeaders(ci) {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		var cve *tls.CertificateVerificationError
		switch {
		case errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0:
			c := cve.UnverifiedCertificates[0]
			return nil, fmt.Errorf("http action: POST %s: the server's certificate %q (issued by %q) does not verify; give the CA that signed it as tls.ca_file: %w",
				cfg.URL, c.Subject.String(), c.Issuer.String(), err)
		case err != nil:
			return nil, fmt.Errorf("http action: POST %s: %w", cfg.URL, err)
		}
		defer resp.Body.Close()
		body := &capped{n: cfg.MaxResultBytes}
		if _, err := io.Copy(body, io.LimitReader(resp.Body, int64(cfg.MaxResultBytes)+64<<10)); err != nil && resp.StatusCode/100 == 2 {
			return nil, fmt.Errorf("http action: reading the response of %s: %w", cfg.URL, err)
		}
		switch code := resp.StatusCode; {
		case code/100 == 2:
			if body.dropped > 0 {
				log.Warn("http action: response body over max_result_bytes; stored truncated",
					"handler", cfg.Handler, "max_result_bytes", cfg.MaxResultBytes)
			}
			return body.buf, nil
		case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code/100 == 5:
			err := fmt.Errorf("http action: POST %s: %s", cfg.URL, resp.Status)
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s >= 0 {
				return nil, dedupworker.RetryAfter(time.Duration(s)*time.Second, err)
			}
			return nil, err
		case code/100 == 4:
			return nil, dedupworker.Permanent(fmt.Errorf("http action: POST %s: %s", cfg.URL, resp.Status))
		default:
			return nil, errors.New("http action: unexpected status " + resp.Status)
		}
	})
}
