package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// The connections of a configuration, made one way for Build (run, demo)
// and for validate --online, so that the check connects exactly as the
// worker will: same addresses, credentials, TLS and timeouts. Errors name
// the config field at fault and never show a secret.

// OpenStore connects to the deduplication store of rc (its url or addrs,
// username, password or password_file, tls, connect_timeout) and probes
// it, within rc.ConnectTimeout plus a second. close closes the store and,
// for redis.addrs, the client it does not own — after the store, so a
// last completion still reaches Redis.
func OpenStore(ctx context.Context, rc *config.Redis, log *slog.Logger) (_ *redisbackend.Store, close func() error, _ error) {
	password, err := secret("redis.password", rc.Password, rc.PasswordFile)
	if err != nil {
		return nil, nil, err
	}
	tc, err := tlsConfig("redis.tls", rc.TLS)
	if err != nil {
		return nil, nil, err
	}
	opts := redisbackend.Options{Namespace: rc.Namespace, Grace: rc.Grace.D(), Logger: log}
	cctx, cancel := context.WithTimeout(ctx, rc.ConnectTimeout.D()+time.Second)
	defer cancel()
	if rc.URL != "" {
		s, err := redisbackend.NewFromURL(cctx, rc.URL, opts, func(o *redis.Options) {
			o.DialTimeout = rc.ConnectTimeout.D()
			if rc.Username != "" {
				o.Username = rc.Username
			}
			if password != "" {
				o.Password = password
			}
			if tc != nil {
				o.TLSConfig = tc
			}
		})
		if err != nil {
			// redisbackend names the address, never the URL's password.
			return nil, nil, fmt.Errorf("redis.url: %w", err)
		}
		return s, s.Close, nil
	}
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs: rc.Addrs, MasterName: rc.MasterName, Username: rc.Username, Password: password,
		TLSConfig: tc, DialTimeout: rc.ConnectTimeout.D(), ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second,
	})
	if err := client.Ping(cctx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("redis.addrs %v: %w: %w", rc.Addrs, idempotency.ErrStoreUnavailable, err)
	}
	s, err := redisbackend.New(client, opts)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	return s, func() error {
		err := s.Close() // New does not own a client it was given
		if cerr := client.Close(); err == nil {
			err = cerr
		}
		return err
	}, nil
}

// DialNATS connects to the NATS server(s) at url with the credentials of
// auth (user and password, token, creds_file), its tls section and the
// connect timeout, shortened to ctx's deadline (nats.Connect takes no
// context). field is the config section ("handlers[0].source.nats") that
// errors name, with the URL shown without credentials. opts come after
// these: handlers, reconnection.
func DialNATS(ctx context.Context, field, url string, auth config.NATSAuth, opts ...nats.Option) (*nats.Conn, error) {
	timeout := connectTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := ctx.Err(); err != nil || timeout <= 0 {
		return nil, fmt.Errorf("%s.url %s: %w", field, config.RedactURL(url), cmp.Or(err, context.DeadlineExceeded))
	}
	all := []nats.Option{nats.Name("dedupworker"), nats.Timeout(timeout)}
	if auth.User != "" {
		all = append(all, nats.UserInfo(auth.User, string(auth.Password)))
	}
	if auth.Token != "" {
		all = append(all, nats.Token(string(auth.Token)))
	}
	if auth.CredsFile != "" {
		all = append(all, nats.UserCredentials(auth.CredsFile))
	}
	tc, err := tlsConfig(field+".tls", auth.TLS)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		all = append(all, nats.Secure(tc))
	}
	nc, err := nats.Connect(url, append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("%s.url %s: %w", field, config.RedactURL(url), err)
	}
	return nc, nil
}

// KafkaTransport is the transport of a Kafka client (kafka.Writer,
// kafka.Client) with the SASL and TLS settings of a Kafka section; field
// ("handlers[0].source.kafka") prefixes errors.
func KafkaTransport(field string, s *config.SASL, t *config.TLS) (*kafkago.Transport, error) {
	mech, tc, err := kafkaAuth(field, s, t)
	if err != nil {
		return nil, err
	}
	return &kafkago.Transport{SASL: mech, TLS: tc, DialTimeout: connectTimeout}, nil
}

// KafkaDialer is the base dialer of a Kafka source (transports/kafka
// applies its timeout) with the same settings.
func KafkaDialer(field string, s *config.SASL, t *config.TLS) (*kafkago.Dialer, error) {
	mech, tc, err := kafkaAuth(field, s, t)
	if err != nil {
		return nil, err
	}
	return &kafkago.Dialer{DualStack: true, SASLMechanism: mech, TLS: tc}, nil
}

// kafkaAuth is the SASL mechanism and TLS configuration of a Kafka
// section's sasl and tls fields, each nil when absent.
func kafkaAuth(field string, s *config.SASL, t *config.TLS) (sasl.Mechanism, *tls.Config, error) {
	mech, err := saslMechanism(field+".sasl", s)
	if err != nil {
		return nil, nil, err
	}
	tc, err := tlsConfig(field+".tls", t)
	if err != nil {
		return nil, nil, err
	}
	return mech, tc, nil
}

func saslMechanism(field string, s *config.SASL) (sasl.Mechanism, error) {
	if s == nil {
		return nil, nil
	}
	password, err := secret(field+".password", s.Password, s.PasswordFile)
	if err != nil {
		return nil, err
	}
	algo := scram.SHA256
	switch strings.ToLower(s.Mechanism) {
	case "plain":
		return plain.Mechanism{Username: s.Username, Password: password}, nil
	case "scram-sha-256":
	case "scram-sha-512":
		algo = scram.SHA512
	default:
		return nil, fmt.Errorf("%s.mechanism %q: want plain, scram-sha-256 or scram-sha-512", field, s.Mechanism)
	}
	m, err := scram.Mechanism(algo, s.Username, password)
	if err != nil {
		// Its error quotes the password: say less.
		return nil, fmt.Errorf("%s: the username or password is refused by SASLprep (RFC 4013): a control or unassigned character?", field)
	}
	return m, nil
}
