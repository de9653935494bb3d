// Package chaos_test drives several real dedupworker processes against real
// Redis, an embedded nats-server and the real 3-node Apache Kafka cluster of
// .ci/kafka.sh, while it kills workers (kill -9), stops them gracefully and
// starts new ones (consumer-group rebalances), kills Kafka brokers with
// SIGKILL and starts them again, cuts connections through TCP proxies, and
// lets some handlers outlive their lease. Then it proves from a ledger that
// no key was lost and that every handler run beyond the first of a key is
// explained by a fault inside that key's earlier run.
//
// It runs once per store:
//
//   - single: a private redis-server with an append-only file, which the
//     driver restarts (with CHAOS_WIPE or CHAOS_LONG, also without its data)
//     and cuts off;
//   - sentinel: a private primary and replica under three Sentinels, whose
//     primary the driver kills with SIGKILL so that Sentinel promotes the
//     replica (the old primary comes back as a replica).
//
// CHAOS_STORE=single or sentinel runs one of them; CHAOS_DURABILITY=1 gives
// the sentinel store redis.durability {replicas: 1}. The default run is short
// (about a minute for both). The long run (50,000 keys over both
// transports, every fault):
//
//	CHAOS_LONG=1 CHAOS_STORE=sentinel go test ./integration/chaos -run TestChaos -v -timeout 80m
//
// CHAOS_KEYS (keys per transport), CHAOS_WORKERS and CHAOS_FAULT_EVERY
// override the figures of either mode; CHAOS_DIR keeps the ledger and the
// worker logs. Faults are injected for a bounded time (faultFor), then the
// run converges; every kind of fault comes in turn.
//
// A restart of a Redis without persistence forgets keys, and a failover
// loses the writes the replica had not received: the keys that ran again
// because of either are counted as explained by a Redis fault, the
// failover's in a column of their own. A lost claim is redelivered unless
// the record shows a new owner, so no key is lost to either. A completion
// lost in a failover leaves the key's record CLAIMED; without
// redis.durability such a record is allowed when a failover came after the
// key's completed run began, and no other record may stay CLAIMED.
package chaos_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// params of one run.
type params struct {
	keys        int           // unique keys per transport
	dupEvery    int           // every dupEvery-th key is published twice
	slowEvery   int           // every slowEvery-th key's handler outlives the lease
	workers     int           // worker processes at once
	faultEvery  time.Duration // time between faults
	memberEvery time.Duration // least time between worker kills/stops and Kafka cuts (each is a rebalance)
	faultFor    time.Duration // faults are injected for this long, then the run converges
	publishFor  time.Duration // publishing is spread over this long
	deadline    time.Duration // the whole run must finish within this
	lease       time.Duration
	downFor     time.Duration // how long a killed Kafka broker stays down
}

func chaosParams(t *testing.T) params {
	p := params{keys: 200, dupEvery: 3, slowEvery: 47, workers: 3, faultEvery: 1500 * time.Millisecond, memberEvery: 5 * time.Second,
		faultFor: 20 * time.Second, publishFor: 6 * time.Second, deadline: 4 * time.Minute, lease: 2 * time.Second, downFor: 3 * time.Second}
	if os.Getenv("CHAOS_LONG") != "" {
		p = params{keys: 25000, dupEvery: 3, slowEvery: 499, workers: 4, faultEvery: 3 * time.Second, memberEvery: 8 * time.Second,
			faultFor: 5 * time.Minute, publishFor: 4 * time.Minute, deadline: 50 * time.Minute, lease: 2 * time.Second, downFor: 5 * time.Second}
	}
	if v, err := strconv.Atoi(os.Getenv("CHAOS_KEYS")); err == nil && v > 0 {
		p.keys = v
	}
	if v, err := strconv.Atoi(os.Getenv("CHAOS_WORKERS")); err == nil && v > 0 {
		p.workers = v
	}
	if v, err := time.ParseDuration(os.Getenv("CHAOS_FAULT_EVERY")); err == nil && v > 0 {
		p.faultEvery = v
	}
	return p
}

func TestChaos(t *testing.T) {
	stores := []string{"single", "sentinel"}
	if v := os.Getenv("CHAOS_STORE"); v != "" {
		stores = []string{v}
	}
	for _, store := range stores {
		t.Run(store, func(t *testing.T) { runChaos(t, chaosParams(t), store) })
	}
}

