package benchutil

import (
	"slices"
	"strings"
	"testing"
)

func TestSplitList(t *testing.T) {
	if got := SplitList(" kafka, ,nats,"); !slices.Equal(got, []string{"kafka", "nats"}) {
		t.Fatalf("SplitList = %q", got)
	}
	if got := SplitList(""); got != nil {
		t.Fatalf("SplitList(\"\") = %q, want nil", got)
	}
}

func TestLoadAvg(t *testing.T) {
	if f := strings.Fields(LoadAvg()); len(f) != 3 {
		t.Fatalf("LoadAvg = %q, want three fields", LoadAvg())
	}
}
