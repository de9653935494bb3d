// Package dashboardtest checks deploy/grafana/dedupworker.json, and the
// alert rules of deploy/prometheus/dedupworker-rules.yaml, against the
// metrics a running dedupworker really exports.
package dashboardtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/deploy/internal/deploytest"
	"github.com/idemkit/dedupworker/internal/alertrules"
	"github.com/idemkit/dedupworker/internal/metrics"
	"github.com/idemkit/dedupworker/internal/testenv"
)

var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dashboardtest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath, err = deploytest.BuildBinary(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID          int          `json:"id"`
	Type        string       `json:"type"`
	Title       string       `json:"title"`
	Description string       `json:"description"`
	Datasource  *datasource  `json:"datasource"`
	Targets     []panelQuery `json:"targets"`
	Panels      []panel      `json:"panels"` // a collapsed row's panels
}

type panelQuery struct {
	Expr       string      `json:"expr"`
	RefID      string      `json:"refId"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *datasource     `json:"datasource"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "dedupworker.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("dedupworker.json does not parse: %v", err)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// queries returns every PromQL text of the dashboard: panel targets and
// query variables, each with where it is.
func queries(d dashboard) map[string]string {
	q := map[string]string{}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			q[fmt.Sprintf("panel %q target %s", p.Title, tg.RefID)] = tg.Expr
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			q["variable "+v.Name] = v.Definition
		}
	}
	return q
}

var metricName = regexp.MustCompile(`dedup_[a-z_]+`)

// TestDashboardShape: the JSON parses, has the variables the panels use,
// every panel queries Prometheus through ${datasource}, and the dashboard
// covers each metric family the worker exports (docs/OPERATIONS.md).
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: want both set", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want a current one (>= 36)", d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if v, ok := vars["datasource"]; !ok || v.Type != "datasource" || string(v.Query) != `"prometheus"` {
		t.Errorf("templating: want a variable datasource of type datasource querying prometheus, got %+v", v)
	}
	if v, ok := vars["handler"]; !ok || v.Type != "query" || !strings.Contains(v.Definition, "dedup_messages_total") {
		t.Errorf("templating: want a query variable handler over dedup_messages_total, got %+v", v)
	}
	ids := map[int]bool{}
	graphs := 0
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		graphs++
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s: empty expr", p.Title, tg.RefID)
			}
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s: datasource %+v, want ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
			if balance(tg.Expr) != 0 {
				t.Errorf("panel %q target %s: unbalanced brackets in %s", p.Title, tg.RefID, tg.Expr)
			}
		}
	}
	if graphs < 8 {
		t.Errorf("%d panels: want the overview, outcomes, latencies, store, leases and in-flight", graphs)
	}
	var all strings.Builder
	for _, q := range queries(d) {
		all.WriteString(q + "\n")
	}
	text := all.String()
	for _, want := range []string{
		`sum by (outcome) (rate(dedup_messages_total`, // outcome rates
		`outcome=~"duplicate|would_skip"`,             // duplicate ratio
		`histogram_quantile(0.5, sum by (le) (rate(dedup_handler_duration_seconds_bucket`,
		`histogram_quantile(0.95, sum by (le) (rate(dedup_handler_duration_seconds_bucket`,
		`histogram_quantile(0.99, sum by (le) (rate(dedup_handler_duration_seconds_bucket`,
		`sum by (le, op) (rate(dedup_store_duration_seconds_bucket`, // store latency by op
		`sum by (op) (rate(dedup_store_errors_total`,                // store errors
		`sum by (result) (rate(dedup_lease_renewals_total`,          // renewals by result
		`dedup_lease_renewals_total{result="lost"}`,                 // losses
		`outcome="lease_lost"`,
		`dedup_inflight{`,
		`dedup_fetch_buffer_bytes{`,                      // the source's bound, filled
		`dedup_fetch_wait_seconds_total{`,                // and waited for
		`max by (handler, partition) (dedup_source_lag{`, // the backlog, each series once across workers
		`rate(dedup_kafka_fetch_requests_total{`,         // Kafka fetch requests
		`rate(dedup_kafka_fetch_partitions_total{`,       // and the partitions they carried
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no query contains %s", want)
		}
	}
	if !strings.Contains(text, `handler=~"$handler"`) {
		t.Error(`no query filters by the handler variable (handler=~"$handler")`)
	}
}

// alertRules is every alerting rule of the rules file.
func alertRules(t *testing.T) []alertrules.Rule {
	t.Helper()
	path, data, err := alertrules.Read()
	if err != nil {
		t.Fatal(err)
	}
	f, err := alertrules.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	rules := f.Alerts()
	if len(rules) == 0 {
		t.Fatalf("%s has no alert", path)
	}
	return rules
}

// TestDashboardLeadsToEveryAlert: each alert is named in the description of
// a panel that shows its condition, so an alert leads to its panel.
func TestDashboardLeadsToEveryAlert(t *testing.T) {
	d := loadDashboard(t)
	for _, r := range alertRules(t) {
		var panels []string
		for _, p := range allPanels(d.Panels) {
			if p.Type != "row" && regexp.MustCompile(`\b`+r.Alert+`\b`).MatchString(p.Description) {
				panels = append(panels, p.Title)
			}
		}
		if len(panels) == 0 {
			t.Errorf("alert %s: no panel's description names it", r.Alert)
		} else {
			t.Logf("%s: %s", r.Alert, strings.Join(panels, "; "))
		}
	}
}

// balance is 0 when (), {} and [] pair up.
func balance(s string) int {
	n := 0
	for _, r := range s {
		switch r {
		case '(', '{', '[':
			n++
		case ')', '}', ']':
			n--
		}
	}
	return n
}

