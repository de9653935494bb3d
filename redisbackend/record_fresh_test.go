package redisbackend

import (
	"reflect"
	"testing"
)

// TestDecodeFreshAgreesWithJSON checks that the fast path reads a template
// claim exactly as encoding/json does, and declines everything it cannot
// read the same way.
func TestDecodeFreshAgreesWithJSON(t *testing.T) {
	for _, raw := range []string{
		`{"v":1,"state":"CLAIMED","fp":"1:abc","fpv":1,"token":"00ff","fence":1,"claimed_at_ms":1700000000000,"lease_until_ms":1700000030000,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"","fpv":0,"token":"t","fence":12,"claimed_at_ms":0,"lease_until_ms":5,"attempts":3}`,
		`{"v":1,"state":"CLAIMED","fp":"1:a\"b","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"1:a\\u00e9","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"é","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":2.5,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":01,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1e3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":-1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1,"released":true}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1234567890123456}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1796120256118329,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":9007199254740992,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":9007199254740993,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":12345678901234567,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":99999999999999999999,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"COMPLETED","fp":"x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"x","fpv":1,"token":"t","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"ok","result":""}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"dead_lettered","result":"eyJzIjoxfQ=="}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"ok","result":"eyJzIjoxfQ="}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"ok","result":"a\/b="}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"ok"}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3,"outcome":"ok","result":"","meta":{"a":"b"}}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"t","fence":3,"claimed_at_ms":1,"lease_until_ms":2,"attempts":2,"completed_at_ms":3.5,"outcome":"ok","result":""}`,
	} {
		want, wantOK := decodeGeneral("k", []byte(raw))
		got, ok := decodeFresh("k", []byte(raw))
		if !ok {
			continue // declined: the general path decides
		}
		if !wantOK || !reflect.DeepEqual(any(got), want) {
			t.Errorf("%s:\nfast    %+v\ngeneral %+v (ok %v)", raw, got, want, wantOK)
		}
	}
	// The template claim and completion must take the fast path, with a
	// fence in microseconds (16 digits) too.
	for _, raw := range []string{
		`{"v":1,"state":"CLAIMED","fp":"1:ab","fpv":1,"token":"cd","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1}`,
		`{"v":1,"state":"CLAIMED","fp":"1:ab","fpv":1,"token":"cd","fence":1796120256118329,"claimed_at_ms":1796120256118,"lease_until_ms":1796120286118,"attempts":1}`,
		`{"v":1,"state":"COMPLETED","fp":"1:ab","fpv":1,"token":"cd","fence":1,"claimed_at_ms":1,"lease_until_ms":2,"attempts":1,"completed_at_ms":3,"outcome":"ok","result":"eyJzIjoxfQ=="}`,
	} {
		if _, ok := decodeFresh("k", []byte(raw)); !ok {
			t.Errorf("the template record was declined: %s", raw)
		}
	}
}

// BenchmarkDecodeClaim compares reading a template claim (the claim
// script's reply for a new key) by the fast path and by encoding/json.
func BenchmarkDecodeClaim(b *testing.B) {
	raw := []byte(`{"v":1,"state":"CLAIMED","fp":"1:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8","fpv":1,"token":"9f86d081884c7d659a2feaa0c55ad015","fence":1,"claimed_at_ms":1764470000000,"lease_until_ms":1764470030000,"attempts":1}`)
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeRecord("k", raw)
		}
	})
	spaced := append(append([]byte(nil), raw...), ' ')
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			decodeRecord("k", spaced)
		}
	})
}
