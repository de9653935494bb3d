package kafka_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestLeaderMove: when a partition's leader moves to another broker, the
// fetcher reconnects to the new leader and continues from where it was:
// nothing skipped, nothing repeated, the commit reaches the end.
func TestLeaderMove(t *testing.T) {
	t.Parallel()
	c, brokers := testenv.KafkaCluster(t, kfake.NumBrokers(3), kfake.SeedTopics(1, "moving"))
	e := &env{t: t, brokers: brokers, topic: "moving", group: "moving-g", parts: 1}
	batch := func(from int) []msg {
		var ms []msg
		for i := from; i < from+50; i++ {
			ms = append(ms, msg{value: strconv.Itoa(i)})
		}
		return ms
	}
	e.produce(e.topic, batch(0))
	rec := newRecord()
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		rec.start(m)
		rec.finish(m)
		return nil, nil
	})
	r := run(t, worker(t, "move", e.source(nil), h))
	eventually(t, 30*time.Second, "the first 50 handled", func() bool { return rec.distinct() == 50 })

	leader := c.LeaderFor("moving", 0)
	if err := c.MoveTopicPartition("moving", 0, (leader+1)%3); err != nil {
		t.Fatal(err)
	}
	if now := c.LeaderFor("moving", 0); now == leader {
		t.Fatalf("leader did not move from %d", leader)
	}
	e.produce(e.topic, batch(50))
	eventually(t, 30*time.Second, "the commit at offset 100", func() bool { return e.committed()[0] == 100 })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if rec.distinct() != 100 || rec.runs() != 100 {
		t.Fatalf("%d distinct offsets in %d runs, want 100 in 100", rec.distinct(), rec.runs())
	}
	for i, o := range rec.seen[0] {
		if o != int64(i) {
			t.Fatalf("message #%d had offset %d", i, o)
		}
	}
}
