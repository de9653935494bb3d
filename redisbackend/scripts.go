package redisbackend

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
)

// script is a Lua script with its source and SHA-1 boxed once as command
// arguments, not once a call.
type script struct {
	*redis.Script
	src, sha any
}

func newScript(src string) *script {
	sc := redis.NewScript(src)
	return &script{Script: sc, src: src, sha: sc.Hash()}
}

// call is one script invocation: its keys (already namespaced), its
// arguments, and after send its reply: in cmd, or in strs or str when
// reply says the script's reply is read as strings or as one string.
type call struct {
	script *script
	keys   []string
	args   []any
	reply  replyKind
	// argv, when set, is the whole command with its first three entries
	// left for send (name, script, number of keys), then the keys, then
	// the arguments; newCall makes it so that the arguments are written
	// into it directly. Without it, send builds it from keys and args.
	argv []any

	cmd  *redis.Cmd
	strs *redis.StringSliceCmd
	str  *redis.StringCmd
	// fail is the call's own error after exec or execDurable, wrapped for
	// the op and, on a cluster, naming the node (idempotency.NodeError);
	// nil when its reply is valid.
	fail error
}

// replyKind is how a call's reply is read.
type replyKind uint8

const (
	replyAny     replyKind = iota // a *redis.Cmd: any reply
	replyStrings                  // a *redis.StringSliceCmd: an array, integers as their decimal text
	replyString                   // a *redis.StringCmd: one string
)

// newCall returns a call of script on keys whose reply is read as reply,
// with room for nargs arguments: the caller appends them to c.argv. Keys
// go into the command as pointers into keys, which go-redis writes as the
// strings they point to (and routes by on a cluster), so no key is copied
// to the heap to fit in an interface.
func newCall(script *script, keys []string, reply replyKind, nargs int) *call {
	argv := make([]any, 3+len(keys), 3+len(keys)+nargs)
	argv[2] = len(keys)
	for i := range keys {
		argv[3+i] = &keys[i]
	}
	return &call{script: script, keys: keys, reply: reply, argv: argv}
}

// processor is where a command is sent: a client or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// send sends c on p, as EVALSHA or, when eval is set, EVAL. The bytes on
// the wire are those of go-redis's Script.EvalSha and Script.Eval with
// c.keys and c.args.
func (c *call) send(ctx context.Context, p processor, eval bool) {
	if c.argv == nil {
		c.argv = make([]any, 3+len(c.keys), 3+len(c.keys)+len(c.args))
		c.argv[2] = len(c.keys)
		for i := range c.keys {
			c.argv[3+i] = &c.keys[i]
		}
		c.argv = append(c.argv, c.args...)
	}
	if eval {
		c.argv[0], c.argv[1] = "eval", c.script.src
	} else {
		c.argv[0], c.argv[1] = "evalsha", c.script.sha
	}
	var cmd interface {
		redis.Cmder
		SetFirstKeyPos(int8)
	}
	switch c.reply {
	case replyStrings:
		c.strs = redis.NewStringSliceCmd(ctx, c.argv...)
		cmd = c.strs
	case replyString:
		c.str = redis.NewStringCmd(ctx, c.argv...)
		cmd = c.str
	default:
		c.cmd = redis.NewCmd(ctx, c.argv...)
		cmd = c.cmd
	}
	if len(c.keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = p.Process(ctx, cmd)
}

// err is the error of c's reply.
func (c *call) err() error {
	switch c.reply {
	case replyStrings:
		return c.strs.Err()
	case replyString:
		return c.str.Err()
	}
	return c.cmd.Err()
}

// exec runs calls: a single one with EVALSHA, falling back on NOSCRIPT to
// reloading the scripts and EVAL; several in one pipeline of EVALSHA, after
// loading the scripts once, sending the calls that met NOSCRIPT again with
// EVAL (the others ran and must not run twice). On a cluster the pipeline
// is split per node by the client, and each call's reply or error is its
// own node's. It returns the first error; each call's own error is in its
// fail, and its reply in it (see call).
func (s *Store) exec(ctx context.Context, op string, calls []*call) error {
	return s.execOn(ctx, op, calls, nil)
}

// execOn is exec, with the calls of a pipeline sent on on, a cluster's
// primary, when it is set: onePrimary found that it serves all their
// slots. A call that on answers MOVED or ASK (its slot changed hands
// since) or TRYAGAIN did not run there: it is sent again through the
// ClusterClient, which follows the redirect, and Node reads the layout
// again.
func (s *Store) execOn(ctx context.Context, op string, calls []*call, on *redis.Client) error {
	if len(calls) == 1 {
		c := calls[0]
		c.send(ctx, s.client, false)
		if isNoScript(c.err()) {
			s.loadScripts(ctx, op)
			c.send(ctx, s.client, true)
		}
		c.fail = s.callErr(ctx, op, c, "", c.err())
		return c.fail
	}
	if !s.scriptsLoaded.Load() {
		s.loadScripts(ctx, op)
	}
	addr := "" // the node of the calls' errors, when known
	if on != nil {
		s.pipeline(ctx, on, calls, false)
		addr = on.Options().Addr
		if moved := redirected(calls); len(moved) > 0 {
			s.nodeGen.Add(1) // Node reads the layout again
			s.pipeline(ctx, s.client, moved, false)
			addr = "" // callErr looks each call's node up
		}
	} else {
		s.pipeline(ctx, s.client, calls, false)
	}
	if again := noScript(calls); len(again) > 0 {
		s.loadScripts(ctx, op)
		s.pipeline(ctx, s.client, again, true)
	}
	var first error
	for _, c := range calls {
		c.fail = s.callErr(ctx, op, c, addr, c.err())
		if first == nil {
			first = c.fail
		}
	}
	return first
}

// callErr wraps err, the error of c, for op; nil stays nil. On a cluster
// the error names c's node: addr when the caller knows it, else the primary
// that serves c's slot now. A reply of MOVED or ASK (a slot changed hands)
// makes the client reload the cluster layout; the engine's retry goes to
// the new owner.
func (s *Store) callErr(ctx context.Context, op string, c *call, addr string, err error) error {
	if err == nil {
		return nil
	}
	if s.cluster == nil {
		return storeErr(op, err)
	}
	s.nodeGen.Add(1) // Node reads the layout again
	if redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") {
		s.cluster.ReloadState(ctx)
	}
	if addr == "" && len(c.keys) > 0 {
		addr = s.nodeOf(ctx, c.keys[0])
	}
	return storeErr(op, &idempotency.NodeError{Node: addr, Err: err})
}

