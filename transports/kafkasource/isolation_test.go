package kafkasource_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestIsolation: a partition holds plain records, an aborted transaction of
// 10 records, a committed one of 10, more plain records, and the two
// transaction markers. Under read_committed handlers see exactly the plain
// and committed records; under read_uncommitted also the aborted ones;
// under both, never a transaction marker, and the group's committed offset
// reaches the end of the partition (markers and skipped records included).
// On real Kafka and on kfake.
func TestIsolation(t *testing.T) {
	t.Parallel()
	brokers := map[string]func(t *testing.T) []string{
		"kafka": func(t *testing.T) []string { return testenv.Kafka(t) },
		"kfake": func(t *testing.T) []string { _, b := testenv.KFake(t); return b },
	}
	for _, name := range []string{"kafka", "kfake"} {
		for _, iso := range []string{"", kafkasource.IsolationReadUncommitted} {
			t.Run(name+"/"+cmp(iso, "default"), func(t *testing.T) {
				t.Parallel()
				e := &env{t: t, brokers: brokers[name](t), parts: 1}
				e.topic = fmt.Sprintf("t-iso-%s-%d-%d", name, time.Now().UnixNano()%1e6, topicSeq.Add(1))
				e.group = e.topic + "-g"
				testenv.CreateKafkaTopic(t, e.brokers, e.topic, 1)
				produceTxns(t, e.brokers, e.topic)

				var mu sync.Mutex
				var seen []string
				h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
					mu.Lock()
					seen = append(seen, fmt.Sprintf("%s=%s", m.Key, m.Payload))
					mu.Unlock()
					return nil, nil
				})
				src := e.source(func(c *kafkasource.Config) { c.Isolation = iso })
				r := run(t, worker(t, "iso", src, h))
				// 30 records and 2 markers; the broker writes a marker after
				// EndTransaction returns.
				ends := map[int]int64{0: 32}
				testenv.Eventually(t, 30*time.Second, "both transaction markers written", func() bool { return e.ends(e.topic, 1)[0] == 32 })
				testenv.Eventually(t, 30*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
				if err := r.Stop(t, 30*time.Second); err != nil {
					t.Fatalf("Run returned %v, want nil", err)
				}

				want := txnRecords("plain1", 5)
				if iso == kafkasource.IsolationReadUncommitted {
					want = append(want, txnRecords("aborted", 10)...)
				}
				want = append(want, txnRecords("committed", 10)...)
				want = append(want, txnRecords("plain2", 5)...)
				mu.Lock()
				got := slices.Clone(seen)
				mu.Unlock()
				for _, s := range got {
					if !strings.Contains(s, `{"id":`) {
						t.Errorf("handler saw a record that was not produced (a transaction marker?): %q", s)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("handled, in order:\n got %q\nwant %q", got, want)
				}
			})
		}
	}
}

func cmp(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func txnRecords(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`%s-%d={"id":"%s-%d"}`, prefix, i, prefix, i)
	}
	return out
}

// produceTxns writes to partition 0 of topic, with franz-go: 5 plain
// records, an aborted transaction of 10, a committed one of 10 and 5 plain
// records. Each record's key is its id; its value is {"id":"<key>"}.
func produceTxns(t *testing.T, brokers []string, topic string) {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner())}
	plain, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	tx, err := kgo.NewClient(append(opts, kgo.TransactionalID(topic+"-tx"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(c *kgo.Client, prefix string, n int) {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			r := &kgo.Record{Key: []byte(id), Value: []byte(`{"id":"` + id + `"}`)}
			if err := c.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce %s: %v", id, err)
			}
		}
	}
	txn := func(prefix string, end kgo.TransactionEndTry) {
		t.Helper()
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		put(tx, prefix, 10)
		if err := tx.EndTransaction(ctx, end); err != nil {
			t.Fatalf("ending the %s transaction: %v", prefix, err)
		}
	}
	put(plain, "plain1", 5)
	txn("aborted", kgo.TryAbort)
	txn("committed", kgo.TryCommit)
	put(plain, "plain2", 5)
}

