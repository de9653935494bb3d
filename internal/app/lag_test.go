package app

import (
	"maps"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLagMetrics: each handler's source lag is exported under its name,
// one series a partition the source reports at the scrape (none while it
// reports none), with the same help for every handler.
func TestLagMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	kafka := map[string]float64{"0": 12, "3": 0}
	var natsOK bool
	if err := registerLag(reg, "orders", func(add func(string, float64)) {
		for p, l := range kafka {
			add(p, l)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := registerLag(reg, "payments", func(add func(string, float64)) {
		if natsOK {
			add("", 7)
		}
	}); err != nil {
		t.Fatal(err)
	}
	gather := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "dedup_source_lag" || !strings.Contains(mf.GetHelp(), "num_pending") {
				t.Fatalf("gathered %s (%q), want only dedup_source_lag with its help", mf.GetName(), mf.GetHelp())
			}
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				got[strings.Join(labels, ",")] = m.GetGauge().GetValue()
			}
		}
		return got
	}
	want := map[string]float64{"handler=orders,partition=0": 12, "handler=orders,partition=3": 0}
	if got := gather(); !maps.Equal(got, want) {
		t.Fatalf("gathered %v, want %v", got, want)
	}
	// Read at each scrape: a partition revoked is gone, a source that
	// started consuming appears.
	delete(kafka, "3")
	kafka["0"] = 40
	natsOK = true
	want = map[string]float64{"handler=orders,partition=0": 40, "handler=payments,partition=": 7}
	if got := gather(); !maps.Equal(got, want) {
		t.Fatalf("gathered %v, want %v", got, want)
	}
	if err := registerLag(reg, "orders", func(func(string, float64)) {}); err == nil {
		t.Fatal("a second handler named orders registered its lag, want the registry's duplicate error")
	}
}
