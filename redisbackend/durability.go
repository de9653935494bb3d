package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
)

// OpReplicaWait is the op under which the store reports the time of each
// WAIT to consumer.HookStoreCall (dedup_store_duration_seconds{op="wait"}):
// the server's time between the script's end and WAIT's
// answer. A wait for a key in flight elsewhere (Store.Wait, up to a lease)
// is op "inflight".
const OpReplicaWait = "wait"

// ErrReplicaShortfall is the cause of a write that fewer replicas than
// Options.Durability.Replicas acknowledged within its timeout. The error
// returned also wraps idempotency.ErrStoreUnavailable: the engine fails
// closed and retries. WAIT undoes nothing: the write is on the primary,
// and may be on some replicas. So a Claim that falls short gives its
// claims back (a release that also takes back the attempt the claim
// counted, without WAIT), and the engine's retry finds the keys free at
// once, their attempt counts as before; a Complete that falls short
// stays stored, and its retry by the same token reports true and waits
// again. On a cluster the WAIT is per node, and only the keys of a node
// that fell short fail (an idempotency.BatchError).
var ErrReplicaShortfall = errors.New("dedup: too few replicas acknowledged the write")

// undoTimeout bounds the release of claims that fell short of replicas.
const undoTimeout = 2 * time.Second

// write runs calls whose result the engine acts on (claims, completions,
// releases, steps): with Options.Durability, through execDurable, which
// pipelines each node's calls on its own client already; else as execOn
// does, on the primary on when it is set (see onePrimary).
func (s *Store) write(ctx context.Context, op string, calls []*call, on *redis.Client) error {
	if s.replicas == 0 {
		return s.execOn(ctx, op, calls, on)
	}
	return s.execDurable(ctx, op, calls)
}

// nodeBatch is the calls that go to one node in one pipeline, followed by
// TIME, WAIT, TIME on the same connection: WAIT waits for that
// connection's writes, so it must follow the scripts there; the two TIMEs
// time it on the server's clock.
type nodeBatch struct {
	client redis.Cmdable // the node: s.client, or a ClusterClient's node client
	addr   string        // the node's address in errors, "" when not known
	calls  []*call

	before, after *redis.TimeCmd
	wait          *redis.IntCmd
}

// execDurable is exec followed by WAIT: each node's calls go in one
// pipeline of EVALSHA (EVAL for calls sent again after NOSCRIPT), TIME,
// WAIT, TIME. A ClusterClient routes a pipeline by the keys of its
// commands, and WAIT has none: it would land on any node, on another
// connection than the scripts. So on a cluster the calls are grouped by
// the primary of their slot and each group is pipelined on that node's
// own client, the nodes concurrently.
//
// Each call's fail is its own error, or else an error wrapping
// ErrReplicaShortfall when the WAIT that followed it on its node counted
// fewer replicas than required: a node's trouble is its calls' alone. It
// returns the first call's error, else the first shortfall.
func (s *Store) execDurable(ctx context.Context, op string, calls []*call) error {
	if !s.scriptsLoaded.Load() {
		s.loadScripts(ctx, op)
	}
	batches, err := s.byNode(ctx, calls)
	if err != nil {
		err = storeErr(op, err)
		for _, c := range calls {
			c.fail = err
		}
		return err
	}
	s.pipelineDurable(ctx, batches, false)
	if again := noScript(calls); len(again) > 0 {
		s.loadScripts(ctx, op)
		more, err := s.byNode(ctx, again)
		if err != nil {
			err = storeErr(op, err)
			for _, c := range calls {
				c.fail = err
			}
			return err
		}
		s.pipelineDurable(ctx, more, true)
		batches = append(batches, more...)
	}
	// A call sent again is in two batches; the later, where it ran,
	// decides its fail.
	var first, short error
	for _, b := range batches {
		werr := s.checkWait(b)
		if errors.Is(werr, ErrReplicaShortfall) {
			s.hooks.DurabilityShortfall(op, b.addr)
		}
		for _, c := range b.calls {
			switch err := c.err(); {
			case err != nil:
				c.fail = s.callErr(ctx, op, c, b.addr, err)
			case werr != nil:
				c.fail = s.callErr(ctx, op, c, b.addr, werr)
			default:
				c.fail = nil
			}
		}
	}
	for _, c := range calls {
		switch {
		case c.fail == nil:
		case errors.Is(c.fail, ErrReplicaShortfall):
			if short == nil {
				short = c.fail
			}
		case first == nil:
			first = c.fail
		}
	}
	if first != nil {
		return first
	}
	return short
}

