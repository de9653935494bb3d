package kafkasource_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/dispatch"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/redisbackend"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestIsolationThroughEngine: the deduplication engine with key json:id and
// missing_key reject in front of the handler, on real Kafka and Redis. A
// transaction marker handed on would have no key and be dead-lettered as
// missing_key; none is: the dead-letter topic stays empty, the handler runs
// once per plain and committed record and never for an aborted one, and the
// committed offset reaches the end of the partition.
func TestIsolationThroughEngine(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	dlq := e.topic + ".dlq"
	testenv.CreateKafkaTopic(t, e.brokers, dlq, 1)
	dedup := engineProcessor(t, e.topic,
		idempotency.WithKeySources(idempotency.JSONKey("id")),
		idempotency.WithMissingKey(idempotency.MissingKeyReject),
		idempotency.WithRetention(time.Minute),
	)
	produceTxns(t, e.brokers, e.topic)

	var mu sync.Mutex
	var seen []string
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s=%s", m.Key, m.Payload))
		mu.Unlock()
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) { c.DeadLetterTopic = dlq })
	r := run(t, worker(t, "iso-engine", src, h, dispatch.WithProcessor(dedup)))
	ends := map[int]int64{0: 32}
	testenv.Eventually(t, 30*time.Second, "both transaction markers written", func() bool { return e.ends(e.topic, 1)[0] == 32 })
	testenv.Eventually(t, 30*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if n := e.ends(dlq, 1)[0]; n != 0 {
		t.Errorf("%d messages dead-lettered, want none", n)
	}
	want := slices.Concat(txnRecords("plain1", 5), txnRecords("committed", 10), txnRecords("plain2", 5))
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, want) {
		t.Errorf("handled, in order:\n got %q\nwant %q", seen, want)
	}
}

// engineProcessor is the deduplication engine's processor factory with opts,
// on the real Redis under namespace, closed when the test ends.
func engineProcessor(t *testing.T, namespace string, opts ...idempotency.Option) func(string, consumer.Handler) consumer.Processor {
	t.Helper()
	store, err := redisbackend.New(testenv.RedisClient(t), redisbackend.Options{Namespace: namespace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	eng, err := idempotency.New(store, idempotency.Config{StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	dedup, err := eng.Processor(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return dedup
}
