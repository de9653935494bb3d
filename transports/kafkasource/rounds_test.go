package kafkasource_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestRoundsShareAFetch: the partitions a broker leads fetch in shared
// requests. Once every partition is at its end, waiting for records, one
// request carries all of them; and what they fetched before that is every
// message, each partition in order.
func TestRoundsShareAFetch(t *testing.T) {
	t.Parallel()
	const partitions = 6
	e := newRealEnv(t, partitions)
	consumeAllInRounds(t, e, "rounds-share", partitions)
}

// consumeAllInRounds consumes e's topic, 40 messages a partition, and
// checks that every message is handled in its partition's order and that,
// once every partition is at its end, the widest shared fetch carries
// widest partitions, and never more.
func consumeAllInRounds(t *testing.T, e *env, name string, widest int) {
	t.Helper()
	produceBatches(e, 2, 20, 64)
	var log orderedLog
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		log.add(m)
		return nil, nil
	})
	src := e.source(nil)
	r := run(t, worker(t, name, src, h))
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("a fetch carrying %d partitions", widest), func() bool {
		return kafkasource.WidestRound(src) == widest
	})
	finishAndCheck(t, e, r, &log, e.parts)
	if got := kafkasource.WidestRound(src); got != widest {
		t.Errorf("a fetch carried %d partitions, want at most %d", got, widest)
	}
	// FetchStats counts the same requests: some carried several partitions.
	if st := src.FetchStats(); st.Requests == 0 || st.Partitions <= st.Requests || st.Partitions > st.Requests*int64(widest) {
		t.Errorf("FetchStats = %+v, want requests of 1 to %d partitions, some of more than one", st, widest)
	}
}

// TestHeldPartitionDoesNotWaitOutALongPoll: a partition whose fetcher waits
// for room (its handler is slow) is not in the request its broker has in
// flight. When it asks again it must not wait out that request's long poll
// of the other partitions: its next message is handled well within MaxWait
// of the slow handler's return. While it waits, the other partition's
// fetches do not hammer the broker either.
func TestHeldPartitionDoesNotWaitOutALongPoll(t *testing.T) {
	t.Parallel()
	const maxWait = 20 * time.Second
	e := newRealEnv(t, 2)
	e.produce(e.topic, []msg{{partition: 0, value: "0"}, {partition: 0, value: "1"}, {partition: 0, value: "2"}})
	release := make(chan struct{})
	started := make(chan struct{})
	handled := make(chan time.Time, 8)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if string(m.Payload) == "0" {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if string(m.Payload) == "3" {
			handled <- time.Now()
		}
		return nil, nil
	})
	// One message unfinished at a time: while "0" runs, partition 0's
	// fetcher holds "1" and "2" and may not fetch again.
	src := e.source(func(c *kafkasource.Config) {
		c.MaxWait = maxWait
		c.BatchSize = 1
		c.MaxUnfinished = 1
	})
	r := run(t, worker(t, "rounds-held", src, h))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal(`"0" was not handled within 30s`)
	}
	// Partition 1's first fetch has returned (its end is known): from then
	// on it waits at the broker for records, without partition 0.
	testenv.Eventually(t, 30*time.Second, "partition 1 fetched", func() bool {
		for _, l := range src.Lag() {
			if l.Partition == 1 {
				return true
			}
		}
		return false
	})
	// Meanwhile partition 1 fetches alone: its fetches wait 10ms, then,
	// while they find nothing, longer, up to 100ms: about 20 requests in
	// two seconds, not 200.
	const over = 2 * time.Second
	before := src.FetchStats().Requests
	<-time.After(over) // the interval requests are counted over, not a synchronisation
	if n := src.FetchStats().Requests - before; n > 60 {
		t.Errorf("%d fetch requests in %v for an idle partition while the other is held, want about 20", n, over)
	}
	e.produce(e.topic, []msg{{partition: 0, value: "3"}})
	released := time.Now()
	close(release)
	select {
	case at := <-handled:
		if d := at.Sub(released); d > maxWait/4 {
			t.Errorf(`"3" was handled %v after "0" returned, want well within MaxWait %v: the held partition waited out the other's long poll`, d, maxWait)
		}
	case <-time.After(2 * maxWait):
		t.Fatalf(`"3" was not handled within %v`, 2*maxWait)
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}

// TestIdleRoundsLongPoll: partitions at their end, with nothing to read,
// keep fetching in one request that long-polls for MaxWait, rather than in
// groups whose requests alternate and each wait only the short wait of a
// request that leaves partitions out. Over two seconds at a MaxWait of
// 100ms that is about 20 requests; split into groups, it would be a
// request every 10ms or so.
func TestIdleRoundsLongPoll(t *testing.T) {
	t.Parallel()
	const partitions = 6
	e := newRealEnv(t, partitions)
	e.produce(e.topic, []msg{{partition: 0, value: "0"}, {partition: 3, value: "3"}})
	handled := make(chan struct{}, partitions)
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		handled <- struct{}{}
		return nil, nil
	})
	src := e.source(nil) // MaxWait 100ms
	r := run(t, worker(t, "rounds-idle", src, h))
	for range 2 {
		select {
		case <-handled:
		case <-time.After(30 * time.Second):
			t.Fatal("the two messages were not handled within 30s")
		}
	}
	testenv.Eventually(t, 30*time.Second, "one fetch carrying every partition", func() bool {
		return kafkasource.WidestRound(src) == partitions
	})
	const over = 2 * time.Second
	before := src.FetchStats().Requests
	<-time.After(over) // the interval requests are counted over, not a synchronisation
	if n := src.FetchStats().Requests - before; n > 60 {
		t.Errorf("%d fetch requests in %v at the partitions' end with MaxWait 100ms, want about 20: the idle partitions do not fetch together", n, over)
	}
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}