// TestOpenTransaction: under read_committed the broker returns nothing from
// the first offset of an open transaction on (the last stable offset), also
// plain records written after it; they are handled once it commits, and
// the committed offset then reaches the end. On real Kafka and on kfake.
func TestOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"kafka", "kfake"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newTxnFixture(t, name, "open")
			e, plain, tx, ctx, put := f.e, f.plain, f.tx, f.ctx, f.put
			put(plain, "p0", "p1")
			if err := tx.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			put(tx, "t0", "t1", "t2")
			put(plain, "p2")

			var mu sync.Mutex
			var seen []string
			h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
				mu.Lock()
				seen = append(seen, string(m.Key))
				mu.Unlock()
				return nil, nil
			})
			r := run(t, worker(t, "open", e.source(nil), h))
			// The committed offset stops at the open transaction's first
			// record (offset 2): nothing after it was fetched.
			testenv.Eventually(t, 30*time.Second, "committed offset at the open transaction", func() bool { return e.committed()[0] >= 2 })
			mu.Lock()
			before := slices.Clone(seen)
			mu.Unlock()
			if c := e.committed()[0]; c != 2 || !slices.Equal(before, []string{"p0", "p1"}) {
				t.Fatalf("while the transaction is open: committed %d, handled %q; want 2 and [p0 p1]", c, before)
			}

			if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			// The broker writes the commit marker after EndTransaction
			// returns.
			ends := map[int]int64{0: 7}
			testenv.Eventually(t, 30*time.Second, "the commit marker at offset 6", func() bool { return e.ends(e.topic, 1)[0] == 7 })
			testenv.Eventually(t, 30*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
			if err := r.Stop(t, 30*time.Second); err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []string{"p0", "p1", "t0", "t1", "t2", "p2"}; !slices.Equal(seen, want) {
				t.Errorf("handled %q, want %q", seen, want)
			}
		})
	}
}

// TestStartLatestOpenTransaction: a new group starting at "latest" under
// read_committed starts at the last stable offset, before the records of a
// transaction still open, as Kafka's own consumer does, so they are handled
// once it commits; the end of the partition would have passed them for
// good. On real Kafka and on kfake.
func TestStartLatestOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"kafka", "kfake"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newTxnFixture(t, name, "latest")
			e, plain, tx, ctx, put := f.e, f.plain, f.tx, f.ctx, f.put
			put(plain, "p0")
			if err := tx.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			put(tx, "t0", "t1")

			var mu sync.Mutex
			var seen []string
			h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
				mu.Lock()
				seen = append(seen, string(m.Key))
				mu.Unlock()
				return nil, nil
			})
			r := run(t, worker(t, "latest", e.source(func(c *kafkasource.Config) { c.Start = kafkasource.StartLatest }), h))
			// The member commits the position it resolved: 1, or 3 (the
			// end) when it passed the open transaction.
			testenv.Eventually(t, 30*time.Second, "a committed offset", func() bool { return e.committed()[0] >= 1 })
			if c := e.committed()[0]; c != 1 {
				t.Fatalf("start at latest: committed %d, want 1 (the open transaction's first offset)", c)
			}
			if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
				t.Fatal(err)
			}
			ends := map[int]int64{0: 4}
			testenv.Eventually(t, 30*time.Second, "the commit marker at offset 3", func() bool { return e.ends(e.topic, 1)[0] == 4 })
			testenv.Eventually(t, 30*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
			if err := r.Stop(t, 30*time.Second); err != nil {
				t.Fatalf("Run returned %v, want nil", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := []string{"t0", "t1"}; !slices.Equal(seen, want) {
				t.Errorf("handled %q, want %q", seen, want)
			}
		})
	}
}

// txnFixture is a subtest's topic on real Kafka ("kafka") or kfake, with a
// plain and a transactional producer on it.
type txnFixture struct {
	t         *testing.T
	e         *env
	plain, tx *kgo.Client
	ctx       context.Context
}

func newTxnFixture(t *testing.T, broker, prefix string) *txnFixture {
	t.Helper()
	var brokers []string
	if broker == "kafka" {
		brokers = testenv.Kafka(t)
	} else {
		_, brokers = testenv.KFake(t)
	}
	e := &env{t: t, brokers: brokers, parts: 1}
	e.topic = fmt.Sprintf("t-%s-%s-%d-%d", prefix, broker, time.Now().UnixNano()%1e6, topicSeq.Add(1))
	e.group = e.topic + "-g"
	testenv.CreateKafkaTopic(t, e.brokers, e.topic, 1)
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(e.topic), kgo.RecordPartitioner(kgo.ManualPartitioner())}
	plain, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)
	tx, err := kgo.NewClient(append(opts, kgo.TransactionalID(e.topic+"-tx"))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tx.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &txnFixture{t: t, e: e, plain: plain, tx: tx, ctx: ctx}
}

// put produces one record per id (key and value the id) with c.
func (f *txnFixture) put(c *kgo.Client, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if err := c.ProduceSync(f.ctx, &kgo.Record{Key: []byte(id), Value: []byte(id)}).FirstErr(); err != nil {
			f.t.Fatalf("produce %s: %v", id, err)
		}
	}
}
