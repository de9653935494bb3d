package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/config"
)

// defaultDuplicateWindow is JetStream's own default duplicate window, the
// least setup gives a forward stream.
const defaultDuplicateWindow = 2 * time.Minute

func cmdSetup(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("setup", `setup -c FILE [--partitions N] [--replication-factor N]

Creates what the config's handlers read and write, where it is missing:
  NATS   the source stream (source.nats.stream, capturing source.nats.subject,
         max_age the handler's retention); a stream capturing the forward
         subject, with a duplicate window of at least the lease plus the retry
         horizon (2m at least); a stream capturing the dead-letter subject
         (unless dead_letter.nats.core). Streams it names are the subject in
         upper case, '.' as '_': orders.unique gives ORDERS_UNIQUE.
  Kafka  the source topic (retention.ms the handler's retention), the forward
         topic and the dead-letter topic.
A stream or topic that exists is left alone; setup says how many messages it
holds and notes what does not fit the config. Running it again is harmless.`, `  dedupworker setup -c config.yaml                 # create what is missing, report what exists
  dedupworker setup -c kafka.yaml --partitions 6   # Kafka topics with 6 partitions
`, stdout, stderr)
	file := fs.String("c", "", "the config `file` (required)")
	partitions := fs.Int("partitions", 1, "partitions of each Kafka topic it creates")
	replication := fs.Int("replication-factor", 1, "replicas of each Kafka topic it creates")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return usagef("-c FILE is required and takes no arguments")
	}
	if *partitions < 1 || *replication < 1 {
		return usagef("--partitions and --replication-factor must be at least 1")
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		return err
	}
	s := &setup{out: stdout, partitions: *partitions, replication: *replication}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range cfg.Handlers {
		if err := s.handler(ctx, i, &cfg.Handlers[i]); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "setup: %d created, %d already there\n", s.created, s.existed)
	return nil
}

// setup creates the streams and topics a config's handlers read from and
// write to, and leaves alone (after checking) those that exist.
type setup struct {
	out                     io.Writer
	partitions, replication int
	created, existed        int
}

func (s *setup) printf(i int, h *config.Handler, format string, args ...any) {
	fmt.Fprintf(s.out, "handlers[%d] (%s): %s\n", i, h.Name, fmt.Sprintf(format, args...))
}

func (s *setup) handler(ctx context.Context, i int, h *config.Handler) error {
	if n := h.Source.NATS; n != nil {
		js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].source.nats", i), n.URL, n.NATSAuth)
		if err != nil {
			return err
		}
		defer done()
		if err := s.natsSource(ctx, js, i, h); err != nil {
			return err
		}
		if dl := h.DeadLetter; dl != nil && dl.NATS != nil {
			if dl.NATS.Core {
				s.printf(i, h, "dead_letter.nats.subject %s: core: true, so no stream is created; dead letters reach only the subscribers listening when they are published", dl.NATS.Subject)
			} else if err := s.natsStream(ctx, js, i, h, "dead_letter", dl.NATS.Subject, 0); err != nil {
				return err
			}
		}
	}
	if k := h.Source.Kafka; k != nil {
		c, done, err := openKafka(ctx, fmt.Sprintf("handlers[%d].source.kafka", i), k.Brokers, k.SASL, k.TLS)
		if err != nil {
			return err
		}
		defer done()
		if err := s.kafkaTopic(ctx, c, i, h, "source", k.Topic, h.Retention.D()); err != nil {
			return err
		}
		if dl := h.DeadLetter; dl != nil && dl.Kafka != nil {
			if err := s.kafkaTopic(ctx, c, i, h, "dead_letter", dl.Kafka.Topic, 0); err != nil {
				return err
			}
		}
	}
	if f := h.Action.Forward; f != nil {
		switch {
		case f.NATS != nil:
			js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].action.forward.nats", i), f.NATS.URL, f.NATS.NATSAuth)
			if err != nil {
				return err
			}
			defer done()
			window := max(forwardWindow(h), defaultDuplicateWindow)
			return s.natsStream(ctx, js, i, h, "action.forward", f.NATS.Subject, window)
		case f.Kafka != nil:
			c, done, err := openKafka(ctx, fmt.Sprintf("handlers[%d].action.forward.kafka", i), f.Kafka.Brokers, f.Kafka.SASL, f.Kafka.TLS)
			if err != nil {
				return err
			}
			defer done()
			return s.kafkaTopic(ctx, c, i, h, "action.forward", f.Kafka.Topic, 0)
		}
	}
	return nil
}

