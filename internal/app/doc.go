// Package app assembles a running dedupworker from its configuration: the
// Redis store, the deduplication engine, one source and one action per
// handler, the Worker, metrics and the health server. The binary's run and
// demo commands both use it, so the demo exercises exactly what production
// runs.
package app
