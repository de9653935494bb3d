package redisbackend

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// call is one script invocation: its keys (already namespaced), its
// arguments, and after exec its reply.
type call struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// exec runs calls: a single one with EVALSHA, falling back on NOSCRIPT to
// reloading the scripts and EVAL; several in one pipeline of EVALSHA, after
// loading the scripts once, sending the calls that met NOSCRIPT again with
// EVAL (the others ran and must not run twice). It returns the first error,
// wrapped for op; each call's reply is in call.cmd.
func (s *Store) exec(ctx context.Context, op string, calls []*call) error {
	if len(calls) == 1 {
		c := calls[0]
		c.cmd = c.script.EvalSha(ctx, s.client, c.keys, c.args...)
		if isNoScript(c.cmd.Err()) {
			s.loadScripts(ctx, op)
			c.cmd = c.script.Eval(ctx, s.client, c.keys, c.args...)
		}
		return storeErr(op, c.cmd.Err())
	}
	if !s.scriptsLoaded.Load() {
		s.loadScripts(ctx, op)
	}
	s.pipeline(ctx, calls, false)
	var again []*call
	for _, c := range calls {
		if isNoScript(c.cmd.Err()) {
			again = append(again, c)
		}
	}
	if len(again) > 0 {
		s.loadScripts(ctx, op)
		s.pipeline(ctx, again, true)
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil {
			return storeErr(op, err)
		}
	}
	return nil
}

// pipeline sends calls in one pipeline (routed per slot by a ClusterClient),
// with EVALSHA, or with EVAL when eval is set.
func (s *Store) pipeline(ctx context.Context, calls []*call, eval bool) {
	_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range calls {
			if eval {
				c.cmd = c.script.Eval(ctx, p, c.keys, c.args...)
			} else {
				c.cmd = c.script.EvalSha(ctx, p, c.keys, c.args...)
			}
		}
		return nil
	})
	// Errors are read per command by the caller.
}

// loadScripts loads every script (SCRIPT LOAD; on a ClusterClient on every
// node). A failure is only logged: the caller falls back to EVAL, which
// needs no cache, and reports any error of its own.
func (s *Store) loadScripts(ctx context.Context, op string) {
	for _, sc := range []*redis.Script{s.claim, s.complete, s.renew, s.release, s.step, s.forget} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			s.log.Warn("dedup: loading redis scripts failed", "op", op, "err", err)
			return
		}
	}
	s.scriptsLoaded.Store(true)
	s.log.Debug("dedup: redis scripts loaded", "op", op)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