// forwardWindow is the duplicate window a forward stream needs: the lease
// plus the retry horizon (duplicateWindowCheck), rounded up to a second.
func forwardWindow(h *config.Handler) time.Duration {
	need := h.Lease.D() + retryHorizon(h)
	return (need + time.Second - 1).Truncate(time.Second)
}

// natsSource creates the source stream, capturing source.nats.subject and
// keeping messages for the handler's retention: a message the stream still
// holds can be redelivered or replayed, and is then answered from its
// record only while the record is kept. An existing stream is left alone,
// and what it lacks is reported.
func (s *setup) natsSource(ctx context.Context, js jetstream.JetStream, i int, h *config.Handler) error {
	n := h.Source.NATS
	field := fmt.Sprintf("handlers[%d].source.nats.stream", i)
	st, err := js.Stream(ctx, n.Stream)
	switch {
	case err == nil:
		s.existed++
		c := st.CachedInfo().Config
		s.printf(i, h, "source stream %s exists (subjects %s, max_age %s, %s): left alone", n.Stream, strings.Join(c.Subjects, " "), maxAgeText(c.MaxAge), messages(st.CachedInfo().State.Msgs))
		if n.Subject != "" && !slices.ContainsFunc(c.Subjects, func(f string) bool { return subjectMatches(f, n.Subject) }) {
			s.printf(i, h, "note: stream %s does not capture source.nats.subject %s: the durable consumer would see nothing", n.Stream, n.Subject)
		}
		if c.MaxAge == 0 || c.MaxAge > h.Retention.D() {
			s.printf(i, h, "note: stream %s keeps messages %s, longer than retention %s: a replay of older messages runs them again", n.Stream, maxAgeText(c.MaxAge), durText(h.Retention.D()))
		}
		return nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%s %q: %w", field, n.Stream, err)
	}
	if n.Subject == "" {
		return usagef("handlers[%d].source.nats.subject: stream %s does not exist, and setup needs the subject it should capture: set source.nats.subject (e.g. orders.new), or create the stream yourself", i, n.Stream)
	}
	cfg := jetstream.StreamConfig{
		Name:       n.Stream,
		Subjects:   []string{n.Subject},
		Storage:    jetstream.FileStorage,
		MaxAge:     h.Retention.D(),
		Duplicates: min(defaultDuplicateWindow, h.Retention.D()),
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return fmt.Errorf("%s %q: creating it: %w", field, n.Stream, err)
	}
	s.created++
	s.printf(i, h, "source stream %s created (subjects %s, max_age %s: the retention)", n.Stream, n.Subject, durText(h.Retention.D()))
	return nil
}

// natsStream makes sure a stream captures subject, the destination of out
// ("dead_letter" or "action.forward"): one that does is left alone (a
// forward stream's duplicate window is checked against window); else a
// stream named after the subject is created, keeping messages without an
// age limit and, for a forward, with the duplicate window that covers a
// repeated publish.
func (s *setup) natsStream(ctx context.Context, js jetstream.JetStream, i int, h *config.Handler, out, subject string, window time.Duration) error {
	field := fmt.Sprintf("handlers[%d].%s.nats.subject", i, out)
	name, err := js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		s.existed++
		st, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("%s %q: reading stream %q: %w", field, subject, name, err)
		}
		s.printf(i, h, "%s subject %s is captured by stream %s (%s): left alone", out, subject, name, messages(st.CachedInfo().State.Msgs))
		if dw := st.CachedInfo().Config.Duplicates; window > 0 && dw < forwardWindow(h) {
			s.printf(i, h, "note: stream %s has a duplicate window of %s, shorter than lease %s plus the retry horizon: a forward repeated after it is stored twice; raise it to at least %s",
				name, durText(dw), durText(h.Lease.D()), durText(forwardWindow(h)))
		}
		return nil
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%s %q: looking up the stream that captures it: %w", field, subject, err)
	}
	name = streamName(subject)
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.FileStorage}
	what := "no age limit"
	if window > 0 {
		cfg.Duplicates = window
		what += ", duplicate window " + durText(window) + ": at least the lease plus the retry horizon"
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return fmt.Errorf("%s %q: creating stream %s to capture it: %w", field, subject, name, err)
	}
	s.created++
	s.printf(i, h, "%s stream %s created (subjects %s, %s)", out, name, subject, what)
	return nil
}

