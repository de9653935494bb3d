package redisbackend

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// wireRecord is the JSON of one stored record, as the scripts of
// package lua write it. Pointers tell a missing or null field from a zero.
type wireRecord struct {
	V           *float64        `json:"v"`
	State       *string         `json:"state"`
	FP          *string         `json:"fp"`
	FPV         *float64        `json:"fpv"`
	Token       *string         `json:"token"`
	Fence       *float64        `json:"fence"`
	ClaimedAt   *float64        `json:"claimed_at_ms"`
	LeaseUntil  *float64        `json:"lease_until_ms"`
	CompletedAt *float64        `json:"completed_at_ms"`
	Outcome     *string         `json:"outcome"`
	Attempts    *float64        `json:"attempts"`
	Result      *string         `json:"result"`
	Meta        json.RawMessage `json:"meta"`
	Steps       json.RawMessage `json:"steps"`
	Released    *bool           `json:"released"`
}

// decodeRecord parses a stored value into the record of key, or reports
// false when the value is not a record. The rule is the one valid() applies
// in lua/claim.lua (see package lua's doc), so a value the claim script keeps
// is one this decoder reads, and a value it would recover is absent here. One difference remains, out of reach of encoding/json: Go
// matches field names case-insensitively, so a hand-written value with a
// field such as "State" reads here but is recovered by the next claim.
func decodeRecord(key string, raw []byte) (*idempotency.Record, bool) {
	if rec, ok := decodeFresh(key, raw); ok {
		return rec, true
	}
	return decodeGeneral(key, raw)
}

// decodeGeneral is decodeRecord without the template fast path: the
// encoding/json reading every record goes through when decodeFresh refuses it.
func decodeGeneral(key string, raw []byte) (*idempotency.Record, bool) {
	var w wireRecord
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, false
	}
	if w.State == nil || (*w.State != string(idempotency.StateClaimed) && *w.State != string(idempotency.StateCompleted)) ||
		w.Token == nil || w.FP == nil || w.FPV == nil || w.Fence == nil || w.Attempts == nil ||
		w.ClaimedAt == nil || w.LeaseUntil == nil {
		return nil, false
	}
	rec := &idempotency.Record{
		Key:                key,
		State:              idempotency.State(*w.State),
		Fingerprint:        *w.FP,
		FingerprintVersion: int(*w.FPV),
		Token:              *w.Token,
		Fence:              int64(*w.Fence),
		ClaimedAt:          msTime(*w.ClaimedAt),
		LeaseUntil:         msTime(*w.LeaseUntil),
		Released:           w.Released != nil && *w.Released,
		Attempts:           int(*w.Attempts),
	}
	if w.CompletedAt != nil {
		rec.CompletedAt = msTime(*w.CompletedAt)
	}
	if w.Outcome != nil {
		rec.Outcome = *w.Outcome
	}
	if w.Result != nil && *w.Result != "" {
		b, err := base64.StdEncoding.DecodeString(*w.Result)
		if err != nil {
			return nil, false
		}
		rec.Result = b
	}
	meta, ok := decodeStringMap(w.Meta)
	if !ok {
		return nil, false
	}
	for k, v := range meta {
		if rec.Meta == nil {
			rec.Meta = make(map[string]string, len(meta))
		}
		rec.Meta[k] = *v
	}
	steps, ok := decodeStringMap(w.Steps)
	if !ok {
		return nil, false
	}
	for k, v := range steps {
		b, err := base64.StdEncoding.DecodeString(*v)
		if err != nil {
			return nil, false
		}
		if b == nil {
			b = []byte{}
		}
		if rec.Steps == nil {
			rec.Steps = make(map[string][]byte, len(steps))
		}
		rec.Steps[k] = b
	}
	return rec, true
}

// decodeStringMap reads an optional JSON object of strings. Absent, null and
// an empty array (what Lua's cjson cannot tell from an empty object) are
// empty; a null member is not a string.
func decodeStringMap(raw json.RawMessage) (map[string]*string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, true
	}
	if raw[0] == '[' {
		var a []json.RawMessage
		return nil, json.Unmarshal(raw, &a) == nil && len(a) == 0
	}
	var m map[string]*string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, false
	}
	for _, v := range m {
		if v == nil {
			return nil, false
		}
	}
	return m, true
}

func msTime(ms float64) time.Time { return time.UnixMilli(int64(ms)) }

