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
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
)

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("validate", "validate -c FILE [--print] [--strict] [--online]", `  dedupworker validate -c config.yaml
  dedupworker validate -c config.yaml --print          # with every default filled in, secrets redacted
  dedupworker validate -c config.yaml --online --strict # also ask Redis and the brokers; warnings fail
`, stdout, stderr)
	file := fs.String("c", "", "the config `file` (required)")
	printCfg := fs.Bool("print", false, "print the config with defaults filled in (secrets redacted)")
	strict := fs.Bool("strict", false, "treat warnings as errors (exit 2)")
	online := fs.Bool("online", false, "also connect to Redis and the brokers: check the deduplication horizon against the source's retention, that each dead_letter destination stores what it is sent (a JetStream stream captures the NATS subject unless dead_letter.nats.core is set, the Kafka topic exists: else exit 2, as run refuses to start), that an http action's host accepts a TCP connection, and that each forward destination connects; warn on a forward subject no stream captures or a forward topic that does not exist, on a NATS AckWait below lease/3 plus one renewal, a forward stream's duplicate window below lease plus the retry horizon, and missing_key: reject without a dead_letter")
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
		ws, notes, err := onlineChecks(cfg)
		if err != nil {
			// A server that does not answer or refuses the credentials
			// is a runtime failure (exit 1), as in run: the file itself
			// parsed and validated. A dead-letter destination that
			// stores nothing is a usage error (exit 2).
			return err
		}
		warnings = append(warnings, ws...)
		for _, n := range notes {
			fmt.Fprintln(stderr, "note:", n)
		}
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

// onlineChecks connects to Redis and each handler's brokers exactly as run
// does (the internal/app constructors: credentials, TLS, timeouts) and
// compares each handler's retention with how long its broker keeps
// messages (JetStream max_age, Kafka retention.ms). It also checks where
// each handler's dead letters and forwarded messages go:
//
//   - dead_letter: on the source's connection, as the transport publishes
//     them (the config keeps dead letters on the source's server or
//     cluster), the checks of run (checkDeadLetters): a NATS subject that
//     no JetStream stream captures, unless dead_letter.nats.core says core
//     NATS delivery is meant, or a Kafka topic that does not exist, is an
//     error (exit 2): an acked dead letter would be kept nowhere.
//   - action.forward: its own connection (URL or brokers and credentials,
//     defaulted from the source) must connect, else an error. A NATS
//     subject that no stream captures is a warning (the JetStream publish
//     fails, so every message is retried, then dead-lettered); a missing
//     Kafka topic is a warning too (writes fail unless the brokers
//     auto-create topics).
//   - action.http: a TCP connection to the URL's host and port must open
//     within 5s, else an error naming the url.
//
// For NATS it also warns when the configured ack_wait, or an
// existing durable's AckWait, is shorter than lease/3 plus one renewal
// (heartbeatGap), and when the stream of a forward subject keeps
// Nats-Msg-Id for less than the lease plus the retry horizon
// (duplicateWindowCheck). Any handler with missing_key: reject and no
// dead_letter is warned about: its keyless messages are acked and lost.
//
// It runs the store health checks of run: each risky Redis
// setting is a warning; what the user may not read (CONFIG, INFO refused)
// is a note, not a warning, so that --strict passes for a least-privilege
// user whose settings could not be judged.
//
// Every call has a deadline; errors name the config field and show no
// secret.
func onlineChecks(cfg *config.Config) (warnings, notes []string, _ error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, closeStore, err := app.OpenStore(ctx, &cfg.Redis, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, nil, err // names redis.url, redis.addrs or redis.sentinel
	}
	// A key of the namespace is readable (an ACL user limited to other
	// keys connects, then fails on the first message).
	_, err = s.Get(ctx, "validate-online")
	_ = closeStore()
	if err != nil {
		return nil, nil, fmt.Errorf("redis.namespace %q: reading a key: %w", cfg.Redis.Namespace, err)
	}
	health, err := app.CheckStoreHealth(ctx, &cfg.Redis, cfg.Handlers)
	if err != nil {
		return nil, nil, err
	}
	var ws []string
	for _, r := range health.Risks {
		ws = append(ws, r.String())
	}
	notes = health.Unread
	for i := range cfg.Handlers {
		h := &cfg.Handlers[i]
		var keep time.Duration
		var what string
		var err error
		switch {
		case h.Source.NATS != nil:
			keep, what, ws, err = natsSourceChecks(ctx, i, h, ws)
		case h.Source.Kafka != nil:
			keep, what, ws, err = kafkaSourceChecks(ctx, i, h, ws)
		}
		if err != nil {
			return nil, nil, err
		}
		if h.MissingKey == string(idempotency.MissingKeyReject) && h.DeadLetter == nil {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): missing_key: reject without a dead_letter: a message without a key is acked and lost; add a dead_letter, or set missing_key: passthrough", i, h.Name))
		}
		if keep == 0 {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): %s is unlimited: a replay from the start sees messages older than retention %s, which run again", i, h.Name, what, h.Retention))
		} else if h.Retention.D() < keep {
			ws = append(ws, fmt.Sprintf("handlers[%d] (%s): retention %s is shorter than %s %s: a replay of older messages runs them again", i, h.Name, h.Retention, what, config.Duration(keep)))
		}
		if h.Action.Forward != nil {
			w, err := forwardCheck(ctx, i, h)
			if err != nil {
				return nil, nil, err
			}
			ws = appendNonEmpty(ws, w)
		}
		if h.Action.HTTP != nil {
			if err := httpDialCheck(ctx, i, h); err != nil {
				return nil, nil, err
			}
		}
	}
	if len(ws) == 0 && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return nil, nil, ctx.Err()
	}
	return ws, notes, nil
}