// streamName is the stream setup creates for a subject: the subject in
// upper case with '.' (and any character a stream name may not hold) as
// '_': orders.unique gives ORDERS_UNIQUE.
func streamName(subject string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, subject)
}

// subjectMatches reports whether the stream subject filter f captures the
// literal subject s ('*' one token, '>' the rest).
func subjectMatches(f, s string) bool {
	ft, st := strings.Split(f, "."), strings.Split(s, ".")
	for i, t := range ft {
		switch {
		case t == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case t != "*" && t != st[i]:
			return false
		}
	}
	return len(ft) == len(st)
}

// messages is "1 message" or "n messages".
func messages(n uint64) string {
	if n == 1 {
		return "1 message"
	}
	return strconv.FormatUint(n, 10) + " messages"
}

func maxAgeText(d time.Duration) string {
	if d == 0 {
		return "unlimited"
	}
	return durText(d)
}

// durText is d as config.Duration writes it, without the zero minutes and
// seconds Go's form ends in: 1h, 2m, 1h30m, 90s as 1m30s.
func durText(d time.Duration) string {
	s := config.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// kafkaTopic makes sure topic exists: one that does is left alone (a
// source topic's retention.ms is checked against the handler's retention);
// else it is created with the flags' partitions and replicas and, for a
// source topic (retention > 0), retention.ms set to the retention.
func (s *setup) kafkaTopic(ctx context.Context, c *kafka.Client, i int, h *config.Handler, out, topic string, retention time.Duration) error {
	field := fmt.Sprintf("handlers[%d].%s.kafka.topic", i, out)
	if out == "source" {
		field = fmt.Sprintf("handlers[%d].source.kafka.topic", i)
	}
	exists, err := kafkaTopicExists(ctx, c, topic)
	if err != nil {
		return fmt.Errorf("%s %q: %w", field, topic, err)
	}
	if exists {
		s.existed++
		s.printf(i, h, "%s topic %s exists: left alone", out, topic)
		if retention > 0 {
			keep, err := kafkaRetention(ctx, c, topic)
			if err != nil {
				return fmt.Errorf("%s %q: reading retention.ms: %w", field, topic, err)
			}
			if keep == 0 || keep > retention {
				s.printf(i, h, "note: topic %s keeps messages %s, longer than retention %s: a replay of older messages runs them again", topic, maxAgeText(keep), durText(h.Retention.D()))
			}
		}
		return nil
	}
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: s.partitions, ReplicationFactor: s.replication}
	what := fmt.Sprintf("%d partition(s), replication factor %d", s.partitions, s.replication)
	if retention > 0 {
		tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: strconv.FormatInt(retention.Milliseconds(), 10)}}
		what += ", retention.ms " + durText(retention) + ": the retention"
	}
	resp, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		return fmt.Errorf("%s %q: creating it: %w", field, topic, err)
	}
	if err := waitTopicLeaders(ctx, c, topic, s.partitions); err != nil {
		return fmt.Errorf("%s %q: created, but its partitions have no leader yet: %w", field, topic, err)
	}
	s.created++
	s.printf(i, h, "%s topic %s created (%s)", out, topic, what)
	return nil
}

// waitTopicLeaders polls the metadata of a topic just created until each
// of its partitions has a leader, so that a publish right after setup
// finds it, within 10s and ctx.
func waitTopicLeaders(ctx context.Context, c *kafka.Client, topic string, partitions int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		md, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions &&
			!slices.ContainsFunc(md.Topics[0].Partitions, func(p kafka.Partition) bool { return p.Leader.ID < 0 || p.Error != nil }) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return err
		case <-tick.C:
		}
	}
}

// kafkaRetention is a topic's retention.ms; 0 when unlimited.
func kafkaRetention(ctx context.Context, c *kafka.Client, topic string) (time.Duration, error) {
	resp, err := c.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"retention.ms"},
	}}})
	if err != nil {
		return 0, err
	}
	for _, r := range resp.Resources {
		if r.Error != nil {
			return 0, r.Error
		}
		for _, e := range r.ConfigEntries {
			if ms, err := strconv.ParseInt(e.ConfigValue, 10, 64); e.ConfigName == "retention.ms" && err == nil {
				return time.Duration(max(ms, 0)) * time.Millisecond, nil
			}
		}
	}
	return 0, nil
}