func runChaos(t *testing.T, p params, store string) {
	start := time.Now()
	bin := buildBinary(t)
	dir := os.Getenv("CHAOS_DIR") // kept after the run, for reading the ledger and worker logs
	if dir == "" {
		dir = t.TempDir()
	} else {
		dir = filepath.Join(dir, store)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ledgerPath := filepath.Join(dir, "ledger")
	led, err := os.OpenFile(ledgerPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	var ledMu sync.Mutex
	fault := func(kind string, pid int) {
		ledMu.Lock()
		defer ledMu.Unlock()
		fmt.Fprintf(led, "F %s %d %d\n", kind, pid, time.Now().UnixMilli())
	}

	// Services, each behind something the driver can cut or kill.
	var (
		rs         *testenv.RedisServer
		redisProxy *testenv.Proxy
		sent       *testenv.Sentinel
		redisCfg   string
	)
	switch store {
	case "single":
		// An append-only file with an fsync on every write, which a restart
		// keeps or (as a Redis without persistence would) loses.
		rs = testenv.NewRedisServer(t, testenv.RedisServerConfig{Dir: filepath.Join(dir, "redis"),
			Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
		redisProxy = testenv.NewProxy(t, rs.Addr())
		redisCfg = `{url: "redis://` + redisProxy.Addr() + `/0", namespace: chaos, connect_timeout: 1s, grace: 5s}`
	case "sentinel":
		sent = testenv.StartSentinel(t)
		durability := ""
		if os.Getenv("CHAOS_DURABILITY") != "" {
			// Every claim and completion waits for the replica:
			// a failover then explains no repeat.
			durability = "durability: {replicas: 1, timeout: 200ms}, "
		}
		redisCfg = `{sentinel: {master: ` + sent.Master + `, addrs: [` + strings.Join(sent.Addrs, ", ") + `]}, ` + durability +
			`namespace: chaos, connect_timeout: 1s, grace: 5s}`
	default:
		t.Fatalf("CHAOS_STORE=%q: want single or sentinel", store)
	}
	natsURL := startNATS(t, filepath.Join(dir, "nats"))
	natsProxy := testenv.NewProxy(t, strings.TrimPrefix(natsURL, "nats://"))
	nodes := testenv.KafkaCluster(t)
	nodes.LockFaults(t)
	kafkaCuts := nodes.CutProxies(t)
	topic := fmt.Sprintf("chaos-%s-%d", store, time.Now().UnixNano())
	testenv.CreateKafkaTopicRF(t, nodes.Brokers, topic, 4, 3)
	var background sync.WaitGroup // broker and Redis restarts
	defer background.Wait()

	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), p.deadline)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "CHAOS", Subjects: []string{"chaos.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}

	// The durable consumer, made here so that several workers share an ack
	// window of workers × concurrency: the binary creates it with
	// MaxAckPending = one worker's concurrency, which starves
	// all but one worker of a shared durable, and binds to an existing one
	// unchanged.
	if _, err := js.CreateOrUpdateConsumer(ctx, "CHAOS", jetstream.ConsumerConfig{
		Durable: "chaos", AckPolicy: jetstream.AckExplicitPolicy, AckWait: p.lease, MaxDeliver: -1,
		FilterSubject: "chaos.>", MaxAckPending: 8 * (p.workers + 2),
	}); err != nil {
		t.Fatal(err)
	}

	cfg := filepath.Join(dir, "config.yaml")
	script := `echo "S $DEDUP_HANDLER $DEDUP_KEY $DEDUP_FENCE $PPID $(date +%s%3N)" >> ` + ledgerPath + `
case "$DEDUP_KEY" in *-slow) sleep ` + strconv.Itoa(int(p.lease.Seconds()*3/2+0.5)) + `;; esac
cat >/dev/null
echo "D $DEDUP_HANDLER $DEDUP_KEY $DEDUP_FENCE $PPID $(date +%s%3N)" >> ` + ledgerPath
	scriptJSON, _ := json.Marshal(script)
	handler := func(name, source string) string {
		return fmt.Sprintf(`  - name: %s
    source: {%s}
    lease: %s
    retention: 1h
    max_attempts: 100000
    backoff: {initial: 50ms, max: 500ms}
    concurrency: 8
    action: {exec: {command: [/bin/sh, -c, %s], timeout: 60s}}
`, name, source, p.lease, scriptJSON)
	}
	if err := os.WriteFile(cfg, []byte(`redis: `+redisCfg+`
http: {addr: ""}
log: {level: info}
shutdown_timeout: 3s
handlers:
`+handler("n", `nats: {url: "nats://`+natsProxy.Addr()+`", stream: CHAOS, subject: "chaos.>", consumer: chaos}`)+
		handler("k", `kafka: {brokers: [`+strings.Join(nodes.CutBrokers, ", ")+`], topic: `+topic+`, group: `+topic+`, session_timeout: 2s}`)), 0o644); err != nil {
		t.Fatal(err)
	}

	// Workers.
	ws := &workers{t: t, bin: bin, cfg: cfg, logDir: dir}
	for range p.workers {
		ws.start()
	}
	defer ws.stopAll()

	// Publish the keys with duplicates, spread over publishFor.
	keys := planKeys(p)
	pubDone := make(chan error, 1)
	go func() { pubDone <- publish(ctx, js, nodes.Brokers, topic, keys, p.publishFor) }()

	// Faults, until every key is done.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	faults := map[string]int{}
	kinds := []string{"kill", "term", "nats-cut", "kafka-cut", "kafka-kill", "kill"}
	redisKinds := []string{"nats-cut"} // what comes instead of a deferred group fault
	switch store {
	case "single":
		kinds = append(kinds, "redis-restart", "redis-cut")
		redisKinds = append(redisKinds, "redis-restart", "redis-cut")
		if os.Getenv("CHAOS_WIPE") != "" || os.Getenv("CHAOS_LONG") != "" {
			// Restarts of a Redis without persistence: see the package doc.
			kinds = append(kinds, "redis-wipe")
		}
	case "sentinel":
		kinds = append(kinds, "redis-failover")
	}
	var kafkaDown, failingOver atomic.Bool
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	nfault := 0
	tick := time.NewTicker(p.faultEvery)
	defer tick.Stop()
	progress := time.NewTicker(10 * time.Second)
	defer progress.Stop()
	published := false
	var lastMember time.Time
	faultStart := time.Now()
	lastCompleted, lastChange := -1, time.Now()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			an := analyse(t, ledgerPath, keys, p.lease)
			t.Fatalf("chaos: not done within %s: %d of %d keys completed", p.deadline, an.completed, len(keys.unique))
		case err := <-pubDone:
			if err != nil {
				t.Fatalf("publish: %v", err)
			}
			published = true
			pubDone = nil
		case <-progress.C:
			an := analyse(t, ledgerPath, keys, p.lease)
			t.Logf("chaos: %s: %d/%d keys completed (%s), faults %v", time.Since(start).Round(time.Second), an.completed, len(keys.unique),
				strings.ReplaceAll(strings.TrimSpace(an.table(keys)), "\n", " "), faults)
		case <-tick.C:
			completed := analyse(t, ledgerPath, keys, p.lease).completed
			if published && completed == len(keys.unique) {
				done = true
				break
			}
			if time.Since(faultStart) > p.faultFor {
				// Quiet: the run converges by itself. On real Kafka a
				// member that died with its JoinGroup held expires after
				// session.timeout.ms, so nothing here kicks the group; a
				// stall ends the run at its deadline, with the analysis.
				if completed != lastCompleted {
					lastCompleted, lastChange = completed, time.Now()
				} else if time.Since(lastChange) > time.Minute {
					t.Logf("chaos: nothing completed for %s", time.Since(lastChange).Round(time.Second))
					lastChange = time.Now()
				}
				continue
			}
			kind := kinds[nfault%len(kinds)] // every kind in turn, in a random order
			// A kill, stop or Kafka cut makes the consumer group rejoin:
			// spaced out, or the group never settles. A deferred one is
			// next in turn; something else happens meanwhile.
			group := kind == "kill" || kind == "term" || kind == "kafka-cut" || kind == "kafka-kill"
			busy := kind == "kafka-kill" && kafkaDown.Load() || kind == "redis-failover" && failingOver.Load()
			if group && time.Since(lastMember) < p.memberEvery || busy {
				kind = redisKinds[rng.IntN(len(redisKinds))]
			} else {
				nfault++
				if group {
					lastMember = time.Now()
				}
			}
			faults[kind]++
			switch kind {
			case "kill":
				w := ws.random(rng)
				fault("kill", w.pid())
				w.kill()
				ws.start()
			case "term": // a graceful leave and a new member: a rebalance
				w := ws.random(rng)
				fault("term", w.pid())
				ws.start()
				ws.leaving.Go(w.term)
			case "redis-restart":
				fault("redis", 0)
				restartRedis(rs, false)
			case "redis-wipe": // a restart of a Redis without persistence
				fault("redis", 0)
				restartRedis(rs, true)
			case "redis-cut":
				fault("redis", 0)
				redisProxy.Cut()
			case "nats-cut":
				fault("nats", 0)
				natsProxy.Cut()
			case "kafka-cut":
				fault("kafka", 0)
				for _, c := range kafkaCuts {
					c.Cut()
				}
			case "kafka-kill": // a broker dies; its partitions' leaders move
				id := 1 + rng.IntN(3)
				fault("kafka-kill", id)
				nodes.Kill(t, id)
				kafkaDown.Store(true)
				background.Go(func() {
					defer kafkaDown.Store(false)
					select {
					case <-time.After(p.downFor):
					case <-ctx.Done():
					}
					if err := nodes.StartErr(id); err != nil {
						t.Errorf("chaos: %v", err)
					}
				})
			case "redis-failover": // the primary dies; Sentinel promotes the replica
				fault("redis", 0)
				fault("failover", 0)
				old := sent.KillPrimary(t)
				failingOver.Store(true)
				background.Go(func() {
					defer failingOver.Store(false)
					if _, err := sent.WaitFailover(old, time.Minute); err != nil {
						t.Errorf("chaos: %v", err)
					}
					if err := sent.RestartNode(old); err != nil {
						t.Errorf("chaos: %v", err)
					}
				})
			}
		}
	}

	// Let the workers finish and drain, then read the ledger and Redis.
	ws.stopAll()
	background.Wait()
	an := analyse(t, ledgerPath, keys, p.lease)
	var rc redis.UniversalClient
	if sent != nil {
		rc = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sent.Master, SentinelAddrs: sent.Addrs})
	} else {
		rc = redis.NewClient(&redis.Options{Addr: rs.Addr()})
	}
	defer rc.Close()
	claimed, completed, missing := scanRecords(t, rc, keys)

	t.Logf("chaos report (%s, store %s, %d workers, faults every %s, lease %s):\n"+
		"| transport | keys published | messages | keys completed | keys lost | runs beyond first | explained by crash | by Redis fault | of which failover | unexplained |\n"+
		"|---|---|---|---|---|---|---|---|---|---|\n%s"+
		"faults injected: %v; worker processes started: %d\n"+
		"records at the end: %d COMPLETED, %d CLAIMED, %d absent (lost to Redis wipes or a failover)\n"+
		"duration %s",
		map[bool]string{true: "long", false: "short"}[os.Getenv("CHAOS_LONG") != ""], store, p.workers, p.faultEvery, p.lease,
		an.table(keys), faults, ws.started, completed, len(claimed), missing, time.Since(start).Round(time.Second))
	if an.lost > 0 {
		t.Errorf("%d keys lost: %v", an.lost, an.lostKeys)
	}
	if len(an.unexplained) > 0 {
		t.Errorf("%d handler runs repeat a key with no crash or Redis fault inside its earlier run: %v", len(an.unexplained), an.unexplained[:min(10, len(an.unexplained))])
	}
	var stuck []string
	for _, hk := range claimed {
		if os.Getenv("CHAOS_DURABILITY") != "" || !an.claimedByFailover(hk) {
			stuck = append(stuck, hk)
		}
	}
	if len(stuck) > 0 {
		t.Errorf("%d records left CLAIMED after every key completed and the workers stopped, with no failover after their completion: %v", len(stuck), stuck[:min(10, len(stuck))])
	}
	if an.completed != len(keys.unique) {
		t.Errorf("%d of %d keys completed", an.completed, len(keys.unique))
	}
}