// decodeFresh reads, without encoding/json, a record exactly as the scripts
// of package lua write it from their templates (claim_json, done_json in
// lib.lua): the reply for nearly every owned claim and every duplicate. It
// accepts only what decodeRecord's general path reads the same way: plain
// printable-ASCII strings without escapes, integers without sign, fraction or
// leading zero up to 2^53 (a fence in microseconds has 16 digits), and a
// result in standard base64.
// Anything else reports false, and the general path decides.
func decodeFresh(key string, raw []byte) (*idempotency.Record, bool) {
	rec := new(idempotency.Record)
	if !decodeFreshInto(rec, key, string(raw)) {
		return nil, false
	}
	return rec, true
}

// decodeFreshInto is decodeFresh reading s into rec, whose fields are
// undefined when it reports false. The record's strings share s's memory:
// the claim reply is read without copying it.
func decodeFreshInto(rec *idempotency.Record, key, s string) bool {
	var state idempotency.State
	switch {
	case strings.HasPrefix(s, `{"v":1,"state":"CLAIMED","fp":`):
		state, s = idempotency.StateClaimed, s[len(`{"v":1,"state":"CLAIMED","fp":`):]
	case strings.HasPrefix(s, `{"v":1,"state":"COMPLETED","fp":`):
		state, s = idempotency.StateCompleted, s[len(`{"v":1,"state":"COMPLETED","fp":`):]
	default:
		return false
	}
	var fp, token string
	var fpv, fence, claimed, lease, attempts int64
	ok := true
	fp, s, ok = plainString(s, ok)
	s, ok = cut(s, `,"fpv":`, ok)
	fpv, s, ok = plainInt(s, ok)
	s, ok = cut(s, `,"token":`, ok)
	token, s, ok = plainString(s, ok)
	s, ok = cut(s, `,"fence":`, ok)
	fence, s, ok = plainInt(s, ok)
	s, ok = cut(s, `,"claimed_at_ms":`, ok)
	claimed, s, ok = plainInt(s, ok)
	s, ok = cut(s, `,"lease_until_ms":`, ok)
	lease, s, ok = plainInt(s, ok)
	s, ok = cut(s, `,"attempts":`, ok)
	attempts, s, ok = plainInt(s, ok)
	*rec = idempotency.Record{
		Key:                key,
		State:              state,
		Fingerprint:        fp,
		FingerprintVersion: int(fpv),
		Token:              token,
		Fence:              fence,
		ClaimedAt:          time.UnixMilli(claimed),
		LeaseUntil:         time.UnixMilli(lease),
		Attempts:           int(attempts),
	}
	if state == idempotency.StateCompleted {
		var completed int64
		var result string
		s, ok = cut(s, `,"completed_at_ms":`, ok)
		completed, s, ok = plainInt(s, ok)
		s, ok = cut(s, `,"outcome":`, ok)
		rec.Outcome, s, ok = plainString(s, ok)
		s, ok = cut(s, `,"result":`, ok)
		result, s, ok = plainString(s, ok)
		rec.CompletedAt = time.UnixMilli(completed)
		if ok && result != "" {
			b, err := base64.StdEncoding.DecodeString(result)
			if err != nil {
				return false
			}
			rec.Result = b
		}
	}
	return ok && s == "}"
}

// cut removes prefix from s, or reports false.
func cut(s, prefix string, ok bool) (string, bool) {
	if !ok || len(s) < len(prefix) || s[:len(prefix)] != prefix {
		return s, false
	}
	return s[len(prefix):], true
}

// plainString reads a JSON string of printable ASCII other than '"' and
// '\\' from the start of s.
func plainString(s string, ok bool) (string, string, bool) {
	if !ok || len(s) < 2 || s[0] != '"' {
		return "", s, false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return s[1:i], s[i+1:], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", s, false
		}
	}
	return "", s, false
}

// maxExact is 2^53: every integer up to it is exact in a float64, which is
// how the general path (encoding/json into float64) reads numbers.
const maxExact = 1 << 53

// plainInt reads a non-negative JSON integer up to maxExact from the start
// of s, so that it reads the same as the general path.
func plainInt(s string, ok bool) (int64, string, bool) {
	if !ok {
		return 0, s, false
	}
	i := 0
	var n int64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		if i == 16 { // 17 digits are above maxExact; stop before n overflows
			return 0, s, false
		}
		n = n*10 + int64(s[i]-'0')
		i++
	}
	if i == 0 || n > maxExact || (s[0] == '0' && i > 1) {
		return 0, s, false
	}
	if i < len(s) && (s[i] == '.' || s[i] == 'e' || s[i] == 'E') {
		return 0, s, false
	}
	return n, s[i:], true
}
