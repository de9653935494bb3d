package config

import (
	"errors"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzParse: Parse never panics, returns a config xor an error, and every
// error is a *Error that names a field path or carries a YAML message; a
// config it accepts prints (secrets redacted) and parses again.
func FuzzParse(f *testing.F) {
	f.Add(specExample)
	for _, s := range []string{
		"", "---", "null", "[]", "42", "redis: 1", "handlers: {}", "handlers: [1]",
		"handlers:\n  - name: a\n    lease: 30x\n",
		"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x]}}\n    lease: 1d12h\n",
		"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S}}\n    action: {exec: {command: [x]}}\n    lease: 99999999999d\n",
		"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, password: ${PW}}}\n    action: {exec: {command: [x]}}\n",
		"handlers:\n  - name: a\n    source: {nats: {url: nats://x, stream: S, password: ${PW:-p}}}\n    action: {exec: {command: [x]}}\n",
		"a: &x {b: *x}", "x: !!binary AAAA", "? [a]\n: b", "redis: {url: [1]}", "handlers:\n- name: a\n  concurrency: 1e99",
		"shutdown_timeout: -1s", "http: {addr: null}", "\t", "{", "handlers: [{name: a, name: b}]",
		"handlers:\n  - name: a\n    source: {kafka: {brokers: [b], topic: t, sasl: {mechanism: plain, username: u, password: p}}}\n    action: {forward: {kafka: {topic: o}}}\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		env := func(name string) (string, bool) {
			if name == "PW" {
				return "s3cret", true
			}
			return "", false
		}
		c, err := Parse([]byte(text), env)
		if err != nil {
			if c != nil {
				t.Fatalf("config and error: %v", err)
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %T %q is not a *config.Error", err, err)
			}
			if ce.Path == "" && ce.Line == 0 && !strings.HasPrefix(ce.Msg, "not valid YAML") && ce.Msg != "the file is empty" {
				t.Fatalf("error %q names no field or line and is not a YAML error", err)
			}
			if ce.Msg == "" {
				t.Fatalf("error %+v says nothing", ce)
			}
			return
		}
		if c == nil {
			t.Fatal("no config and no error")
		}
		if len(c.Handlers) == 0 {
			t.Fatal("accepted a config without handlers")
		}
		out, err := c.Print()
		if err != nil {
			t.Fatalf("Print: %v", err)
		}
		if strings.Contains(string(out), "s3cret") {
			t.Fatalf("Print shows a secret:\n%s", out)
		}
		for _, h := range c.Handlers {
			if h.Lease.D() <= 0 || h.Retention.D() <= 0 || h.Concurrency < 1 || h.MaxAttempts < 1 {
				t.Fatalf("accepted handler %q with lease %v retention %v concurrency %d attempts %d",
					h.Name, h.Lease, h.Retention, h.Concurrency, h.MaxAttempts)
			}
		}
	})
}

// FuzzParseDuration: a duration with a day prefix either fails or is exactly
// days×24h plus the rest; it never wraps around int64 into a short or
// negative duration (before the fix, "213504d" read as about 27 minutes).
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{"1d", "7d", "1d12h", "30s", "106751d", "106752d", "213504d", "2000000000d", "106751d23h59m", "0d", "d", "1dd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if m := daysPrefix.FindStringSubmatch(s); m != nil {
			n, perr := strconv.ParseInt(m[1], 10, 64)
			if perr != nil {
				t.Fatalf("%q: accepted a day count %q that is not an integer", s, m[1])
			}
			if d < time.Duration(n)*24*time.Hour || d/(24*time.Hour) < time.Duration(n) {
				t.Fatalf("%q parsed as %v: shorter than its %d days (overflow)", s, d, n)
			}
		}
	})
}

func TestParseDurationOverflow(t *testing.T) {
	for _, s := range []string{"213504d", "106752d", "2000000000d", "106751d23h59m"} {
		if d, err := ParseDuration(s); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error (it does not fit in a time.Duration)", s, d)
		}
	}
	if d, err := ParseDuration("106751d"); err != nil || d != 106751*24*time.Hour {
		t.Errorf("ParseDuration(106751d) = %v, %v", d, err)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                   "redis://127.0.0.1:6379/0",
		"rediss://dedup:s3cret@h:6380/0":             "rediss://dedup:<redacted>@h:6380/0",
		"redis://:s3cret@h:6379":                     "redis://:<redacted>@h:6379",
		"nats://tok3n@h:4222":                        "nats://<redacted>@h:4222",
		"nats://u:s3cret@a:4222,nats://u:s3cret@b:1": "nats://u:<redacted>@a:4222,nats://u:<redacted>@b:1",
		"%zz:s3cret@h":                               "<redacted>",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzRedactURL: a password written in a redis(s):// or nats/tls:// URL
// never survives redaction.
func FuzzRedactURL(f *testing.F) {
	f.Add("redis", "user", "s3cret", "h:1")
	f.Add("nats", "", "p@ss:word", "h")
	f.Fuzz(func(t *testing.T, scheme, user, pw, host string) {
		schemes := []string{"redis", "rediss", "nats", "tls"} // what the config accepts
		mk := func(pw string) string {
			return (&url.URL{Scheme: schemes[len(scheme)%len(schemes)], User: url.UserPassword(user, pw), Host: host}).String()
		}
		if len(pw) < 4 || strings.Contains(mk("<redacted>"), pw) || strings.Contains(mk("<redacted>"), url.QueryEscape(pw)) || strings.Contains(mk("<redacted>"), url.PathEscape(pw)) {
			return // the password's text occurs in what is not the password
		}
		u := mk(pw)
		got := RedactURL(u)
		if strings.Contains(got, pw) || strings.Contains(got, url.QueryEscape(pw)) || strings.Contains(got, url.PathEscape(pw)) {
			t.Fatalf("RedactURL(%q) = %q keeps the password %q", u, got, pw)
		}
	})
}

// A Secret logged through slog's JSON handler (the binary's) is redacted.
func TestSecretLogValue(t *testing.T) {
	var b strings.Builder
	slog.New(slog.NewJSONHandler(&b, nil)).Info("x", "password", Secret("s3cret"))
	if strings.Contains(b.String(), "s3cret") || !strings.Contains(b.String(), "<redacted>") {
		t.Fatalf("slog JSON shows %s", b.String())
	}
}
