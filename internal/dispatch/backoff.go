package dispatch

import (
	"math/rand/v2"
	"time"
)

// Backoff returns the delay before retry number attempt (1-based): initial
// doubled for every earlier attempt, capped at max, moved by up to a fifth
// either way (jitter) so that retries of many messages do not arrive in step.
func Backoff(attempt int, initial, max time.Duration) time.Duration {
	if initial <= 0 {
		return 0
	}
	d := initial
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if max > 0 && d > max {
		d = max
	}
	jitter := time.Duration(rand.Int64N(int64(d)/5*2+1)) - d/5
	return d + jitter
}
