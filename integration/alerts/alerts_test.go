// Package alerts_test proves dedupworker's alert rules end to end: a real
// Prometheus scrapes running `dedupworker run` processes and evaluates
// deploy/prometheus/dedupworker-rules.yaml with its durations shortened, a
// real Alertmanager routes the alerts to a webhook receiver inside the test,
// and the test causes each fault for real, checks that the matching alert
// arrives, undoes the fault and checks that the alert resolves.
//
// Prometheus and Alertmanager come from Debian's prometheus and
// prometheus-alertmanager packages (.ci/services.sh installs them). The test
// starts its own of each on free loopback ports, rather than using shared
// ones, because their configuration is the test's: the rules rewritten with
// short durations, scrape targets on ports chosen at run time, and the
// webhook receiver's address. Without them it is skipped, or failed under
// DEDUP_REQUIRE_SERVICES=1. It uses the shared NATS for its sources (streams
// of its own) and redis-servers of its own, which it stops and fills.
package alerts_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/internal/alertrules"
	"github.com/idemkit/dedupworker/internal/testenv"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupworker-alerts-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "dedupworker")
	code := 1
	if out, err := exec.Command("go", "build", "-o", binPath, "../../cmd/dedupworker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// The rules' durations divided by speedup: for: as it comes out, range
// windows no shorter than minWindow. A window must hold several of the
// source's lag readings (5 s apart while idle) and, while the store is down,
// more than one redelivery of a message that backs off up to 15 s: with less,
// a window can hold no delivery at all and the store alert resolves in the
// middle of the outage.
const (
	speedup   = 20
	minWindow = 30 * time.Second
)

var scale = alertrules.Scale{
	For: func(d time.Duration) time.Duration {
		if d == 0 {
			return 0
		}
		return max(d/speedup, time.Second)
	},
	Range: func(d time.Duration) time.Duration {
		return max(d/speedup, minWindow)
	},
}

// TestAlertsEndToEnd runs three workers, a Prometheus and an Alertmanager,
// then, in parallel, each fault and its undoing.
func TestAlertsEndToEnd(t *testing.T) {
	promBin := lookPath(t, "prometheus", "prometheus")
	amBin := lookPath(t, "prometheus-alertmanager", "prometheus-alertmanager")
	natsURL := testenv.NATS(t)
	start := time.Now()

	hook := newWebhook(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	// Three stores: one to stop, one that evicts, one for the handler faults.
	aof := []string{"--appendonly", "yes"}
	rMain := testenv.StartRedisServer(t, aof...)
	rDown := testenv.StartRedisServer(t, aof...)
	rEvict := testenv.StartRedisServer(t, append(aof, "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru")...)

	nc, err := nats.Connect(natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	stream := func(prefix string) string {
		s := testenv.NewNATSStream(t, natsURL, prefix)
		return s.Name
	}
	// The handlers of wMain run healthy while these files exist; removing
	// one is the fault, writing it again the undoing.
	okFile, fastFile := filepath.Join(dir, "fail-fixed"), filepath.Join(dir, "slow-fixed")
	touch(t, okFile)
	touch(t, fastFile)

	// The dead letters go to a stream of their own: the worker refuses a
	// dead-letter subject that no stream stores.
	dlq := testenv.NewNATSStream(t, natsURL, "ALDLQ").Subject + ".dead"
	wMain := &worker{name: "main", dir: dir, addr: testenv.FreeAddr(t), redis: rMain.URL(), nats: natsURL, handlers: []handler{
		// Fails every run (exit 1: retried, then dead-lettered) until the
		// file exists.
		{name: "fail", stream: stream("ALFAIL"), rate: 3, command: fmt.Sprintf(`test -e %s`, okFile),
			extra: "max_attempts: 2\n    backoff: {initial: 100ms, max: 200ms}\n    dead_letter: {nats: {subject: " + dlq + "}}"},
		// Slower than its input (one run at a time, 0.5 s each, 4 messages a
		// second) until the file exists.
		{name: "slow", stream: stream("ALSLOW"), rate: 4, command: fmt.Sprintf(`test -e %s || sleep 0.5`, fastFile),
			extra: "concurrency: 1"},
	}}
	wDown := &worker{name: "down", dir: dir, addr: testenv.FreeAddr(t), redis: rDown.URL(), nats: natsURL, handlers: []handler{
		{name: "stored", stream: stream("ALDOWN"), rate: 4, command: "true", extra: "concurrency: 4"},
	}}
	wEvict := &worker{name: "evict", dir: dir, addr: testenv.FreeAddr(t), redis: rEvict.URL(), nats: natsURL, handlers: []handler{
		{name: "evicted", stream: stream("ALEVICT"), rate: 2, command: "true"},
	}}
	workers := []*worker{wMain, wDown, wEvict}
	evictStarted := time.Now()
	for _, w := range workers {
		w.start(t)
	}
	for _, w := range workers {
		w.waitUp(t, ctx)
	}

	rules := shortenedRules(t, dir)
	am := startAlertmanager(t, ctx, amBin, dir, hook.url())
	prom := startPrometheus(t, ctx, promBin, dir, rules, am, []string{wMain.addr, wDown.addr, wEvict.addr})

	// Each stream gets messages at its handler's rate until the test ends.
	var producers sync.WaitGroup
	pctx, stopProducing := context.WithCancel(ctx)
	t.Cleanup(func() { stopProducing(); producers.Wait() })
	for _, w := range workers {
		for _, h := range w.handlers {
			producers.Go(func() { produce(pctx, t, nc, h) })
		}
	}
	t.Logf("workers, Prometheus and Alertmanager up in %s", time.Since(start).Round(time.Millisecond))
	// A baseline before any fault: Prometheus sees every handler complete
	// messages.
	eventually(t, ctx, 60*time.Second, "every handler processes messages, as Prometheus sees it", func() (bool, string) {
		body, err := get(ctx, "http://"+prom+"/api/v1/query?query="+url.QueryEscape(`count(sum by (handler) (increase(dedup_messages_total{outcome="processed"}[10s])) > 0)`))
		if err != nil {
			return false, err.Error()
		}
		if !strings.Contains(body, `"4"]`) {
			return false, body
		}
		return true, ""
	})
	t.Logf("baseline reached at %s", time.Since(start).Round(time.Millisecond))

	var mu sync.Mutex
	var results []result
	record := func(r ...result) {
		mu.Lock()
		results = append(results, r...)
		mu.Unlock()
	}
	top := t // owns the processes started inside the subtests
	t.Run("faults", func(t *testing.T) {
		t.Run("redis stopped", func(t *testing.T) {
			t.Parallel()
			f := fault{name: "the store's redis-server stopped", hook: hook, expect: []match{
				{alert: "DedupStoreUnavailable", labels: map[string]string{"handler": "stored"}},
				{alert: "DedupHandlerStuck", labels: map[string]string{"handler": "stored"}},
				{alert: "DedupWorkerNotReady", labels: map[string]string{"instance": wDown.addr, "check": "redis"}},
			}}
			record(f.run(t, ctx, rDown.Stop, rDown.Start)...)
		})
		t.Run("handler fails", func(t *testing.T) {
			t.Parallel()
			f := fault{name: "exec action exits 1 on every run", hook: hook, expect: []match{
				{alert: "DedupHandlerErrors", labels: map[string]string{"handler": "fail"}},
				{alert: "DedupDeadLettered", labels: map[string]string{"handler": "fail"}},
			}}
			record(f.run(t, ctx, func() { remove(t, okFile) }, func() { touch(t, okFile) })...)
		})
		t.Run("handler slow", func(t *testing.T) {
			t.Parallel()
			f := fault{name: "exec action takes 0.5 s, 4 messages/s arrive, concurrency 1", hook: hook, expect: []match{
				{alert: "DedupHandlerTooSlow", labels: map[string]string{"handler": "slow"}},
			}}
			record(f.run(t, ctx, func() { remove(t, fastFile) }, func() { touch(t, fastFile) })...)
		})
		t.Run("redis evicts", func(t *testing.T) {
			t.Parallel()
			rc := redis.NewClient(rEvict.Options())
			defer rc.Close()
			instance := map[string]string{"instance": wEvict.addr}
			// The risk is the policy the worker found at its start, so its
			// alert is timed from there.
			f := fault{name: "maxmemory 8mb, allkeys-lru (risk: from the worker's start), 16 MB of other keys written", hook: hook, expect: []match{
				{alert: "DedupRedisEvictions", labels: instance},
				{alert: "DedupStoreRisk", labels: map[string]string{"instance": wEvict.addr, "check": "eviction"}, from: evictStarted},
			}}
			// Undone as the alerts' runbooks say: noeviction, then a restart so
			// the worker reads the setting again. The restart waits for the
			// worker's own down alert.
			undo := func() {
				if err := rc.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
					t.Errorf("CONFIG SET maxmemory-policy: %v", err)
				}
				if err := rc.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
					t.Errorf("CONFIG SET maxmemory: %v", err)
				}
				down := fault{name: "the worker stopped (SIGKILL) to restart it", hook: hook, expect: []match{
					{alert: "DedupWorkerDown", labels: instance},
				}}
				record(down.run(t, ctx, wEvict.kill, func() { wEvict.start(top); wEvict.waitUp(t, ctx) })...)
			}
			record(f.run(t, ctx, func() { fill(t, ctx, rc) }, undo)...)
		})
	})

	report(t, rules, results, hook)
	t.Logf("wall time %s", time.Since(start).Round(time.Second))
}

func lookPath(t *testing.T, bin, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		testenv.Unavailable(t, bin+" (Debian package "+pkg+")", err.Error())
	}
	return p
}

