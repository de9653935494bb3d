// Package alertrules reads dedupworker's Prometheus alerting rules,
// deploy/prometheus/dedupworker-rules.yaml, for the tests that check them,
// and rewrites their durations for tests that run them against a real
// Prometheus and cannot wait minutes.
package alertrules