// checkWait reports b's WAIT to the hooks, and returns its error or
// shortfall. A batch none of whose calls ran (all met NOSCRIPT, and were
// sent again in a batch of their own) is not checked.
func (s *Store) checkWait(b *nodeBatch) error {
	ran := false
	for _, c := range b.calls {
		ran = ran || !isNoScript(c.err())
	}
	if !ran {
		return nil
	}
	on := ""
	if b.addr != "" {
		on = " on " + b.addr
	}
	n, err := b.wait.Result()
	if err != nil {
		err = fmt.Errorf("WAIT%s: %w", on, err)
	} else if n < int64(s.replicas) {
		err = fmt.Errorf("WAIT%s: %d of %d replicas acknowledged within %s: %w", on, n, s.replicas, s.waitTimeout, ErrReplicaShortfall)
	}
	var took time.Duration
	if t0, t1 := b.before.Val(), b.after.Val(); b.before.Err() == nil && b.after.Err() == nil && t1.After(t0) {
		took = t1.Sub(t0)
	}
	werr := err
	if err != nil && s.cluster != nil {
		werr = &idempotency.NodeError{Node: b.addr, Err: err}
	}
	s.hooks.StoreCall(OpReplicaWait, took, werr)
	return err
}

// undoClaims gives back the owned claims of the calls of a Claim that fell
// short of replicas (their fail wraps ErrReplicaShortfall): each is
// released and its attempt taken back (release.lua with undo), so the
// engine's retry is not held up for a lease by claims nobody runs, nor
// counts a run that never happened against max_attempts. The claims of the
// calls that were acknowledged are kept: their keys run. A call that failed
// otherwise has no reply to read; on a node that ran it after all, its
// claims are reclaimed when their lease ends. Best effort and without WAIT:
// a claim whose undo is lost, here or in a failover, is reclaimed when its
// lease ends. It runs under its own deadline, since ctx may have been spent
// on the WAIT.
func (s *Store) undoClaims(ctx context.Context, reqs []idempotency.ClaimRequest, tokens []string, groups []group, calls []*call) {
	var undo []*call
	for gi, g := range groups {
		if !errors.Is(calls[gi].fail, ErrReplicaShortfall) {
			continue
		}
		vals, err := claimReply(calls[gi].strs, len(g.idx))
		if err != nil {
			continue
		}
		rec := 0
		for j, i := range g.idx {
			var claim idempotency.Claim
			o, js := vals.next(j, &rec)
			res, _, err := claimResult(&reqs[i], tokens[i], vals.nowUs, o, js, &claim)
			if err != nil || !res.Outcome.Owned() {
				continue
			}
			undo = append(undo, &call{script: s.release, keys: []string{g.keys[j]}, args: []any{tokens[i], s.graceMs, s.channel, 1}})
		}
	}
	if len(undo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	if err := s.exec(ctx, "claim undo", undo); err != nil {
		s.log.Warn("dedup: giving back claims that too few replicas acknowledged failed; their keys are reclaimed when the lease ends",
			"keys", len(undo), "err", err)
	}
}

// byNode groups calls into the batches of execDurable: all on s.client on
// a single node (a Client or a FailoverClient pipeline is one connection);
// on a cluster, by the primary that owns each call's slot, in order of
// first appearance.
func (s *Store) byNode(ctx context.Context, calls []*call) ([]*nodeBatch, error) {
	if s.cluster == nil {
		return []*nodeBatch{{client: s.client, calls: calls}}, nil
	}
	var bs []*nodeBatch
	byClient := make(map[*redis.Client]*nodeBatch)
	for _, c := range calls {
		node, err := s.cluster.MasterForKey(ctx, c.keys[0])
		if err != nil {
			return nil, err
		}
		b := byClient[node]
		if b == nil {
			b = &nodeBatch{client: node, addr: node.Options().Addr}
			byClient[node] = b
			bs = append(bs, b)
		}
		b.calls = append(b.calls, c)
	}
	return bs, nil
}

// pipelineDurable sends each batch in one pipeline on its node, the nodes
// concurrently, and waits for them all. Errors are read per command by the
// caller.
func (s *Store) pipelineDurable(ctx context.Context, batches []*nodeBatch, eval bool) {
	run := func(b *nodeBatch) {
		_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range b.calls {
				c.send(ctx, p, eval)
			}
			b.before = p.Time(ctx)
			b.wait = redis.NewIntCmd(ctx, "wait", s.replicas, s.waitTimeout.Milliseconds())
			_ = p.Process(ctx, b.wait)
			b.after = p.Time(ctx)
			return nil
		})
	}
	if len(batches) == 1 {
		run(batches[0])
		return
	}
	var wg sync.WaitGroup
	for _, b := range batches {
		wg.Go(func() { run(b) })
	}
	wg.Wait()
}
