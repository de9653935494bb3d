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

func cmdRun(args []string, _, stderr io.Writer) error {
	fs := newFlagSet("run", "run -c FILE", `  dedupworker run -c /etc/dedupworker/config.yaml
  REDIS_URL=redis://cache:6379/0 dedupworker run -c config.yaml   # with ${REDIS_URL} in the file
`, stderr)
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

func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
