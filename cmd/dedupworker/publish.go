package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
)

// headerFlags collects repeated --header K=V flags.
type headerFlags [][2]string

func (h *headerFlags) String() string { return "" }
func (h *headerFlags) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want NAME=VALUE", v)
	}
	*h = append(*h, [2]string{k, val})
	return nil
}

func cmdPublish(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("publish", `publish -c FILE --handler NAME [--key K] [--header NAME=VALUE ...] [--subject S] PAYLOAD

Publishes one test message to the handler's source, as its producers would:
on NATS through JetStream to source.nats.subject (the stream's acknowledgement
is printed), on Kafka to the source topic. PAYLOAD is the message body; - reads
it from stdin. No Nats-Msg-Id is set, so publishing twice stores two messages.`, `  dedupworker publish -c config.yaml --handler orders --key order-1 '{"id":"order-1"}'
  dedupworker publish -c config.yaml --handler orders --header Idempotency-Key=order-1 --header Trace=t1 '{"id":"order-1"}'
  echo '{"id":"order-2"}' | dedupworker publish -c config.yaml --handler orders -   # the payload from stdin
`, stdout, stderr)
	file := fs.String("c", "", "the config `file` (required)")
	name := fs.String("handler", "", "the handler whose source gets the message (required)")
	key := fs.String("key", "", "the idempotency `key`, put where the handler reads it first: its header (header:NAME), or on Kafka the message key (kafka-key); the message key of a Kafka message in any case")
	subject := fs.String("subject", "", "the NATS `subject` to publish on, instead of the handler's source.nats.subject")
	var headers headerFlags
	fs.Var(&headers, "header", "a message header `NAME=VALUE`; repeat for more")
	if err := parseInterspersed(fs, args); err != nil {
		return err
	}
	if *file == "" || *name == "" || fs.NArg() != 1 {
		fs.Usage()
		return usagef("-c FILE, --handler NAME and one PAYLOAD argument are required (- reads it from stdin)")
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		return err
	}
	i, h, err := findHandler(cfg, *name, *file)
	if err != nil {
		return err
	}
	payload := []byte(fs.Arg(0))
	if fs.Arg(0) == "-" {
		if payload, err = io.ReadAll(os.Stdin); err != nil {
			return fmt.Errorf("reading the payload from stdin: %w", err)
		}
	}
	m := testMessage{payload: payload, headers: headers}
	if *key != "" {
		if err := m.setKey(i, h, *key); err != nil {
			return err
		}
	}
	if *subject != "" && h.Source.NATS == nil {
		return usagef("--subject is for a NATS source; handler %q reads Kafka topic %s", h.Name, h.Source.Kafka.Topic)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if h.Source.NATS != nil {
		return publishTestNATS(ctx, stdout, i, h, cmp.Or(*subject, h.Source.NATS.Subject), m)
	}
	return publishTestKafka(ctx, stdout, i, h, m)
}

// findHandler finds the handler called name in cfg.
func findHandler(cfg *config.Config, name, file string) (int, *config.Handler, error) {
	names := make([]string, len(cfg.Handlers))
	for i := range cfg.Handlers {
		if cfg.Handlers[i].Name == name {
			return i, &cfg.Handlers[i], nil
		}
		names[i] = cfg.Handlers[i].Name
	}
	return 0, nil, usagef("--handler %q is not a handler of %s (it has %s)", name, file, strings.Join(names, ", "))
}

// testMessage is what publish sends.
type testMessage struct {
	payload    []byte
	headers    headerFlags
	messageKey []byte // Kafka only
}

// setKey puts key where handler h reads its key first: a header, or the
// Kafka message key. On Kafka the message key is set in any case, so that
// the messages of one key go to one partition.
func (m *testMessage) setKey(i int, h *config.Handler, key string) error {
	if h.Source.Kafka != nil {
		m.messageKey = []byte(key)
	}
	for _, src := range h.Key {
		switch {
		case strings.HasPrefix(src, "header:"):
			m.headers = append(m.headers, [2]string{strings.TrimPrefix(src, "header:"), key})
			return nil
		case src == "kafka-key" && h.Source.Kafka != nil:
			return nil
		}
	}
	return usagef("--key: handlers[%d] (%s) reads its key from %s, which publish cannot set apart from the payload; put the key in the payload (or a --header) instead", i, h.Name, strings.Join(h.Key, ", "))
}

// publishTestNATS publishes m through JetStream, so that a stream acknowledges
// storing it.
func publishTestNATS(ctx context.Context, stdout io.Writer, i int, h *config.Handler, subject string, m testMessage) error {
	n := h.Source.NATS
	if subject == "" {
		return usagef("handlers[%d].source.nats.subject is not set: give --subject, one that stream %s captures", i, n.Stream)
	}
	js, done, err := openJetStream(ctx, fmt.Sprintf("handlers[%d].source.nats", i), n.URL, n.NATSAuth)
	if err != nil {
		return err
	}
	defer done()
	msg := nats.NewMsg(subject)
	msg.Data = m.payload
	for _, kv := range m.headers {
		msg.Header.Add(kv[0], kv[1])
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("publishing to %s: %w (does a stream capture it? 'dedupworker setup -c FILE' creates stream %s)", subject, err, n.Stream)
	}
	fmt.Fprintf(stdout, "published to %s: stream %s, sequence %d\n", subject, ack.Stream, ack.Sequence)
	return nil
}

// publishTestKafka writes m to the handler's topic and waits for every in-sync
// replica.
func publishTestKafka(ctx context.Context, stdout io.Writer, i int, h *config.Handler, m testMessage) error {
	k := h.Source.Kafka
	field := fmt.Sprintf("handlers[%d].source.kafka", i)
	tr, err := app.KafkaTransport(field, k.SASL, k.TLS)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr: kafka.TCP(k.Brokers...), Topic: k.Topic, Transport: tr,
		Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll, MaxAttempts: 3,
		WriteTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
	}
	defer w.Close()
	msg := kafka.Message{Key: m.messageKey, Value: m.payload}
	for _, kv := range m.headers {
		msg.Headers = append(msg.Headers, kafka.Header{Key: kv[0], Value: []byte(kv[1])})
	}
	if err := w.WriteMessages(ctx, msg); err != nil {
		return fmt.Errorf("%s.topic %q: publishing: %w", field, k.Topic, err)
	}
	fmt.Fprintf(stdout, "published to topic %s\n", k.Topic)
	return nil
}
