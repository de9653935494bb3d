package consumer_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// A refused option names its field and says why; the package's sentinel
// tells which package refused it.
func ExampleConfigError() {
	err := idempotency.ValidateOptions(idempotency.WithLease(50 * time.Millisecond))
	var ce *consumer.ConfigError
	if errors.As(err, &ce) {
		fmt.Println("field:", ce.Field)
		fmt.Println("reason:", ce.Reason)
	}
	fmt.Println(errors.Is(err, idempotency.ErrInvalidOption))
	fmt.Println(err)
	// Output:
	// field: Lease
	// reason: 50ms: must be at least 100ms
	// true
	// dedup: invalid option: Lease: 50ms: must be at least 100ms
}
