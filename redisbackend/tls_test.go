package redisbackend_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// rediss:// reaches a real TLS Redis (a redis-server started for the test
// with a certificate made here), verifying the server against the given CA.
func TestNewFromURLTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testenv.NewTestCA(t)
	pool := ca.Pool
	port := freePort(t)
	startRedis(t, dir, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", ca.CertFile, "--tls-key-file", ca.KeyFile,
		"--tls-ca-cert-file", ca.CAFile, "--tls-auth-clients", "no")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	withCA := func(o *redis.Options) { o.TLSConfig.RootCAs = pool }
	waitFor(t, "redis-server with TLS", func() error {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err == nil {
			_ = c.Close()
		}
		return err
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redisbackend.NewFromURL(ctx, "rediss://"+addr+"/0", redisbackend.Options{}, withCA)
	if err != nil {
		t.Fatalf("NewFromURL(rediss://): %v", err)
	}
	defer s.Close()
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: "tls:1", Fingerprint: "1:f", FingerprintVersion: 1, Lease: time.Second}})
	if err != nil || res[0].Outcome != idempotency.ClaimNew {
		t.Fatalf("Claim over TLS = %+v, %v", res, err)
	}

	// Without the CA the server is not trusted; in plain text it does not answer.
	_, err = redisbackend.NewFromURL(ctx, "rediss://"+addr+"/0?dial_timeout=2s", redisbackend.Options{})
	var unknownCA x509.UnknownAuthorityError
	if !errors.As(err, &unknownCA) {
		t.Errorf("rediss:// to a server of an unknown CA = %v, want a certificate error", err)
	}
	if _, err := redisbackend.NewFromURL(ctx, "redis://"+addr+"/0?dial_timeout=1s", redisbackend.Options{}); err == nil {
		t.Error("redis:// (plain) to a TLS-only port: no error")
	}
}