// natsSourceChecks reads how long h's stream keeps messages and checks its
// dead-letter subject on the source's connection, where the transport
// publishes dead letters.
func natsSourceChecks(ctx context.Context, i int, h *config.Handler, ws []string) (keep time.Duration, what string, _ []string, _ error) {
	n := h.Source.NATS
	js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].source.nats", i), n.URL, n.NATSAuth)
	if err != nil {
		return 0, "", ws, err
	}
	defer done()
	st, err := js.Stream(ctx, n.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, "", ws, fmt.Errorf("handlers[%d].source.nats.stream %q: %w: create it ('dedupworker setup -c FILE' does, capturing source.nats.subject)", i, n.Stream, err)
	}
	if err != nil {
		return 0, "", ws, fmt.Errorf("handlers[%d].source.nats.stream %q: %w", i, n.Stream, err)
	}
	if dl := h.DeadLetter; dl != nil && dl.NATS != nil && !dl.NATS.Core {
		if err := natsDeadLetterCheck(ctx, js, i, dl.NATS.Subject); err != nil {
			return 0, "", ws, err
		}
	}
	w, err := ackWaitCheck(ctx, st, i, h)
	if err != nil {
		return 0, "", ws, err
	}
	ws = appendNonEmpty(ws, w)
	return st.CachedInfo().Config.MaxAge, "stream " + n.Stream + " max_age", ws, nil
}

// heartbeatGap is the longest time between two heartbeats of a running or
// waiting delivery: a renewal is due every third of the lease, late by up to
// its jitter (a tenth of the interval), and the heartbeat follows the
// renewal, which may take up to its deadline, min(lease/3, the engine's
// default store timeout 5s).
// An AckWait at or below it lets JetStream redeliver a message still in
// hand.
func heartbeatGap(lease time.Duration) time.Duration {
	return lease/3 + lease/30 + min(lease/3, 5*time.Second)
}

