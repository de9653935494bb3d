package main

// redrive against real NATS and Redis with hand-made dead
// letters: each record state, a failed republish and its rerun, --limit,
// and the usage errors.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// redriveEnv is a NATS handler "rd" with a dead-letter stream, and its
// store.
type redriveEnv struct {
	t                 *testing.T
	js                jetstream.JetStream
	store             *redisbackend.Store
	cfg               string
	stream, dlqStream string
	in, dlq           string // the source subject prefix, the dead-letter subject
}

func newRedriveEnv(t *testing.T) *redriveEnv {
	t.Helper()
	url, redisURL := testenv.NATS(t), testenv.Redis(t)
	id := testenv.RandID()
	e := &redriveEnv{t: t, stream: "RDC_" + id, dlqStream: "RDC_" + id + "_DLQ", in: "rdc." + id + ".in", dlq: "rdc." + id + ".dlq"}
	_, e.js = testenv.NATSConnect(t, url)
	e.addStream(e.dlqStream, e.dlq)
	ns := "rdc-" + id
	client := testenv.RedisClient(t)
	var err error
	if e.store, err = redisbackend.New(client, redisbackend.Options{Namespace: ns}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, _ := client.Keys(ctx, ns+":*").Result()
		if len(keys) > 0 {
			client.Del(ctx, keys...)
		}
		e.store.Close()
	})
	e.cfg = writeConfig(t, `
redis: {url: %q, namespace: %s}
http: {addr: ""}
handlers:
  - name: rd
    source: {nats: {url: %q, stream: %s, subject: %s}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: {subject: %s}}
`, redisURL, ns, url, e.stream, e.in+".>", e.dlq)
	return e
}

func (e *redriveEnv) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	e.t.Cleanup(cancel)
	return ctx
}

func (e *redriveEnv) addStream(name string, subjects ...string) {
	e.t.Helper()
	if _, err := e.js.CreateStream(e.ctx(), jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.MemoryStorage}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.js.DeleteStream(ctx, name)
	})
}

// record writes key's record of handler rd: claimed, or completed with
// outcome.
func (e *redriveEnv) record(key, outcome string) {
	e.t.Helper()
	ekey := idempotency.EffectiveKey("rd", key)
	res, err := e.store.Claim(e.ctx(), []idempotency.ClaimRequest{{Key: ekey, Fingerprint: "fp", FingerprintVersion: 1, Lease: time.Hour}})
	if err != nil || res[0].Claim == nil {
		e.t.Fatalf("claim %s: %v %+v", key, err, res)
	}
	if outcome == "" {
		return
	}
	if _, err := e.store.Complete(e.ctx(), []idempotency.Completion{{Key: ekey, Token: res[0].Claim.Token, Outcome: outcome, Retention: time.Hour}}); err != nil {
		e.t.Fatal(err)
	}
}

// deadLetter publishes a dead letter of handler rd and key that came from
// subject.
func (e *redriveEnv) deadLetter(key, subject string) { e.deadLetterOf("rd", key, subject) }

// deadLetterOf publishes a dead letter that handler dead-lettered.
func (e *redriveEnv) deadLetterOf(handler, key, subject string) {
	e.t.Helper()
	h := nats.Header{"Idempotency-Key": {key}, "X-Kept": {"yes"}}
	for k, v := range (consumer.DeadLetter{Reason: "max_attempts", Key: key, Handler: handler, Attempts: 5}).Headers(consumer.Origin{Transport: "nats", Topic: e.stream, Subject: subject, Offset: 1}) {
		h[k] = v
	}
	if _, err := e.js.PublishMsg(e.ctx(), &nats.Msg{Subject: e.dlq, Data: []byte("payload " + key), Header: h}); err != nil {
		e.t.Fatal(err)
	}
}

// class is key's record class, or "absent".
func (e *redriveEnv) class(key string) string {
	e.t.Helper()
	rec, err := e.store.Get(e.ctx(), idempotency.EffectiveKey("rd", key))
	if err != nil {
		e.t.Fatal(err)
	}
	if rec == nil {
		return "absent"
	}
	return string(redisbackend.ClassOf(rec))
}

