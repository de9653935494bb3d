package idempotency

import (
	"strings"
	"testing"

	"github.com/idemkit/dedupworker/consumer"
)

func TestExtractKeyOrderAndSources(t *testing.T) {
	m := &consumer.Message{
		Key:     []byte("customer-7"),
		Payload: []byte(`{"order":{"id":42,"ref":"r-1"},"s":"x"}`),
		Header:  consumer.Header{"idempotency-key": {"hk"}, "Nats-Msg-Id": {"mid"}},
	}
	cases := []struct {
		sources []string
		want    string
	}{
		{[]string{"header:Idempotency-Key"}, "hk"},
		{[]string{"header:X-Missing", "nats-msg-id"}, "mid"},
		{[]string{"kafka-key"}, "customer-7"},
		{[]string{"json:order.id"}, "42"},
		{[]string{"json:order.ref"}, "r-1"},
		{[]string{"json:order"}, ""}, // an object is not a key
		{[]string{"json:missing.path", "json:s"}, "x"},
		{[]string{"payload-hash"}, "FP"},
	}
	for _, c := range cases {
		var srcs []KeySource
		for _, s := range c.sources {
			ks, err := ParseKeySource(s)
			if err != nil {
				t.Fatal(err)
			}
			srcs = append(srcs, ks)
		}
		got, _, err := ExtractKey(m, srcs, "FP")
		if err != nil || got != c.want {
			t.Errorf("%v: got %q, %v; want %q", c.sources, got, err, c.want)
		}
	}
}

func TestParseKeySourceRejectsBadSpellings(t *testing.T) {
	for _, s := range []string{"", "header:", "json:", "json:a..b", "kafka", "header", "uuid"} {
		if _, err := ParseKeySource(s); err == nil {
			t.Errorf("ParseKeySource(%q) accepted", s)
		}
	}
}

func TestEffectiveKeyHashesLongKeys(t *testing.T) {
	if got := EffectiveKey("orders", "abc"); got != "orders:abc" {
		t.Fatalf("got %q", got)
	}
	long := strings.Repeat("x", MaxKeyBytes+1)
	got := EffectiveKey("orders", long)
	if !strings.HasPrefix(got, "orders:sha256:") || len(got) != len("orders:sha256:")+64 {
		t.Fatalf("a key over %d bytes must become sha256:<hex>, got %q", MaxKeyBytes, got)
	}
	if EffectiveKey("orders", strings.Repeat("x", MaxKeyBytes)) != "orders:"+strings.Repeat("x", MaxKeyBytes) {
		t.Fatal("a key of exactly MaxKeyBytes must be kept")
	}
}

// TestFingerprintVectors pins Fingerprint's output: stored records carry it,
// so a change would make every redelivery of an older message a mismatch.
// The first is sha256("12:{\"order\":42}"); each runs twice, the second
// time on a pooled hash state.
func TestFingerprintVectors(t *testing.T) {
	h := consumer.Header{}
	h.Set("Tenant", "acme")
	h.Set("X-Region", "eu")
	m := &consumer.Message{Payload: []byte(`{"order":42}`), Header: h}
	big := make([]byte, 100000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for _, c := range []struct {
		m       *consumer.Message
		headers []string
		want    string
	}{
		{m, nil, "1:0d916809c7c616a0e20c9bcc2da5c0dd4d75dcd5b7ad954e656f80ca2438d696"},
		{m, []string{"tenant", "x-region"}, "1:d5eef24c1ecc2fbb435402bb7a970d3731da747fc694699a31981e954c9f3ce1"},
		{&consumer.Message{}, nil, "1:ba768b331fd86cec803be04e56ab2b3d4c0e98ef4ee4fcd4e72ad7cce61a1d1f"},
		{&consumer.Message{Payload: big, Header: h}, []string{"Tenant"}, "1:3abe068d0052ddda11f2ad01d12a75e2c8fa8461858768a54679e57b8d52a5b1"},
	} {
		for range 2 { // the second time with a pooled buffer
			if got := Fingerprint(c.m, c.headers); got != c.want {
				t.Fatalf("Fingerprint(%d-byte payload, %v) = %s, want %s", len(c.m.Payload), c.headers, got, c.want)
			}
		}
	}
}

func TestFingerprint(t *testing.T) {
	a := &consumer.Message{Payload: []byte("p"), Header: consumer.Header{"Tenant": {"t1"}}}
	b := &consumer.Message{Payload: []byte("p"), Header: consumer.Header{"Tenant": {"t2"}}}
	if Fingerprint(a, nil) != Fingerprint(b, nil) {
		t.Fatal("headers not configured must not change the fingerprint")
	}
	if Fingerprint(a, []string{"tenant"}) == Fingerprint(b, []string{"tenant"}) {
		t.Fatal("a configured header must change the fingerprint")
	}
	if !strings.HasPrefix(Fingerprint(a, nil), "1:") || len(Fingerprint(a, nil)) != 2+64 {
		t.Fatalf("fingerprint %q: want 1:<64 hex>", Fingerprint(a, nil))
	}
	// Length prefixes keep payload and header boundaries apart.
	c := &consumer.Message{Payload: []byte("ab"), Header: consumer.Header{"H": {"c"}}}
	d := &consumer.Message{Payload: []byte("a"), Header: consumer.Header{"H": {"bc"}}}
	if Fingerprint(c, []string{"H"}) == Fingerprint(d, []string{"H"}) {
		t.Fatal("different inputs hashed the same")
	}
}
