package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// printed is the part of `dedupworker validate --print`'s output that the
// generated configs set.
type printed struct {
	Redis struct {
		Namespace  string `yaml:"namespace"`
		LocalCache struct {
			Entries int `yaml:"entries"`
		} `yaml:"local_cache"`
	} `yaml:"redis"`
	HTTP struct {
		Addr *string `yaml:"addr"`
	} `yaml:"http"`
	Handlers []struct {
		Concurrency int    `yaml:"concurrency"`
		Lease       string `yaml:"lease"`
		Source      struct {
			Kafka *struct {
				Group     string `yaml:"group"`
				Isolation string `yaml:"isolation"`
			} `yaml:"kafka"`
			NATS *struct {
				Consumer string `yaml:"consumer"`
			} `yaml:"nats"`
		} `yaml:"source"`
		Action struct {
			Forward *struct {
				Kafka *struct {
					Topic string `yaml:"topic"`
				} `yaml:"kafka"`
				NATS *struct {
					Subject string `yaml:"subject"`
				} `yaml:"nats"`
			} `yaml:"forward"`
			HTTP *struct {
				URL string `yaml:"url"`
			} `yaml:"http"`
		} `yaml:"action"`
	} `yaml:"handlers"`
}

// The generated configs are checked by the binary's own validate command
// (built from the product module), so a schema change shows here rather
// than as a relay that does not start.
func TestWorkerYAMLIsAValidConfig(t *testing.T) {
	bin, err := buildBinary(t.Context(), "../../..", "./cmd/dedupworker", t.TempDir(), "dedupworker")
	if err != nil {
		t.Fatal(err)
	}
	base := workerSpec{RedisURL: "redis://127.0.0.1:6379/0", Namespace: "rb-1", Concurrency: 64, Lease: 30 * time.Second}
	cases := map[string]func(s *workerSpec){
		"kafka forward": func(s *workerSpec) {
			s.Brokers, s.InTopic, s.Group, s.OutTopic = []string{"127.0.0.1:9092"}, "in", "g", "out"
		},
		"nats forward": func(s *workerSpec) {
			s.NATSURL, s.InStream, s.Consumer, s.OutSubject = "nats://127.0.0.1:4222", "IN", "c", "out.x"
		},
		"nats forward with metrics": func(s *workerSpec) {
			s.NATSURL, s.InStream, s.Consumer, s.OutSubject = "nats://127.0.0.1:4222", "IN", "c", "out.x"
			s.MetricsAddr = "127.0.0.1:19464"
		},
		"kafka forward read_uncommitted": func(s *workerSpec) {
			s.Brokers, s.InTopic, s.Group, s.OutTopic = []string{"127.0.0.1:9092"}, "in", "g", "out"
			s.Isolation = "read_uncommitted"
		},
		"nats forward with a larger local cache": func(s *workerSpec) {
			s.NATSURL, s.InStream, s.Consumer, s.OutSubject = "nats://127.0.0.1:4222", "IN", "c", "out.x"
			s.LocalCacheEntries = 50000
		},
		"kafka http": func(s *workerSpec) {
			s.Brokers, s.InTopic, s.Group, s.HTTPURL = []string{"127.0.0.1:9092"}, "in", "g", "http://127.0.0.1:1/"
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			s := base
			edit(&s)
			y, err := workerYAML(s)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "worker.yaml")
			if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "validate", "-c", path, "--print").Output()
			if err != nil {
				t.Fatalf("dedupworker validate rejects the generated config: %v\n%s\n%s", err, y, stderrOf(err))
			}
			var cfg printed
			if err := yaml.Unmarshal(out, &cfg); err != nil {
				t.Fatalf("validate --print: %v\n%s", err, out)
			}
			if len(cfg.Handlers) != 1 {
				t.Fatalf("%d handlers", len(cfg.Handlers))
			}
			if got := cfg.HTTP.Addr; (got == nil && s.MetricsAddr != "") || (got != nil && *got != s.MetricsAddr) {
				t.Fatalf("http.addr = %v, want %q", got, s.MetricsAddr)
			}
			if want := max(s.LocalCacheEntries, defaultLocalCacheEntries); cfg.Redis.LocalCache.Entries != want {
				t.Fatalf("redis.local_cache.entries = %d, want %d", cfg.Redis.LocalCache.Entries, want)
			}
			h := cfg.Handlers[0]
			if s.Isolation != "" && (h.Source.Kafka == nil || h.Source.Kafka.Isolation != s.Isolation) {
				t.Fatalf("source %+v, want isolation %s", h.Source, s.Isolation)
			}
			if h.Concurrency != 64 || h.Lease != "30s" || cfg.Redis.Namespace != "rb-1" {
				t.Fatalf("concurrency %d, lease %v, namespace %q", h.Concurrency, h.Lease, cfg.Redis.Namespace)
			}
			switch {
			case s.HTTPURL != "":
				if h.Action.HTTP == nil || h.Action.HTTP.URL != s.HTTPURL {
					t.Fatalf("action = %+v, want http to %s", h.Action, s.HTTPURL)
				}
			case s.OutTopic != "":
				if h.Action.Forward == nil || h.Action.Forward.Kafka == nil || h.Action.Forward.Kafka.Topic != "out" || h.Source.Kafka.Group != "g" {
					t.Fatalf("action %+v, source %+v", h.Action, h.Source)
				}
			default:
				if h.Action.Forward == nil || h.Action.Forward.NATS == nil || h.Action.Forward.NATS.Subject != "out.x" || h.Source.NATS.Consumer != "c" {
					t.Fatalf("action %+v, source %+v", h.Action, h.Source)
				}
			}
		})
	}
}

// defaultLocalCacheEntries is the binary's redis.local_cache.entries when
// the config leaves it out.
const defaultLocalCacheEntries = 10000

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	return ""
}

func TestWorkerYAMLRejectsIncompleteSpecs(t *testing.T) {
	ok := workerSpec{RedisURL: "redis://x", Namespace: "n", Concurrency: 1, Lease: time.Second,
		Brokers: []string{"b:9092"}, InTopic: "in", Group: "g", OutTopic: "out"}
	for name, edit := range map[string]func(s *workerSpec){
		"no redis":  func(s *workerSpec) { s.RedisURL = "" },
		"no lease":  func(s *workerSpec) { s.Lease = 0 },
		"no group":  func(s *workerSpec) { s.Group = "" },
		"no source": func(s *workerSpec) { s.Brokers = nil },
		"no action": func(s *workerSpec) { s.OutTopic = "" },
	} {
		s := ok
		edit(&s)
		if y, err := workerYAML(s); err == nil {
			t.Errorf("%s: accepted:\n%s", name, y)
		}
	}
	if _, err := workerYAML(ok); err != nil {
		t.Fatalf("the complete spec: %v", err)
	}
	y, _ := workerYAML(ok)
	if !strings.Contains(y, `topic: "out"`) {
		t.Fatalf("no output topic in\n%s", y)
	}
}
