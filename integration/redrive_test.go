package integration_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// redriveMessages is how many messages each end-to-end test dead-letters.
const redriveMessages = 20

// redriveCase is what the end-to-end redrive test needs of a transport.
type redriveCase struct {
	// config is the worker's YAML: handler "rd" whose exec action is
	// action, dead-lettering to the transport's dead-letter destination.
	config func(action string) string
	// publish sends one message per key, with an Idempotency-Key header.
	publish func(t *testing.T, keys []string)
	// deadLetters counts the dead letters held at the destination.
	deadLetters func(t *testing.T) int
	// untouched reports what a redrive changed at the source of dead
	// letters ("" if nothing: no consumer or group offsets).
	untouched func(t *testing.T) string
	// republished checks the copies redrive sent back: each key's copy
	// where the original went, without Dedup-Dlq-* headers.
	republished func(t *testing.T, keys []string)
}

// redriveOutput is the part of redrive -o json the tests read.
type redriveOutput struct {
	DryRun      bool `json:"dry_run"`
	Read        int  `json:"read"`
	Republished int  `json:"republished"`
	Skipped     int  `json:"skipped"`
	Failed      int  `json:"failed"`
	DeadLetters []struct {
		Key    string `json:"key"`
		Record string `json:"record"`
		Action string `json:"action"`
	} `json:"dead_letters"`
}

// Twenty messages are dead-lettered by an exec action that fails until a
// flag file exists; records lists exactly them as dead_lettered; a dry run
// changes nothing; once the flag exists, redrive republishes the twenty and
// each runs once; a second redrive republishes none.
func TestRedriveNATSEndToEnd(t *testing.T) {
	t.Parallel()
	url := testenv.NATS(t)
	h := newNATSHarness(t, url)
	dlqStream := h.stream + "_DLQ"
	dlqSubj := h.subj + "-dlq.rd"
	h.createStream(t, dlqStream, dlqSubj)
	inSubj := h.subj + ".in"
	redriveE2E(t, redriveCase{
		config: func(action string) string {
			return fmt.Sprintf(`
redis: {url: %q, namespace: %s}
http: {addr: ""}
log: {level: warn}
handlers:
  - name: rd
    source: {nats: {url: %q, stream: %s, subject: %s}}
    max_attempts: 2
    backoff: {initial: 10ms, max: 20ms}
    action: {exec: {command: %s}}
    dead_letter: {nats: {subject: %s}}
`, h.redisURL, h.ns, url, h.stream, inSubj, action, dlqSubj)
		},
		publish: func(t *testing.T, keys []string) {
			for _, k := range keys {
				m := &nats.Msg{Subject: inSubj, Data: []byte("payload of " + k), Header: nats.Header{"Idempotency-Key": {k}, "X-Trace": {"t-" + k}}}
				if _, err := h.js.PublishMsg(natsCtx(t, 5*time.Second), m); err != nil {
					t.Fatal(err)
				}
			}
		},
		deadLetters: func(t *testing.T) int {
			info := natsStreamInfo(t, h.js, dlqStream)
			return int(info.State.Msgs)
		},
		untouched: func(t *testing.T) string {
			st, err := h.js.Stream(natsCtx(t, 5*time.Second), dlqStream)
			if err != nil {
				t.Fatal(err)
			}
			// The redrive durable holds what a real run acked; a dry run
			// must not create it (its own ordered consumer is ephemeral).
			infos := st.ListConsumers(natsCtx(t, 5*time.Second))
			var durables []string
			for ci := range infos.Info() {
				if ci.Config.Durable != "" {
					durables = append(durables, ci.Name)
				}
			}
			if err := infos.Err(); err != nil {
				t.Fatal(err)
			}
			if len(durables) > 0 {
				return fmt.Sprintf("durable consumers %v on the dead-letter stream", durables)
			}
			return ""
		},
		republished: func(t *testing.T, keys []string) {
			st, err := h.js.Stream(natsCtx(t, 5*time.Second), h.stream)
			if err != nil {
				t.Fatal(err)
			}
			info := natsStreamInfo(t, h.js, h.stream)
			if want := uint64(2 * len(keys)); info.State.LastSeq != want {
				t.Fatalf("source stream holds %d messages, want %d: the originals and one copy each", info.State.LastSeq, want)
			}
			seen := map[string]int{}
			for seq := uint64(len(keys)) + 1; seq <= info.State.LastSeq; seq++ {
				m, err := st.GetMsg(natsCtx(t, 5*time.Second), seq)
				if err != nil {
					t.Fatal(err)
				}
				k := m.Header.Get("Idempotency-Key")
				seen[k]++
				if m.Subject != inSubj || string(m.Data) != "payload of "+k || m.Header.Get("X-Trace") != "t-"+k {
					t.Errorf("copy seq %d: subject %q data %q X-Trace %q: want the original's", seq, m.Subject, m.Data, m.Header.Get("X-Trace"))
				}
				for name := range m.Header {
					if strings.HasPrefix(strings.ToLower(name), "dedup-dlq-") {
						t.Errorf("copy seq %d keeps the dead-letter header %s", seq, name)
					}
				}
			}
			for _, k := range keys {
				if seen[k] != 1 {
					t.Errorf("key %s: %d copies republished, want 1", k, seen[k])
				}
			}
		},
	})
}