// pending is the stream sequence below which the redrive durable has
// acked everything, and how many dead letters it has not had acked: not
// delivered yet, or delivered and nak'ed or unacked (a nak'ed one stays
// among the ack-pending until it is delivered again).
func (e *redriveEnv) pending() (uint64, uint64) {
	e.t.Helper()
	c, err := e.js.Consumer(e.ctx(), e.dlqStream, "rd-dedup-redrive")
	if err != nil {
		e.t.Fatal(err)
	}
	ci, err := c.Info(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	return ci.AckFloor.Stream, ci.NumPending + uint64(ci.NumAckPending)
}

// sourceMsgs is how many messages the source stream holds.
func (e *redriveEnv) sourceMsgs() uint64 {
	e.t.Helper()
	st, err := e.js.Stream(e.ctx(), e.stream)
	if err != nil {
		e.t.Fatal(err)
	}
	info, err := st.Info(e.ctx())
	if err != nil {
		e.t.Fatal(err)
	}
	return info.State.Msgs
}

func (e *redriveEnv) redrive(wantCode int, args ...string) redriveReport {
	e.t.Helper()
	code, stdout, stderr := runCmd(e.t, append([]string{"redrive", "-c", e.cfg, "--handler", "rd", "-o", "json"}, args...)...)
	if code != wantCode {
		e.t.Fatalf("redrive %v: exit %d, want %d\n%s\n%s", args, code, wantCode, stdout, stderr)
	}
	var rep redriveReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		e.t.Fatalf("redrive -o json: %v\n%s", err, stdout)
	}
	return rep
}