// TestDashboardMetricsExported starts the real binary with a NATS source and
// a Kafka source, lets each handler process one message, scrapes /metrics,
// and checks that every metric name the dashboard queries, and every one an
// alert rule's expression names, is one the binary exports.
func TestDashboardMetricsExported(t *testing.T) {
	d := loadDashboard(t)
	natsURL := testenv.NATS(t)
	redisURL := testenv.Redis(t)

	id := testenv.RandID()
	stream, subject, handler := "DASH_"+strings.ToUpper(id), "dash."+id, "dash-"+id
	brokers := testenv.Kafka(t)
	topic, kafkaHandler := "dash-"+id, "dash-kafka-"+id
	testenv.CreateKafkaTopic(t, brokers, topic, 1)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}, MaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })

	addr := testenv.FreeAddr(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `redis: {url: %q, namespace: %q}
http: {addr: %q}
log: {level: debug}
handlers:
  - name: %s
    source:
      nats: {url: %q, stream: %s, subject: %s}
    action:
      exec: {command: [/bin/true], timeout: 10s}
  - name: %s
    source:
      kafka: {brokers: [%q], topic: %s, group: %s}
    action:
      exec: {command: [/bin/true], timeout: 10s}
`, redisURL, "dashtest-"+id, addr, handler, natsURL, stream, subject,
		kafkaHandler, brokers[0], topic, kafkaHandler), 0o600); err != nil {
		t.Fatal(err)
	}
	out := &testenv.SyncBuffer{}
	cmd := exec.Command(binPath, "run", "-c", cfg)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("dedupworker output:\n%s", out.String())
		}
	})

	msg := nats.NewMsg(subject)
	msg.Header.Set("Idempotency-Key", "dash-key-"+id)
	msg.Data = []byte(`{"id":1}`)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	testenv.ProduceKafka(t, brokers, topic, []kafka.Message{{
		Value:   []byte(`{"id":1}`),
		Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte("dash-kafka-key-" + id)}},
	}})

	var exposed map[string]bool
	processed := []string{
		fmt.Sprintf(`dedup_messages_total{handler=%q,outcome="processed",transport="nats"} 1`, handler),
		fmt.Sprintf(`dedup_messages_total{handler=%q,outcome="processed",transport="kafka"} 1`, kafkaHandler),
	}
	deploytest.Eventually(t, 60*time.Second, "the worker processes both messages and /metrics counts them", func() (bool, string) {
		select {
		case <-done:
			return false, "dedupworker exited"
		default:
		}
		body, err := scrape("http://" + addr + "/metrics")
		if err != nil {
			return false, err.Error()
		}
		for _, line := range processed {
			if !strings.Contains(body, line) {
				return false, "no line " + line
			}
		}
		exposed = sampleNames(body)
		return true, ""
	})

	// Vector metrics without a fixed label set (store errors by op) have no
	// series until their first event; they still must be registered by the
	// metrics package the binary uses.
	registered := registeredVectors(t)
	var names []string
	exprs := queries(d)
	for _, r := range alertRules(t) {
		exprs["alert rule "+r.Alert] = r.Expr
	}
	for where, q := range exprs {
		for _, name := range metricName.FindAllString(q, -1) {
			names = append(names, name)
			if exposed[name] {
				continue
			}
			if base, ok := registered[name]; ok {
				t.Logf("%s (%s): %s has no series before its first event; registered as %s", where, q, name, base)
				continue
			}
			t.Errorf("%s queries %s, which the binary does not export (exported: %s)", where, name, strings.Join(sortedKeys(exposed), ", "))
		}
	}
	if len(names) == 0 {
		t.Fatal("found no dedup_ metric in the dashboard's queries")
	}
	// The scrape itself must hold the families the dashboard is about.
	for _, want := range []string{"dedup_messages_total", "dedup_handler_duration_seconds_bucket",
		"dedup_store_duration_seconds_bucket", "dedup_lease_renewals_total", "dedup_inflight",
		"dedup_kafka_fetch_requests_total", "dedup_kafka_fetch_partitions_total"} {
		if !exposed[want] {
			t.Errorf("/metrics has no %s after processing a message", want)
		}
	}
}

func scrape(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// sampleNames returns the metric names of the exposition's samples: a
// histogram X appears as X_bucket, X_sum and X_count, as Prometheus stores it.
func sampleNames(exposition string) map[string]bool {
	names := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(exposition))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

var descName = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// collectorsOf is a prometheus.Registerer that keeps what is registered.
type collectorsOf struct{ cs []prometheus.Collector }

func (c *collectorsOf) Register(x prometheus.Collector) error {
	c.cs = append(c.cs, x)
	return nil
}

func (c *collectorsOf) MustRegister(xs ...prometheus.Collector) { c.cs = append(c.cs, xs...) }
func (c *collectorsOf) Unregister(prometheus.Collector) bool    { return false }

// registeredVectors maps the sample names of every labelled metric the
// metrics package registers (a histogram's _bucket, _sum and _count too) to
// the metric's name.
func registeredVectors(t *testing.T) map[string]string {
	t.Helper()
	reg := &collectorsOf{}
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	descs := make(chan *prometheus.Desc)
	go func() {
		for _, c := range reg.cs {
			c.Describe(descs)
		}
		close(descs)
	}()
	out := map[string]string{}
	for d := range descs {
		sm := descName.FindStringSubmatch(d.String())
		if sm == nil || strings.TrimSpace(sm[2]) == "" {
			continue
		}
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			out[sm[1]+s] = sm[1]
		}
	}
	if _, ok := out["dedup_messages_total"]; !ok {
		t.Fatalf("the metrics package describes no dedup_messages_total vector: %v", out)
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
