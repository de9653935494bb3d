package chaos_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestFailover kills the Redis primary of a Sentinel pair with SIGKILL while
// two workers process a steady stream of NATS messages, lets Sentinel
// promote the replica and brings the old primary back as a replica
// (docs/GUARANTEES.md, "Failover"). Once without redis.durability and once with replicas: 1, it
// reports the keys that ran more than once, the keys lost (none may be) and
// how long no key completed around the kill. With replicas: 1 no key may
// run twice: every claim and completion was on the replica before the
// worker acted on it, and a handler that finished while no primary answered
// has its result held until its completion lands on the promoted replica.
// That takes a lease longer than the failover (docs/SECURITY.md, "When Redis fails over",
// has the figures): a claim whose lease ran out while nothing could
// renew it is another worker's to take, as a crashed worker's would be.
// Without durability the repeats are the writes the replica had not
// received; the test reports them and asserts nothing about their number.
func TestFailover(t *testing.T) {
	for _, c := range []struct {
		name, durability string
	}{
		{"no durability", ""},
		{"replicas 1", "durability: {replicas: 1, timeout: 200ms}, "},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runFailover(t, c.durability)
			t.Logf("failover (%s): %d keys, %d run more than once, %d lost; no completion for %s, resumed %s after the kill",
				c.name, r.keys, r.repeated, r.lost, r.gap, r.resume)
			if r.lost > 0 {
				t.Errorf("%d keys lost", r.lost)
			}
			if c.durability != "" && r.repeated > 0 {
				t.Errorf("with replicas: 1, %d keys ran more than once: %v", r.repeated, r.repeatedKeys)
			}
		})
	}
}

type failoverResult struct {
	keys, repeated, lost int
	repeatedKeys         []string
	gap                  time.Duration // the longest time without a completion after the kill
	resume               time.Duration // from the kill to the end of that gap
}

func runFailover(t *testing.T, durability string) failoverResult {
	const keys = 3000
	bin := buildBinary(t)
	dir := t.TempDir()
	ledgerPath := filepath.Join(dir, "ledger")
	sent := testenv.StartSentinel(t)
	natsURL := startNATS(t, filepath.Join(dir, "nats"))
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FO", Subjects: []string{"fo.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "FO", jetstream.ConsumerConfig{
		Durable: "fo", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, MaxDeliver: -1,
		FilterSubject: "fo.>", MaxAckPending: 64,
	}); err != nil {
		t.Fatal(err)
	}
	script := `echo "S $DEDUP_HANDLER $DEDUP_KEY $DEDUP_FENCE $PPID $(date +%s%3N)" >> ` + ledgerPath + `
cat >/dev/null
echo "D $DEDUP_HANDLER $DEDUP_KEY $DEDUP_FENCE $PPID $(date +%s%3N)" >> ` + ledgerPath
	scriptJSON, _ := json.Marshal(script)
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(`redis: {sentinel: {master: `+sent.Master+`, addrs: [`+strings.Join(sent.Addrs, ", ")+`]}, `+
		durability+`namespace: fo, connect_timeout: 1s, grace: 5s}
http: {addr: ""}
log: {level: info}
shutdown_timeout: 5s
handlers:
  - name: n
    source: {nats: {url: "`+natsURL+`", stream: FO, subject: "fo.>", consumer: fo}}
    lease: 10s
    retention: 1h
    max_attempts: 100000
    backoff: {initial: 50ms, max: 500ms}
    concurrency: 16
    action: {exec: {command: [/bin/sh, -c, `+string(scriptJSON)+`], timeout: 60s}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ws := &workers{t: t, bin: bin, cfg: cfg, logDir: dir}
	ws.start()
	ws.start()
	defer ws.stopAll()

	// A steady stream: the keys over about 12 s, each published once.
	pubDone := make(chan error, 1)
	go func() {
		for i := 0; i < keys; i += 50 {
			var futs []jetstream.PubAckFuture
			for j := i; j < min(i+50, keys); j++ {
				m := nats.NewMsg("fo.in")
				m.Header.Set("Idempotency-Key", "k-"+strconv.Itoa(j))
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					pubDone <- err
					return
				}
				futs = append(futs, f)
			}
			for _, f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					pubDone <- err
					return
				case <-ctx.Done():
					pubDone <- ctx.Err()
					return
				}
			}
			select {
			case <-time.After(200 * time.Millisecond): // the publish rate, not synchronisation
			case <-ctx.Done():
			}
		}
		pubDone <- nil
	}()

	completedKeys := func() int {
		done, _ := readFailoverLedger(t, ledgerPath)
		return len(done)
	}
	deadline, _ := ctx.Deadline()
	testenv.Eventually(t, time.Until(deadline), "a third of the keys done", func() bool { return completedKeys() >= keys/3 })
	killed := time.Now()
	old := sent.KillPrimary(t)
	if _, err := sent.WaitFailover(old, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := sent.RestartNode(old); err != nil {
		t.Fatal(err)
	}
	if err := <-pubDone; err != nil {
		t.Fatalf("publish: %v", err)
	}
	testenv.Eventually(t, time.Until(deadline), "every key done", func() bool { return completedKeys() == keys })
	ws.stopAll()

	done, starts := readFailoverLedger(t, ledgerPath)
	r := failoverResult{keys: keys}
	for i := range keys {
		k := "k-" + strconv.Itoa(i)
		if len(done[k]) == 0 {
			r.lost++
		}
		if starts[k] > 1 {
			r.repeated++
			r.repeatedKeys = append(r.repeatedKeys, k)
		}
	}
	var all []int64
	for _, ds := range done {
		all = append(all, ds...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	// The outage: the longest stretch without a completion that ends
	// within a minute after the kill (completions in flight at the kill may
	// still land just after it); resume is when it ended.
	k := killed.UnixMilli()
	for i := 1; i < len(all); i++ {
		if all[i] < k || all[i] > k+60_000 {
			continue
		}
		if g := time.Duration(all[i]-max(all[i-1], k)) * time.Millisecond; g > r.gap {
			r.gap = g
			r.resume = time.Duration(all[i]-k) * time.Millisecond
		}
	}
	return r
}

// readFailoverLedger returns the completion times (ms) and the number of
// runs of each key.
func readFailoverLedger(t *testing.T, path string) (done map[string][]int64, starts map[string]int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	done, starts = map[string][]int64{}, map[string]int{}
	for line := range strings.SplitSeq(string(b), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 6 {
			continue
		}
		at, _ := strconv.ParseInt(fs[5], 10, 64)
		switch fs[0] {
		case "S":
			starts[fs[2]]++
		case "D":
			done[fs[2]] = append(done[fs[2]], at)
		}
	}
	return done, starts
}
