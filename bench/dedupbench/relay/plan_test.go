package main

import (
	"testing"
	"time"
)

func TestMakePlanDuplicatesRepeatAnEarlierMessageOnItsPartition(t *testing.T) {
	const n, dup, parts = 10000, 30, 8
	plan := makePlan(n, dup, parts, "k")
	if len(plan) != n {
		t.Fatalf("len = %d, want %d", len(plan), n)
	}
	first := map[string]int{}
	lastSeq := make([]int, parts)
	for i := range lastSeq {
		lastSeq[i] = -1
	}
	dups := 0
	for i, in := range plan {
		if !in.Dup {
			if _, ok := first[in.Key]; ok {
				t.Fatalf("message %d: key %s is not a duplicate but was seen before", i, in.Key)
			}
			first[in.Key] = i
			if in.Seq != lastSeq[in.Part]+1 {
				t.Fatalf("message %d: seq %d on partition %d after %d, want consecutive", i, in.Seq, in.Part, lastSeq[in.Part])
			}
			lastSeq[in.Part] = in.Seq
			continue
		}
		dups++
		j, ok := first[in.Key]
		if !ok {
			t.Fatalf("duplicate %d of key %s has no original before it", i, in.Key)
		}
		if o := plan[j]; o.Part != in.Part || o.Seq != in.Seq {
			t.Fatalf("duplicate %d is on partition %d seq %d, its original on %d seq %d", i, in.Part, in.Seq, o.Part, o.Seq)
		}
		if i-j < minDupDistance {
			t.Fatalf("duplicate %d comes %d messages after its original, want at least %d", i, i-j, minDupDistance)
		}
	}
	if dups != n*dup/100 || distinct(plan) != n-dups {
		t.Fatalf("%d duplicates and %d distinct, want %d and %d", dups, distinct(plan), n*dup/100, n-n*dup/100)
	}
}

func TestMakePlanWithoutDuplicates(t *testing.T) {
	plan := makePlan(3000, 0, 1, "k")
	for i, in := range plan {
		if in.Dup || in.Seq != i || in.Part != 0 {
			t.Fatalf("message %d = %+v, want distinct with seq %d on partition 0", i, in, i)
		}
	}
}

func TestPayloadRoundTrips(t *testing.T) {
	in := input{Key: "k-7", Part: 3, Seq: 41}
	b, err := parsePayload(payload(in))
	if err != nil || b.ID != in.Key || b.Part != in.Part || b.Seq != in.Seq {
		t.Fatalf("parsePayload(payload(%+v)) = %+v, %v", in, b, err)
	}
	padded := payload(input{Key: "k-7", Part: 3, Seq: 41, Pad: 4096})
	if b, err := parsePayload(padded); err != nil || b.Seq != 41 || len(padded) < 4096 || len(padded) > 4096+len(payload(in))+16 {
		t.Fatalf("a payload padded by 4096 bytes: %d bytes, parsed %+v, %v", len(padded), b, err)
	}
	if _, err := parsePayload([]byte("not json")); err == nil {
		t.Fatal("a payload that is not JSON parsed")
	}
}

func msg(key string, part, seq int) []byte { return payload(input{Key: key, Part: part, Seq: seq}) }

func TestRecorderFindsOrderViolationsPerStream(t *testing.T) {
	now := time.Now()
	r := newRecorder(nil)
	// Output partition 0 carries input partitions 0 and 1 interleaved, in
	// order within each: no violation.
	r.add(0, msg("a", 0, 0), "", now)
	r.add(0, msg("x", 1, 0), "", now)
	r.add(0, msg("b", 0, 1), "", now)
	r.add(0, msg("y", 1, 1), "", now)
	// A repeat of an earlier key is not an order violation.
	r.add(0, msg("a", 0, 0), "", now)
	// Another output partition starts its own stream.
	r.add(1, msg("p", 0, 5), "", now)
	if s := r.snapshot(); s.Violations != 0 || s.Total != 6 || s.Distinct != 5 {
		t.Fatalf("in-order output: %+v, want 0 violations, 6 outputs, 5 distinct", s)
	}
	// Input partition 0's seq 2 after its seq 3 in output partition 0.
	r.add(0, msg("d", 0, 3), "", now)
	r.add(0, msg("c", 0, 2), "", now)
	if s := r.snapshot(); s.Violations != 1 {
		t.Fatalf("violations = %d after seq 2 followed seq 3, want 1", s.Violations)
	}
	r.add(0, []byte("garbage"), "", now)
	if s := r.snapshot(); s.Bad != 1 {
		t.Fatalf("bad = %d, want 1", s.Bad)
	}
	plan := []input{{Key: "a"}, {Key: "b"}, {Key: "zz"}, {Key: "a", Dup: true}}
	if m := r.missing(plan); m != 1 {
		t.Fatalf("missing = %d, want 1 (zz)", m)
	}
}

func TestRecorderLatencyAndWindow(t *testing.T) {
	t0 := time.Unix(100, 0)
	calls := 0
	r := newRecorder(func() { calls++ })
	r.add(0, msg("a", 0, 0), "", t0)
	r.add(0, msg("b", 0, 1), "99000000000", t0.Add(time.Second)) // published at 99s
	r.add(0, msg("c", 0, 2), "bad", t0.Add(2*time.Second))
	s := r.snapshot()
	if calls != 1 || !s.FirstAt.Equal(t0) || !s.LastAt.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("onFirst called %d times, window %v..%v", calls, s.FirstAt, s.LastAt)
	}
	l := r.takeLatencies()
	if len(l) != 1 || l[0] != 2*time.Second {
		t.Fatalf("latencies = %v, want [2s]", l)
	}
	if l := r.takeLatencies(); len(l) != 0 {
		t.Fatalf("takeLatencies kept %v", l)
	}
}

func TestQuantileNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}} {
		if got := quantile(d, c.q); got != c.want {
			t.Errorf("quantile(1..100ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := quantile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("quantile of one sample = %v", got)
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("quantile of none = %v", got)
	}
}
