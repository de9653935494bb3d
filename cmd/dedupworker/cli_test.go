package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/testenv"
)

func TestValidateRejectsBrokenConfigs(t *testing.T) {
	t.Parallel()
	const head = "handlers:\n  - name: a\n"
	const nats = "    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}\n"
	const act = "    action: {exec: {command: [/bin/true]}}\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", "redsi: {url: redis://x}\n" + head + nats + act, "redsi (line 1): unknown field"},
		{"unknown handler field", head + nats + act + "    retries: 3\n", "handlers[0].retries (line 5): unknown field"},
		{"bad duration", head + nats + act + "    lease: 30 seconds\n", "handlers[0].lease (line 5)"},
		{"wrong type", head + nats + act + "    concurrency: lots\n", "handlers[0].concurrency (line 5): \"lots\": want an integer"},
		{"two sources", head + "    source:\n      nats: {url: nats://x, stream: S}\n      kafka: {brokers: [b:1], topic: t}\n" + act, "handlers[0].source (line 3): two sources"},
		{"two actions", head + nats + "    action:\n      exec: {command: [x]}\n      http: {url: http://x}\n", "handlers[0].action (line 4): two actions"},
		{"missing stream", head + "    source: {nats: {url: nats://x}}\n" + act, "handlers[0].source.nats.stream (line 3): required"},
		{"bad key source", head + nats + act + "    key: [uuid]\n", "handlers[0].key[0] (line 5)"},
		{"bad policy", head + nats + act + "    missing_key: drop\n", "handlers[0].missing_key (line 5): \"drop\": want reject or passthrough"},
		{"unset env", "redis: {url: '${NO_SUCH_VAR_DEDUP}'}\n" + head + nats + act, "redis.url (line 1): environment variable NO_SUCH_VAR_DEDUP is not set"},
		{"duplicate names", head + nats + act + "  - name: a\n" + nats + act, "handlers[1].name (line 5): \"a\" is also the name of handlers[0]"},
		{"not yaml", "handlers: [\n", "not valid YAML"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, "%s", c.yaml)
			code, _, stderr := runCmd(t, "validate", "-c", path)
			if code != exitUsage || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr, c.want)
			}
		})
	}
}

func TestValidatePrintAndStrict(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, `
redis: {url: redis://127.0.0.1:6379/0, password: s3cret-pw}
handlers:
  - name: a
    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}
    retention: 10s
    action: {exec: {command: [/bin/true]}}
`)
	code, stdout, stderr := runCmd(t, "validate", "-c", path, "--print")
	if code != 0 || !strings.Contains(stdout, "lease: 30s") || !strings.Contains(stdout, "<redacted>") || strings.Contains(stdout+stderr, "s3cret-pw") {
		t.Fatalf("--print: exit %d\n%s\n%s\nwant defaults filled, the password redacted", code, stdout, stderr)
	}
	if !strings.Contains(stderr, "warning: handlers[0] (a): retention 10s is shorter than the retry horizon") {
		t.Fatalf("want the horizon warning on stderr, got %q", stderr)
	}
	if code, _, _ := runCmd(t, "validate", "-c", path, "--strict"); code != exitUsage {
		t.Fatalf("--strict with a warning: exit %d, want 2", code)
	}
}

// Asked-for help goes to stdout with exit 0, for the program and for each
// command; help shown because of a usage mistake goes to stderr with exit 2.
func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, stdout, stderr := runCmd(t, args...)
		if code != 0 || !strings.Contains(stdout, "Usage: dedupworker <command>") || !strings.Contains(stdout, "setup") || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the commands on stdout only", args, code, stdout, stderr)
		}
	}
	for _, c := range []struct {
		command string
		args    []string
	}{
		{"run", []string{"run", "-h"}},
		{"run", []string{"run", "--help"}},
		{"run", []string{"help", "run"}},
		{"validate", []string{"validate", "-c", "x.yaml", "-help"}},
		{"setup", []string{"setup", "--help"}},
		{"publish", []string{"publish", "-h"}},
	} {
		code, stdout, stderr := runCmd(t, c.args...)
		if code != 0 || !strings.Contains(stdout, "Usage: dedupworker "+c.command) || !strings.Contains(stdout, "Examples:") || stderr != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 0 and the usage with examples on stdout only", c.args, code, stdout, stderr)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"run", "--frobnicate"}, {"run"}} {
		code, stdout, stderr := runCmd(t, args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, "Usage: dedupworker") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and the usage on stderr only", args, code, stdout, stderr)
		}
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	if code, _, _ := runCmd(t, "frobnicate"); code != exitUsage {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
	if code, _, _ := runCmd(t, "run"); code != exitUsage {
		t.Errorf("run without -c: exit %d, want 2", code)
	}
	// A Redis that does not answer is a runtime failure, reported fast.
	path := writeConfig(t, `
redis: {url: redis://127.0.0.1:1/0, connect_timeout: 500ms}
handlers:
  - name: a
    source: {nats: {url: nats://127.0.0.1:4222, stream: S}}
    action: {exec: {command: [/bin/true]}}
`)
	start := time.Now()
	code, _, stderr := runCmd(t, "run", "-c", path)
	if code != exitRuntime || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("unreachable Redis: exit %d (%s), want 1 naming the address", code, stderr)
	}
	if time.Since(start) > 20*time.Second {
		t.Errorf("unreachable Redis took %s to fail", time.Since(start))
	}
	if code, stdout, _ := runCmd(t, "version"); code != 0 || !strings.HasPrefix(stdout, "dedupworker ") {
		t.Errorf("version: exit %d %q", code, stdout)
	}
}

