package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCA is a certificate authority made for one test, with a server
// certificate for 127.0.0.1 and localhost, written as PEM files for servers
// (redis-server --tls-*, nats-server) and kept in memory for Go servers.
type TestCA struct {
	// CAFile, CertFile and KeyFile are PEM files in the test's temp dir.
	CAFile, CertFile, KeyFile string
	// Pool trusts the CA.
	Pool *x509.CertPool
	// Server is the server certificate with its key.
	Server tls.Certificate
}

// NewTestCA makes a CA and a server certificate valid for an hour.
func NewTestCA(t testing.TB) *TestCA {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatalf("testenv: making test certificates: %v", err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dedupworker test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	must(err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	must(err)
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		must(os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	ca := &TestCA{
		CAFile:   write("ca.pem", "CERTIFICATE", caDER),
		CertFile: write("cert.pem", "CERTIFICATE", leafDER),
		KeyFile:  write("key.pem", "EC PRIVATE KEY", keyDER),
		Pool:     x509.NewCertPool(),
		Server:   tls.Certificate{Certificate: [][]byte{leafDER, caDER}, PrivateKey: key},
	}
	ca.Pool.AddCert(caCert)
	return ca
}
