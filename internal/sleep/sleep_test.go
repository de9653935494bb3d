package sleep

import (
	"context"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	if !For(context.Background(), time.Millisecond) {
		t.Error("a live context's wait reported false")
	}
	if !For(context.Background(), 0) {
		t.Error("no wait on a live context reported false")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if For(ctx, 0) {
		t.Error("no wait on an ended context reported true")
	}
	start := time.Now()
	if For(ctx, time.Hour) {
		t.Error("a wait on an ended context reported true")
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("a wait on an ended context took %s", took)
	}
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan bool)
	go func() { done <- For(ctx, time.Hour) }()
	cancel()
	select {
	case ok := <-done:
		if ok {
			t.Error("a wait cut short by its context reported true")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a wait did not end with its context")
	}
}
