package redisbackend

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// FuzzScriptReplies feeds claimReply and completeReply replies that no
// script wrote: whatever they accept, every key has one outcome and the
// claim's records are exactly those its codes announce, so that reading
// them (claimVals.next) stays inside the reply.
func FuzzScriptReplies(f *testing.F) {
	f.Add("nDI", "rec1\x00rec2\x001764619000000000", 3)
	f.Add("nn", "1764619000000000", 2)
	f.Add("120", "", 3)
	f.Add("1201764619000000", "", 3)
	f.Fuzz(func(t *testing.T, first, rest string, n int) {
		if n < 0 || n > 1000 {
			return
		}
		vals := []string{first}
		if rest != "" {
			vals = append(vals, strings.Split(rest, "\x00")...)
		}
		if v, err := claimReply(redis.NewStringSliceResult(vals, nil), n); err == nil {
			rec := 0
			for j := 0; j < n; j++ {
				before := rec
				o, js := v.next(j, &rec)
				switch {
				case o == "":
					t.Fatalf("key %d of %q: no outcome", j, vals)
				case v.codes[j] == 'n' && (o != "NEW" || js != "" || rec != before):
					t.Fatalf("key %d of %q: code n read as %q %q, taking a record", j, vals, o, js)
				case v.codes[j] != 'n' && (rec != before+1 || js != v.recs[before]):
					t.Fatalf("key %d of %q: code %c did not take record %d", j, vals, v.codes[j], before)
				}
			}
			if rec != len(v.recs) || v.nowUs <= 0 {
				t.Fatalf("%q: %d records read of %d, time %d", vals, rec, len(v.recs), v.nowUs)
			}
		}
		if codes, at, err := completeReply(redis.NewStringResult(first, nil), n); err == nil {
			if len(codes) != n || strings.Trim(codes, "012") != "" || at < 0 {
				t.Fatalf("completeReply(%q, %d) = %q, %d", first, n, codes, at)
			}
		}
	})
}
