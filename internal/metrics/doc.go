// Package metrics adapts dedupworker's hooks (consumer.Hook*) to Prometheus
// metrics listed in docs/OPERATIONS.md, and serves /metrics, /healthz and
// /readyz.
package metrics
