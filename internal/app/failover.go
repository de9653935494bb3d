package app

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/redisbackend"
)

// failoverPromotion is what the failover check allows, beyond Sentinel's
// down-after-milliseconds, for the election and the promotion: while both
// run no primary takes writes. README ("When Redis fails over") has the
// failovers measured.
const failoverPromotion = 5 * time.Second

// failoverRisks is the failover check of a Sentinel deployment: a handler
// whose lease is shorter than a failover can run a key twice. A handler
// that finishes while no primary answers holds its result and retries the
// completion until one does; if its claim's lease ran out first, another
// worker's redelivery finds the claim expired and runs the key again, as it
// would after a crash. Every failover stops writes for at least
// down-after-milliseconds plus the promotion, and a claim may have less
// than two thirds of its lease left when it starts, so a lease below 8/5
// of that outage is reported. It returns the risks, and a line for
// StoreHealth.Unread when no Sentinel told down-after-milliseconds;
// nothing for other deployments.
func failoverRisks(ctx context.Context, rc *config.Redis, handlers []config.Handler) ([]StoreRisk, string) {
	s := rc.Sentinel
	if s == nil || len(handlers) == 0 {
		return nil, ""
	}
	downAfter, err := sentinelDownAfter(ctx, rc)
	if err != nil {
		return nil, fmt.Sprintf("redis.sentinel %v: could not read down-after-milliseconds of master %q (%s): skipped the failover check; the Sentinel user needs +sentinel|master",
			s.Addrs, s.Master, firstLine(err))
	}
	// The engine renews a lease every third of it, with a tenth of jitter:
	// a failover can start just before a renewal was due, with about 0.63
	// of the lease left, so the lease must be 8/5 of the outage, in whole
	// seconds.
	outage := downAfter + failoverPromotion
	least := (outage*8/5 + time.Second - 1).Truncate(time.Second)
	var rs []StoreRisk
	for i := range handlers {
		h := &handlers[i]
		if lease := h.Lease.D(); lease < least {
			rs = append(rs, StoreRisk{
				Check: "failover",
				Node:  fmt.Sprintf("sentinel master %q", s.Master),
				Seen:  fmt.Sprintf("down-after-milliseconds %d, handlers[%d] (%s) lease %s", downAfter.Milliseconds(), i, h.Name, h.Lease),
				Why: "a failover stops every write for at least down-after-milliseconds and the promotion after it; a handler that finishes meanwhile holds its result until a primary answers, " +
					"but once its lease has run out another worker may claim the key and run it again",
				Fix: fmt.Sprintf("raise handlers[%d].lease to at least %s (a claim renewed every third of its lease may have 5/8 of it left when the failover starts: down-after-milliseconds + %s for the promotion, × 8/5), or lower down-after-milliseconds",
					i, config.Duration(least), config.Duration(failoverPromotion)),
			})
		}
	}
	return rs, ""
}

// sentinelDownAfter asks the Sentinels of rc, in order, for their
// down-after-milliseconds of the master, and returns the first answer.
func sentinelDownAfter(ctx context.Context, rc *config.Redis) (time.Duration, error) {
	s := rc.Sentinel
	password, err := sentinelPassword(s)
	if err != nil {
		return 0, err
	}
	tc, dial, err := dialSettings(rc)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, addr := range s.Addrs {
		d, err := func() (time.Duration, error) {
			c := redis.NewSentinelClient(&redis.Options{
				Addr: addr, Username: s.Username, Password: password, TLSConfig: tc,
				DialTimeout: dial, ReadTimeout: redisbackend.DefaultIOTimeout, WriteTimeout: redisbackend.DefaultIOTimeout,
				ContextTimeoutEnabled: true, MaxRetries: -1,
			})
			defer c.Close()
			m, err := c.Master(ctx, s.Master).Result()
			if err != nil {
				return 0, err
			}
			ms, err := strconv.ParseInt(m["down-after-milliseconds"], 10, 64)
			if err != nil || ms < 0 {
				return 0, fmt.Errorf("SENTINEL MASTER %s: down-after-milliseconds %q is not a number of milliseconds", s.Master, m["down-after-milliseconds"])
			}
			return time.Duration(ms) * time.Millisecond, nil
		}()
		if err == nil {
			return d, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return 0, errors.New(strings.ReplaceAll(errors.Join(errs...).Error(), "\n", "; "))
}
