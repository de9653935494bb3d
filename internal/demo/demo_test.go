package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestDemoRunsEachKeyOnce(t *testing.T) {
	var progress bytes.Buffer
	rep, err := Run(context.Background(), Options{Unique: 60, RedisURL: "inprocess", Timeout: 30 * time.Second}, &progress)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, progress.String())
	}
	if !rep.OK() {
		var out bytes.Buffer
		rep.Print(&out)
		t.Fatalf("demo report not ok:\n%s", out.String())
	}
	for _, row := range rep.Rows {
		if row.Published != 60+18 || row.Retried != 6 {
			t.Fatalf("%s: published %d retried %d, want 78 and 6", row.Transport, row.Published, row.Retried)
		}
	}
	var out bytes.Buffer
	rep.Print(&out)
	if !strings.Contains(out.String(), "handler runs == unique keys on every transport: true") {
		t.Fatalf("table:\n%s", out.String())
	}
}

func TestDemoFallsBackWhenRedisURLIsClosed(t *testing.T) {
	t.Setenv("REDIS_URL", "redis://demo:s3cret@127.0.0.1:1/0")
	url, desc, stop, err := chooseRedis("")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if strings.Contains(url, "127.0.0.1:1/") || !strings.Contains(desc, "does not answer") {
		t.Fatalf("chose %s (%s): a closed $REDIS_URL must be skipped and said so", url, desc)
	}
	if strings.Contains(desc, "s3cret") {
		t.Fatalf("the description %q shows $REDIS_URL's password", desc)
	}
}