// The same on Kafka: the dead-letter topic has 2 partitions, the source 3;
// each copy goes back to its original's partition.
func TestRedriveKafkaEndToEnd(t *testing.T) {
	t.Parallel()
	brokers := testenv.RealKafka(t)
	id := testenv.RandID()
	topic, dlq, group, ns := "rd-"+id, "rd-"+id+"-dlq", "rd-"+id+"-g", "rd-"+id
	testenv.CreateKafkaTopic(t, brokers, topic, 3)
	testenv.CreateKafkaTopic(t, brokers, dlq, 2)
	testenv.DropNamespace(t, ns)
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	redriveE2E(t, redriveCase{
		config: func(action string) string {
			return fmt.Sprintf(`
redis: {url: %q, namespace: %s}
http: {addr: ""}
log: {level: warn}
handlers:
  - name: rd
    source: {kafka: {brokers: [%q], topic: %s, group: %s}}
    max_attempts: 2
    backoff: {initial: 10ms, max: 20ms}
    action: {exec: {command: %s}}
    dead_letter: {kafka: {topic: %s}}
`, testenv.Redis(t), ns, brokers[0], topic, group, action, dlq)
		},
		publish: func(t *testing.T, keys []string) {
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{},
				BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
			defer w.Close()
			msgs := make([]kafka.Message, len(keys))
			for i, k := range keys {
				msgs[i] = kafka.Message{Key: []byte("entity-" + k), Value: []byte("payload of " + k),
					Headers: []kafka.Header{{Key: "Idempotency-Key", Value: []byte(k)}, {Key: "X-Trace", Value: []byte("t-" + k)}}}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				t.Fatal(err)
			}
		},
		deadLetters: func(t *testing.T) int {
			n := 0
			for _, end := range kafkaEnds(t, client, dlq, 2) {
				n += int(end)
			}
			return n
		},
		untouched: func(t *testing.T) string {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group + "-redrive", Topics: map[string][]int{dlq: {0, 1}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range of.Topics[dlq] {
				if p.CommittedOffset >= 0 {
					return fmt.Sprintf("group %s-redrive committed %s[%d] at %d", group, dlq, p.Partition, p.CommittedOffset)
				}
			}
			return ""
		},
		republished: func(t *testing.T, keys []string) {
			type copyOf struct {
				partitions []int
				dlqHeaders []string
			}
			got := map[string]*copyOf{}
			total := 0
			for p, end := range kafkaEnds(t, client, topic, 3) {
				for _, r := range kafkaRecords(t, client, topic, p, end) {
					total++
					var k string
					var dlqHeaders []string
					for _, h := range r.Headers {
						if h.Key == "Idempotency-Key" {
							k = string(h.Value)
						}
						if strings.HasPrefix(strings.ToLower(h.Key), "dedup-dlq-") {
							dlqHeaders = append(dlqHeaders, h.Key)
						}
					}
					if string(r.Key) != "entity-"+k || string(r.Value) != "payload of "+k {
						t.Errorf("%s[%d] offset %d: key %q value %q: want the original's", topic, p, r.Offset, r.Key, r.Value)
					}
					if got[k] == nil {
						got[k] = &copyOf{}
					}
					got[k].partitions = append(got[k].partitions, p)
					got[k].dlqHeaders = append(got[k].dlqHeaders, dlqHeaders...)
				}
			}
			if total != 2*len(keys) {
				t.Fatalf("source topic holds %d records, want %d: the originals and one copy each", total, 2*len(keys))
			}
			for _, k := range keys {
				c := got[k]
				switch {
				case c == nil || len(c.partitions) != 2:
					t.Errorf("key %s: records %v, want the original and one copy", k, c)
				case c.partitions[0] != c.partitions[1]:
					t.Errorf("key %s: original and copy on partitions %v, want the same", k, c.partitions)
				case len(c.dlqHeaders) > 0:
					t.Errorf("key %s: the copy keeps the dead-letter headers %v", k, c.dlqHeaders)
				}
			}
		},
	})
}

func redriveE2E(t *testing.T, c redriveCase) {
	dir := t.TempDir()
	flag, log := filepath.Join(dir, "fixed"), filepath.Join(dir, "processed.log")
	script := fmt.Sprintf(`cat >/dev/null; if [ -e %q ]; then echo "$DEDUP_KEY" >> %q; else echo "not fixed yet" >&2; exit 3; fi`, flag, log)
	action, _ := json.Marshal([]string{"/bin/sh", "-c", script})
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(c.config(string(action))), 0o600); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, redriveMessages)
	for i := range keys {
		keys[i] = fmt.Sprintf("rd-key-%02d", i)
	}

	startRedriveWorker(t, cfg)
	c.publish(t, keys)
	var listed []string
	testenv.EventuallyNil(t, 90*time.Second, fmt.Sprintf("%d records dead_lettered and %d dead letters", len(keys), len(keys)), func() error {
		listed = deadLetteredKeys(t, cfg)
		if n := c.deadLetters(t); len(listed) != len(keys) || n != len(keys) {
			return fmt.Errorf("%d records dead_lettered and %d dead letters", len(listed), n)
		}
		return nil
	})
	if !slices.Equal(listed, keys) {
		t.Fatalf("records --state dead_lettered lists %v, want %v", listed, keys)
	}
	if n := len(processedLines(t, log)); n != 0 {
		t.Fatalf("%d keys processed before the fix, want 0", n)
	}

	// A dry run reports the twenty and changes nothing.
	dry := runRedrive(t, 0, cfg, "--dry-run")
	if !dry.DryRun || dry.Read != len(keys) || dry.Republished != len(keys) || dry.Skipped != 0 || dry.Failed != 0 {
		t.Fatalf("dry run: %+v, want %d read and would-republish", dry, len(keys))
	}
	for _, r := range dry.DeadLetters {
		if r.Record != "dead_lettered" || r.Action != "would republish" {
			t.Errorf("dry run: %+v, want record dead_lettered, action would republish", r)
		}
	}
	if got := deadLetteredKeys(t, cfg); !slices.Equal(got, keys) {
		t.Fatalf("after the dry run, records dead_lettered %v, want all %d", got, len(keys))
	}
	if n := c.deadLetters(t); n != len(keys) {
		t.Fatalf("after the dry run, %d dead letters, want %d", n, len(keys))
	}
	if what := c.untouched(t); what != "" {
		t.Fatalf("the dry run changed the dead-letter source: %s", what)
	}

	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	first := runRedrive(t, 0, cfg)
	if first.DryRun || first.Read != len(keys) || first.Republished != len(keys) || first.Skipped != 0 || first.Failed != 0 {
		t.Fatalf("redrive: %+v, want %d read and republished", first, len(keys))
	}
	var lines []string
	testenv.EventuallyNil(t, 60*time.Second, fmt.Sprintf("%d keys processed and completed", len(keys)), func() error {
		lines = processedLines(t, log)
		if n := len(recordsIn(t, cfg, "completed")); len(lines) < len(keys) || n != len(keys) {
			return fmt.Errorf("%d keys processed, %d records completed", len(lines), n)
		}
		return nil
	})
	counts := map[string]int{}
	for _, l := range lines {
		counts[l]++
	}
	for _, k := range keys {
		if counts[k] != 1 {
			t.Errorf("key %s processed %d times after the redrive, want once", k, counts[k])
		}
	}
	if len(lines) != len(keys) {
		t.Errorf("%d lines processed, want %d: %v", len(lines), len(keys), lines)
	}
	if got := deadLetteredKeys(t, cfg); len(got) != 0 {
		t.Errorf("after the redrive, records dead_lettered %v, want none", got)
	}
	c.republished(t, keys)

	second := runRedrive(t, 0, cfg)
	if second.Read != 0 || second.Republished != 0 || second.Failed != 0 {
		t.Fatalf("second redrive: %+v, want nothing read or republished", second)
	}
	if n := len(processedLines(t, log)); n != len(keys) {
		t.Fatalf("after the second redrive, %d lines processed, want %d", n, len(keys))
	}
}

