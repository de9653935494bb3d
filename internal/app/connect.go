package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/internal/redisprobe"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// The connections of a configuration, made one way for Build (run, demo),
// validate --online, inspect and forget, so that each connects exactly as
// the worker does: same addresses, credentials, TLS and timeouts. Errors name
// the config field at fault and never show a secret.

// OpenStore connects to the deduplication store of rc through RedisClient
// and probes it, within rc.ConnectTimeout plus a second, and logs which
// kind of deployment it found (standalone, cluster or sentinel). The store
// waits for rc.Durability's replicas after every write and
// reports its own measurements (the WAITs' time, durability shortfalls) to
// hooks: run passes the hooks that feed /metrics. It keeps
// redis.local_cache (on by default) of the records it completes. close closes the store,
// then the client: after the store, so a last completion still reaches
// Redis.
func OpenStore(ctx context.Context, rc *config.Redis, log *slog.Logger, hooks ...consumer.Hook) (_ *redisbackend.Store, close func() error, _ error) {
	s, _, closeFn, err := openStore(ctx, rc, log, hooks)
	return s, closeFn, err
}

// openStore is OpenStore that also returns the client, for the store
// health checks; close closes both.
func openStore(ctx context.Context, rc *config.Redis, log *slog.Logger, hooks consumer.Hooks) (_ *redisbackend.Store, _ redis.UniversalClient, close func() error, _ error) {
	client, err := RedisClient(ctx, rc)
	if err != nil {
		return nil, nil, nil, err
	}
	log.Info("connected to the store", "deployment", deploymentKind(client, rc), "namespace", rc.Namespace)
	opts := rc.StoreOptions()
	opts.Logger, opts.Hooks = log, hooks
	s, err := redisbackend.New(client, opts)
	if err != nil {
		client.Close()
		return nil, nil, nil, rc.StoreError(err) // the rest of the options were validated with the config
	}
	return s, client, func() error {
		err := s.Close() // New does not own a client it was given
		if cerr := client.Close(); err == nil {
			err = cerr
		}
		return err
	}, nil
}

// deploymentKind is how the client of rc reaches Redis: standalone, cluster
// or sentinel.
func deploymentKind(client redis.UniversalClient, rc *config.Redis) string {
	switch _, cluster := client.(*redis.ClusterClient); {
	case cluster:
		return "cluster"
	case rc.Sentinel != nil:
		return "sentinel"
	}
	return "standalone"
}

// RedisClient is the one way every command (run, validate --online,
// inspect, forget) connects to the Redis of rc, so all of them reach the
// same deployment with the same credentials: rc's username, password or
// password_file, tls and connect_timeout, and
//
//   - redis.url: a *redis.Client, or a *redis.ClusterClient seeded with
//     the URL's node when that node answers INFO with cluster_enabled:1;
//   - redis.addrs: a *redis.ClusterClient on those seeds;
//   - redis.sentinel: a failover *redis.Client that asks the Sentinels (with
//     their own username and password) for the primary.
//
// It answers within rc.ConnectTimeout plus a second, once the deployment
// answered a PING; errors name the config field, wrap
// idempotency.ErrStoreUnavailable when Redis did not answer, and never
// show a password. The caller closes the client.
func RedisClient(ctx context.Context, rc *config.Redis) (redis.UniversalClient, error) {
	password, err := secret("redis.password", rc.Password, rc.PasswordFile)
	if err != nil {
		return nil, err
	}
	tc, dial, err := dialSettings(rc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, dial+time.Second)
	defer cancel()
	switch {
	case rc.Sentinel != nil:
		return sentinelClient(ctx, rc, password, tc, dial)
	case len(rc.Addrs) > 0:
		c := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: rc.Addrs, Username: rc.Username, Password: password, TLSConfig: tc,
			DialTimeout: dial, ReadTimeout: redisbackend.DefaultIOTimeout, WriteTimeout: redisbackend.DefaultIOTimeout,
			ContextTimeoutEnabled: true,
		})
		cc, err := pinged(ctx, c, fmt.Sprintf("redis.addrs %v", rc.Addrs))
		if err != nil && strings.Contains(err.Error(), "cluster support disabled") {
			return nil, fmt.Errorf("%w (redis.addrs lists Cluster seeds; give a standalone server as redis.url, a Sentinel deployment as redis.sentinel)", err)
		}
		return cc, err
	}
	return urlClient(ctx, rc, password, tc, dial)
}

