package redisbackend_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// skewShim is preloaded into redis-server to move its wall clock (TIME,
// and the expiry of keys) by SKEW_SECONDS. libfaketime cannot do it here:
// under it redis-server's allocator recurses into clock_gettime at start
// and the server never listens; nor can it move a Go process's clock, which
// the runtime reads from the vDSO, not through libc. The shim asks the
// kernel directly, so it allocates nothing.
const skewShim = `
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long skew(void) { const char *s = getenv("SKEW_SECONDS"); return s ? atol(s) : 0; }

int clock_gettime(clockid_t c, struct timespec *ts) {
	long r = syscall(SYS_clock_gettime, c, ts);
	if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)) ts->tv_sec += skew();
	return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
	struct timespec ts;
	(void)tz;
	if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return -1;
	if (tv) { tv->tv_sec = ts.tv_sec + skew(); tv->tv_usec = ts.tv_nsec / 1000; }
	return 0;
}

time_t time(time_t *t) {
	struct timeval tv;
	gettimeofday(&tv, 0);
	if (t) *t = tv.tv_sec;
	return tv.tv_sec;
}
`

// skewedRedis starts a private redis-server whose wall clock is skew away
// from this process's, and returns a client to it.
func skewedRedis(t *testing.T, skew time.Duration) redis.UniversalClient {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		testenv.Unavailable(t, "gcc (to build the clock shim)", err.Error())
	}
	dir := t.TempDir()
	src, so := filepath.Join(dir, "skew.c"), filepath.Join(dir, "skew.so")
	if err := os.WriteFile(src, []byte(skewShim), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, gcc, "-shared", "-fPIC", "-O2", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("building the clock shim: %v\n%s", err, out)
	}
	srv := testenv.NewRedisServer(t, testenv.RedisServerConfig{
		Env: []string{"LD_PRELOAD=" + so, "SKEW_SECONDS=" + strconv.Itoa(int(skew/time.Second))},
	})
	client := srv.Client(t)
	tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := client.Time(tctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if off := time.Until(now); off < skew-time.Minute || off > skew+time.Minute {
		t.Fatalf("the server's TIME is %s off this clock, want about %s: the shim is not in effect", off, skew)
	}
	return client
}

// Leases follow the Redis server's clock, whatever the worker's: against a
// Redis whose clock is hours ahead of or behind the worker's, a live lease
// (fresh, or kept alive by renewals) is never reclaimed early, and an
// expired one is reclaimed as soon as it ends, not hours later. Were any
// decision taken on the worker's clock, a server 3h behind would make every
// lease look expired to it, and one 3h ahead every lease live for hours.
func TestLeasesFollowRedisTimeUnderClockSkew(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-3 * time.Hour, 3 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			s := newStore(t, skewedRedis(t, skew), redisbackend.Options{Grace: time.Second})
			const lease = time.Second
			claim := func(key string) idempotency.ClaimResult {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "1:aa", FingerprintVersion: 1, Lease: lease, Retention: time.Minute}})
				if err != nil {
					t.Fatal(err)
				}
				return res[0]
			}

			first := claim("k")
			if first.Outcome != idempotency.ClaimNew {
				t.Fatalf("first claim %s, want NEW", first.Outcome)
			}
			if off := time.Until(first.Claim.LeaseUntil); off < skew-time.Minute || off > skew+time.Minute {
				t.Errorf("lease ends %s from this clock, want about %s + the lease: on the server's clock", off, skew)
			}
			// Renewed every third of the lease for three leases: live all
			// along, never reclaimed.
			end := time.Now().Add(3 * lease)
			tick := time.NewTicker(lease / 3)
			defer tick.Stop()
			for time.Now().Before(end) {
				if r := claim("k"); r.Outcome != idempotency.ClaimInFlight {
					t.Fatalf("claim of a renewed, live lease: %s, want IN_FLIGHT", r.Outcome)
				}
				<-tick.C
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, ok, err := s.Renew(ctx, "k", first.Claim.Token, lease)
				cancel()
				if err != nil || !ok {
					t.Fatalf("Renew = %v, %v", ok, err)
				}
			}
			// The owner stops renewing (it died): reclaimed once the lease
			// is over on the server's clock, within the lease and a margin.
			stopped := time.Now()
			for {
				r := claim("k")
				if r.Outcome == idempotency.ClaimReclaimed {
					if took := time.Since(stopped); took < lease-100*time.Millisecond {
						t.Errorf("reclaimed %s after the last renewal, before its lease of %s was over", took, lease)
					}
					if r.Claim.Attempts != 2 {
						t.Errorf("reclaimed with attempts %d, want 2", r.Claim.Attempts)
					}
					break
				}
				if r.Outcome != idempotency.ClaimInFlight {
					t.Fatalf("claim after the owner stopped: %s, want IN_FLIGHT, then RECLAIMED", r.Outcome)
				}
				if time.Since(stopped) > lease+2*time.Second {
					t.Fatalf("still IN_FLIGHT %s after the last renewal of a %s lease: held late", time.Since(stopped), lease)
				}
				poll := time.NewTimer(20 * time.Millisecond) // re-claim until the server says the lease is over
				<-poll.C
			}
		})
	}
}