func TestInspectAndForget(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "IIN_"+id, "iin."+id)
	redisURL := testenv.Redis(t)
	ns := "insp-" + id
	cfg := writeConfig(t, `
redis: {url: %q, namespace: %s}
http: {addr: ""}
handlers:
  - name: orders
    source: {nats: {url: %q, stream: IIN_%s, consumer: c}}
    action: {exec: {command: [sh, -c, "printf receipt"]}}
`, redisURL, ns, url, id)
	publishNATS(t, js, "iin."+id, []string{"order-1"})
	p := start(t, nil, "run", "-c", cfg)
	testenv.Eventually(t, 20*time.Second, "order-1 completed", func() bool {
		_, out, _ := runCmd(t, "inspect", "-c", cfg, "--handler", "orders", "-o", "json", "order-1")
		return strings.Contains(out, `"state": "COMPLETED"`)
	})
	p.term(20 * time.Second)

	code, out, _ := runCmd(t, "inspect", "--redis", redisURL, "--namespace", ns, "--handler", "orders", "-o", "json", "order-1")
	var v recordView
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.Outcome != "ok" || v.Fence < 1 || v.ResultBytes != len("receipt") || v.EffectiveKey != "orders:order-1" {
		t.Fatalf("inspect -o json: exit %d %s", code, out)
	}
	if code, out, _ := runCmd(t, "inspect", "-c", cfg, "--handler", "orders", "order-1"); code != 0 || !strings.Contains(out, "COMPLETED") || !strings.Contains(out, "7 bytes") {
		t.Fatalf("inspect table: exit %d\n%s", code, out)
	}
	if code, _, stderr := runCmd(t, "forget", "-c", cfg, "--handler", "orders", "order-1"); code != exitUsage || !strings.Contains(stderr, "--yes") {
		t.Fatalf("forget without --yes and no terminal: exit %d %q, want 2 asking for --yes", code, stderr)
	}
	if code, out, _ := runCmd(t, "forget", "-c", cfg, "--handler", "orders", "--yes", "order-1"); code != 0 || !strings.Contains(out, "deleted ") {
		t.Fatalf("forget --yes: exit %d %q", code, out)
	}
	if _, out, _ := runCmd(t, "inspect", "-c", cfg, "--handler", "orders", "order-1"); !strings.Contains(out, "absent") {
		t.Fatalf("after forget the record must be absent:\n%s", out)
	}
}

// scrape returns the samples of dedup_messages_total for handler by outcome.
func scrape(t *testing.T, addr, handler string) map[string]float64 {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "dedup_messages_total{") || !strings.Contains(line, `handler="`+handler+`"`) {
			continue
		}
		i := strings.Index(line, `outcome="`)
		rest := line[i+len(`outcome="`):]
		outcome := rest[:strings.IndexByte(rest, '"')]
		v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		out[outcome] = v
	}
	return out
}

// metricValue returns the value of the unlabelled metric name, or -1 when
// /metrics does not have it.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	return -1
}