func remove(t *testing.T, path string) {
	if err := os.Remove(path); err != nil {
		t.Error(err)
	}
}

func touch(t *testing.T, path string) {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Error(err)
	}
}

// fill writes 16 MB of keys of its own into the evicting Redis, more than its
// maxmemory, so that it evicts.
func fill(t *testing.T, ctx context.Context, rc *redis.Client) {
	value := strings.Repeat("x", 4096)
	for i := range 4 {
		pipe := rc.Pipeline()
		for j := range 1000 {
			pipe.Set(ctx, fmt.Sprintf("filler:%d:%d", i, j), value, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Errorf("filling redis: %v", err)
			return
		}
	}
	n, err := rc.Info(ctx, "stats").Result()
	if err == nil && !strings.Contains(n, "evicted_keys:") {
		t.Errorf("INFO stats has no evicted_keys")
	}
}

// handler is one handler of a worker: an exec action of `sh -c command`
// over a NATS stream that gets rate messages a second.
type handler struct {
	name, stream, command, extra string
	rate                         int
}

// worker is one `dedupworker run` with its config.
type worker struct {
	name, dir, addr, redis, nats string
	handlers                     []handler

	mu   sync.Mutex
	proc *testenv.Process
}

func (w *worker) config(t *testing.T) string {
	var b strings.Builder
	fmt.Fprintf(&b, "redis: {url: %q, namespace: alerts-%s}\nhttp: {addr: %q}\nlog: {level: info}\nhandlers:\n", w.redis, w.name, w.addr)
	for _, h := range w.handlers {
		fmt.Fprintf(&b, "  - name: %s\n    source:\n      nats: {url: %q, stream: %s, subject: %q}\n    action:\n      exec: {command: [/bin/sh, -c, %q], timeout: 10s}\n",
			h.name, w.nats, h.stream, strings.ToLower(h.stream)+".>", h.command)
		if h.extra != "" {
			fmt.Fprintf(&b, "    %s\n", h.extra)
		}
	}
	path := filepath.Join(w.dir, w.name+".yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// start runs the worker; t's end kills it.
func (w *worker) start(t *testing.T) {
	cfg := w.config(t)
	p := testenv.StartProcess(t, nil, binPath, "run", "-c", cfg)
	w.mu.Lock()
	w.proc = p
	w.mu.Unlock()
}

func (w *worker) kill() {
	w.mu.Lock()
	p := w.proc
	w.mu.Unlock()
	p.Kill()
}

// waitUp waits until the worker serves /metrics.
func (w *worker) waitUp(t *testing.T, ctx context.Context) {
	t.Helper()
	w.mu.Lock()
	p := w.proc
	w.mu.Unlock()
	eventually(t, ctx, 30*time.Second, "worker "+w.name+" serves /metrics", func() (bool, string) {
		select {
		case <-p.Done():
			return false, "exited: " + p.Output.String()
		default:
		}
		_, err := get(ctx, "http://"+w.addr+"/metrics")
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// produce publishes h.rate messages a second, each with a key of its own,
// to h's stream until ctx ends.
func produce(ctx context.Context, t *testing.T, nc *nats.Conn, h handler) {
	tick := time.NewTicker(time.Second / time.Duration(h.rate))
	defer tick.Stop()
	subject := strings.ToLower(h.stream) + ".m"
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		m := nats.NewMsg(subject)
		m.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", h.name, i))
		m.Data = []byte(`{}`)
		if err := nc.PublishMsg(m); err != nil && ctx.Err() == nil {
			t.Errorf("publish to %s: %v", subject, err)
			return
		}
	}
}

// shortenedRules writes the rules file with its durations shortened and
// returns its path.
func shortenedRules(t *testing.T, dir string) string {
	t.Helper()
	_, data, err := alertrules.Read()
	if err != nil {
		t.Fatal(err)
	}
	short, err := alertrules.Shorten(data, scale)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(out, short, 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// startAlertmanager runs Alertmanager on a free loopback port, without
// clustering, routing every alert on its own (group_by: ['...']) to hook,
// resolved ones too, and returns its address.
func startAlertmanager(t *testing.T, ctx context.Context, bin, dir, hook string) string {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `route:
  receiver: hook
  group_by: ['...']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: %q
        send_resolved: true
`, hook), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProcess(t, nil, bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "am"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	eventually(t, ctx, 30*time.Second, "alertmanager answers", func() (bool, string) {
		select {
		case <-p.Done():
			return false, "exited: " + p.Output.String()
		default:
		}
		if _, err := get(ctx, "http://"+addr+"/-/ready"); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return addr
}

// startPrometheus runs Prometheus on a free loopback port, scraping targets
// as job dedupworker every second and evaluating rules every second, and
// waits until it has loaded the rules and scraped every target once.
func startPrometheus(t *testing.T, ctx context.Context, bin, dir, rules, am string, targets []string) string {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cfg := filepath.Join(dir, "prometheus.yml")
	tj, _ := json.Marshal(targets)
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}
rule_files: [%q]
alerting:
  alertmanagers:
    - static_configs: [{targets: [%q]}]
scrape_configs:
  - job_name: dedupworker
    static_configs: [{targets: %s}]
`, rules, am, tj), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.StartProcess(t, nil, bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "prom"),
		"--web.listen-address="+addr, "--rules.alert.resend-delay=1s", "--log.level=warn")
	eventually(t, ctx, 60*time.Second, "prometheus loads the rules and scrapes every worker", func() (bool, string) {
		select {
		case <-p.Done():
			return false, "exited: " + p.Output.String()
		default:
		}
		body, err := get(ctx, "http://"+addr+"/api/v1/rules")
		if err != nil {
			return false, err.Error()
		}
		if !strings.Contains(body, `"DedupWorkerDown"`) {
			return false, "rules not loaded: " + body
		}
		body, err = get(ctx, "http://"+addr+"/api/v1/query?query="+`count(up{job="dedupworker"}==1)`)
		if err != nil {
			return false, err.Error()
		}
		if !strings.Contains(body, fmt.Sprintf(`"%d"]`, len(targets))) {
			return false, "not every target up: " + body
		}
		return true, ""
	})
	return addr
}

func get(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

// eventually polls cond every 200ms until it holds, and fails the test
// with what and cond's last complaint when within passes first.
func eventually(t *testing.T, ctx context.Context, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not within %s: %s (last: %s)", within, what, why)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// webhook is the Alertmanager receiver: it keeps when each alert (by its
// labels) first arrived firing and, after that, resolved.
type webhook struct {
	srv *httptest.Server

	mu     sync.Mutex
	alerts map[string]*seen // by labelKey
	events chan struct{}    // a notification arrived
}

type seen struct {
	labels   map[string]string
	firing   time.Time // first firing notification
	resolved time.Time // first resolved notification after firing
}

func newWebhook(t *testing.T) *webhook {
	h := &webhook{alerts: map[string]*seen{}, events: make(chan struct{}, 1)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			Alerts []struct {
				Status string            `json:"status"`
				Labels map[string]string `json:"labels"`
			} `json:"alerts"`
		}
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		h.mu.Lock()
		for _, a := range msg.Alerts {
			k := labelKey(a.Labels)
			s := h.alerts[k]
			if s == nil {
				s = &seen{labels: a.Labels}
				h.alerts[k] = s
			}
			switch {
			case a.Status == "firing" && s.firing.IsZero():
				s.firing = now
			case a.Status == "firing" && !s.resolved.IsZero():
				// Fired again after resolving: a new episode.
				s.firing, s.resolved = now, time.Time{}
			case a.Status == "resolved" && !s.firing.IsZero() && s.resolved.IsZero():
				s.resolved = now
			}
		}
		h.mu.Unlock()
		select {
		case h.events <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *webhook) url() string { return h.srv.URL + "/alerts" }

func labelKey(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q,", k, l[k])
	}
	return b.String()
}

// match is an alert name and the labels that locate it.
type match struct {
	alert  string
	labels map[string]string
	from   time.Time // when its cause began, if before the fault's start
}

func (m match) String() string {
	keys := make([]string, 0, len(m.labels))
	for k := range m.labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, m.labels[k]))
	}
	return m.alert + "{" + strings.Join(parts, ",") + "}"
}

// since is when m's cause began: from if set, else the fault's start t0.
func (m match) since(t0 time.Time) time.Time {
	if !m.from.IsZero() {
		return m.from
	}
	return t0
}

func (m match) matches(l map[string]string) bool {
	if l["alertname"] != m.alert {
		return false
	}
	for k, v := range m.labels {
		if l[k] != v {
			return false
		}
	}
	return true
}

// find returns the alert matching m that fired at or after since.
func (h *webhook) find(m match, since time.Time) (seen, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.alerts {
		if m.matches(s.labels) && !s.firing.Before(since) {
			return *s, true
		}
	}
	return seen{}, false
}

func (h *webhook) all() []seen {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []seen
	for _, s := range h.alerts {
		out = append(out, *s)
	}
	return out
}

// fault is one cause of alerts and the alerts it must raise.
type fault struct {
	name   string
	hook   *webhook
	expect []match
}

// result is one alert's measured way through.
type result struct {
	fault             string
	alert             match
	toWebhook, toOkay time.Duration // from the fault, and from its undoing
}

// alertWait bounds the wait for each alert to arrive and to resolve: the
// longest shortened for: plus window, with room for a loaded machine.
const alertWait = 150 * time.Second

// run causes the fault, waits until every expected alert arrived firing,
// undoes it, and waits until each arrived resolved.
func (f fault) run(t *testing.T, ctx context.Context, cause, undo func()) []result {
	t.Helper()
	t0 := time.Now()
	cause()
	res := make([]result, len(f.expect))
	for i, m := range f.expect {
		res[i] = result{fault: f.name, alert: m}
		since := m.since(t0)
		eventually(t, ctx, alertWait, fmt.Sprintf("%s reaches the webhook after: %s", m, f.name), func() (bool, string) {
			if s, ok := f.hook.find(m, since); ok {
				res[i].toWebhook = s.firing.Sub(since)
				return true, ""
			}
			return false, "arrived so far: " + strings.Join(arrived(f.hook), "; ")
		})
	}
	t1 := time.Now()
	for _, m := range f.expect {
		if s, _ := f.hook.find(m, m.since(t0)); !s.resolved.IsZero() {
			t.Fatalf("%s resolved %.1fs after %s began, before it was undone: the alert does not hold through the fault",
				m, s.resolved.Sub(t0).Seconds(), f.name)
		}
	}
	undo()
	for i, m := range f.expect {
		since := m.since(t0)
		eventually(t, ctx, alertWait, fmt.Sprintf("%s resolves after undoing: %s", m, f.name), func() (bool, string) {
			s, _ := f.hook.find(m, since)
			if !s.resolved.IsZero() && s.resolved.After(t1) {
				res[i].toOkay = s.resolved.Sub(t1)
				return true, ""
			}
			return false, "still firing"
		})
	}
	return res
}

func arrived(h *webhook) []string {
	var out []string
	for _, s := range h.all() {
		state := "firing"
		if !s.resolved.IsZero() {
			state = "resolved"
		}
		out = append(out, fmt.Sprintf("%s %s", s.labels["alertname"], state))
	}
	slices.Sort(out)
	return out
}

// report logs, for each alert the test saw through, its shortened
// expression and for:, the fault, and the times to the webhook and back.
func report(t *testing.T, rulesPath string, results []result, hook *webhook) {
	data, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	f, err := alertrules.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string]alertrules.Rule{}
	for _, r := range f.Alerts() {
		rules[r.Alert] = r
	}
	var b bytes.Buffer
	for _, r := range results {
		rule := rules[r.alert.alert]
		fmt.Fprintf(&b, "\n%s\n  fault: %s\n  for: %s (shortened)  fired after %.1fs, resolved %.1fs after the undo\n  expr: %s\n",
			r.alert, r.fault, rule.For, r.toWebhook.Seconds(), r.toOkay.Seconds(), strings.Join(strings.Fields(rule.Expr), " "))
	}
	fmt.Fprintf(&b, "\nevery alert the webhook received: %s", strings.Join(arrived(hook), "; "))
	t.Log(b.String())
}