// ackWaitCheck warns when the existing durable's AckWait, or the configured
// ack_wait that run sets on it, is shorter than heartbeatGap. A missing
// durable is quiet: run creates it with ack_wait.
func ackWaitCheck(ctx context.Context, st jetstream.Stream, i int, h *config.Handler) (string, error) {
	n := h.Source.NATS
	gap := heartbeatGap(h.Lease.D())
	if n.AckWait.D() < gap {
		return fmt.Sprintf("handlers[%d] (%s): source.nats.ack_wait %s is shorter than lease/3 plus one renewal (%s for lease %s): JetStream redelivers messages still being handled or waiting; raise ack_wait to the lease",
			i, h.Name, n.AckWait, config.Duration(gap), h.Lease), nil
	}
	cons, err := st.Consumer(ctx, n.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("handlers[%d].source.nats.consumer %q: %w", i, n.Consumer, err)
	}
	if aw := cons.CachedInfo().Config.AckWait; aw < gap {
		return fmt.Sprintf("handlers[%d] (%s): the existing durable %q has AckWait %s, shorter than lease/3 plus one renewal (%s for lease %s): until run updates it to ack_wait %s, JetStream redelivers messages still being handled or waiting",
			i, h.Name, n.Consumer, config.Duration(aw), config.Duration(gap), h.Lease, n.AckWait), nil
	}
	return "", nil
}

// kafkaSourceChecks reads h's topic's retention.ms and checks its
// dead-letter topic with the source's dialer, which writes dead letters.
func kafkaSourceChecks(ctx context.Context, i int, h *config.Handler, ws []string) (keep time.Duration, what string, _ []string, _ error) {
	k := h.Source.Kafka
	field := fmt.Sprintf("handlers[%d].source.kafka", i)
	c, done, err := openKafka(ctx, field, k.Brokers, k.SASL, k.TLS)
	if err != nil {
		return 0, "", ws, err
	}
	defer done()
	resp, err := c.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: k.Topic, ConfigNames: []string{"retention.ms"},
	}}})
	if err != nil {
		return 0, "", ws, fmt.Errorf("%s.brokers: %w", field, err)
	}
	if dl := h.DeadLetter; dl != nil && dl.Kafka != nil {
		if err := kafkaDeadLetterCheck(ctx, c, i, dl.Kafka.Topic); err != nil {
			return 0, "", ws, err
		}
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return 0, "", ws, fmt.Errorf("%s.topic %q: %w", field, k.Topic, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); e.ConfigName == "retention.ms" && err == nil {
				keep = time.Duration(max(ms, 0)) * time.Millisecond // -1: unlimited, as 0
			}
		}
	}
	return keep, "topic " + k.Topic + " retention.ms", ws, nil
}

// forwardCheck connects to a forward destination as the action does (its
// own URL or brokers and credentials) and reports a subject no stream
// captures or a missing topic.
func forwardCheck(ctx context.Context, i int, h *config.Handler) (string, error) {
	f := h.Action.Forward
	switch {
	case f.NATS != nil:
		js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].action.forward.nats", i), f.NATS.URL, f.NATS.NATSAuth)
		if err != nil {
			return "", err
		}
		defer done()
		w, err := natsForwardCheck(ctx, js, i, h.Name, f.NATS.Subject)
		if w != "" || err != nil {
			return w, err
		}
		return duplicateWindowCheck(ctx, js, i, h)
	case f.Kafka != nil:
		k := f.Kafka
		c, done, err := openKafka(ctx, fmt.Sprintf("handlers[%d].action.forward.kafka", i), k.Brokers, k.SASL, k.TLS)
		if err != nil {
			return "", err
		}
		defer done()
		return kafkaForwardCheck(ctx, c, i, h.Name, k.Topic)
	}
	return "", nil
}

// duplicateWindowCheck warns when the duplicate window of the stream that
// captures the forward subject is shorter than the time over which one key
// can be forwarded twice: the lease (a worker that published, then crashed
// before its completion, is reclaimed after it) plus the handler's retry
// horizon (retryHorizon: a publish whose PubAck was lost is retried with
// the same Nats-Msg-Id after each backoff, up to max_attempts). Only within
// the window does JetStream drop the second publish.
func duplicateWindowCheck(ctx context.Context, js jetstream.JetStream, i int, h *config.Handler) (string, error) {
	subject := h.Action.Forward.NATS.Subject
	name, err := js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return "", fmt.Errorf("handlers[%d].action.forward.nats.subject %q: looking up the stream that captures it: %w", i, subject, err)
	}
	st, err := js.Stream(ctx, name)
	if err != nil {
		return "", fmt.Errorf("handlers[%d].action.forward.nats.subject %q: reading stream %q: %w", i, subject, name, err)
	}
	hz := retryHorizon(h)
	need := h.Lease.D() + hz
	if dw := st.CachedInfo().Config.Duplicates; dw < need {
		return fmt.Sprintf("handlers[%d] (%s): stream %s, which captures action.forward.nats.subject %q, has a duplicate window of %s, shorter than lease %s plus the retry horizon %s (max_attempts %d, backoff %s..%s): a forward repeated after it is stored twice; raise the stream's duplicate_window to at least %s",
			i, h.Name, name, subject, config.Duration(dw), h.Lease, config.Duration(hz.Round(time.Second)), h.MaxAttempts, h.Backoff.Initial, h.Backoff.Max, config.Duration(need.Round(time.Second))), nil
	}
	return "", nil
}

