// Package dispatch is the worker behind dedupworker.Worker and what only it
// and the deduplication engine call: it runs each registered handler behind
// its source, caps its concurrency, drains on shutdown, turns a handler's
// error into the delivery's fate (Decide), and runs a handler without
// deduplication when it has no processor. Handler authors use the root
// package; transport and processor authors the consumer package.
package dispatch
