package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// clientCert makes a self-signed client certificate (its own CA) and writes
// it and its key as PEM files.
func clientCert(t *testing.T) (pool *x509.CertPool, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "dedupworker test client"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return pool, certFile, keyFile
}

// TestHTTPActionTLS: action.http.tls trusts a private CA and presents a
// client certificate to a server that requires one; without the CA the
// error names the server's certificate and the field to set.
func TestHTTPActionTLS(t *testing.T) {
	ca := testenv.NewTestCA(t)
	clientPool, certFile, keyFile := clientCert(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s from %s", b, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientPool, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	run := func(tlsYAML string) ([]byte, error) {
		t.Helper()
		y := fmt.Sprintf("handlers:\n  - name: h\n    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}\n    action: {http: {url: %q, timeout: 5s, tls: %s}}\n", srv.URL, tlsYAML)
		c, err := config.Parse([]byte(y), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		a := &App{cfg: c, log: slog.New(slog.DiscardHandler)}
		h, err := a.action(&c.Handlers[0], nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return h.Handle(ctx, &consumer.Message{Payload: []byte("order-1")})
	}

	res, err := run(fmt.Sprintf("{ca_file: %q, cert_file: %q, key_file: %q}", ca.CAFile, certFile, keyFile))
	if err != nil || string(res) != "order-1 from dedupworker test client" {
		t.Fatalf("with the CA and the client certificate: result %q, err %v", res, err)
	}
	_, err = run(fmt.Sprintf("{cert_file: %q, key_file: %q}", certFile, keyFile))
	if err == nil || !strings.Contains(err.Error(), `certificate "CN=127.0.0.1" (issued by "CN=dedupworker test CA")`) || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Fatalf("without the CA: err %v, want one naming the server's certificate, its issuer and tls.ca_file", err)
	}
	if _, err = run(fmt.Sprintf("{ca_file: %q}", ca.CAFile)); err == nil {
		t.Fatal("without a client certificate the server must refuse the request")
	}
}

// TestHTTPActionTLSErrorsNameTheField: an unreadable ca_file fails at
// start, naming the field.
func TestHTTPActionTLSErrorsNameTheField(t *testing.T) {
	y := "handlers:\n  - name: h\n    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}\n    action: {http: {url: https://127.0.0.1:1, tls: {ca_file: /nonexistent/ca.pem}}}\n"
	c, err := config.Parse([]byte(y), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	a := &App{cfg: c, log: slog.New(slog.DiscardHandler)}
	if _, err := a.action(&c.Handlers[0], nil, nil); err == nil || !strings.Contains(err.Error(), "http.tls.ca_file") {
		t.Fatalf("err %v, want one naming http.tls.ca_file", err)
	}
}

// TestHTTPActionClientKeepsConcurrencyConnections: the http action's client
// keeps as many idle connections to the server as the handler has requests
// in flight (actions.HTTPClient), with tls and without.
func TestHTTPActionClientKeepsConcurrencyConnections(t *testing.T) {
	ca := testenv.NewTestCA(t)
	for _, act := range []*config.HTTPAction{
		{URL: "http://127.0.0.1:1"},
		{URL: "https://127.0.0.1:1", TLS: &config.TLS{CAFile: ca.CAFile}},
	} {
		c, err := httpActionClient(act, 48)
		if err != nil {
			t.Fatal(err)
		}
		tr, ok := c.Transport.(*http.Transport)
		if !ok {
			t.Fatalf("%s: transport %T, want an *http.Transport", act.URL, c.Transport)
		}
		if act.TLS != nil && (tr.TLSClientConfig == nil || tr.TLSClientConfig.RootCAs == nil) {
			t.Errorf("%s: the transport does not trust ca_file", act.URL)
		}
		if tr.MaxIdleConnsPerHost != 48 || tr.MaxIdleConns < 48 {
			t.Errorf("%s: MaxIdleConnsPerHost %d, MaxIdleConns %d: want 48 and at least 48 (the handler's concurrency)", act.URL, tr.MaxIdleConnsPerHost, tr.MaxIdleConns)
		}
	}
}
