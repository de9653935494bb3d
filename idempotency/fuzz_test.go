package idempotency_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
)

// jsonAt walks a decoded JSON value along path the way a reader of the
// JSONKey documentation would: objects only, exact member names.
func jsonAt(payload []byte, path []string) (any, bool) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	for _, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = obj[p]; !ok {
			return nil, false
		}
	}
	return v, true
}

// FuzzExtractKey: over arbitrary payloads, header values and paths, key
// extraction with header: and json: sources never panics and never errors
// (a non-JSON payload is a missing key); a key found by the
// header source is that header's value; a key found by the json source is a
// non-empty string or number at exactly that path of the payload; and the
// fingerprint is stable and versioned.
func FuzzExtractKey(f *testing.F) {
	f.Add([]byte(`{"id":"order-1"}`), "id", "Idempotency-Key", "")
	f.Add([]byte(`{"order":{"id":42}}`), "order.id", "X-Key", "")
	f.Add([]byte(`{"order":{"id":1.5e300}}`), "order.id", "X-Key", "hdr")
	f.Add([]byte(`{"a":{"b":null}}`), "a.b", "H", "")
	f.Add([]byte(`{"a":[1,2]}`), "a", "H", "")
	f.Add([]byte(`{"a":true}`), "a", "H", "")
	f.Add([]byte(`{"a":""}`), "a", "H", "")
	f.Add([]byte(`not json`), "id", "H", "")
	f.Add([]byte(`{"id":"x"} trailing`), "id", "H", "")
	f.Add([]byte(`{"id":"\ud800"}`), "id", "H", "\xff\x00bin")
	f.Add([]byte("\xff\xfe{"), "id", "Idempotency-Key", "\x00")
	f.Add([]byte(`{"":{"":"e"}}`), ".", "H", "")
	f.Add([]byte(`{"id":"a","id":"b"}`), "id", "H", "")
	f.Add([]byte(`[{"id":1}]`), "id", "H", "")
	f.Add([]byte(strings.Repeat(`{"a":`, 2000)+`1`+strings.Repeat(`}`, 2000)), "a.a.a", "H", "")
	f.Fuzz(func(t *testing.T, payload []byte, path, header, hval string) {
		m := &consumer.Message{Payload: payload, Header: consumer.Header{}}
		if header != "" && hval != "" {
			m.Header.Set(header, hval)
		}
		fp := idempotency.Fingerprint(m, []string{header})
		if !strings.HasPrefix(fp, "1:") || len(fp) != 2+64 || fp != idempotency.Fingerprint(m, []string{header}) {
			t.Fatalf("fingerprint %q: want a stable 1:<64 hex>", fp)
		}
		var sources []idempotency.KeySource
		var hsrc, jsrc idempotency.KeySource
		if header != "" {
			var err error
			if hsrc, err = idempotency.ParseKeySource("header:" + header); err != nil {
				t.Fatalf("header:%q refused: %v", header, err)
			}
			sources = append(sources, hsrc)
		}
		jsrc, jerr := idempotency.ParseKeySource("json:" + path)
		if jerr == nil {
			sources = append(sources, jsrc)
		} else if path != "" && !strings.Contains("."+path+".", "..") {
			t.Fatalf("json:%q refused: %v", path, jerr)
		}
		key, from, err := idempotency.ExtractKey(m, sources, fp)
		if err != nil {
			t.Fatalf("ExtractKey: %v (a bad payload is a missing key, not an error)", err)
		}
		if key == "" {
			if from.String() != "" {
				t.Fatalf("no key but a source %q", from)
			}
			// No key: then the header is absent and the path holds no
			// non-empty string or number.
			if header != "" && m.Header.Get(header) != "" {
				t.Fatalf("header %q=%q present but no key", header, m.Header.Get(header))
			}
			if jerr == nil {
				if v, ok := jsonAt(payload, strings.Split(path, ".")); ok {
					switch x := v.(type) {
					case string:
						if x != "" {
							t.Fatalf("json:%s holds %q but no key", path, x)
						}
					case json.Number:
						t.Fatalf("json:%s holds %s but no key", path, x)
					}
				}
			}
			return
		}
		switch from.String() {
		case hsrc.String():
			if header == "" || key != m.Header.Get(header) {
				t.Fatalf("key %q from %s but header holds %q", key, from, m.Header.Get(header))
			}
		case jsrc.String():
			if header != "" && m.Header.Get(header) != "" {
				t.Fatalf("json source won over a present header")
			}
			v, ok := jsonAt(payload, strings.Split(path, "."))
			if !ok {
				t.Fatalf("key %q from %s but nothing at that path of %q", key, from, payload)
			}
			switch x := v.(type) {
			case string:
				if x != key {
					t.Fatalf("key %q but the string at %s is %q", key, path, x)
				}
			case json.Number:
				if x.String() != key {
					t.Fatalf("key %q but the number at %s is %s", key, path, x)
				}
			default:
				t.Fatalf("key %q from %s, but the value there is a %T", key, path, v)
			}
		default:
			t.Fatalf("key %q from unknown source %q", key, from)
		}
		// Any key, however long or not UTF-8, maps to a bounded effective key.
		ek := idempotency.EffectiveKey("h", key)
		if len(key) > idempotency.MaxKeyBytes {
			if len(ek) != len("h:sha256:")+64 || !utf8.ValidString(ek) {
				t.Fatalf("long key's effective key %q", ek)
			}
		} else if ek != "h:"+key {
			t.Fatalf("EffectiveKey(h, %q) = %q", key, ek)
		}
	})
}
