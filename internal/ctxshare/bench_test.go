package ctxshare

import (
	"context"
	"testing"
)

// BenchmarkBind binds one delivery context per op, from parallel
// goroutines as a source's deliveries are, against the worker's work
// context: "shared" through a Binder, "per-call" with the
// context.WithCancelCause and AfterFunc a Binder saves. The sources are a
// context nothing cancels (NATS) and a partition's cancellable one (Kafka).
//
//	go test ./internal/ctxshare -run '^$' -bench Bind -benchmem
func BenchmarkBind(b *testing.B) {
	work, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	partition, revoke := context.WithCancel(context.Background())
	defer revoke()
	sources := []struct {
		name string
		ctx  context.Context
	}{
		{"uncancellable", context.WithoutCancel(context.Background())},
		{"partition", partition},
	}
	for _, src := range sources {
		b.Run(src.name+"/shared", func(b *testing.B) {
			var binder Binder
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, cancel := binder.Bind(src.ctx, work)
					_ = c.Err()
					cancel()
				}
			})
		})
		b.Run(src.name+"/per-call", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c, cancel := context.WithCancelCause(src.ctx)
					stop := context.AfterFunc(work, func() { cancel(context.Cause(work)) })
					_ = c.Err()
					stop()
					cancel(nil)
				}
			})
		})
	}
}
