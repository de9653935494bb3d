package kafka

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// TestJoinHookSeesKafkaGoJoins pins the one thing the keeper learns from
// kafka-go's logs (group.go, joinedFormat): the member id and generation of
// a successful JoinGroup. Should an upgrade of kafka-go change that log
// line, the keeper would silently stop keeping members alive during
// SyncGroup; this test fails instead.
func TestJoinHookSeesKafkaGoJoins(t *testing.T) {
	brokers := testenv.Kafka(t)
	topic := fmt.Sprintf("joinhook-%d", time.Now().UnixNano())
	testenv.CreateKafkaTopic(t, brokers, topic, 1)

	s := &Source{cfg: Config{Brokers: brokers, GroupID: topic + "-g", NetworkTimeout: 5 * time.Second, HeartbeatInterval: time.Second}, log: slog.New(slog.DiscardHandler)}
	s.dialer = &kafkago.Dialer{Timeout: 5 * time.Second}
	gc := s.newGroupClient()
	defer gc.close()
	keep := newKeeper(gc)
	defer keep.stop()
	var joined atomic.Pointer[joinedAs]
	live := new(atomic.Bool)
	live.Store(true)

	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: s.cfg.GroupID, Brokers: brokers, Topics: []string{topic},
		Timeout: 10 * time.Second, SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second,
		Logger: joinHook(kafkago.LoggerFunc(func(string, ...any) {}), &joined, keep, live),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gen, err := cg.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	j := joined.Load()
	if j == nil {
		t.Fatalf("kafka-go joined as %s in generation %d, but joinHook saw no %q log line", gen.MemberID, gen.ID, joinedFormat)
	}
	if j.member != gen.MemberID || j.generation != gen.ID {
		t.Fatalf("joinHook saw member %s generation %d, kafka-go joined as %s in generation %d", j.member, j.generation, gen.MemberID, gen.ID)
	}
}
