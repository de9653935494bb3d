package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"

	"github.com/idemkit/dedupworker/consumer"
)

// KeyFunc extracts an idempotency key in Go. An empty key with a nil error
// means the message has none.
type KeyFunc func(m *consumer.Message) (string, error)

// KeySource is one place an idempotency key may come from. Build
// one with HeaderKey, NatsMsgID, KafkaKey, JSONKey, PayloadHash, KeyFrom or
// ParseKeySource.
type KeySource struct {
	kind string // header, nats-msg-id, kafka-key, json, payload-hash, func
	arg  string
	path []string
	fn   KeyFunc
}

// HeaderKey takes the key from the named header.
func HeaderKey(name string) KeySource { return KeySource{kind: "header", arg: name} }

// NatsMsgID takes the key from the Nats-Msg-Id header.
func NatsMsgID() KeySource { return KeySource{kind: "nats-msg-id", arg: "Nats-Msg-Id"} }

// KafkaKey takes the Kafka message key. A Kafka key is usually an entity id,
// not a message id: use it only when producers set one key per message.
func KafkaKey() KeySource { return KeySource{kind: "kafka-key"} }

// JSONKey takes a string or number field of a JSON payload, at a dot path
// such as "order.id".
func JSONKey(path string) KeySource {
	return KeySource{kind: "json", arg: path, path: strings.Split(path, ".")}
}

// PayloadHash makes the key the fingerprint of the content: identical
// payloads (and configured headers) are duplicates.
func PayloadHash() KeySource { return KeySource{kind: "payload-hash"} }

// KeyFrom takes the key from a Go function; name appears in logs.
func KeyFrom(name string, f KeyFunc) KeySource { return KeySource{kind: "func", arg: name, fn: f} }

// DefaultKeySources is header:Idempotency-Key alone.
func DefaultKeySources() []KeySource { return []KeySource{HeaderKey("Idempotency-Key")} }

// ParseKeySource parses the configuration spelling of a key source:
// "header:<Name>", "nats-msg-id", "kafka-key", "json:<dot.path>" or
// "payload-hash".
func ParseKeySource(s string) (KeySource, error) {
	kind, arg, hasArg := strings.Cut(s, ":")
	switch {
	case kind == "header" && hasArg && arg != "":
		return HeaderKey(arg), nil
	case kind == "json" && hasArg && arg != "" && !strings.Contains("."+arg+".", ".."):
		return JSONKey(arg), nil
	case s == "nats-msg-id":
		return NatsMsgID(), nil
	case s == "kafka-key":
		return KafkaKey(), nil
	case s == "payload-hash":
		return PayloadHash(), nil
	}
	return KeySource{}, fmt.Errorf("key source %q: want header:<Name>, nats-msg-id, kafka-key, json:<dot.path> or payload-hash", s)
}

// String returns the configuration spelling.
func (k KeySource) String() string {
	switch k.kind {
	case "header", "json", "func":
		return k.kind + ":" + k.arg
	}
	return k.kind
}

var errNotJSON = errors.New("payload is not JSON")

// extract returns the key from this source, or "" when it has none.
func (k KeySource) extract(m *consumer.Message, fp string) (string, error) {
	switch k.kind {
	case "header", "nats-msg-id":
		return m.Header.Get(k.arg), nil
	case "kafka-key":
		return string(m.Key), nil
	case "payload-hash":
		return fp, nil
	case "func":
		return k.fn(m)
	case "json":
		return jsonField(m.Payload, k.path)
	}
	return "", errors.New("dedup: zero KeySource: build one with HeaderKey, JSONKey or KeyFrom")
}

func jsonField(payload []byte, path []string) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", errNotJSON
	}
	for _, p := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return "", nil
		}
		if v, ok = obj[p]; !ok {
			return "", nil
		}
	}
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	}
	return "", nil
}

// ExtractKey tries sources in order and returns the first non-empty key and
// the source it came from. ok is false when no source yields a key; a payload
// that is not JSON for a json: source counts as no key. fp is the
// message's fingerprint, used by PayloadHash.
func ExtractKey(m *consumer.Message, sources []KeySource, fp string) (key string, from KeySource, err error) {
	for _, s := range sources {
		k, err := s.extract(m, fp)
		if err != nil && !errors.Is(err, errNotJSON) {
			return "", s, fmt.Errorf("dedup: key source %s: %w", s, err)
		}
		if k != "" {
			return k, s, nil
		}
	}
	return "", KeySource{}, nil
}

// MaxKeyBytes is the longest key kept verbatim in an effective key; longer
// keys are replaced by "sha256:<hex>" of themselves.
const MaxKeyBytes = 200

// EffectiveKey returns "<scope>:<key>", the store key of a key in a scope.
// The store adds its namespace in front. Keys over MaxKeyBytes bytes are
// replaced by their SHA-256 so a hostile key cannot bloat Redis.
func EffectiveKey(scope, key string) string {
	if len(key) > MaxKeyBytes {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return scope + ":" + key
}

// FingerprintVersion is the version of Fingerprint's algorithm, stored with
// every record.
const FingerprintVersion = 1

// Fingerprint returns "1:<hex sha256>" over the payload and then each named
// header's name and values, in name order. Every part is
// length-prefixed, so no two different inputs hash the same text.
//
// The hash state and its scratch buffer are pooled: a hash allocated per
// message, and each part converted for it, were five allocations a message.
func Fingerprint(m *consumer.Message, headers []string) string {
	st := fpStates.Get().(*fpState)
	st.h.Reset()
	st.part(m.Payload, "")
	for _, name := range headers { // sorted by the option
		st.part(nil, strings.ToLower(name))
		st.part(nil, m.Header.Get(name))
	}
	st.sum = st.h.Sum(st.sum[:0])
	var out [24 + 2*sha256.Size]byte
	b := strconv.AppendInt(out[:0], FingerprintVersion, 10)
	b = append(b, ':')
	fp := string(hex.AppendEncode(b, st.sum))
	if cap(st.buf) <= fpBufMax {
		fpStates.Put(st)
	}
	return fp
}

// fpState is Fingerprint's pooled hash and scratch space.
type fpState struct {
	h   hash.Hash
	buf []byte // a part's "<len>:" prefix, and a string part itself
	sum []byte
}

// fpBufMax bounds the scratch buffers the pool keeps.
const fpBufMax = 64 << 10

var fpStates = sync.Pool{New: func() any { return &fpState{h: sha256.New(), buf: make([]byte, 0, 256)} }}

// part hashes "<len>:<part>" for the bytes b, or for the string s when b is
// nil (copied into the scratch buffer: a string converted to bytes for the
// hash's Write would be copied to the heap).
func (st *fpState) part(b []byte, s string) {
	n := len(b)
	if b == nil {
		n = len(s)
	}
	st.buf = strconv.AppendInt(st.buf[:0], int64(n), 10)
	st.buf = append(st.buf, ':')
	if b == nil {
		st.buf = append(st.buf, s...)
		st.h.Write(st.buf)
		return
	}
	st.h.Write(st.buf)
	st.h.Write(b)
}
