// Package services finds the Redis, NATS and Kafka servers the benchmark
// module's tests run against: the address in the environment (REDIS_URL,
// NATS_URL, KAFKA_BROKERS) or the local default that .ci/services.sh
// starts. A server that does not answer skips the test, or fails it when
// DEDUP_REQUIRE_SERVICES=1, as the product module's tests do.
package services

import (
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

// Redis returns the Redis URL.
func Redis(t testing.TB) string {
	t.Helper()
	u := env("REDIS_URL", "redis://127.0.0.1:6379/0")
	p, err := url.Parse(u)
	if err != nil {
		unavailable(t, "redis", "REDIS_URL "+u+": "+err.Error())
	}
	dial(t, "redis", p.Host)
	return u
}

// NATS returns the NATS URL.
func NATS(t testing.TB) string {
	t.Helper()
	u := env("NATS_URL", "nats://127.0.0.1:4222")
	p, err := url.Parse(u)
	if err != nil {
		unavailable(t, "nats", "NATS_URL "+u+": "+err.Error())
	}
	dial(t, "nats", p.Host)
	return u
}

// Kafka returns the seed brokers of the single-node Kafka.
func Kafka(t testing.TB) []string {
	t.Helper()
	brokers := strings.Split(env("KAFKA_BROKERS", "127.0.0.1:9092"), ",")
	for _, b := range brokers {
		dial(t, "kafka", b)
	}
	return brokers
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// dial checks that addr accepts a TCP connection within a few seconds.
func dial(t testing.TB, service, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		unavailable(t, service, err.Error())
		return
	}
	_ = c.Close()
}

func unavailable(t testing.TB, service, why string) {
	t.Helper()
	if os.Getenv("DEDUP_REQUIRE_SERVICES") == "1" {
		t.Fatalf("services: %s unavailable (DEDUP_REQUIRE_SERVICES=1): %s", service, why)
	}
	t.Skipf("services: %s unavailable: %s", service, why)
}
