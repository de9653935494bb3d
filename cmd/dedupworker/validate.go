package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
)

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "validate -c FILE [--print] [--strict] [--online]", `  dedupworker validate -c config.yaml
  dedupworker validate -c config.yaml --print          # with every default filled in, secrets redacted
  dedupworker validate -c config.yaml --online --strict # also ask Redis and the brokers; warnings fail
`, stderr)
	file := fs.String("c", "", "the config `file` (required)")
	printCfg := fs.Bool("print", false, "print the config with defaults filled in (secrets redacted)")
	strict := fs.Bool("strict", false, "treat warnings as errors (exit 2)")
	online := fs.Bool("online", false, "also connect to Redis and the brokers and check the deduplication horizon against them")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return usagef("-c FILE is required and takes no arguments")
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		return err
	}
	warnings := horizonWarnings(cfg)
	if *online {
		ws, err := onlineChecks(cfg)
		if err != nil {
			return err
		}
		warnings = append(warnings, ws...)
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if *printCfg {
		out, err := cfg.Print()
		if err != nil {
			return err
		}
		_, _ = stdout.Write(out)
	} else {
		fmt.Fprintf(stdout, "%s: ok (%d handlers)\n", *file, len(cfg.Handlers))
	}
	if *strict && len(warnings) > 0 {
		return usagef("%d warning(s) under --strict", len(warnings))
	}
	return nil
}

// retryHorizon is the longest time over which a failing message is
// redelivered: the sum of the backoff delays before max_attempts, at the top
// of their jitter.
func retryHorizon(h *config.Handler) time.Duration {
	var total time.Duration
	d := h.Backoff.Initial.D()
	for i := 1; i < h.MaxAttempts; i++ {
		total += d * 12 / 10
		d = min(d*2, h.Backoff.Max.D())
	}
	return total
}

// horizonWarnings reports retentions shorter than the retry horizon: a
// redelivery after the record expired would run the handler again.
func horizonWarnings(cfg *config.Config) []string {
	var ws []string
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		if hz := retryHorizon(h); h.Retention.D() < hz {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): retention %s is shorter than the retry horizon %s (max_attempts %d, backoff %s..%s): a redelivery after the record expires runs again",
				i, h.Name, h.Retention, config.Duration(hz.Round(time.Second)), h.MaxAttempts, h.Backoff.Initial, h.Backoff.Max))
		}
	}
	return ws
}

// onlineChecks connects to Redis and each handler's broker exactly as run
// does (the internal/app constructors: credentials, TLS, timeouts) and
// compares each handler's retention with how long its broker keeps
// messages (JetStream max_age, Kafka retention.ms). Every call has a
// deadline; errors name the config field and show no secret.
func onlineChecks(cfg *config.Config) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, closeStore, err := app.OpenStore(ctx, &cfg.Redis, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err // names redis.url or redis.addrs
	}
	// A key of the namespace is readable (an ACL user limited to other
	// keys connects, then fails on the first message).
	_, err = s.Get(ctx, "validate-online")
	_ = closeStore()
	if err != nil {
		return nil, fmt.Errorf("redis.namespace %q: reading a key: %w", cfg.Redis.Namespace, err)
	}
	var ws []string
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		var keep time.Duration
		var what string
		switch {
		case h.Source.NATS != nil:
			n := h.Source.NATS
			nc, err := app.DialNATS(ctx, fmt.Sprintf("handlers[%d].source.nats", i), n.URL, n.NATSAuth)
			if err != nil {
				return nil, err
			}
			js, err := jetstream.New(nc)
			if err != nil {
				nc.Close()
				return nil, fmt.Errorf("handlers[%d].source.nats: %w", i, err)
			}
			st, err := js.Stream(ctx, n.Stream)
			nc.Close()
			if err != nil {
				return nil, fmt.Errorf("handlers[%d].source.nats.stream %q: %w", i, n.Stream, err)
			}
			keep, what = st.CachedInfo().Config.MaxAge, "stream "+n.Stream+" max_age"
		case h.Source.Kafka != nil:
			k := h.Source.Kafka
			field := fmt.Sprintf("handlers[%d].source.kafka", i)
			// kafka.Client reports a refused handshake as "Broker Not
			// Available": dial first, as the source does, to say why.
			if err := dialKafka(ctx, field, k); err != nil {
				return nil, err
			}
			tr, err := app.KafkaTransport(field, k.SASL, k.TLS)
			if err != nil {
				return nil, err
			}
			c := &kafkago.Client{Addr: kafkago.TCP(k.Brokers...), Timeout: 10 * time.Second, Transport: tr}
			resp, err := c.DescribeConfigs(ctx, &kafkago.DescribeConfigsRequest{Resources: []kafkago.DescribeConfigRequestResource{{
				ResourceType: kafkago.ResourceTypeTopic, ResourceName: k.Topic, ConfigNames: []string{"retention.ms"},
			}}})
			tr.CloseIdleConnections()
			if err != nil {
				return nil, fmt.Errorf("%s.brokers: %w", field, err)
			}
			for _, r := range resp.Resources {
				if r.Error != nil {
					return nil, fmt.Errorf("%s.topic %q: %w", field, k.Topic, r.Error)
				}
				for _, e := range r.ConfigEntries {
					if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); e.ConfigName == "retention.ms" && err == nil {
						if ms < 0 {
							keep = 0
						} else {
							keep = time.Duration(ms) * time.Millisecond
						}
					}
				}
			}
			what = "topic " + k.Topic + " retention.ms"
		}
		if keep == 0 {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): %s is unlimited: a replay from the start sees messages older than retention %s, which run again", i, h.Name, what, h.Retention))
		} else if h.Retention.D() < keep {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): retention %s is shorter than %s %s: a replay of older messages runs them again", i, h.Name, h.Retention, what, config.Duration(keep)))
		}
	}
	if len(ws) == 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, ctx.Err()
	}
	return ws, nil
}

// dialKafka connects to some broker of k with the source's dialer (TLS and
// the SASL handshake), within 10s: nil as soon as one accepts.
func dialKafka(ctx context.Context, field string, k *config.KafkaSource) error {
	d, err := app.KafkaDialer(field, k.SASL, k.TLS)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, b := range k.Brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			return c.Close()
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
	}
	return fmt.Errorf("%s.brokers: %w", field, errors.Join(errs...))
}
