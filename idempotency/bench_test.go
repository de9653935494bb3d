package idempotency_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/consumer/consumertest"
	"github.com/idemkit/dedupworker/idempotency"
)

// stubStore answers every claim NEW and every completion owned, at once. It
// keeps no records and checks nothing: BenchmarkEngine measures the engine's
// own CPU and allocations per message, which on the real store are lost in
// the noise of Redis and the network (the storage semantics are tested
// against real Redis, in storetest and the engine tests).
type stubStore struct{}

var errStub = errors.New("stub store: not used by the benchmark")

func (stubStore) Claim(_ context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	res := make([]idempotency.ClaimResult, len(reqs))
	until := time.Now().Add(time.Minute)
	for i, r := range reqs {
		res[i] = idempotency.ClaimResult{Outcome: idempotency.ClaimNew, Claim: &idempotency.Claim{
			Key: r.Key, Token: "t", Fence: 1, LeaseUntil: until, Attempts: 1,
		}}
	}
	return res, nil
}

func (stubStore) Complete(_ context.Context, cs []idempotency.Completion) ([]bool, error) {
	ok := make([]bool, len(cs))
	for i := range ok {
		ok[i] = true
	}
	return ok, nil
}

func (stubStore) Renew(context.Context, string, string, time.Duration) (time.Time, bool, error) {
	return time.Time{}, false, errStub
}
func (stubStore) Release(context.Context, string, string, time.Duration) (bool, error) {
	return false, errStub
}
func (stubStore) SaveStep(context.Context, string, string, string, []byte) (bool, error) {
	return false, errStub
}
func (stubStore) Wait(context.Context, string, time.Duration) (*idempotency.Record, error) {
	return nil, errStub
}
func (stubStore) Get(context.Context, string) (*idempotency.Record, error) { return nil, errStub }
func (stubStore) Delete(context.Context, string) (bool, error)             { return false, errStub }
func (stubStore) Ping(context.Context) error                               { return nil }

// BenchmarkEngine runs batches of 100 deliveries through the engine as a
// source does (Prepare, then Process on a pool of 100 goroutines) with a no-op
// handler and a store that answers at once. b.N counts messages; allocs/op
// and B/op are per message and do not depend on the machine's load
// (docs/PERFORMANCE.md).
func BenchmarkEngine(b *testing.B) {
	eng, err := idempotency.New(stubStore{}, idempotency.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	dedup, err := eng.Processor()
	if err != nil {
		b.Fatal(err)
	}
	noop := consumer.HandlerFunc(func(context.Context, *consumer.Message) ([]byte, error) { return nil, nil })
	p := dedup("bench", noop)
	ctx := context.Background()
	const batch = 100
	ds := make([]consumer.Delivery, batch)
	fds := make([]*consumertest.Delivery, batch)
	// Long-lived goroutines, as the sources' pools: a goroutine started
	// per delivery would be measured too.
	work := make(chan consumer.Delivery)
	var done, workers sync.WaitGroup
	for range batch {
		workers.Go(func() {
			for d := range work {
				p.Process(ctx, d)
				done.Done()
			}
		})
	}
	defer func() {
		close(work)
		workers.Wait()
	}()
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for n < b.N {
		b.StopTimer()
		for i := range ds {
			fds[i] = consumertest.NewDelivery(consumertest.NewMessage("k"+strconv.Itoa(n+i), `{"order":42}`), 1)
			ds[i] = fds[i]
		}
		b.StartTimer()
		p.Prepare(ctx, ds)
		done.Add(batch)
		for _, d := range ds {
			work <- d
		}
		done.Wait()
		n += batch
	}
	b.StopTimer()
	for _, d := range fds {
		d.ExpectAcked(b)
	}
}
