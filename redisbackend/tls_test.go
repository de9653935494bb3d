package redisbackend_test

import (
	"context"
	"crypto/x509"
	"errors"
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
	ca := testenv.NewTestCA(t)
	addr := testenv.NewRedisServer(t, testenv.RedisServerConfig{TLS: ca}).Addr()
	withCA := func(o *redis.Options) { o.TLSConfig.RootCAs = ca.Pool }

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
