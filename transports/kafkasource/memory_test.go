package kafkasource_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

// TestFetchesOneAhead: a partition whose handler is stuck holds the fetch
// it is dispatching and no other: the fetcher fetches again only once the
// rest of its last fetch fits in MaxUnfinished. With the handler released,
// every message is handled (the fetcher resumes).
func TestFetchesOneAhead(t *testing.T) {
	t.Parallel()
	e := newRealEnv(t, 1)
	const (
		fetchBytes = 128 << 10
		valueBytes = 4 << 10
		messages   = 120 // about four fetches
	)
	value := strings.Repeat("v", valueBytes)
	for range messages {
		// One record batch each: the broker fills a fetch with whole
		// batches up to FetchMaxBytes.
		e.produce(e.topic, []msg{{value: value}})
	}
	var read atomic.Int64
	nd := &net.Dialer{Timeout: 10 * time.Second}
	dialer := &kafka.Dialer{DualStack: true, DialFunc: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := nd.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, read: &read}, nil
	}}
	started := make(chan struct{})
	release := make(chan struct{})
	var handled, first atomic.Int64
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		if first.Add(1) == 1 {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		handled.Add(1)
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) {
		c.Dialer = dialer
		c.FetchMaxBytes = fetchBytes
		c.BatchSize = 10
		c.MaxUnfinished = 10
	})
	r := run(t, worker(t, "one-ahead", src, h))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the first message was not handled within 30s")
	}
	// What must not happen is a further fetch; there is no event to wait
	// for, so give the fetcher ten of its MaxWaits (100ms) to make one.
	time.Sleep(time.Second)
	got := read.Load()
	// One fetch is about fetchBytes; group, metadata and offset traffic
	// are a few KiB. A fetcher running ahead would have read two more.
	if got > fetchBytes*3/2 {
		t.Errorf("read %d bytes from the brokers while the first message was stuck, want at most %d: the fetcher ran more than one fetch ahead", got, fetchBytes*3/2)
	}
	if got < fetchBytes/2 {
		t.Errorf("read only %d bytes: the test did not fill a fetch of %d", got, fetchBytes)
	}
	close(release)
	testenv.Eventually(t, 30*time.Second, "every message handled", func() bool { return handled.Load() == messages })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
}