func status(addr, path string) int {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func TestMetricsAndReadiness(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "MIN_"+id, "min."+id)
	redis := testenv.StartRedisServer(t)
	addr := testenv.FreeAddr(t)
	dir := t.TempDir()
	cfg := writeConfig(t, `
redis: {url: %q, namespace: m-%s, connect_timeout: 1s}
http: {addr: %q}
handlers:
  - name: m
    source: {nats: {url: %q, stream: MIN_%s, consumer: c}}
    action: {exec: {command: [sh, -c, "cat >> %s/out"]}}
`, redis.URL(), id, addr, url, id, dir)
	keys := dupPlan("k", 50)                            // 50 unique, 15 duplicates
	publishNATS(t, js, "min."+id, append(keys, "", "")) // two without a key: missing_key
	p := start(t, nil, "run", "-c", cfg)
	testenv.Eventually(t, 20*time.Second, "every message settled in /metrics", func() bool {
		m := scrape(t, addr, "m")
		return m["processed"]+m["duplicate"]+m["missing_key"] >= 67
	})
	m := scrape(t, addr, "m")
	if m["processed"] != 50 || m["duplicate"] != 15 || m["missing_key"] != 2 || m["failed"] != 0 {
		t.Fatalf("dedup_messages_total by outcome = %v; want processed 50, duplicate 15, missing_key 2", m)
	}
	for _, name := range []string{"dedup_handler_duration_seconds_count", "dedup_store_duration_seconds_count", "dedup_inflight", "go_goroutines", "process_resident_memory_bytes"} {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// A redelivery of a key this worker just completed is answered by its
	// local cache, which is subscribed to forgets.
	if v := metricValue(t, addr, "dedup_local_cache_subscribed"); v != 1 {
		t.Fatalf("dedup_local_cache_subscribed = %v, want 1", v)
	}
	hits := metricValue(t, addr, "dedup_local_cache_hits_total")
	publishNATS(t, js, "min."+id, []string{"k-0"})
	testenv.Eventually(t, 20*time.Second, "the redelivery of k-0 acked as a duplicate", func() bool { return scrape(t, addr, "m")["duplicate"] == 16 })
	if v := metricValue(t, addr, "dedup_local_cache_hits_total"); v != hits+1 {
		t.Fatalf("dedup_local_cache_hits_total %v after a redelivery of a key completed seconds before, want %v", v, hits+1)
	}
	if s := status(addr, "/healthz"); s != 200 {
		t.Fatalf("/healthz = %d", s)
	}
	if s := status(addr, "/readyz"); s != 200 {
		t.Fatalf("/readyz with Redis up = %d, want 200", s)
	}
	redis.Stop()
	testenv.Eventually(t, 15*time.Second, "/readyz turns 503 while Redis is stopped", func() bool { return status(addr, "/readyz") == 503 })
	redis.Start()
	testenv.Eventually(t, 15*time.Second, "/readyz turns 200 when Redis is back", func() bool { return status(addr, "/readyz") == 200 })
	if code := p.term(20 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	out, _ := os.ReadFile(filepath.Join(dir, "out"))
	if n := strings.Count(string(out), "}"); n != 50 {
		t.Fatalf("the exec action ran %d times, want 50", n)
	}
}

// TestExampleConfigsValidate keeps the shipped examples true.
func TestExampleConfigsValidate(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../examples/config/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example configs found: %v", err)
	}
	for _, f := range files {
		if code, _, stderr := runCmd(t, "validate", "-c", f); code != 0 {
			t.Errorf("%s: exit %d: %s", f, code, stderr)
		}
	}
}

func TestValidateOnlineChecksTheHorizon(t *testing.T) {
	t.Parallel()
	url, js := natsSetup(t)
	id := testenv.RandID()
	createStream(t, js, "VIN_"+id, "vin."+id) // max_age 0: kept forever
	path := writeConfig(t, `
redis: {url: %q}
handlers:
  - name: a
    source: {nats: {url: %q, stream: VIN_%s}}
    retention: 1h
    action: {exec: {command: [/bin/true]}}
`, testenv.Redis(t), url, id)
	code, _, stderr := runCmd(t, "validate", "-c", path)
	if code != 0 || strings.Contains(stderr, "unlimited") {
		t.Fatalf("offline validate must not ask the broker: exit %d %q", code, stderr)
	}
	code, _, stderr = runCmd(t, "validate", "-c", path, "--online")
	if code != 0 || !strings.Contains(stderr, "stream VIN_"+id+" max_age is unlimited") {
		t.Fatalf("--online: exit %d, stderr %q; want a warning naming the stream's unlimited max_age", code, stderr)
	}
	if code, _, _ := runCmd(t, "validate", "-c", path, "--online", "--strict"); code != exitUsage {
		t.Fatalf("--online --strict with a warning: exit %d, want 2", code)
	}
	missing := writeConfig(t, `
handlers:
  - name: a
    source: {nats: {url: %q, stream: NO_SUCH_%s}}
    action: {exec: {command: [/bin/true]}}
`, url, id)
	if code, _, stderr := runCmd(t, "validate", "-c", missing, "--online"); code == 0 || !strings.Contains(stderr, "NO_SUCH_"+id) {
		t.Fatalf("--online with a missing stream: exit %d %q, want a failure naming it", code, stderr)
	}
}