// startRedriveWorker runs dedupworker run -c cfg until the test ends.
func startRedriveWorker(t *testing.T, cfg string) {
	t.Helper()
	var out testenv.SyncBuffer
	cmd := exec.Command(hostileBinary(t), "run", "-c", cfg)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("worker output:\n%s", out.String())
		}
	})
}

// runRedrive runs redrive -o json with args and wants exit code want.
func runRedrive(t *testing.T, want int, cfg string, args ...string) redriveOutput {
	t.Helper()
	code, stdout, stderr := runDedupworker(t, append([]string{"redrive", "-c", cfg, "--handler", "rd", "-o", "json"}, args...)...)
	if code != want {
		t.Fatalf("redrive %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, code, want, stdout, stderr)
	}
	var out redriveOutput
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("redrive %v -o json: %v\n%s", args, err, stdout)
	}
	if len(out.DeadLetters) != out.Read {
		t.Fatalf("redrive %v: %d rows for %d dead letters read", args, len(out.DeadLetters), out.Read)
	}
	return out
}

func runDedupworker(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, hostileBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		t.Fatalf("dedupworker %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// recordsIn returns the sorted keys of handler rd's records in state.
func recordsIn(t *testing.T, cfg, state string) []string {
	t.Helper()
	code, stdout, stderr := runDedupworker(t, "records", "-c", cfg, "--handler", "rd", "--state", state, "--limit", "0", "-o", "json")
	if code != 0 {
		t.Fatalf("records: exit %d\n%s", code, stderr)
	}
	var views []struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(stdout), &views); err != nil {
		t.Fatalf("records -o json: %v\n%s", err, stdout)
	}
	keys := make([]string, len(views))
	for i, v := range views {
		keys[i] = v.Key
	}
	slices.Sort(keys)
	return keys
}

func deadLetteredKeys(t *testing.T, cfg string) []string { return recordsIn(t, cfg, "dead_lettered") }

// processedLines is the exec action's log: one key per run that succeeded.
func processedLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

func natsStreamInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.StreamInfo {
	t.Helper()
	st, err := js.Stream(natsCtx(t, 5*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(natsCtx(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// kafkaEnds returns the high watermark of each of topic's partitions.
func kafkaEnds(t *testing.T, c *kafka.Client, topic string, partitions int) map[int]int64 {
	t.Helper()
	reqs := make([]kafka.OffsetRequest, partitions)
	for p := range partitions {
		reqs[p] = kafka.LastOffsetOf(p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		t.Fatal(err)
	}
	ends := map[int]int64{}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			t.Fatal(p.Error)
		}
		ends[p.Partition] = p.LastOffset
	}
	return ends
}

// kafkaRecord is a record read back by kafkaRecords.
type kafkaRecord struct {
	Offset     int64
	Key, Value []byte
	Headers    []kafka.Header
}

// kafkaRecords reads partition p of topic from offset 0 to end.
func kafkaRecords(t *testing.T, c *kafka.Client, topic string, p int, end int64) []kafkaRecord {
	t.Helper()
	var out []kafkaRecord
	for pos := int64(0); pos < end; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := c.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: p, Offset: pos, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: time.Second})
		cancel()
		if err == nil {
			err = res.Error
		}
		if err != nil {
			t.Fatal(err)
		}
		before := pos
		for {
			r, err := res.Records.ReadRecord()
			if err != nil {
				break
			}
			if r.Offset < pos {
				continue
			}
			k, _ := kafka.ReadAll(r.Key)
			v, _ := kafka.ReadAll(r.Value)
			out = append(out, kafkaRecord{Offset: r.Offset, Key: k, Value: v, Headers: r.Headers})
			pos = r.Offset + 1
		}
		if pos == before {
			t.Fatalf("%s[%d]: no record at offset %d below the end %d", topic, p, pos, end)
		}
	}
	return out
}
