package main

// records and the bulk forget on standalone Redis and on the
// Cluster.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// seeded is what seedRecords wrote: the raw keys of handler "orders" by
// class, and the claim tokens of the claimed ones.
type seeded struct {
	keys   map[redisbackend.Class][]string
	tokens map[string]string
	old    []string // completed an hour ago, also in keys[ClassCompleted]
	store  *redisbackend.Store
}

// seedRecords writes, through the store on client under ns, n records of
// each class of handler "orders", plus nOld completed an hour ago, a
// record of handler "other" and a value of "orders" that is no record.
func seedRecords(t *testing.T, client redis.UniversalClient, ns string, n, nOld int) *seeded {
	t.Helper()
	s, err := redisbackend.New(client, redisbackend.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sd := &seeded{keys: map[redisbackend.Class][]string{}, tokens: map[string]string{}, store: s}
	claim := func(handler string, keys []string) []string {
		tokens := make([]string, 0, len(keys))
		for start := 0; start < len(keys); start += 1000 {
			part := keys[start:min(start+1000, len(keys))]
			reqs := make([]idempotency.ClaimRequest, len(part))
			for i, k := range part {
				reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey(handler, k), Fingerprint: "fp", FingerprintVersion: 1, Lease: time.Hour}
			}
			res, err := s.Claim(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range res {
				if r.Claim == nil {
					t.Fatalf("claim %s: %s", reqs[i].Key, r.Outcome)
				}
				tokens = append(tokens, r.Claim.Token)
			}
		}
		return tokens
	}
	complete := func(handler string, keys, tokens []string, outcome string) {
		for start := 0; start < len(keys); start += 1000 {
			end := min(start+1000, len(keys))
			cs := make([]idempotency.Completion, 0, end-start)
			for i := start; i < end; i++ {
				cs = append(cs, idempotency.Completion{Key: idempotency.EffectiveKey(handler, keys[i]), Token: tokens[i], Outcome: outcome, Result: []byte("receipt"), Retention: time.Hour})
			}
			if _, err := s.Complete(ctx, cs); err != nil {
				t.Fatal(err)
			}
		}
	}
	names := func(prefix string, n int) []string {
		ks := make([]string, n)
		for i := range ks {
			ks[i] = fmt.Sprintf("%s-%d", prefix, i)
		}
		return ks
	}
	for _, c := range []redisbackend.Class{redisbackend.ClassClaimed, redisbackend.ClassReleased, redisbackend.ClassCompleted, redisbackend.ClassDeadLettered} {
		keys := names(string(c), n)
		tokens := claim("orders", keys)
		switch c {
		case redisbackend.ClassClaimed:
			for i, k := range keys {
				sd.tokens[k] = tokens[i]
			}
		case redisbackend.ClassReleased:
			for i, k := range keys {
				if ok, err := s.Release(ctx, idempotency.EffectiveKey("orders", k), tokens[i], time.Hour); err != nil || !ok {
					t.Fatalf("release %s: %v %v", k, ok, err)
				}
			}
		case redisbackend.ClassCompleted:
			complete("orders", keys, tokens, idempotency.RecordOutcomeOK)
		case redisbackend.ClassDeadLettered:
			complete("orders", keys, tokens, idempotency.RecordOutcomeDeadLettered)
		}
		sd.keys[c] = keys
	}
	hourAgo := time.Now().Add(-time.Hour).UnixMilli()
	for _, k := range names("old", nOld) {
		v := fmt.Sprintf(`{"v":1,"state":"COMPLETED","fp":"fp","fpv":1,"token":"t","fence":7,"claimed_at_ms":%d,"lease_until_ms":%d,"attempts":1,"completed_at_ms":%d,"outcome":"ok","result":""}`,
			hourAgo, hourAgo, hourAgo)
		if err := client.Set(ctx, s.RedisKey(idempotency.EffectiveKey("orders", k)), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		sd.old = append(sd.old, k)
		sd.keys[redisbackend.ClassCompleted] = append(sd.keys[redisbackend.ClassCompleted], k)
	}
	complete("other", []string{"x"}, claim("other", []string{"x"}), idempotency.RecordOutcomeOK)
	if err := client.Set(ctx, s.RedisKey("orders:garbage"), "not a record", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for _, ks := range sd.keys {
		slices.Sort(ks)
	}
	return sd
}

// all returns every seeded key of "orders", sorted.
func (sd *seeded) all() []string {
	var ks []string
	for _, v := range sd.keys {
		ks = append(ks, v...)
	}
	slices.Sort(ks)
	return ks
}

// recordsJSON runs records -o json with args and returns its records.
func recordsJSON(t *testing.T, args ...string) []recordView {
	t.Helper()
	code, out, stderr := runCmd(t, append(append([]string{"records"}, args...), "-o", "json")...)
	var vs []recordView
	if code != 0 {
		t.Fatalf("records %v -o json: exit %d\n%s\n%s", args, code, out, stderr)
	}
	if err := json.Unmarshal([]byte(out), &vs); err != nil {
		t.Fatalf("records %v -o json: %v\n%s", args, err, out)
	}
	if strings.Contains(stderr, "\r") {
		t.Errorf("records wrote progress to a pipe: %q", stderr)
	}
	return vs
}

func viewKeys(vs []recordView) []string {
	ks := make([]string, len(vs))
	for i, v := range vs {
		ks[i] = v.Key
	}
	slices.Sort(ks)
	return ks
}

// storeConfigs are the stores records and forget are tested on: a
// standalone Redis, and the Cluster reached from one node's URL.
func storeConfigs(t *testing.T) map[string]func(t *testing.T) (redis.UniversalClient, string) {
	return map[string]func(t *testing.T) (redis.UniversalClient, string){
		"standalone": func(t *testing.T) (redis.UniversalClient, string) {
			return testenv.RedisClient(t), testenv.Redis(t)
		},
		"cluster": func(t *testing.T) (redis.UniversalClient, string) {
			addrs := testenv.RedisCluster(t)
			return testenv.RedisClusterClient(t), "redis://" + addrs[0] + "/0"
		},
	}
}

func TestRecordsListsByStateAgeAndLimit(t *testing.T) {
	t.Parallel()
	for name, store := range storeConfigs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client, url := store(t)
			ns := "rec-" + testenv.RandID()
			sd := seedRecords(t, client, ns, 6, 3)
			cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, url, ns)
			for _, c := range redisbackend.Classes {
				want := sd.keys[c]
				if c == redisbackend.ClassAll {
					want = sd.all()
				}
				vs := recordsJSON(t, "-c", cfg, "--state", string(c), "--handler", "orders", "--limit", "0")
				if got := viewKeys(vs); !slices.Equal(got, want) {
					t.Errorf("--state %s: got %v, want %v", c, got, want)
				}
				for _, v := range vs {
					if v.Handler != "orders" || v.EffectiveKey != "orders:"+v.Key || !v.Found || v.TTLLeftMS <= 0 {
						t.Errorf("--state %s: %+v, want handler, effective key, found and a TTL", c, v)
					}
				}
			}
			if got := viewKeys(recordsJSON(t, "-c", cfg, "--handler", "orders", "--state", "completed", "--older-than", "30m")); !slices.Equal(got, sd.old) {
				t.Errorf("--older-than 30m: got %v, want %v", got, sd.old)
			}
			if vs := recordsJSON(t, "--handler", "orders", "-c", cfg, "--limit", "5"); len(vs) != 5 {
				t.Errorf("--limit 5: %d records", len(vs))
			}
			code, out, stderr := runCmd(t, "records", "-c", cfg, "--handler", "orders", "--state", "dead_lettered")
			if code != 0 || !strings.Contains(out, "KEY") || !strings.Contains(out, "dead_lettered-3") || !strings.Contains(stderr, "6 records of handler \"orders\"") {
				t.Errorf("table: exit %d\n%s\n%s", code, out, stderr)
			}
			t.Logf("records table:\n%s%s", out, stderr)
		})
	}
}

