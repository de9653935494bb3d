package kafka_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/transports/kafka"
)

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := kafka.Config{Brokers: []string{"127.0.0.1:9092"}, Topic: "t", GroupID: "g"}
	if _, err := kafka.New(ok); err != nil {
		t.Fatalf("a minimal config: %v", err)
	}
	cases := []struct {
		field string
		mod   func(*kafka.Config)
	}{
		{"Config.Brokers", func(c *kafka.Config) { c.Brokers = nil }},
		{"Config.Brokers[0]", func(c *kafka.Config) { c.Brokers = []string{" "} }},
		{"Config.Topic", func(c *kafka.Config) { c.Topic = "" }},
		{"Config.GroupID", func(c *kafka.Config) { c.GroupID = "" }},
		{"Config.Start", func(c *kafka.Config) { c.Start = "middle" }},
		{"Config.Ordering", func(c *kafka.Config) { c.Ordering = "random" }},
		{"Config.Isolation", func(c *kafka.Config) { c.Isolation = "read_some" }},
		{"Config.SessionTimeout", func(c *kafka.Config) { c.SessionTimeout = -time.Second }},
		{"Config.HeartbeatInterval", func(c *kafka.Config) { c.HeartbeatInterval = 5 * time.Second }},
		{"Config.RevokeTimeout", func(c *kafka.Config) { c.RevokeTimeout = time.Minute }},
		{"Config.MaxWait", func(c *kafka.Config) { c.MaxWait = -1 }},
		{"Config.CommitInterval", func(c *kafka.Config) { c.CommitInterval = -1 }},
		{"Config.BatchSize", func(c *kafka.Config) { c.BatchSize = -1 }},
		{"Config.DeadLetterTopic", func(c *kafka.Config) { c.DeadLetterTopic = "t" }},
		{"Config.SASL.Mechanism", func(c *kafka.Config) { c.SASL = &kafka.SASL{Mechanism: "GSSAPI", Username: "u"} }},
		{"Config.SASL.Username", func(c *kafka.Config) { c.SASL = &kafka.SASL{Mechanism: "PLAIN"} }},
	}
	for _, tc := range cases {
		c := ok
		tc.mod(&c)
		_, err := kafka.New(c)
		if err == nil || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%s: New = %v, want an error naming the field", tc.field, err)
		}
	}
	for _, iso := range []string{kafka.IsolationReadCommitted, kafka.IsolationReadUncommitted} {
		c := ok
		c.Isolation = iso
		if _, err := kafka.New(c); err != nil {
			t.Errorf("Isolation %s: %v", iso, err)
		}
	}
	for _, m := range []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		c := ok
		c.SASL = &kafka.SASL{Mechanism: m, Username: "u", Password: "p"}
		if _, err := kafka.New(c); err != nil {
			t.Errorf("SASL %s: %v", m, err)
		}
	}
}

func TestTrackerWatermark(t *testing.T) {
	t.Parallel()
	tr := kafka.NewTracker(10)
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