// ---- keys and publishing ----

type keyPlan struct {
	unique []string // "<handler>/<key>"
	msgs   []string // in publish order, duplicates included
}

func planKeys(p params) keyPlan {
	var kp keyPlan
	for _, h := range []string{"n", "k"} {
		for i := range p.keys {
			k := fmt.Sprintf("%s-%d", h, i)
			if p.slowEvery > 0 && i%p.slowEvery == p.slowEvery-1 {
				k += "-slow"
			}
			kp.unique = append(kp.unique, h+"/"+k)
			kp.msgs = append(kp.msgs, h+"/"+k)
			if i%p.dupEvery == 0 {
				kp.msgs = append(kp.msgs, h+"/"+k)
			}
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	r.Shuffle(len(kp.msgs), func(i, j int) { kp.msgs[i], kp.msgs[j] = kp.msgs[j], kp.msgs[i] })
	return kp
}

func publish(ctx context.Context, js jetstream.JetStream, brokers []string, topic string, kp keyPlan, over time.Duration) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
		BatchTimeout: 2 * time.Millisecond, RequiredAcks: kafka.RequireAll, MaxAttempts: 20}
	defer w.Close()
	const chunk = 100
	pause := over / time.Duration(max(1, len(kp.msgs)/chunk))
	for i := 0; i < len(kp.msgs); i += chunk {
		var kmsgs []kafka.Message
		var futs []jetstream.PubAckFuture
		for _, hk := range kp.msgs[i:min(i+chunk, len(kp.msgs))] {
			h, k, _ := strings.Cut(hk, "/")
			if h == "k" {
				kmsgs = append(kmsgs, kafka.Message{Key: []byte(k), Value: []byte("v " + k),
					Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(k)}}})
				continue
			}
			m := nats.NewMsg("chaos.in")
			m.Data = []byte("v " + k)
			m.Header.Set("Idempotency-Key", k)
			f, err := js.PublishMsgAsync(m)
			if err != nil {
				return err
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		// A killed broker leads its partitions until the controller fences
		// it: a producer retries the chunk, as any producer would (copies
		// written twice are duplicates, which the workers must ack).
		for len(kmsgs) > 0 {
			err := w.WriteMessages(ctx, kmsgs...)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return err
			}
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// ---- the ledger ----

type run struct {
	at     int64 // ms of its S
	done   bool  // a D followed
	doneAt int64 // ms of its D
	fence  string
	pid    int // the worker's pid; 1 when the worker died before the run began
}

type analysis struct {
	runs        map[string][]*run // "<handler>/<key>" -> runs in start order
	completed   int
	lost        int
	lostKeys    []string
	byCrash     map[string]int // per handler
	byRedis     map[string]int
	byFailover  map[string]int // of byRedis, those with a failover in the window
	unexplained []string
	failovers   []int64 // when the primary was killed, ms
}

// analyse reads the ledger. A run of a key after its first is explained
// ("crash") when the worker of the earlier run was killed or stopped before
// this run began (the earlier run's handler or completion was cut short; a
// killed worker's handler process is orphaned and may still finish), or
// ("redis") when Redis was restarted, wiped or cut off between a lease
// before the earlier run began (its claim) and this run's start (its
// renewal or completion could not land, or a wipe forgot the key). Cuts of
// NATS or Kafka explain nothing: they may redeliver, but a redelivery of a
// completed key must be a duplicate.
func analyse(t *testing.T, path string, kp keyPlan, lease time.Duration) *analysis {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	an := &analysis{runs: map[string][]*run{}, byCrash: map[string]int{}, byRedis: map[string]int{}, byFailover: map[string]int{}}
	killedAt := map[int]int64{}
	var redisFaults, failovers []int64
	open := map[string]*run{} // "<handler>/<key>/<pid>/<fence>" -> run without D yet
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		switch {
		case len(fs) == 4 && fs[0] == "F":
			pid, _ := strconv.Atoi(fs[2])
			at, _ := strconv.ParseInt(fs[3], 10, 64)
			switch fs[1] {
			case "kill", "term":
				killedAt[pid] = at
			case "redis":
				redisFaults = append(redisFaults, at)
			case "failover":
				failovers = append(failovers, at)
			}
		case len(fs) == 6 && (fs[0] == "S" || fs[0] == "D"):
			hk := fs[1] + "/" + fs[2]
			pid, _ := strconv.Atoi(fs[4])
			at, _ := strconv.ParseInt(fs[5], 10, 64)
			id := hk + "/" + fs[4] + "/" + fs[3]
			if fs[0] == "S" {
				r := &run{at: at, fence: fs[3], pid: pid}
				an.runs[hk] = append(an.runs[hk], r)
				open[id] = r
			} else if r := open[id]; r != nil {
				r.done, r.doneAt = true, at
				delete(open, id)
			}
		}
	}
	for _, hk := range kp.unique {
		rs := an.runs[hk]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].at < rs[j].at })
		doneOnce := false
		for _, r := range rs {
			doneOnce = doneOnce || r.done
		}
		if doneOnce {
			an.completed++
		} else {
			an.lost++
			an.lostKeys = append(an.lostKeys, hk)
		}
		h, _, _ := strings.Cut(hk, "/")
		for i := 1; i < len(rs); i++ {
			prev, cur := rs[i-1], rs[i]
			// The kill or stop must fall inside the earlier run: from just
			// before its S (a handler forked before the kill writes after
			// it) to a lease after its D (the completion in flight).
			end := cur.at
			if prev.done {
				end = min(end, prev.doneAt+lease.Milliseconds())
			}
			k, killed := killedAt[prev.pid]
			crash := prev.pid == 1 || killed && k >= prev.at-1000 && k <= end
			in := func(at int64) bool { return at >= prev.at-lease.Milliseconds()-1000 && at <= cur.at }
			red, failover := false, false
			for _, at := range redisFaults {
				red = red || in(at)
			}
			for _, at := range failovers {
				failover = failover || in(at)
			}
			switch {
			case crash:
				an.byCrash[h]++
			case red:
				an.byRedis[h]++
				if failover {
					an.byFailover[h]++
				}
			default:
				an.unexplained = append(an.unexplained, fmt.Sprintf("%s run %d (fence %s, pid %d, at %d) after a run (fence %s, pid %d, at %d, done %v)",
					hk, i+1, cur.fence, cur.pid, cur.at, prev.fence, prev.pid, prev.at, prev.done))
			}
		}
	}
	sort.Strings(an.lostKeys)
	an.failovers = failovers
	return an
}