// --limit stops the scan: of 3000 records, listing 5 reads far fewer keys.
func TestRecordsLimitStopsTheScan(t *testing.T) {
	t.Parallel()
	client := testenv.RedisClient(t)
	ns := "reclim-" + testenv.RandID()
	seedRecords(t, client, ns, 750, 0)
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, testenv.Redis(t), ns)
	code, _, stderr := runCmd(t, "records", "-c", cfg, "--handler", "orders", "--limit", "5")
	m := regexp.MustCompile(`(\d+) records of handler .*; (\d+) keys scanned`).FindStringSubmatch(stderr)
	if code != 0 || m == nil {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	listed, _ := strconv.Atoi(m[1])
	scanned, _ := strconv.Atoi(m[2])
	if listed != 5 || scanned == 0 || scanned >= 3000 {
		t.Fatalf("listed %d, scanned %d of 3000 keys; want 5 listed and the scan stopped early: %s", listed, scanned, stderr)
	}
}

func TestRecordsRefusesBadUsage(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, "redis: {url: redis://127.0.0.1:1/0}\n"+storeHandler)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"records", "-c", cfg}, "--handler NAME is required"},
		{[]string{"records", "-c", cfg, "--handler", "orders", "--state", "done"}, `--state "done": want one of all, claimed`},
		{[]string{"records", "-c", cfg, "--handler", "orders", "--older-than", "soon"}, `--older-than "soon"`},
		{[]string{"records", "-c", cfg, "--handler", "orders", "--limit", "-1"}, "--limit -1"},
		{[]string{"forget", "-c", cfg, "--handler", "orders", "--state", "claimed"}, "without --yes"},
		{[]string{"forget", "-c", cfg, "--handler", "orders", "--state", "claimed", "--yes", "--dry-run"}, "not both"},
		{[]string{"forget", "-c", cfg, "--handler", "orders", "--dry-run", "k"}, "go with --state"},
		{[]string{"forget", "-c", cfg, "--handler", "orders", "--state", "claimed", "--yes", "k"}, "takes no KEY"},
	} {
		code, _, stderr := runCmd(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

func TestBulkForgetCounts(t *testing.T) {
	t.Parallel()
	for name, store := range storeConfigs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			client, url := store(t)
			ns := "bulk-" + testenv.RandID()
			sd := seedRecords(t, client, ns, 40, 3)
			cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, url, ns)
			count := func(c redisbackend.Class) int {
				return len(recordsJSON(t, "-c", cfg, "--handler", "orders", "--state", string(c), "--limit", "0"))
			}
			code, out, stderr := runCmd(t, "forget", "-c", cfg, "--handler", "orders", "--state", "dead_lettered", "--dry-run")
			if code != 0 || !strings.Contains(out, "dry run: matched 40 dead_lettered") || count(redisbackend.ClassDeadLettered) != 40 {
				t.Fatalf("--dry-run: exit %d\n%s\n%s", code, out, stderr)
			}
			code, out, stderr = runCmd(t, "forget", "-c", cfg, "--handler", "orders", "--state", "dead_lettered", "--yes")
			if code != 0 || !strings.Contains(out, "matched 40 dead_lettered records of handler \"orders\"; deleted 40, kept 0") {
				t.Fatalf("--yes: exit %d\n%s\n%s", code, out, stderr)
			}
			code, out, stderr = runCmd(t, "forget", "-c", cfg, "--handler", "orders", "--state", "completed", "--older-than", "30m", "--yes")
			if code != 0 || !strings.Contains(out, "deleted 3,") {
				t.Fatalf("--older-than 30m: exit %d\n%s\n%s", code, out, stderr)
			}
			for c, want := range map[redisbackend.Class]int{redisbackend.ClassDeadLettered: 0, redisbackend.ClassCompleted: 40, redisbackend.ClassClaimed: 40, redisbackend.ClassReleased: 40} {
				if got := count(c); got != want {
					t.Errorf("after the forgets: %d %s records, want %d", got, c, want)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, k := range []string{ns + ":other:x", ns + ":orders:garbage"} {
				if n, err := client.Exists(ctx, k).Result(); err != nil || n != 1 {
					t.Errorf("EXISTS %s = %d, %v; want the other handler's record and the non-record kept", k, n, err)
				}
			}
			_ = sd
		})
	}
}