// nodeOf is the address of the primary that serves rkey's slot on a
// cluster, as the client's cached layout says; "" on a single node, or when
// the layout cannot be read within ctx's deadline (at most a short one).
func (s *Store) nodeOf(ctx context.Context, rkey string) string {
	if s.cluster == nil {
		return ""
	}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > nodeLookupTimeout || ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), nodeLookupTimeout)
		defer cancel()
	}
	node, err := s.cluster.MasterForKey(ctx, rkey)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// nodeLookupTimeout bounds reading the cluster layout to name a node; the
// client has it cached except right after it starts or a slot moved.
const nodeLookupTimeout = time.Second

// pipeline sends calls in one pipeline on client (routed per slot when it
// is a ClusterClient), with EVALSHA, or with EVAL when eval is set.
func (s *Store) pipeline(ctx context.Context, client redis.Cmdable, calls []*call, eval bool) {
	_, _ = client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range calls {
			c.send(ctx, p, eval)
		}
		return nil
	})
	// Errors are read per command by the caller.
}

// loadScripts loads every script (SCRIPT LOAD; on a ClusterClient on every
// node). A failure is only logged: the caller falls back to EVAL, which
// needs no cache, and reports any error of its own.
func (s *Store) loadScripts(ctx context.Context, op string) {
	for _, sc := range []*script{s.claim, s.complete, s.renew, s.release, s.step, s.forget} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			s.log.Warn("dedup: loading redis scripts failed", "op", op, "err", err)
			return
		}
	}
	s.scriptsLoaded.Store(true)
	s.log.Debug("dedup: redis scripts loaded", "op", op)
}

// noScript returns the calls that failed because their node had not
// loaded the script (a restarted or new node): they are sent again, as
// EVAL, once the scripts are loaded.
func noScript(calls []*call) []*call {
	var again []*call
	for _, c := range calls {
		if isNoScript(c.err()) {
			again = append(again, c)
		}
	}
	return again
}

// redirected returns the calls that a primary refused because it does
// not serve their slot now (MOVED, ASK) or cannot yet (TRYAGAIN, during a
// slot's migration): they did not run.
func redirected(calls []*call) []*call {
	var again []*call
	for _, c := range calls {
		if err := c.err(); err != nil && (redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") || redis.HasErrorPrefix(err, "TRYAGAIN")) {
			again = append(again, c)
		}
	}
	return again
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