// openJetStream connects as run does; done closes the connection.
func openJetStream(ctx context.Context, field, url string, auth config.NATSAuth) (js jetstream.JetStream, done func(), err error) {
	nc, err := app.DialNATS(ctx, field, url, auth)
	if err != nil {
		return nil, nil, err
	}
	js, err = jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	return js, nc.Close, nil
}

// openKafka dials one of brokers with run's dialer first (kafka.Client
// reports a refused handshake as "Broker Not Available"; the dial says
// why), then returns a client over the same TLS and SASL; done closes its
// connections.
func openKafka(ctx context.Context, field string, brokers []string, s *config.SASL, t *config.TLS) (c *kafka.Client, done func(), err error) {
	if err := dialKafka(ctx, field, brokers, s, t); err != nil {
		return nil, nil, err
	}
	tr, err := app.KafkaTransport(field, s, t)
	if err != nil {
		return nil, nil, err
	}
	return &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: tr}, tr.CloseIdleConnections, nil
}

// natsForwardCheck asks JetStream which stream captures a forward subject:
// none, or no JetStream at all, is a warning, as actions.ForwardNATS
// publishes through JetStream and no stream would acknowledge the publish.
func natsForwardCheck(ctx context.Context, js jetstream.JetStream, i int, handler, subject string) (string, error) {
	captured, err := natsCaptured(ctx, js, subject)
	switch {
	case err != nil:
		return "", fmt.Errorf("handlers[%d].action.forward.nats.subject %q: looking up the stream that captures it: %w", i, subject, err)
	case !captured:
		return fmt.Sprintf("handlers[%d] (%s): action.forward.nats.subject %q is not captured by any JetStream stream: forwarded messages are published through JetStream and no stream acknowledges them: every forward fails, is retried, then dead-lettered; create one ('dedupworker setup -c FILE' does)", i, handler, subject), nil
	}
	return "", nil
}

// kafkaForwardCheck asks the cluster's metadata for a forward topic
// (without asking the broker to create it): a missing topic is a warning.
func kafkaForwardCheck(ctx context.Context, c *kafka.Client, i int, handler, topic string) (string, error) {
	exists, err := kafkaTopicExists(ctx, c, topic)
	switch {
	case err != nil:
		return "", fmt.Errorf("handlers[%d].action.forward.kafka.topic %q: %w", i, topic, err)
	case !exists:
		return fmt.Sprintf("handlers[%d] (%s): action.forward.kafka.topic %q does not exist: writes fail unless the brokers auto-create topics; create it ('dedupworker setup -c FILE' does)", i, handler, topic), nil
	}
	return "", nil
}

func appendNonEmpty(ws []string, w string) []string {
	if w == "" {
		return ws
	}
	return append(ws, w)
}

// dialKafka connects to some broker of brokers with a source's dialer (TLS
// and the SASL handshake), within 10s: nil as soon as one accepts.
func dialKafka(ctx context.Context, field string, brokers []string, s *config.SASL, t *config.TLS) error {
	d, err := app.KafkaDialer(field, s, t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, b := range brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			return c.Close()
		}
		errs = append(errs, fmt.Errorf("%s: %w", b, err))
	}
	return fmt.Errorf("%s.brokers: %w", field, errors.Join(errs...))
}
