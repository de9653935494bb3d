package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/config"
)

// A password SASLprep refuses (a control character) fails with the field
// named and without the password (xdg-go/scram's error quotes it).
func TestSASLMechanismErrorHidesThePassword(t *testing.T) {
	const pw = "Secret\x07Bell-4242"
	for _, mech := range []string{"scram-sha-256", "scram-sha-512"} {
		_, err := KafkaTransport("handlers[0].source.kafka", &config.SASL{Mechanism: mech, Username: "u", Password: pw}, nil)
		if err == nil {
			t.Fatalf("%s: a password with a control character: no error", mech)
		}
		if strings.Contains(err.Error(), "Secret") || !strings.Contains(err.Error(), "handlers[0].source.kafka.sasl") {
			t.Errorf("%s: %v: want the field and not the password", mech, err)
		}
	}
	if _, err := KafkaDialer("kafka", &config.SASL{Mechanism: "scram-sha-256", Username: "u", Password: "fine"}, nil); err != nil {
		t.Errorf("a valid SCRAM password: %v", err)
	}
}

// Files named by the config that cannot be read fail before any
// connection, naming the field.
func TestConnectErrorsNameTheField(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	rc := config.Redis{URL: "redis://127.0.0.1:1/0", ConnectTimeout: config.Duration(time.Second), Namespace: "n"}
	check := func(name string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %s", name, err, want)
		}
	}
	r := rc
	r.PasswordFile = missing
	_, _, err := OpenStore(ctx, &r, log)
	check("redis password_file", err, "redis.password_file")
	r = rc
	r.TLS = &config.TLS{CAFile: notPEM}
	_, _, err = OpenStore(ctx, &r, log)
	check("redis tls.ca_file", err, "redis.tls.ca_file")
	_, err = DialNATS(ctx, "handlers[0].source.nats", "tls://127.0.0.1:1", config.NATSAuth{TLS: &config.TLS{CAFile: missing}})
	check("nats tls.ca_file", err, "handlers[0].source.nats.tls.ca_file")
	_, err = KafkaTransport("handlers[0].source.kafka", &config.SASL{Mechanism: "plain", Username: "u", PasswordFile: missing}, nil)
	check("kafka sasl.password_file", err, "handlers[0].source.kafka.sasl.password_file")
	_, err = KafkaDialer("handlers[0].source.kafka", nil, &config.TLS{CertFile: missing, KeyFile: missing})
	check("kafka tls.cert_file", err, "handlers[0].source.kafka.tls.cert_file")
}

// DialNATS does not start a connection once its context is done, and says
// which field it was for, without the URL's password.
func TestDialNATSStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := DialNATS(ctx, "handlers[1].source.nats", "nats://u:Pw-1234@127.0.0.1:1", config.NATSAuth{})
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "handlers[1].source.nats.url") || strings.Contains(err.Error(), "Pw-1234") {
		t.Errorf("DialNATS with a cancelled context: %v", err)
	}
}

// A forward whose credentials differ from its source's in any field must
// not share the source's connection; the same credentials must.
func TestNATSConnKeyCoversEveryCredential(t *testing.T) {
	const url = "nats://127.0.0.1:4222"
	base := config.NATSAuth{User: "u", Password: "p", TLS: &config.TLS{CAFile: "ca.pem", CertFile: "a.pem", KeyFile: "a.key"}}
	same := base
	same.TLS = &config.TLS{CAFile: "ca.pem", CertFile: "a.pem", KeyFile: "a.key"} // equal, another pointer
	if natsConnKey(url, base) != natsConnKey(url, same) {
		t.Fatal("equal credentials got different connections")
	}
	for name, change := range map[string]func(*config.NATSAuth){
		"url":         nil,
		"user":        func(a *config.NATSAuth) { a.User = "v" },
		"password":    func(a *config.NATSAuth) { a.Password = "q" },
		"token":       func(a *config.NATSAuth) { a.Token = "t" },
		"creds_file":  func(a *config.NATSAuth) { a.CredsFile = "x.creds" },
		"no tls":      func(a *config.NATSAuth) { a.TLS = nil },
		"client cert": func(a *config.NATSAuth) { a.TLS = &config.TLS{CAFile: "ca.pem", CertFile: "b.pem", KeyFile: "a.key"} },
		"client key":  func(a *config.NATSAuth) { a.TLS = &config.TLS{CAFile: "ca.pem", CertFile: "a.pem", KeyFile: "b.key"} },
		"ca": func(a *config.NATSAuth) {
			a.TLS = &config.TLS{CAFile: "other.pem", CertFile: "a.pem", KeyFile: "a.key"}
		},
		"server name": func(a *config.NATSAuth) {
			a.TLS = &config.TLS{CAFile: "ca.pem", CertFile: "a.pem", KeyFile: "a.key", ServerName: "n"}
		},
		"insecure": func(a *config.NATSAuth) {
			a.TLS = &config.TLS{CAFile: "ca.pem", CertFile: "a.pem", KeyFile: "a.key", InsecureSkipVerify: true}
		},
	} {
		other, u := base, url
		if change == nil {
			u = "nats://127.0.0.1:4223"
		} else {
			change(&other)
		}
		if natsConnKey(url, base) == natsConnKey(u, other) {
			t.Errorf("%s differs but the connection would be shared", name)
		}
	}
}
