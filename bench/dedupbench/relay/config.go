package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// workerSpec is what a dedupworker relay config says: where it reads, what
// its action does, and its engine settings.
type workerSpec struct {
	RedisURL, Namespace string
	Concurrency         int
	Lease               time.Duration

	// Source: Kafka when Brokers is set, else NATS.
	Brokers       []string
	InTopic       string
	Group         string
	NATSURL       string
	InStream      string
	Consumer      string
	InSubject     string
	OutTopic      string // forward.kafka
	OutSubject    string // forward.nats
	HTTPURL       string // the http action instead of forward
	HandlerName   string
	CommitEvery   time.Duration // Kafka commit_interval; 0 leaves the default
	Isolation     string        // Kafka isolation; empty leaves the default
	MaxAckPending int           // NATS max_ack_pending; 0 leaves the default
	// LocalCacheEntries is redis.local_cache.entries; 0 leaves the default.
	LocalCacheEntries int
	// MetricsAddr is the host:port of the binary's /metrics and /readyz
	// server; empty turns it off.
	MetricsAddr string
}

// yamlQuote quotes s as a YAML double-quoted scalar.
func yamlQuote(s string) string { return strconv.Quote(s) }

// workerYAML renders spec as a dedupworker config (docs in README.md and
// internal/config): one handler, logging at warn, and the metrics server
// on MetricsAddr only when it is set.
func workerYAML(s workerSpec) (string, error) {
	if s.RedisURL == "" || s.Namespace == "" || s.Concurrency <= 0 || s.Lease <= 0 {
		return "", fmt.Errorf("relay config: Redis URL, namespace, a concurrency > 0 and a lease > 0 are required")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "redis: {url: %s, namespace: %s", yamlQuote(s.RedisURL), yamlQuote(s.Namespace))
	if s.LocalCacheEntries > 0 {
		fmt.Fprintf(&b, ", local_cache: {entries: %d}", s.LocalCacheEntries)
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "http: {addr: %s}\nlog: {level: warn, format: text}\nhandlers:\n", yamlQuote(s.MetricsAddr))
	fmt.Fprintf(&b, "  - name: %s\n", yamlQuote(orDefault(s.HandlerName, "relay")))
	switch {
	case len(s.Brokers) > 0:
		if s.InTopic == "" || s.Group == "" {
			return "", fmt.Errorf("relay config: a Kafka source needs a topic and a group")
		}
		q := make([]string, len(s.Brokers))
		for i, br := range s.Brokers {
			q[i] = yamlQuote(br)
		}
		fmt.Fprintf(&b, "    source:\n      kafka:\n        brokers: [%s]\n        topic: %s\n        group: %s\n",
			strings.Join(q, ", "), yamlQuote(s.InTopic), yamlQuote(s.Group))
		if s.CommitEvery > 0 {
			fmt.Fprintf(&b, "        commit_interval: %s\n", s.CommitEvery)
		}
		if s.Isolation != "" {
			fmt.Fprintf(&b, "        isolation: %s\n", yamlQuote(s.Isolation))
		}
	case s.NATSURL != "":
		if s.InStream == "" || s.Consumer == "" {
			return "", fmt.Errorf("relay config: a NATS source needs a stream and a consumer")
		}
		fmt.Fprintf(&b, "    source:\n      nats:\n        url: %s\n        stream: %s\n        consumer: %s\n",
			yamlQuote(s.NATSURL), yamlQuote(s.InStream), yamlQuote(s.Consumer))
		if s.InSubject != "" {
			fmt.Fprintf(&b, "        subject: %s\n", yamlQuote(s.InSubject))
		}
		if s.MaxAckPending > 0 {
			fmt.Fprintf(&b, "        max_ack_pending: %d\n", s.MaxAckPending)
		}
	default:
		return "", fmt.Errorf("relay config: neither Kafka brokers nor a NATS URL")
	}
	fmt.Fprintf(&b, "    lease: %s\n    concurrency: %d\n    action:\n", s.Lease, s.Concurrency)
	switch {
	case s.HTTPURL != "":
		fmt.Fprintf(&b, "      http: {url: %s, timeout: 10s}\n", yamlQuote(s.HTTPURL))
	case s.OutTopic != "":
		q := make([]string, len(s.Brokers))
		for i, br := range s.Brokers {
			q[i] = yamlQuote(br)
		}
		if len(q) == 0 {
			return "", fmt.Errorf("relay config: forward.kafka needs brokers")
		}
		fmt.Fprintf(&b, "      forward: {kafka: {brokers: [%s], topic: %s}}\n", strings.Join(q, ", "), yamlQuote(s.OutTopic))
	case s.OutSubject != "":
		if s.NATSURL == "" {
			return "", fmt.Errorf("relay config: forward.nats needs a NATS URL")
		}
		fmt.Fprintf(&b, "      forward: {nats: {url: %s, subject: %s}}\n", yamlQuote(s.NATSURL), yamlQuote(s.OutSubject))
	default:
		return "", fmt.Errorf("relay config: no action (an output topic, subject or HTTP URL)")
	}
	return b.String(), nil
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
