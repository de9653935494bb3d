package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/internal/testenv"
)

// ProduceKafka writes each message to the partition it names; KafkaEnds
// and ReadKafka see them there, in order; KafkaCommitted reads what a
// group committed and -1 where it committed nothing, as Apache Kafka
// answers (kfake leaves such partitions out).
func TestProduceReadCommitted(t *testing.T) {
	brokers := testenv.RealKafka(t)
	topic := testenv.UniqueName(t, "t")
	testenv.CreateKafkaTopic(t, brokers, topic, 3)
	msgs := []kafka.Message{
		{Partition: 2, Value: []byte("a")},
		{Partition: 0, Value: []byte("b")},
		{Partition: 2, Value: []byte("c"), Key: []byte("k")},
		{Partition: 1, Value: []byte("d")},
		{Partition: 2, Value: []byte("e")},
	}
	testenv.ProduceKafka(t, brokers, topic, msgs)
	if ends := testenv.KafkaEnds(t, brokers, topic, 3); ends[0] != 1 || ends[1] != 1 || ends[2] != 3 || len(ends) != 3 {
		t.Fatalf("end offsets %v, want 0:1 1:1 2:3", ends)
	}
	got := testenv.ReadKafka(t, brokers, topic, 3)
	want := []struct {
		partition int
		offset    int64
		value     string
	}{{0, 0, "b"}, {1, 0, "d"}, {2, 0, "a"}, {2, 1, "c"}, {2, 2, "e"}}
	if len(got) != len(want) {
		t.Fatalf("read %d messages, want %d", len(got), len(want))
	}
	for i, w := range want {
		if m := got[i]; m.Partition != w.partition || m.Offset != w.offset || string(m.Value) != w.value {
			t.Errorf("message %d: %d/%d %q, want %d/%d %q", i, m.Partition, m.Offset, m.Value, w.partition, w.offset, w.value)
		}
	}
	if string(got[3].Key) != "k" {
		t.Errorf("key %q, want k", got[3].Key)
	}

	group := topic + "-g"
	if c := testenv.KafkaCommitted(t, brokers, group, topic, 3); c[0] != -1 || c[1] != -1 || c[2] != -1 {
		t.Fatalf("a group that committed nothing: %v, want -1 everywhere", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := cl.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: 2, Offset: 2}}}})
	if err != nil || resp.Topics[topic][0].Error != nil {
		t.Fatalf("committing offset 2 of partition 2: %v %+v", err, resp)
	}
	if c := testenv.KafkaCommitted(t, brokers, group, topic, 3); c[0] != -1 || c[1] != -1 || c[2] != 2 {
		t.Fatalf("committed %v, want 0:-1 1:-1 2:2", c)
	}
}
