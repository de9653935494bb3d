package kafkasource_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestLeaderMove: when a partition's leader dies (kill -9 of a broker of the
// real 3-node cluster, replication factor 3), the fetcher reconnects to the
// new leader and continues from where it was: nothing skipped, nothing
// repeated, the commit reaches the end. The killed broker is started again
// before the test ends.
func TestLeaderMove(t *testing.T) {
	nodes := testenv.KafkaCluster(t)
	nodes.LockFaults(t) // the chaos run kills nodes of the same cluster
	topic := fmt.Sprintf("moving-%d", time.Now().UnixNano())
	testenv.CreateKafkaTopicRF(t, nodes.Brokers, topic, 1, 3)
	e := &env{t: t, brokers: nodes.Brokers, topic: topic, group: topic + "-g", parts: 1}
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
	testenv.Eventually(t, 30*time.Second, "the first 50 handled", func() bool { return rec.distinct() == 50 })
	testenv.Eventually(t, 30*time.Second, "the commit at offset 50", func() bool { return e.committed()[0] == 50 })

	leader := partitionLeader(t, nodes.Brokers, topic)
	nodes.Kill(t, leader)
	t.Cleanup(func() { nodes.Start(t, leader) })
	testenv.Eventually(t, 30*time.Second, "a new leader", func() bool {
		l := partitionLeaderOf(nodes.Brokers, topic)
		return l > 0 && l != leader
	})
	e.produce(e.topic, batch(50))
	// The group's coordinator may have been on the killed broker: a request
	// that meets it moving is logged and retried until the deadline.
	testenv.Eventually(t, 60*time.Second, "the commit at offset 100", func() bool {
		c, err := testenv.KafkaCommittedErr(e.brokers, e.group, e.topic, e.parts)
		if err != nil {
			t.Logf("%v; retrying", err)
			return false
		}
		return c[0] == 100
	})
	if err := r.Stop(t, 30*time.Second); err != nil {
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

// partitionLeader is the node id leading partition 0 of topic.
func partitionLeader(t *testing.T, brokers []string, topic string) int {
	t.Helper()
	l := partitionLeaderOf(brokers, topic)
	if l <= 0 {
		t.Fatalf("no leader for %s/0", topic)
	}
	return l
}

func partitionLeaderOf(brokers []string, topic string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 3 * time.Second}
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(md.Topics) != 1 || len(md.Topics[0].Partitions) != 1 || md.Topics[0].Partitions[0].Error != nil {
		return 0
	}
	return md.Topics[0].Partitions[0].Leader.ID
}

// TestRoundsFollowLeaders: on the 3-node cluster, a topic whose partitions
// have different leaders is fetched in rounds to each leader, each carrying
// that leader's partitions and no other's (a request naming partitions of
// two leaders is refused by the Transport, and nothing would be fetched).
// Every message is handled, each partition in order, and once all are at
// their end a round carries every partition of its leader.
func TestRoundsFollowLeaders(t *testing.T) {
	nodes := testenv.KafkaCluster(t)
	nodes.LockFaults(t) // a fault test's kill would move the leaders
	const partitions = 6
	topic := fmt.Sprintf("rounds-leaders-%d", time.Now().UnixNano())
	testenv.CreateKafkaTopicRF(t, nodes.Brokers, topic, partitions, 1)
	e := &env{t: t, brokers: nodes.Brokers, topic: topic, group: topic + "-g", parts: partitions}
	perLeader := map[int]int{}
	testenv.Eventually(t, 30*time.Second, "a leader for every partition", func() bool {
		clear(perLeader)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cl := &kafka.Client{Addr: kafka.TCP(nodes.Brokers...), Timeout: 3 * time.Second}
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || len(md.Topics[0].Partitions) != partitions {
			return false
		}
		for _, p := range md.Topics[0].Partitions {
			if p.Error != nil || p.Leader.ID <= 0 {
				return false
			}
			perLeader[p.Leader.ID]++
		}
		return true
	})
	widest := 0
	for _, n := range perLeader {
		widest = max(widest, n)
	}
	if len(perLeader) < 2 || widest >= partitions {
		t.Fatalf("the test needs partitions led by more than one broker; leaders: %v", perLeader)
	}
	t.Logf("partitions by leader: %v", perLeader)
	consumeAllInRounds(t, e, "rounds-leaders", widest)
}
