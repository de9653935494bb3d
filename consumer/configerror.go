package consumer

// ConfigError is a configuration value that a constructor refused: which
// field, what is wrong with it and how to fix it. Every package of the
// module that validates a Config, Options or functional options returns it
// (several of them joined with errors.Join when a constructor reports every
// bad field at once), and it wraps that package's sentinel, so both
//
//	errors.Is(err, nats.ErrInvalidConfig)
//	errors.As(err, &ce) // ce *consumer.ConfigError
//
// work on what the constructor returned, also when a caller wrapped it.
type ConfigError struct {
	// Field is the Go path of the refused value within what the caller
	// passed: a struct field ("Lease", "Durability.Timeout",
	// "SASL.Mechanism"), with an index for an element of a slice
	// ("Brokers[1]"). For functional options it is the option's name
	// without With ("MaxAttempts" for WithMaxAttempts), and a parameter of
	// the option after a dot ("Backoff.Max" for WithBackoff's max).
	Field string
	// Reason says what is wrong with the value and how to fix it, e.g.
	// `"middle": want earliest or latest`. It may name other fields by
	// their Go path when the limit depends on them.
	Reason string
	// Err is the sentinel of the package that refused the value (for
	// example idempotency.ErrInvalidOption): Unwrap returns it.
	Err error
}

// Error renders the sentinel, the field and the reason:
// "dedup: kafka: invalid config: Start: "middle": want earliest or latest".
func (e *ConfigError) Error() string {
	prefix := "dedup: invalid config"
	if e.Err != nil {
		prefix = e.Err.Error()
	}
	return prefix + ": " + e.Field + ": " + e.Reason
}

// Unwrap returns the sentinel of the package that refused the value.
func (e *ConfigError) Unwrap() error { return e.Err }