// claimedByFailover reports whether a failover can explain the CLAIMED
// record of hk, a key whose handler completed: one came after its last
// completed run began, so the replica Sentinel promoted may have had the
// claim and not the completion (asynchronous replication). A
// duplicate that claims the key again repairs such a record; one answered
// by the local cache of the process that completed it (which is right: the
// key was completed) leaves it.
func (an *analysis) claimedByFailover(hk string) bool {
	var last *run
	for _, r := range an.runs[hk] {
		if r.done {
			last = r
		}
	}
	if last == nil {
		return false
	}
	for _, at := range an.failovers {
		if at >= last.at-1000 {
			return true
		}
	}
	return false
}

func (an *analysis) table(kp keyPlan) string {
	var b strings.Builder
	for _, h := range []string{"n", "k"} {
		name := map[string]string{"n": "NATS", "k": "Kafka"}[h]
		keys, msgs, completed, lost, beyond, unexpl := 0, 0, 0, 0, 0, 0
		for _, hk := range kp.unique {
			if !strings.HasPrefix(hk, h+"/") {
				continue
			}
			keys++
			rs := an.runs[hk]
			ok := false
			for _, r := range rs {
				ok = ok || r.done
			}
			if ok {
				completed++
			} else {
				lost++
			}
			if len(rs) > 1 {
				beyond += len(rs) - 1
			}
		}
		for _, m := range kp.msgs {
			if strings.HasPrefix(m, h+"/") {
				msgs++
			}
		}
		for _, u := range an.unexplained {
			if strings.HasPrefix(u, h+"/") {
				unexpl++
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", name, keys, msgs, completed, lost, beyond, an.byCrash[h], an.byRedis[h], an.byFailover[h], unexpl)
	}
	return b.String()
}

// scanRecords counts the records of the keys by state.
func scanRecords(t *testing.T, rc redis.UniversalClient, kp keyPlan) (claimed []string, completed, missing int) {
	ctx := context.Background()
	for i := 0; i < len(kp.unique); i += 500 {
		hks := kp.unique[i:min(i+500, len(kp.unique))]
		var ks []string
		for _, hk := range hks {
			h, k, _ := strings.Cut(hk, "/")
			ks = append(ks, "chaos:"+h+":"+k)
		}
		vals, err := rc.MGet(ctx, ks...).Result()
		if err != nil {
			t.Fatalf("reading records: %v", err)
		}
		for j, v := range vals {
			s, _ := v.(string)
			var rec struct{ State string }
			switch {
			case v == nil:
				missing++
			case json.Unmarshal([]byte(s), &rec) != nil:
				t.Errorf("a record that is not JSON: %q", s)
			case rec.State == "COMPLETED":
				completed++
			default:
				claimed = append(claimed, hks[j])
			}
		}
	}
	return
}
