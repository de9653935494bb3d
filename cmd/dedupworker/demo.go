package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/idemkit/dedupworker/internal/demo"
)

func cmdDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "demo [--messages N] [--redis URL|inprocess]", `  go run ./cmd/dedupworker demo
  dedupworker demo --messages 1000
  dedupworker demo --redis inprocess     # ignore any local Redis
`, stdout, stderr)
	n := fs.Int("messages", 200, "unique keys published on each transport (30% more are duplicates)")
	redisURL := fs.String("redis", "", "Redis `URL`, or inprocess (default: $REDIS_URL, else 127.0.0.1:6379 if it answers, else in-process)")
	verbose := fs.Bool("v", false, "show the worker's info logs")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *n < 10 || fs.NArg() > 0 {
		return usagef("--messages must be at least 10, and demo takes no arguments")
	}
	level := slog.LevelError // the forced failures are the demo's point, not news
	if *verbose {
		level = slog.LevelInfo
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(stdout, "dedupworker demo: duplicates and redeliveries on NATS JetStream and Kafka, each key run once.")
	rep, err := demo.Run(ctx, demo.Options{
		Unique: *n, RedisURL: *redisURL,
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
	}, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout)
	rep.Print(stdout)
	if !rep.OK() {
		return errors.New("handler runs differ from unique keys")
	}
	return nil
}