// urlClient is RedisClient for redis.url.
func urlClient(ctx context.Context, rc *config.Redis, password string, tc *tls.Config, dial time.Duration) (redis.UniversalClient, error) {
	if u, err := url.Parse(rc.URL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		// url.Parse's error repeats the URL, password included: say less.
		return nil, errors.New("redis.url: want redis://[user:password@]host[:port][/db], or rediss:// for TLS")
	}
	ro, err := redis.ParseURL(rc.URL)
	if err != nil {
		return nil, fmt.Errorf("redis.url %s: %w", config.RedactURL(rc.URL), err)
	}
	// The URL's query may set the I/O timeouts; the dial timeout is the
	// config's, so that an unreachable Redis fails as fast everywhere.
	ro.DialTimeout = dial
	if ro.ReadTimeout == 0 {
		ro.ReadTimeout = redisbackend.DefaultIOTimeout
	}
	if ro.WriteTimeout == 0 {
		ro.WriteTimeout = redisbackend.DefaultIOTimeout
	}
	ro.ContextTimeoutEnabled = true
	if rc.Username != "" {
		ro.Username = rc.Username
	}
	if password != "" {
		ro.Password = password
	}
	if tc != nil {
		ro.TLSConfig = tc
	}
	cluster, err := redisprobe.Node(ctx, ro)
	if err != nil {
		return nil, connectError("redis.url: connect to "+ro.Addr, ro.Addr, err)
	}
	if !cluster {
		return pinged(ctx, redis.NewClient(ro), "redis.url: "+ro.Addr)
	}
	if ro.DB != 0 {
		return nil, fmt.Errorf("redis.url: %s is a Cluster node, which has only database 0: end the URL with /0 or no database", ro.Addr)
	}
	ctls := ro.TLSConfig
	if ctls != nil && (rc.TLS == nil || rc.TLS.ServerName == "") {
		// rediss:// names the seed as the server; each node must be
		// verified against its own address instead.
		ctls = ctls.Clone()
		ctls.ServerName = ""
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{ro.Addr}, Username: ro.Username, Password: ro.Password, TLSConfig: ctls,
		DialTimeout: ro.DialTimeout, ReadTimeout: ro.ReadTimeout, WriteTimeout: ro.WriteTimeout,
		PoolSize: ro.PoolSize, MinIdleConns: ro.MinIdleConns, MaxRetries: ro.MaxRetries,
		ContextTimeoutEnabled: true,
	})
	return pinged(ctx, c, "redis.url: Cluster seeded with "+ro.Addr)
}

// sentinelClient is RedisClient for redis.sentinel.
func sentinelClient(ctx context.Context, rc *config.Redis, password string, tc *tls.Config, dial time.Duration) (redis.UniversalClient, error) {
	s := rc.Sentinel
	spw, err := sentinelPassword(s)
	if err != nil {
		return nil, err
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.Master, SentinelAddrs: s.Addrs, SentinelUsername: s.Username, SentinelPassword: spw,
		Username: rc.Username, Password: password, TLSConfig: tc,
		DialTimeout: dial, ReadTimeout: redisbackend.DefaultIOTimeout, WriteTimeout: redisbackend.DefaultIOTimeout,
		ContextTimeoutEnabled: true,
	})
	return pinged(ctx, c, fmt.Sprintf("redis.sentinel %v (master %q)", s.Addrs, s.Master))
}

// dialSettings are the TLS configuration (nil without redis.tls) and the
// dial timeout of every connection to the deployment of rc, the Sentinels'
// included.
func dialSettings(rc *config.Redis) (*tls.Config, time.Duration, error) {
	tc, err := tlsConfig("redis.tls", rc.TLS)
	if err != nil {
		return nil, 0, err
	}
	dial := rc.ConnectTimeout.D()
	if dial <= 0 {
		dial = redisbackend.DefaultDialTimeout
	}
	return tc, dial, nil
}

// sentinelPassword is the Sentinels' own password, from
// redis.sentinel.password or password_file.
func sentinelPassword(s *config.Sentinel) (string, error) {
	return secret("redis.sentinel.password", s.Password, s.PasswordFile)
}

// pinged returns c once it answered a PING within ctx, else closes it and
// fails naming where.
func pinged(ctx context.Context, c redis.UniversalClient, where string) (redis.UniversalClient, error) {
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, connectError(where, where, err)
	}
	return c, nil
}

// connectError is a failed first contact with Redis, wrapping
// idempotency.ErrStoreUnavailable. Refused credentials are the password's
// fault, not the address's: the error then names the fields that set them
// rather than where.
func connectError(where, server string, err error) error {
	if redisprobe.AuthRefused(err) {
		return fmt.Errorf("redis.password / redis.password_file (and redis.username, or the user:password of redis.url): "+
			"%s refused the credentials, check them: %w: %w", server, idempotency.ErrStoreUnavailable, err)
	}
	return fmt.Errorf("%s: %w: %w", where, idempotency.ErrStoreUnavailable, err)
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
func KafkaTransport(field string, s *config.SASL, t *config.TLS) (*kafka.Transport, error) {
	mech, tc, err := kafkaAuth(field, s, t)
	if err != nil {
		return nil, err
	}
	return &kafka.Transport{SASL: mech, TLS: tc, DialTimeout: connectTimeout}, nil
}

// KafkaDialer is the base dialer of a Kafka source (transports/kafkasource
// applies its timeout) with the same settings.
func KafkaDialer(field string, s *config.SASL, t *config.TLS) (*kafka.Dialer, error) {
	mech, tc, err := kafkaAuth(field, s, t)
	if err != nil {
		return nil, err
	}
	return &kafka.Dialer{DualStack: true, SASLMechanism: mech, TLS: tc}, nil
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
