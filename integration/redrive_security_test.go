package integration_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/internal/testenv"
)

// redrive needs no Redis command beyond the least-privilege ACL of docs/SECURITY.md:
// as that user, over TLS with password_file, it forgets a dead_lettered
// record and republishes its dead letter, and the user's password shows
// nowhere in its output.
func TestSecurityRedriveAsTheACLUser(t *testing.T) {
	t.Parallel()
	const ns, pw = "secrd", "redrive-Valid-3141"
	ca, raddr, _, s := secACLStore(t, ns, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ekey := idempotency.EffectiveKey("rd", "k1")
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: ekey, Fingerprint: "fp", FingerprintVersion: 1, Lease: time.Minute}})
	if err != nil || res[0].Claim == nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := s.Complete(ctx, []idempotency.Completion{{Key: ekey, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeDeadLettered, Retention: time.Hour}}); err != nil {
		t.Fatal(err)
	}

	h := newNATSHarness(t, testenv.NATS(t))
	dlq := h.subj + "-dlq"
	h.createStream(t, h.stream+"_DLQ", dlq)
	hdr := nats.Header{"Idempotency-Key": {"k1"}}
	for k, v := range (consumer.DeadLetter{Reason: "max_attempts", Key: "k1", Handler: "rd", Attempts: 2}).Headers(consumer.Origin{Transport: "nats", Topic: h.stream, Subject: h.subj + ".in", Offset: 1}) {
		hdr[k] = v
	}
	if _, err := h.js.PublishMsg(ctx, &nats.Msg{Subject: dlq, Data: []byte("p"), Header: hdr}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte(pw), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `
redis: {url: "rediss://%s/0", username: dedup, password_file: %s, namespace: %s, tls: {ca_file: %s}}
http: {addr: ""}
handlers:
  - name: rd
    source: {nats: {url: %q, stream: %s, subject: %s.in}}
    action: {exec: {command: [/bin/true]}}
    dead_letter: {nats: {subject: %s}}
`, raddr, pwFile, ns, ca.CAFile, h.url, h.stream, h.subj, dlq), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := secRunCLI(t, []string{pw}, "redrive", "-c", cfg, "--handler", "rd", "-o", "json")
	if code != 0 {
		t.Fatalf("redrive as the ACL user: exit %d\n%s%s", code, out, errOut)
	}
	var rep struct {
		Republished int `json:"republished"`
		Failed      int `json:"failed"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Republished != 1 || rep.Failed != 0 {
		t.Fatalf("redrive as the ACL user: %v\n%s", err, out)
	}
	if rec, err := s.Get(ctx, ekey); err != nil || rec != nil {
		t.Errorf("the record after redrive: %+v, %v; want it forgotten", rec, err)
	}
}
