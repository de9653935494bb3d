package kafkasource_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/testenv"
	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// hostResolver maps one host name to an address and counts its lookups.
type hostResolver struct {
	name, addr string
	lookups    atomic.Int64
}

func (r *hostResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if host != r.name {
		return []string{host}, nil
	}
	r.lookups.Add(1)
	return []string{r.addr}, nil
}

// TestFetchUsesResolver: Config.Dialer's Resolver applies to the fetches
// too: a broker named by a host only the resolver knows is consumed to the
// end.
func TestFetchUsesResolver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(e.topic, []msg{{value: "a"}, {value: "b"}})
	_, port, err := net.SplitHostPort(e.brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(e.brokers[0])
	res := &hostResolver{name: "broker.dedup.invalid", addr: host}
	var seen atomic.Int64
	h := consumer.HandlerFunc(func(ctx context.Context, m *consumer.Message) ([]byte, error) {
		seen.Add(1)
		return nil, nil
	})
	src := e.source(func(c *kafkasource.Config) {
		c.Brokers = []string{net.JoinHostPort(res.name, port)}
		c.Dialer = &kafka.Dialer{Resolver: res, DualStack: true}
	})
	r := run(t, worker(t, "resolver", src, h))
	ends := e.ends(e.topic, 1)
	testenv.Eventually(t, 30*time.Second, "committed offset at the partition end", func() bool { return reachedEnds(e.committed(), ends) })
	if err := r.Stop(t, 30*time.Second); err != nil {
		t.Fatalf("Run returned %v, want nil", err)
	}
	if seen.Load() != 2 || res.lookups.Load() == 0 {
		t.Errorf("handled %d, resolver lookups %d; want 2 and some", seen.Load(), res.lookups.Load())
	}
}
