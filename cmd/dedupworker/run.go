package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemkit/dedupworker/internal/app"
	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/memlimit"
)

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", `run -c FILE

Before it consumes, run checks that every handler's dead letters are stored:
a dead-letter subject must be captured by a JetStream stream (unless
dead_letter.nats.core: true), a dead-letter topic must exist ('dedupworker
setup -c FILE' creates both); else it exits 2 naming the field.`, `  dedupworker run -c /etc/dedupworker/config.yaml
  REDIS_URL=redis://cache:6379/0 dedupworker run -c config.yaml   # with ${REDIS_URL} in the file
`, stdout, stderr)
	file := fs.String("c", "", "the config `file` (required)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *file == "" || fs.NArg() > 0 {
		fs.Usage()
		return usagef("-c FILE is required and takes no arguments")
	}
	cfg, err := loadConfig(*file)
	if err != nil {
		return err
	}
	log := newLogger(stderr, cfg.Log)
	app.RedisLogs(log) // go-redis's own lines, in the worker's format
	memlimit.Apply(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tracer, stopTracing, err := app.TracerFromEnv(ctx, versionString())
	if err != nil {
		return fmt.Errorf("tracing (OTEL_* environment): %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	if tracer != nil {
		log.Info("tracing on: exporting spans over OTLP/HTTP as OTEL_* says")
	}
	// Before a message is consumed: a dead letter is acked, so it must be
	// stored somewhere.
	if err := checkDeadLetters(ctx, cfg); err != nil {
		return err
	}
	a, err := app.Build(ctx, cfg, log, app.Options{Tracer: tracer})
	if err != nil {
		return err
	}
	log.Info("dedupworker running", "handlers", len(cfg.Handlers), "version", versionString())
	if err := a.Run(ctx); err != nil {
		return err
	}
	log.Info("dedupworker stopped cleanly")
	return nil
}

// loadConfig loads a config file; every problem with it is a usage error
// (exit 2).
func loadConfig(path string) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		var ce *config.Error
		if errors.As(err, &ce) {
			return nil, usageError{err}
		}
		return nil, usageError{err} // unreadable file: also the caller's to fix
	}
	return cfg, nil
}

// newLogger is the worker's logger: JSON or text at the configured level,
// with durations written as text ("30s", "1m30s") rather than slog's
// default nanoseconds, in either format.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationText}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// durationText is a slog ReplaceAttr that renders a time.Duration, or a
// config.Duration, as its String form. Groups' attributes reach it one by
// one, so nested durations are rendered too.
func durationText(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindAny:
		switch d := a.Value.Any().(type) {
		case config.Duration:
			a.Value = slog.StringValue(d.String())
		case *config.Duration:
			if d != nil {
				a.Value = slog.StringValue(d.String())
			}
		}
	}
	return a
}
