// Package sleep waits out a delay that a context can cut short: the retry
// and backoff waits of the sources, the engine and the test helpers.
package sleep
