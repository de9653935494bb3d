package kafkasource_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestLag: Lag reports, for each partition the source holds, its end and
// the offset the group would resume at. While every handler is stuck the
// fetchers stop (MaxUnfinished), and records produced then still show up
// in the lag, through the listing of the partitions' ends; once the
// handlers finish the lag is 0, and a source that stopped reports none.
func TestLag(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, 2)
	var first []msg
	for i := range 10 {
		first = append(first, msg{partition: 0, value: strconv.Itoa(i)})
	}
	for i := range 5 {
		first = append(first, msg{partition: 1, value: strconv.Itoa(i)})
	}
	e.produce(e.topic, first)

	release := make(chan struct{})
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		select {
		case <-release:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	// The fetchers fetch again once the rest of a fetch fits in
	// max(MaxUnfinished, BatchSize): with both 2, a partition's first
	// fetch of 5 or 10 records keeps its fetcher waiting.
	src := e.source(func(c *kafkasource.Config) { c.BatchSize, c.MaxUnfinished = 2, 2 })
	if got := src.Lag(); got != nil {
		t.Fatalf("Lag before Consume = %v, want nil", got)
	}
	r := run(t, worker(t, "lag", src, h))

	// want checks Lag against partition -> {offset, end}.
	want := func(exp map[int][2]int64) func() error {
		return func() error {
			got := src.Lag()
			if len(got) != len(exp) {
				return fmt.Errorf("Lag = %+v, want %d partitions", got, len(exp))
			}
			for _, l := range got {
				w, ok := exp[l.Partition]
				if !ok || l.Offset != w[0] || l.End != w[1] || l.Lag != w[1]-w[0] {
					return fmt.Errorf("Lag = %+v, want partition %d at offset %d of %d", got, l.Partition, w[0], w[1])
				}
				if l.Seen.IsZero() || time.Since(l.Seen) > time.Minute {
					return fmt.Errorf("partition %d: Seen %v", l.Partition, l.Seen)
				}
			}
			if got[0].Partition != 0 || got[1].Partition != 1 {
				return fmt.Errorf("Lag = %+v, not in partition order", got)
			}
			return nil
		}
	}
	testenv.EventuallyNil(t, 30*time.Second, "the lag of the stuck handlers", want(map[int][2]int64{0: {0, 10}, 1: {0, 5}}))

	// The fetchers wait for room now: only the listing sees these.
	var more []msg
	for i := range 7 {
		more = append(more, msg{partition: 0, value: "more" + strconv.Itoa(i)})
	}
	e.produce(e.topic, more)
	testenv.EventuallyNil(t, 30*time.Second, "the lag of records produced while the fetchers wait", want(map[int][2]int64{0: {0, 17}, 1: {0, 5}}))

	close(release)
	testenv.EventuallyNil(t, 60*time.Second, "no lag once everything is handled", want(map[int][2]int64{0: {17, 17}, 1: {5, 5}}))
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := src.Lag(); got != nil {
		t.Fatalf("Lag after Consume returned = %v, want nil", got)
	}
}
