package redisbackend

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// wireRecord is the JSON of one stored record (SPEC §4.1), as the scripts of
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
// is one this decoder reads, and a value it would recover is absent here
// (SPEC §4.8). One difference remains, out of reach of encoding/json: Go
// matches field names case-insensitively, so a hand-written value with a
// field such as "State" reads here but is recovered by the next claim.
func decodeRecord(key string, raw []byte) (*idempotency.Record, bool) {
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
