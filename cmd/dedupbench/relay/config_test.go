package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemkit/dedupworker/internal/config"
)

// The generated configs are checked by the binary's own parser, so a
// schema change shows here rather than as a relay that does not start.
func TestWorkerYAMLIsAValidConfig(t *testing.T) {
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
			cfg, err := config.Parse([]byte(y), func(string) (string, bool) { return "", false })
			if err != nil {
				t.Fatalf("config.Parse rejects the generated config: %v\n%s", err, y)
			}
			if len(cfg.Handlers) != 1 {
				t.Fatalf("%d handlers", len(cfg.Handlers))
			}
			if cfg.HTTP.Addr == nil || *cfg.HTTP.Addr != s.MetricsAddr {
				t.Fatalf("http.addr = %v, want %q", cfg.HTTP.Addr, s.MetricsAddr)
			}
			if want := max(s.LocalCacheEntries, config.DefaultLocalCacheEntries); cfg.Redis.LocalCache.Size() != want {
				t.Fatalf("redis.local_cache entries = %d, want %d", cfg.Redis.LocalCache.Size(), want)
			}
			h := cfg.Handlers[0]
			if s.Isolation != "" && (h.Source.Kafka == nil || h.Source.Kafka.Isolation != s.Isolation) {
				t.Fatalf("source %+v, want isolation %s", h.Source, s.Isolation)
			}
			if h.Concurrency != 64 || h.Lease.D() != 30*time.Second || cfg.Redis.Namespace != "rb-1" {
				t.Fatalf("concurrency %d, lease %v, namespace %q", h.Concurrency, h.Lease.D(), cfg.Redis.Namespace)
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