// Each record state gets what the command's doc says: dead_lettered is
// forgotten and republished, absent and keyless republished, completed and
// claimed skipped, and so is another handler's dead letter (its key's
// record of rd is kept); every one is acked.
func TestRedriveRecordStates(t *testing.T) {
	t.Parallel()
	e := newRedriveEnv(t)
	e.addStream(e.stream, e.in+".>")
	e.record("dead", idempotency.RecordOutcomeDeadLettered)
	e.record("done", idempotency.RecordOutcomeOK)
	e.record("busy", "")
	for _, k := range []string{"dead", "done", "busy", "gone"} {
		e.deadLetter(k, e.in+"."+k)
	}
	e.deadLetter("", e.in+".nokey")
	e.record("theirs", idempotency.RecordOutcomeDeadLettered)
	e.deadLetterOf("other", "theirs", e.in+".theirs")

	rep := e.redrive(0)
	want := map[string][2]string{ // key: record, action
		"dead":   {"dead_lettered", actRepublished},
		"done":   {"completed", actSkipped},
		"busy":   {"claimed", actSkipped},
		"gone":   {"absent", actRepublished},
		"":       {"no key", actRepublished},
		"theirs": {"of handler other", actSkipped},
	}
	if rep.Read != 6 || rep.Republished != 3 || rep.Skipped != 3 || rep.Failed != 0 || len(rep.DeadLetters) != 6 {
		t.Fatalf("report %+v, want 6 read, 3 republished, 3 skipped", rep)
	}
	for _, r := range rep.DeadLetters {
		if w := want[r.Key]; r.Record != w[0] || r.Action != w[1] {
			t.Errorf("key %q: record %s, action %s; want %s, %s", r.Key, r.Record, r.Action, w[0], w[1])
		}
	}
	if c := e.class("dead"); c != "absent" {
		t.Errorf("the dead_lettered record is %s after the redrive, want forgotten", c)
	}
	if c := e.class("done"); c != "completed" {
		t.Errorf("the completed record is %s after the redrive, want kept", c)
	}
	if c := e.class("theirs"); c != "dead_lettered" {
		t.Errorf("rd's record of another handler's dead letter is %s, want kept", c)
	}
	if n := e.sourceMsgs(); n != 3 {
		t.Errorf("source stream holds %d messages, want the 3 republished", n)
	}
	st, err := e.js.Stream(e.ctx(), e.stream)
	if err != nil {
		t.Fatal(err)
	}
	for seq := uint64(1); seq <= 3; seq++ {
		m, err := st.GetMsg(e.ctx(), seq)
		if err != nil {
			t.Fatal(err)
		}
		k := m.Header.Get("Idempotency-Key")
		if m.Subject != e.in+"."+cmpOr(k, "nokey") || string(m.Data) != "payload "+k || m.Header.Get("X-Kept") != "yes" || m.Header.Get(consumer.HeaderDeadLetterReason) != "" {
			t.Errorf("republished seq %d: subject %s, data %q, headers %v", seq, m.Subject, m.Data, m.Header)
		}
	}
	if floor, left := e.pending(); floor != 6 || left != 0 {
		t.Errorf("redrive consumer: acked up to seq %d, %d left; want every dead letter acked", floor, left)
	}
	if again := e.redrive(0); again.Read != 0 {
		t.Errorf("second redrive read %d dead letters, want 0", again.Read)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// A republish that fails (no stream captures the original subject) stops
// the run with exit 1 and leaves the dead letter unacked; the record it
// forgot first is absent, so the rerun, once the subject is captured,
// republishes it.
func TestRedriveFailedRepublishLosesNothing(t *testing.T) {
	t.Parallel()
	e := newRedriveEnv(t)
	e.record("k1", idempotency.RecordOutcomeDeadLettered)
	e.record("k2", idempotency.RecordOutcomeDeadLettered)
	e.deadLetter("k1", e.in+".k1")
	e.deadLetter("k2", e.in+".k2")

	rep := e.redrive(1)
	if rep.Read != 1 || rep.Failed != 1 || rep.Republished != 0 || rep.DeadLetters[0].Action != actFailed || rep.DeadLetters[0].Error == "" {
		t.Fatalf("report %+v, want the first dead letter failed and the run stopped", rep)
	}
	if c := e.class("k1"); c != "absent" {
		t.Errorf("k1 is %s: the forget runs before the republish", c)
	}
	if c := e.class("k2"); c != "dead_lettered" {
		t.Errorf("k2 is %s: the run stopped before it", c)
	}
	if floor, left := e.pending(); floor != 0 || left != 2 {
		t.Fatalf("redrive consumer: acked up to seq %d, %d left; want none acked, both left for the next run", floor, left)
	}

	// The rerun, well within the durable's ack wait, gets both at once:
	// the failed run nak'ed what it had fetched.
	e.addStream(e.stream, e.in+".>")
	rep = e.redrive(0)
	if rep.Read != 2 || rep.Republished != 2 || rep.Failed != 0 {
		t.Fatalf("rerun %+v, want both republished", rep)
	}
	if r := rep.DeadLetters[0]; r.Key != "k1" || r.Record != "absent" || r.Action != actRepublished {
		t.Errorf("rerun, k1: %+v; want its absent record republished", r)
	}
	if n := e.sourceMsgs(); n != 2 {
		t.Errorf("source stream holds %d, want 2", n)
	}
}

// --limit stops after N dead letters and says so; the rest wait for the
// next run. --dry-run with --limit changes nothing either.
func TestRedriveLimit(t *testing.T) {
	t.Parallel()
	e := newRedriveEnv(t)
	e.addStream(e.stream, e.in+".>")
	for i := range 3 {
		k := fmt.Sprintf("k%d", i)
		e.record(k, idempotency.RecordOutcomeDeadLettered)
		e.deadLetter(k, e.in+"."+k)
	}
	if rep := e.redrive(0, "--dry-run", "--limit", "2"); rep.Read != 2 || !rep.Limited || !rep.DryRun || e.sourceMsgs() != 0 || e.class("k0") != "dead_lettered" {
		t.Fatalf("dry run --limit 2: %+v, source %d, k0 %s", rep, e.sourceMsgs(), e.class("k0"))
	}
	rep := e.redrive(0, "--limit", "2")
	if rep.Read != 2 || rep.Republished != 2 || !rep.Limited {
		t.Fatalf("--limit 2: %+v", rep)
	}
	if floor, left := e.pending(); floor != 2 || left != 1 {
		t.Errorf("after --limit 2: acked up to seq %d, %d left; want 2 and 1", floor, left)
	}
	rep = e.redrive(0)
	if rep.Read != 1 || rep.Republished != 1 || rep.Limited || rep.DeadLetters[0].Key != "k2" {
		t.Fatalf("the rest: %+v", rep)
	}
	code, stdout, _ := runCmd(t, "redrive", "-c", e.cfg, "--handler", "rd")
	if code != 0 || !strings.Contains(stdout, "republished 0, skipped 0 (record taken up again, or another handler's), failed 0; 0 dead letters read from stream "+e.dlqStream) {
		t.Errorf("table output: exit %d\n%s", code, stdout)
	}
}

// Usage and config errors exit 2 and name the flag or field; a dead-letter
// subject no stream captures exits 1 and says how to keep the next ones.
func TestRedriveErrors(t *testing.T) {
	t.Parallel()
	nodlq := writeConfig(t, `
redis: {url: "redis://127.0.0.1:1/0"}
handlers:
  - name: a
    source: {nats: {url: "nats://127.0.0.1:1", stream: S}}
    action: {exec: {command: [/bin/true]}}
`)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"redrive", "--handler", "a"}, exitUsage, "-c FILE and --handler NAME are required"},
		{[]string{"redrive", "-c", nodlq}, exitUsage, "-c FILE and --handler NAME are required"},
		{[]string{"redrive", "-c", nodlq, "--handler", "a", "extra"}, exitUsage, "takes no arguments"},
		{[]string{"redrive", "-c", nodlq, "--handler", "a", "-o", "yaml"}, exitUsage, `-o "yaml"`},
		{[]string{"redrive", "-c", nodlq, "--handler", "a", "--limit", "-1"}, exitUsage, "--limit -1"},
		{[]string{"redrive", "-c", nodlq, "--handler", "b"}, exitUsage, `--handler "b" is not a handler of`},
		{[]string{"redrive", "-c", nodlq, "--handler", "a"}, exitUsage, "handlers[0].dead_letter: handler \"a\" has no dead-letter destination"},
	} {
		code, _, stderr := runCmd(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming %q", c.args, code, stderr, c.code, c.want)
		}
	}

	url := testenv.NATS(t)
	id := testenv.RandID()
	uncaptured := writeConfig(t, `
redis: {url: %q}
http: {addr: ""}
handlers:
  - name: a
    source: {nats: {url: %q, stream: S, subject: in.x}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: {subject: nowhere.%s}}
`, testenv.Redis(t), url, id)
	code, _, stderr := runCmd(t, "redrive", "-c", uncaptured, "--handler", "a")
	if code != exitRuntime || !strings.Contains(stderr, "handlers[0].dead_letter.nats.subject \"nowhere."+id+"\": no JetStream stream captures it") {
		t.Errorf("uncaptured dead-letter subject: exit %d, stderr %q", code, stderr)
	}
}

