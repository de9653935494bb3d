package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

func TestScanAndForgetIfStandalone(t *testing.T) {
	t.Parallel()
	testScanAndForgetIf(t, testenv.RedisClient(t))
}

func TestScanAndForgetIfCluster(t *testing.T) {
	t.Parallel()
	testScanAndForgetIf(t, testenv.RedisClusterClient(t))
}

// seedClasses writes n records of each class under scope and returns their
// effective keys by class.
func seedClasses(t *testing.T, s *redisbackend.Store, scope string, n int) map[redisbackend.Class][]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[redisbackend.Class][]string{}
	for _, c := range redisbackend.Classes[1:] {
		reqs := make([]idempotency.ClaimRequest, n)
		for i := range reqs {
			reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey(scope, fmt.Sprintf("%s-%d", c, i)), Fingerprint: "fp", FingerprintVersion: 1, Lease: time.Hour}
			out[c] = append(out[c], reqs[i].Key)
		}
		res, err := s.Claim(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		var cs []idempotency.Completion
		for i, r := range res {
			switch c {
			case redisbackend.ClassReleased:
				if ok, err := s.Release(ctx, reqs[i].Key, r.Claim.Token, time.Hour); err != nil || !ok {
					t.Fatalf("release: %v %v", ok, err)
				}
			case redisbackend.ClassCompleted, redisbackend.ClassDeadLettered:
				outcome := idempotency.RecordOutcomeOK
				if c == redisbackend.ClassDeadLettered {
					outcome = idempotency.RecordOutcomeDeadLettered
				}
				cs = append(cs, idempotency.Completion{Key: reqs[i].Key, Token: r.Claim.Token, Outcome: outcome, Retention: time.Hour})
			}
		}
		if len(cs) > 0 {
			if _, err := s.Complete(ctx, cs); err != nil {
				t.Fatal(err)
			}
		}
		slices.Sort(out[c])
	}
	return out
}

func testScanAndForgetIf(t *testing.T, client redis.UniversalClient) {
	s := newStore(t, client, redisbackend.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	byClass := seedClasses(t, s, "a*b", 30)
	seedClasses(t, s, "aXb", 3) // a scope the glob a*b would match unescaped

	scanned := map[redisbackend.Class][]string{}
	err := s.Scan(ctx, "a*b", 7, func(page []redisbackend.ScannedRecord, _ redisbackend.ScanStats) (bool, error) {
		for _, r := range page {
			c := redisbackend.ClassOf(r.Record)
			scanned[c] = append(scanned[c], r.Key)
			if r.TTL <= 0 || r.TTL > time.Hour+time.Minute || r.Bytes == 0 {
				t.Errorf("%s: TTL %s, %d bytes", r.Key, r.TTL, r.Bytes)
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for c, want := range byClass {
		got := slices.Compact(slices.Sorted(slices.Values(scanned[c])))
		if !slices.Equal(got, want) {
			t.Errorf("Scan %s: got %v, want %v", c, got, want)
		}
	}

	pages := 0
	if err := s.Scan(ctx, "a*b", 5, func([]redisbackend.ScannedRecord, redisbackend.ScanStats) (bool, error) {
		pages++
		return false, nil
	}); err != nil || pages != 1 {
		t.Errorf("Scan stopped by fn: %d pages, %v; want 1", pages, err)
	}

	if _, err := s.ForgetIf(ctx, []string{"a*b:x"}, "done", 0); err == nil {
		t.Error("ForgetIf with class done: no error")
	}
	if _, err := s.ForgetIf(ctx, []string{"a*b:x", "a*b:x"}, redisbackend.ClassAll, 0); err == nil {
		t.Error("ForgetIf naming a key twice: no error")
	}
	all := slices.Concat(byClass[redisbackend.ClassClaimed], byClass[redisbackend.ClassReleased], byClass[redisbackend.ClassCompleted], byClass[redisbackend.ClassDeadLettered], []string{"a*b:none"})
	// None is an hour old: all kept.
	if r, err := s.ForgetIf(ctx, all, redisbackend.ClassAll, time.Hour); err != nil || r != (redisbackend.ForgetResult{Kept: 120, Gone: 1}) {
		t.Fatalf("ForgetIf older than 1h: %+v %v", r, err)
	}
	// The script's class of each record is the Go decoder's.
	for _, c := range redisbackend.Classes[1:] {
		r, err := s.ForgetIf(ctx, all, c, 0)
		if err != nil || r.Deleted != 30 {
			t.Fatalf("ForgetIf %s: %+v %v; want its 30 deleted", c, r, err)
		}
		for _, k := range byClass[c] {
			if rec, err := s.Get(ctx, k); err != nil || rec != nil {
				t.Fatalf("after ForgetIf %s: %s is %+v, %v", c, k, rec, err)
			}
		}
	}
	if n := len(scanKeys(t, s, "aXb")); n != 12 {
		t.Errorf("scope aXb after forgetting a*b: %d records, want its 12", n)
	}
}

func scanKeys(t *testing.T, s *redisbackend.Store, scope string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var keys []string
	if err := s.Scan(ctx, scope, 0, func(page []redisbackend.ScannedRecord, _ redisbackend.ScanStats) (bool, error) {
		for _, r := range page {
			keys = append(keys, r.Key)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return keys
}
