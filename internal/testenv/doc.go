// Package testenv finds the services tests run against (SPEC §10): from the
// environment (REDIS_URL, NATS_URL, KAFKA_BROKERS), then local defaults, then
// in-process servers. A service that cannot be found skips the test, or fails
// it when DEDUP_REQUIRE_SERVICES=1.
package testenv
