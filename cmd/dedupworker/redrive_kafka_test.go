package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
)

// On Kafka, a dead letter goes back to the source partition it names, a
// completed record is skipped and committed, and a republish that fails
// (a partition the source topic does not have) stops the run: the group's
// offset stays on that dead letter, so neither it nor any after it is
// lost, and a rerun stops there again.
func TestRedriveKafkaCommitsUpToTheFailure(t *testing.T) {
	t.Parallel()
	brokers := testenv.RealKafka(t)
	id := testenv.RandID()
	src, dlq, group, ns := "rdk-"+id, "rdk-"+id+"-dlq", "rdk-"+id+"-g", "rdk-"+id
	testenv.CreateKafkaTopic(t, brokers, src, 2)
	testenv.CreateKafkaTopic(t, brokers, dlq, 1)
	client := testenv.RedisClient(t)
	store, err := redisbackend.New(client, redisbackend.Options{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if keys, _ := client.Keys(ctx, ns+":*").Result(); len(keys) > 0 {
			client.Del(ctx, keys...)
		}
		store.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for key, outcome := range map[string]string{"done": idempotency.RecordOutcomeOK, "dead": idempotency.RecordOutcomeDeadLettered, "bad": idempotency.RecordOutcomeDeadLettered, "after": idempotency.RecordOutcomeDeadLettered} {
		ekey := idempotency.EffectiveKey("rd", key)
		res, err := store.Claim(ctx, []idempotency.ClaimRequest{{Key: ekey, Fingerprint: "fp", FingerprintVersion: 1, Lease: time.Hour}})
		if err != nil || res[0].Claim == nil {
			t.Fatalf("claim %s: %v", key, err)
		}
		if _, err := store.Complete(ctx, []idempotency.Completion{{Key: ekey, Token: res[0].Claim.Token, Outcome: outcome, Retention: time.Hour}}); err != nil {
			t.Fatal(err)
		}
	}
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: dlq, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll}
	defer w.Close()
	var msgs []kafka.Message
	for _, dl := range []struct {
		key       string
		partition int
	}{{"done", 0}, {"dead", 1}, {"bad", 9}, {"after", 0}} {
		hs := []kafka.Header{{Key: "Idempotency-Key", Value: []byte(dl.key)}}
		for k, v := range (consumer.DeadLetter{Reason: "max_attempts", Key: dl.key, Handler: "rd", Attempts: 3}).Headers(consumer.Origin{Transport: "kafka", Topic: src, Partition: dl.partition, Offset: 7}) {
			hs = append(hs, kafka.Header{Key: k, Value: []byte(v[0])})
		}
		msgs = append(msgs, kafka.Message{Key: []byte("entity-" + dl.key), Value: []byte("payload " + dl.key), Headers: hs})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, `
redis: {url: %q, namespace: %s}
http: {addr: ""}
handlers:
  - name: rd
    source: {kafka: {brokers: [%q], topic: %s, group: %s}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {kafka: {topic: %s}}
`, testenv.Redis(t), ns, brokers[0], src, group, dlq)
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	committed := func() int64 {
		t.Helper()
		of, err := kc.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group + "-redrive", Topics: map[string][]int{dlq: {0}}})
		if err != nil {
			t.Fatal(err)
		}
		return of.Topics[dlq][0].CommittedOffset
	}
	class := func(key string) string {
		rec, err := store.Get(ctx, idempotency.EffectiveKey("rd", key))
		if err != nil {
			t.Fatal(err)
		}
		if rec == nil {
			return "absent"
		}
		return string(redisbackend.ClassOf(rec))
	}
	redrive := func() redriveReport {
		t.Helper()
		code, stdout, stderr := runCmd(t, "redrive", "-c", cfg, "--handler", "rd", "-o", "json")
		if code != exitRuntime {
			t.Fatalf("redrive: exit %d, want 1\n%s\n%s", code, stdout, stderr)
		}
		var rep redriveReport
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("%v\n%s", err, stdout)
		}
		return rep
	}

	rep := redrive()
	if rep.Read != 3 || rep.Skipped != 1 || rep.Republished != 1 || rep.Failed != 1 {
		t.Fatalf("report %+v, want done skipped, dead republished, bad failed, after not read", rep)
	}
	if r := rep.DeadLetters[2]; r.Key != "bad" || r.Action != actFailed {
		t.Errorf("third dead letter %+v, want bad failed", r)
	}
	if c := committed(); c != 2 {
		t.Errorf("group committed offset %d, want 2: past done and dead, on bad", c)
	}
	if c := class("after"); c != "dead_lettered" {
		t.Errorf("after is %s: the run stopped before it", c)
	}
	if c := class("dead"); c != "absent" {
		t.Errorf("dead is %s, want forgotten", c)
	}
	res, err := kc.Fetch(ctx, &kafka.FetchRequest{Topic: src, Partition: 1, Offset: 0, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: time.Second})
	if err != nil || res.Error != nil {
		t.Fatal(err, res.Error)
	}
	r, err := res.Records.ReadRecord()
	if err != nil {
		t.Fatalf("source partition 1: %v, want the republished dead letter", err)
	}
	k, _ := kafka.ReadAll(r.Key)
	v, _ := kafka.ReadAll(r.Value)
	if string(k) != "entity-dead" || string(v) != "payload dead" || len(r.Headers) != 1 || r.Headers[0].Key != "Idempotency-Key" {
		t.Errorf("republished key %q value %q headers %v, want the original's without Dedup-Dlq-*", k, v, r.Headers)
	}
	if _, err := res.Records.ReadRecord(); err == nil {
		t.Error("source partition 1 holds more than the one republished record")
	}

	rep = redrive()
	if rep.Read != 1 || rep.Failed != 1 || rep.DeadLetters[0].Key != "bad" {
		t.Fatalf("rerun %+v, want it to stop at bad again", rep)
	}
	if c := committed(); c != 2 {
		t.Errorf("after the rerun, committed offset %d, want still 2", c)
	}
}
