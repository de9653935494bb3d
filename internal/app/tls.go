package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/idemkit/dedupworker/internal/config"
)

// tlsConfig builds a client TLS configuration; nil in, nil out.
func tlsConfig(field string, c *config.TLS) (*tls.Config, error) {
	if c == nil {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // opt-in
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", field, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file %s: no PEM certificate in it", field, c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file/key_file: %w", field, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// secret returns the inline value, or the trimmed content of file.
func secret(field string, inline config.Secret, file string) (string, error) {
	if file == "" {
		return string(inline), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s_file: %w", field, err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}
