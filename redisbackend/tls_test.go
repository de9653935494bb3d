package redisbackend_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/redisbackend"
)

// rediss:// reaches a real TLS Redis (a redis-server started for the test
// with a certificate made here), verifying the server against the given CA.
func TestNewFromURLTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pool := writeTLSFiles(t, dir)
	port := freePort(t)
	startRedis(t, dir, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no")
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

// writeTLSFiles writes a CA and a server certificate for 127.0.0.1 and
// localhost into dir, and returns a pool trusting the CA.
func writeTLSFiles(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dedup test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", "CERTIFICATE", caDER)
	write("cert.pem", "CERTIFICATE", leafDER)
	write("key.pem", "EC PRIVATE KEY", keyDER)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool
}