// Dead letters delivered to an earlier run that died unacked come back only
// after the durable's ack wait: a run in between reads none and says so.
func TestRedriveNotesDeadLettersHeldByAnEarlierRun(t *testing.T) {
	t.Parallel()
	e := newRedriveEnv(t)
	e.addStream(e.stream, e.in+".>")
	e.record("k", idempotency.RecordOutcomeDeadLettered)
	e.deadLetter("k", e.in+".k")
	// The earlier run: the durable as redrive makes it, one fetch, no ack.
	c, err := e.js.CreateOrUpdateConsumer(e.ctx(), e.dlqStream, jetstream.ConsumerConfig{
		Durable: "rd-dedup-redrive", FilterSubject: e.dlq, AckPolicy: jetstream.AckExplicitPolicy, AckWait: redriveAckWait, MaxAckPending: redriveFetch,
	})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for range batch.Messages() {
		got++
	}
	if got != 1 {
		t.Fatalf("the earlier run fetched %d dead letters, want 1", got)
	}
	rep := e.redrive(0)
	if rep.Read != 0 || len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "1 dead letter(s) went to an earlier redrive run that did not ack them") {
		t.Fatalf("report %+v, want nothing read and a note of the 1 held", rep)
	}
	if c := e.class("k"); c != "dead_lettered" {
		t.Errorf("k is %s, want untouched", c)
	}
}
