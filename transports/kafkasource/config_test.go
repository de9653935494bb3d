package kafkasource_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// configFields lists the Field of every *consumer.ConfigError that err
// joins, in order.
func configFields(err error) []string {
	var fields []string
	var walk func(error)
	walk = func(err error) {
		var ce *consumer.ConfigError
		switch e := err.(type) {
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		default:
			if errors.As(err, &ce) {
				fields = append(fields, ce.Field)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return fields
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := kafkasource.Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "t", GroupID: "g"}
	if _, err := kafkasource.New(ok); err != nil {
		t.Fatalf("a minimal config: %v", err)
	}
	cases := []struct {
		field string
		mod   func(*kafkasource.Config)
	}{
		{"Brokers", func(c *kafkasource.Config) { c.Brokers = nil }},
		{"Brokers[0]", func(c *kafkasource.Config) { c.Brokers = []string{" "} }},
		{"Topic", func(c *kafkasource.Config) { c.Topic = "" }},
		{"GroupID", func(c *kafkasource.Config) { c.GroupID = "" }},
		{"Start", func(c *kafkasource.Config) { c.Start = "middle" }},
		{"Ordering", func(c *kafkasource.Config) { c.Ordering = "random" }},
		{"Isolation", func(c *kafkasource.Config) { c.Isolation = "read_some" }},
		{"SessionTimeout", func(c *kafkasource.Config) { c.SessionTimeout = -time.Second }},
		{"HeartbeatInterval", func(c *kafkasource.Config) { c.HeartbeatInterval = 5 * time.Second }},
		{"RevokeTimeout", func(c *kafkasource.Config) { c.RevokeTimeout = time.Minute }},
		{"MaxWait", func(c *kafkasource.Config) { c.MaxWait = -1 }},
		{"CommitInterval", func(c *kafkasource.Config) { c.CommitInterval = -1 }},
		{"BatchSize", func(c *kafkasource.Config) { c.BatchSize = -1 }},
		{"MaxUnfinished", func(c *kafkasource.Config) { c.MaxUnfinished = -1 }},
		{"FetchMaxBytes", func(c *kafkasource.Config) { c.FetchMaxBytes = -1 }},
		{"FetchBufferBytes", func(c *kafkasource.Config) { c.FetchBufferBytes = 64 << 10 }},
		{"NetworkTimeout", func(c *kafkasource.Config) { c.NetworkTimeout = -time.Second }},
		{"DeadLetterTopic", func(c *kafkasource.Config) { c.DeadLetterTopic = "t" }},
		{"SASL.Mechanism", func(c *kafkasource.Config) { c.SASL = &kafkasource.SASL{Mechanism: "GSSAPI", Username: "u"} }},
		{"SASL.Username", func(c *kafkasource.Config) { c.SASL = &kafkasource.SASL{Mechanism: "PLAIN"} }},
	}
	for _, tc := range cases {
		c := ok
		tc.mod(&c)
		_, err := kafkasource.New(c)
		if got := configFields(err); !slices.Equal(got, []string{tc.field}) || !errors.Is(err, kafkasource.ErrInvalidConfig) {
			t.Errorf("%s: New = %v (fields %q), want one ConfigError for %s wrapping ErrInvalidConfig", tc.field, err, got, tc.field)
		}
		if verr := c.Validate(); verr == nil || verr.Error() != err.Error() {
			t.Errorf("%s: Validate = %v, New = %v; want the same error", tc.field, verr, err)
		}
	}
	// Every bad field is reported, each as its own ConfigError.
	_, err := kafkasource.New(kafkasource.Config{Brokers: []string{"b:1", ""}, Start: "middle"})
	if got, want := configFields(err), []string{"Brokers[1]", "Topic", "GroupID", "Start"}; !slices.Equal(got, want) {
		t.Errorf("New with four bad fields = %v (fields %q), want %q", err, got, want)
	}
	// A session timeout too short for its default heartbeat is the session
	// timeout's error: that is the field the caller set.
	c := ok
	c.SessionTimeout = 100 * time.Millisecond
	if _, err := kafkasource.New(c); !slices.Equal(configFields(err), []string{"SessionTimeout"}) {
		t.Errorf("SessionTimeout 100ms: %v, want a ConfigError for SessionTimeout", err)
	}
	for _, iso := range []string{kafkasource.IsolationReadCommitted, kafkasource.IsolationReadUncommitted} {
		c := ok
		c.Isolation = iso
		if _, err := kafkasource.New(c); err != nil {
			t.Errorf("Isolation %s: %v", iso, err)
		}
	}
	for _, m := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		c := ok
		c.SASL = &kafkasource.SASL{Mechanism: m, Username: "u", Password: "p"}
		if _, err := kafkasource.New(c); err != nil {
			t.Errorf("SASL %s: %v", m, err)
		}
	}
}

func TestTrackerWatermark(t *testing.T) {
	t.Parallel()
	tr := kafkasource.NewTracker(10)
	if w := tr.Watermark(); w != 10 {
		t.Fatalf("empty tracker watermark %d, want the start 10", w)
	}
	for _, o := range []int64{10, 11, 13, 14} { // 12: a compaction gap
		tr.Add(o)
	}
	tr.Advance(15)
	steps := []struct {
		finish int64
		want   int64
	}{
		{13, 10}, {11, 10}, {10, 14}, {99, 14}, {14, 15},
	}
	for _, s := range steps {
		tr.Finish(s.finish)
		if w := tr.Watermark(); w != s.want {
			t.Fatalf("after finishing %d: watermark %d, want %d", s.finish, w, s.want)
		}
	}
	if p := tr.Pending(); p != 0 {
		t.Fatalf("pending %d, want 0", p)
	}
	// A long run finished out of order compacts without losing place.
	for o := int64(100); o < 5000; o++ {
		tr.Add(o)
	}
	for o := int64(4999); o > 100; o-- {
		tr.Finish(o)
	}
	if w := tr.Watermark(); w != 100 {
		t.Fatalf("watermark %d, want 100", w)
	}
	tr.Finish(100)
	if w := tr.Watermark(); w != 5000 {
		t.Fatalf("watermark %d, want 5000", w)
	}
}

// MaxUnfinished defaults to one run of a partition, and to room for two
// (one storing its results while the next runs) when the runner batches;
// to four runs of a key's under key ordering; a value set is kept.
func TestMaxUnfinishedDefault(t *testing.T) {
	for _, tc := range []struct {
		ordering string
		batch    int
		set      int
		want     [2]int // not batching, batching
	}{
		{kafkasource.OrderingPartition, 0, 0, [2]int{100, 200}},
		{kafkasource.OrderingPartition, 10, 0, [2]int{10, 20}},
		{kafkasource.OrderingKey, 10, 0, [2]int{40, 40}},
		{kafkasource.OrderingPartition, 10, 15, [2]int{15, 15}},
	} {
		s, err := kafkasource.New(kafkasource.Config{
			Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g",
			Ordering: tc.ordering, BatchSize: tc.batch, MaxUnfinished: tc.set,
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, batching := range []bool{false, true} {
			if got := kafkasource.MaxUnfinished(s, batching); got != tc.want[i] {
				t.Errorf("ordering %s, BatchSize %d, MaxUnfinished %d, batching %v: %d, want %d", tc.ordering, tc.batch, tc.set, batching, got, tc.want[i])
			}
		}
	}
}
