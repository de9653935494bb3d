package app

import (
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/dedupworker/transports/kafkasource"
)

// TestFetchBufferMetrics: each handler's fetch buffer is exported
// under its name, read from its source when scraped.
func TestFetchBufferMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	orders := fetchBufferStats{size: 32 << 20, held: 1234, waited: 1500 * time.Millisecond}
	payments := fetchBufferStats{size: 8 << 20}
	if err := registerFetchBuffer(reg, "orders", func() fetchBufferStats { return orders }); err != nil {
		t.Fatal(err)
	}
	if err := registerFetchBuffer(reg, "payments", func() fetchBufferStats { return payments }); err != nil {
		t.Fatal(err)
	}
	orders.held = 5678 // read at the scrape, not at registration
	got := gathered(t, reg)
	want := map[string]float64{
		"dedup_fetch_buffer_bytes{handler=orders}":         5678,
		"dedup_fetch_buffer_bytes{handler=payments}":       0,
		"dedup_fetch_buffer_limit_bytes{handler=orders}":   32 << 20,
		"dedup_fetch_buffer_limit_bytes{handler=payments}": 8 << 20,
		"dedup_fetch_wait_seconds_total{handler=orders}":   1.5,
		"dedup_fetch_wait_seconds_total{handler=payments}": 0,
	}
	if !maps.Equal(got, want) {
		t.Fatalf("gathered %v, want %v", got, want)
	}
	if err := registerFetchBuffer(reg, "orders", func() fetchBufferStats { return orders }); err == nil {
		t.Fatal("a second handler named orders registered its fetch buffer, want the registry's duplicate error")
	}
}

// TestKafkaFetchMetrics: a Kafka handler's fetch requests and the
// partitions they carried are exported under its name, read when scraped.
func TestKafkaFetchMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := kafkasource.FetchStats{Requests: 3, Partitions: 17}
	if err := registerKafkaFetches(reg, "orders", func() kafkasource.FetchStats { return st }); err != nil {
		t.Fatal(err)
	}
	st.Requests = 4 // read at the scrape, not at registration
	want := map[string]float64{
		"dedup_kafka_fetch_requests_total{handler=orders}":   4,
		"dedup_kafka_fetch_partitions_total{handler=orders}": 17,
	}
	if got := gathered(t, reg); !maps.Equal(got, want) {
		t.Fatalf("gathered %v, want %v", got, want)
	}
}

// gathered returns every gauge and counter of reg by name{labels}.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName() + "{"
			for _, l := range m.GetLabel() {
				name += l.GetName() + "=" + l.GetValue()
			}
			name += "}"
			switch {
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}