// A record that changes between the scan and the delete is kept: the
// script checks the state again. The test runs forget in-process, with
// afterScan completing two of the claimed records and deleting a third.
func TestBulkForgetKeepsRecordsChangedSinceTheScan(t *testing.T) {
	client := testenv.RedisClient(t)
	ns := "bulkchg-" + testenv.RandID()
	sd := seedRecords(t, client, ns, 20, 0)
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, testenv.Redis(t), ns)
	claimed := sd.keys[redisbackend.ClassClaimed]
	afterScan = func(keys []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if len(keys) != len(claimed) {
			t.Errorf("the scan found %d claimed keys, want %d", len(keys), len(claimed))
		}
		var cs []idempotency.Completion
		for _, k := range claimed[:2] {
			cs = append(cs, idempotency.Completion{Key: "orders:" + k, Token: sd.tokens[k], Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour})
		}
		if ok, err := sd.store.Complete(ctx, cs); err != nil || !ok[0] || !ok[1] {
			t.Errorf("complete in between: %v %v", ok, err)
		}
		if _, err := sd.store.Delete(ctx, "orders:"+claimed[2]); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { afterScan = nil })
	var stdout, stderr bytes.Buffer
	code := runMain([]string{"forget", "-c", cfg, "--handler", "orders", "--state", "claimed", "--yes"}, &stdout, &stderr)
	want := "matched 20 claimed records of handler \"orders\"; deleted 17, kept 2 (changed since the scan), gone 1"
	if code != 0 || !strings.Contains(stdout.String(), want) {
		t.Fatalf("exit %d\n%s\n%s\nwant %q", code, stdout.String(), stderr.String(), want)
	}
	if got := viewKeys(recordsJSON(t, "-c", cfg, "--handler", "orders", "--state", "completed", "--limit", "0")); len(got) != 22 {
		t.Errorf("completed after: %d records, want 20 + the 2 completed in between", len(got))
	}
}

// 100 000 completed records deleted by one bulk forget on standalone Redis:
// the wall time is logged, not asserted.
func TestBulkForget100k(t *testing.T) {
	client := testenv.RedisClient(t)
	ns := "bulk100k-" + testenv.RandID()
	start := time.Now()
	sd := seedRecords(t, client, ns, 25000, 0)
	t.Logf("seeded 100 000 records (25 000 per state) in %s", time.Since(start).Round(time.Millisecond))
	cfg := writeConfig(t, "redis: {url: %q, namespace: %s}\n"+storeHandler, testenv.Redis(t), ns)
	start = time.Now()
	code, out, stderr := runCmd(t, "forget", "-c", cfg, "--handler", "orders", "--state", "all", "--yes")
	wall := time.Since(start)
	if code != 0 || !strings.Contains(out, "matched 100000 all records of handler \"orders\"; deleted 100000, kept 0") {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	t.Logf("forget --state all --yes of 100 000 records: %s wall (scan + forget_if in batches of %d): %s", wall.Round(time.Millisecond), forgetBatch, strings.TrimSpace(out))
	_ = sd
}
