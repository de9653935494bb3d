package app

import (
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
