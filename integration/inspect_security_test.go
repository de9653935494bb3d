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
	"github.com/idemkit/dedupworker/internal/testenv"
)

// inspect and forget -c FILE connect as run does: to Redis over TLS with
// the CA of redis.tls, as the least-privilege ACL user of redis.username
// and password_file (an ACL without INFO: the URL's node is then taken as
// standalone). With another CA they fail, exit 1, naming redis.url; no
// output shows the password.
func TestSecurityInspectForgetTLSAndACL(t *testing.T) {
	t.Parallel()
	ca, otherCA := testenv.NewTestCA(t), testenv.NewTestCA(t)
	raddr, admin := secTLSRedis(t, ca)
	const ns, pw = "secinsp", "inspect-Valid-1618"
	secACLUser(t, admin, "dedup", pw, ns)

	s := secUserStore(t, raddr, ca, ns, pw)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := idempotency.EffectiveKey("orders", "order-7")
	res, err := s.Claim(ctx, []idempotency.ClaimRequest{{Key: key, Fingerprint: "fp", FingerprintVersion: 1, Lease: 30 * time.Second}})
	if err != nil || res[0].Claim == nil {
		t.Fatalf("claim: %+v %v", res, err)
	}
	if ok, err := s.Complete(ctx, []idempotency.Completion{{Key: key, Token: res[0].Claim.Token, Outcome: idempotency.RecordOutcomeOK, Result: []byte("done"), Retention: time.Hour}}); err != nil || !ok[0] {
		t.Fatalf("complete: %v %v", ok, err)
	}

	dir := t.TempDir()
	pwFile := filepath.Join(dir, "redis-password")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	write := func(name, caFile string) string {
		p := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(p, fmt.Appendf(nil, `
redis: {url: "rediss://%s/0", username: dedup, password_file: %s, namespace: %s, tls: {ca_file: %s}}
handlers:
  - name: orders
    source: {nats: {url: "nats://127.0.0.1:4222", stream: S}}
    action: {exec: {command: [/bin/true]}}
`, raddr, pwFile, ns, caFile), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	run := func(args ...string) (int, string) {
		t.Helper()
		code, out, errOut := secRunCLI(t, []string{pw}, args...)
		return code, out + errOut
	}
	cfg := write("good", ca.CAFile)
	code, out := run("inspect", "-c", cfg, "--handler", "orders", "order-7", "-o", "json")
	var v struct {
		State       string `json:"state"`
		ResultBytes int    `json:"result_bytes"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.State != "COMPLETED" || v.ResultBytes != len("done") {
		t.Fatalf("inspect over TLS as the ACL user: exit %d\n%s", code, out)
	}
	if code, out := run("forget", "-c", cfg, "--handler", "orders", "order-7", "--yes"); code != 0 || !strings.Contains(out, "deleted "+key) {
		t.Fatalf("forget over TLS as the ACL user: exit %d\n%s", code, out)
	}
	if n, err := admin.Exists(ctx, ns+":"+key).Result(); err != nil || n != 0 {
		t.Fatalf("after forget: EXISTS = %d, %v", n, err)
	}
	otherCfg := write("other-ca", otherCA.CAFile)
	for cmd, extra := range map[string][]string{"inspect": nil, "forget": {"--yes"}} {
		code, out := run(append([]string{cmd, "-c", otherCfg, "--handler", "orders", "order-7"}, extra...)...)
		if code != 1 || !strings.Contains(out, "redis.url") || !strings.Contains(out, "certificate") {
			t.Errorf("%s with another CA: exit %d, want 1 naming redis.url and the certificate:\n%s", cmd, code, out)
		}
	}
}
