package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// records, forget --state and stats work over TLS as the
// least-privilege ACL user of docs/SECURITY.md (secACL), and each of +scan, +pttl and
// +memory|usage is needed: without it the command fails, exit 1, with the
// server's refusal.
func TestSecurityRecordsForgetStatsAsTheACLUser(t *testing.T) {
	t.Parallel()
	const ns, pw = "secrec", "records-Valid-2718"
	ca, raddr, admin, s := secACLStore(t, ns, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reqs := make([]idempotency.ClaimRequest, 6)
	for i := range reqs {
		reqs[i] = idempotency.ClaimRequest{Key: idempotency.EffectiveKey("orders", fmt.Sprintf("order-%d", i)), Fingerprint: "fp", FingerprintVersion: 1, Lease: 30 * time.Second}
	}
	res, err := s.Claim(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	var cs []idempotency.Completion
	for i, r := range res[:4] {
		cs = append(cs, idempotency.Completion{Key: reqs[i].Key, Token: r.Claim.Token, Outcome: idempotency.RecordOutcomeOK, Retention: time.Hour})
	}
	if _, err := s.Complete(ctx, cs); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte(pw), 0o600); err != nil {
		t.Fatal(err)
	}
	config := func(username string) string {
		p := filepath.Join(dir, username+".yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, `
redis: {url: "rediss://%s/0", username: %s, password_file: %s, namespace: %s, tls: {ca_file: %s}}
handlers:
  - name: orders
    source: {nats: {url: "nats://127.0.0.1:4222", stream: S}}
    action: {exec: {command: [/bin/true]}}
`, raddr, username, pwFile, ns, ca.CAFile), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) (int, string) {
		t.Helper()
		code, out, errOut := secRunCLI(t, []string{pw}, args...)
		if code != 0 {
			out += errOut
		}
		return code, out
	}
	cfg := config("dedup")
	code, out := run("records", "-c", cfg, "--handler", "orders", "--state", "completed", "-o", "json")
	var vs []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &vs) != nil || len(vs) != 4 {
		t.Fatalf("records as the ACL user: exit %d\n%s", code, out)
	}
	code, out = run("stats", "-c", cfg, "--rate", "10/s", "-o", "json")
	var st struct {
		Records        int     `json:"records"`
		BytesPerRecord float64 `json:"bytes_per_record"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Records != 6 || st.BytesPerRecord <= 0 {
		t.Fatalf("stats as the ACL user: exit %d\n%s", code, out)
	}
	if code, out := run("forget", "-c", cfg, "--handler", "orders", "--state", "claimed", "--yes"); code != 0 || !strings.Contains(out, "deleted 2,") {
		t.Fatalf("forget --state claimed as the ACL user: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		missing string
		args    []string
	}{
		{"-scan", []string{"records", "-c", "", "--handler", "orders"}},
		{"-pttl", []string{"records", "-c", "", "--handler", "orders"}},
		{"-memory|usage", []string{"stats", "-c", ""}},
	} {
		name := "dedup" + strings.NewReplacer("|", "", "-", "").Replace(c.missing)
		secACLUser(t, admin, name, pw, ns, c.missing)
		c.args[2] = config(name)
		if code, out := run(c.args...); code != 1 || !strings.Contains(out, "NOPERM") {
			t.Errorf("%s without %s: exit %d, want 1 and the refusal:\n%s", c.args[0], c.missing[1:], code, out)
		}
	}
}
