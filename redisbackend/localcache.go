package redisbackend

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker/internal/ilist"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
)

// LocalCache bounds the Store's in-process tier: the COMPLETED records this
// Store wrote, and the live claims it holds. A duplicate of a key this
// Store completed is answered from it without a Redis call, and so is a
// claim of a key this Store is still running, and a Wait on it. The zero
// value turns it off.
//
// Only successful completions (outcome ok) this Store made, and Redis
// confirmed, of claims without steps (SaveStep) enter it, so a cached record
// is the stored one; a dead-lettered key is left out because it is what a
// redrive forgets and republishes at once, faster than an invalidation may
// travel. An entry
// answers only a claim with the same fingerprint and fingerprint version
// (any other goes to Redis, so a mismatch is still reported). An entry lives
// at most TTL, and never longer than the record's own retention. Forget
// (Store.Delete, Store.ForgetIf) publishes an invalidation that every Store
// with a cache on the namespace receives; while that subscription is down
// the cache answers nothing and is emptied. So an answer from the cache is
// stale only when a record changed without an invalidation reaching this
// process (deleted by hand, evicted, a wiped Redis, a message lost between
// the server and a live subscription), and then for at most TTL.
//
// Claims in flight. While this Store holds an owned claim on a key (Redis
// gave it NEW, RECLAIMED or RECOVERED, without steps, and it has not been
// completed, released, lost at a renewal or given a step since), a claim of
// that key with the same fingerprint and version is answered IN_FLIGHT with
// the CLAIMED record as Redis holds it (token, fence, attempts, claimed-at
// and lease end), and a Store.Wait on it waits in process: it returns the
// COMPLETED record once this Store completes the key into the cache, and
// otherwise (released, dead-lettered, refused, lost) goes on with Redis
// for what is left of its max. These answers end a tenth of the lease
// (at most 1s) before the lease's end as this process reckons it (from
// the start of the call that set it, which is before the server started
// the lease), are given only while the invalidation subscription is
// confirmed, and end for a key at its invalidation and for every key at a
// flush or a change of the subscription. At most Entries claims wait for
// their completion; a claim past that bound is answered by Redis.
//
// Why a local IN_FLIGHT is safe: it can only delay a duplicate, never ack
// one. The engine acks a delivery as a duplicate only on DUPLICATE, and the
// only DUPLICATE the cache gives is a completion Redis confirmed to this
// Store; IN_FLIGHT makes the engine wait or redeliver later, and every
// wait that is not answered by such a completion ends with Redis. The
// staleness bound: if this Store's claim was lost without it knowing
// (Redis lost the record in a failover or a flush, or it was deleted with
// no invalidation reaching this process, or another worker reclaimed it
// after renewals were missed), the local IN_FLIGHT holds until this
// Store's lease end at most (its last renewal's, less the margin), and the
// duplicate then goes to Redis.
type LocalCache struct {
	// Entries is the most records kept, the oldest dropped first, and the
	// most claims awaiting their completion that it remembers (and so
	// answers for). 0 turns the cache off.
	Entries int
	// TTL is the longest an entry answers for its key after the completion
	// (at least 1ms; required when Entries > 0): the staleness bound.
	TTL time.Duration
}

// LocalCacheStats are the counters of a Store's local cache.
type LocalCacheStats struct {
	// Hits counts claims answered DUPLICATE from the cache, without Redis.
	Hits int64
	// InFlightHits counts claims answered IN_FLIGHT without Redis: keys
	// this Store held a live claim on.
	InFlightHits int64
	// LocalWaits counts Waits that ended without Redis: the claim this
	// Store held completed into the cache, or the wait ran out while it
	// was still live.
	LocalWaits int64
	// Entries is the number of records held now.
	Entries int
	// Held is the number of this Store's claims that answer locally: not
	// completed, released or lost yet, and trusted (a claim past its
	// lease's local end counts until one of those drops it).
	Held int
	// Flushes counts the times the cache was emptied: a bulk forget, or its
	// invalidation subscription lost or (re)established.
	Flushes int64
	// Subscribed reports whether the invalidation subscription is
	// confirmed: only then does the cache answer.
	Subscribed bool
}

// cacheSlot is what the cache knows of one Redis key: first an owned claim
// this Store made and awaits the completion of (pending), then, once that
// claim completed, the COMPLETED record it wrote (cached). The claim's slot
// becomes its cache entry in place, so a key costs the cache one map entry
// from its claim to its eviction, and a completion finds its claim by the
// key it is looked up by anyway. The cached slots form a list, oldest
// first, through the Links it embeds: a slot is its own list element.
type cacheSlot struct {
	key        string // the caller's key; rkey is the Redis key
	rkey       string
	token      string
	fp         string
	fpv        int
	fence      int64
	attempts   int
	claimedAt  time.Time // the server's clock, as the record holds it
	leaseUntil time.Time // the server's clock, as the record holds it
	// answerUntil is when local answers for the claim end, on this
	// process's monotonic clock: the start of the call that set the lease
	// (claim or renewal), plus the lease, less leaseMargin. The server
	// started the lease after that call started, so its lease ends later.
	answerUntil time.Time
	// held reports whether the pending claim answers the key's other
	// claims IN_FLIGHT and its Waits (until answerUntil): it was made in
	// the epoch it is remembered in, and no invalidation, flush or change
	// of trust has ended that since.
	held bool
	// ended is made by the first local Wait on the claim and closed when
	// the claim stops answering locally (completed, released, renewed
	// unsuccessfully, invalidated, replaced, or trust lost).
	ended chan struct{}

	// cached reports that the claim completed (outcome ok) and the slot is
	// its COMPLETED record: completedAt on the server's clock, the result
	// and meta (the cache's own copies), until expires on this process's
	// monotonic clock, min(completion + TTL, call start + retention).
	cached      bool
	completedAt time.Time
	result      []byte
	meta        map[string]string
	expires     time.Time
	ilist.Links[cacheSlot]
}

// leaseMargin is how long before its lease end, as this process reckons
// it, a claim stops answering locally: a tenth of the lease, at most 1s,
// room for the Redis server's clock to run ahead of this one.
func leaseMargin(lease time.Duration) time.Duration {
	return min(lease/10, time.Second)
}

// claimRecord is the CLAIMED record a pending slot stands for, as Redis
// holds it.
func (s *cacheSlot) claimRecord() *idempotency.Record {
	return &idempotency.Record{
		Key:                s.key,
		State:              idempotency.StateClaimed,
		Fingerprint:        s.fp,
		FingerprintVersion: s.fpv,
		Token:              s.token,
		Fence:              s.fence,
		ClaimedAt:          s.claimedAt,
		LeaseUntil:         s.leaseUntil,
		Attempts:           s.attempts,
	}
}

// completedRecord is a copy the caller may keep of the COMPLETED record a
// cached slot holds.
func (s *cacheSlot) completedRecord() *idempotency.Record {
	rec := s.claimRecord() // the claim's fields, as its completion kept them
	rec.State, rec.CompletedAt, rec.Outcome = idempotency.StateCompleted, s.completedAt, idempotency.RecordOutcomeOK
	if s.result != nil {
		rec.Result = append([]byte(nil), s.result...)
	}
	if s.meta != nil {
		rec.Meta = make(map[string]string, len(s.meta))
		for k, v := range s.meta {
			rec.Meta[k] = v
		}
	}
	return rec
}

// localCache is the cache of LocalCache: a slot by Redis key for each key
// this Store holds an owned claim on or has a cached completion of. Trust
// follows the invalidation subscription: cached records and held claims
// are answered only while it is confirmed, and every change of trust,
// every invalidation and every flush moves epoch, so that a completion or
// a claim that raced one is not answered from.
type localCache struct {
	max int
	ttl time.Duration

	mu    sync.Mutex
	slots map[string]*cacheSlot
	// list holds the cached slots, oldest first.
	list ilist.List[cacheSlot, *cacheSlot]
	// pending, held and cached count the slots of each kind: held ones
	// are pending too.
	pending, held, cached int
	trusted               bool
	epoch                 uint64

	hits, inFlightHits, localWaits, flushes atomic.Int64
}

func newLocalCache(o LocalCache) *localCache {
	return &localCache{max: o.Entries, ttl: o.TTL, slots: make(map[string]*cacheSlot)}
}

// answer is the local answer to a claim of rkey with fp and fpv, when
// there is one: DUPLICATE with the cached record when it is trusted, not
// expired and of the same fingerprint and version; IN_FLIGHT with the
// CLAIMED record when this Store holds a live claim on rkey of the same
// fingerprint and version. Any other claim goes to Redis, which reports a
// MISMATCH or a fingerprint version change. The record is a copy the
// caller may keep. rkey is bytes so that the caller can build it in place:
// the lookup does not copy it.
func (c *localCache) answer(rkey []byte, fp string, fpv int, now time.Time) (idempotency.ClaimResult, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return idempotency.ClaimResult{}, false
	}
	s := c.slots[string(rkey)]
	switch {
	case s == nil:
		return idempotency.ClaimResult{}, false
	case !s.cached:
		if !s.held || !now.Before(s.answerUntil) || s.fp != fp || s.fpv != fpv {
			return idempotency.ClaimResult{}, false
		}
		c.inFlightHits.Add(1)
		return idempotency.ClaimResult{Outcome: idempotency.ClaimInFlight, Record: s.claimRecord()}, true
	case !c.liveLocked(s, now) || s.fp != fp || s.fpv != fpv:
		return idempotency.ClaimResult{}, false
	}
	c.hits.Add(1)
	return idempotency.ClaimResult{Outcome: idempotency.ClaimDuplicate, Record: s.completedRecord()}, true
}

// liveLocked reports whether the cached slot s has not expired, dropping
// it when it has; c.mu is held and the cache trusted.
func (c *localCache) liveLocked(s *cacheSlot, now time.Time) bool {
	if !now.Before(s.expires) {
		c.removeLocked(s)
		return false
	}
	return true
}

// localWait is what a Wait on a key can learn locally (see await).
type localWait struct {
	completed *idempotency.Record // the key's cached COMPLETED record
	claim     *idempotency.Record // the CLAIMED record of the held claim
	ended     <-chan struct{}     // closed when the held claim stops answering
	until     time.Time           // its answerUntil
}

// await reports what a Wait on rkey can rely on locally: the cached
// COMPLETED record, or the live claim this Store holds on it (wait for
// ended or until, then ask again), or neither (ask Redis).
func (c *localCache) await(rkey string, now time.Time) (localWait, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return localWait{}, false
	}
	s := c.slots[rkey]
	switch {
	case s == nil:
		return localWait{}, false
	case !s.cached:
		if !s.held || !now.Before(s.answerUntil) {
			return localWait{}, false
		}
		if s.ended == nil {
			s.ended = make(chan struct{})
		}
		return localWait{claim: s.claimRecord(), ended: s.ended, until: s.answerUntil}, true
	case c.liveLocked(s, now):
		return localWait{completed: s.completedRecord()}, true
	}
	return localWait{}, false
}

// claimed remembers the owned claims a Claim call made, while trusted and
// while fewer than max claims wait for their completion; when full, claims
// whose lease (plus grace) has passed are dropped first. A claim answers
// locally only when the epoch is still the one the call started in: an
// invalidation that raced the call may have deleted it. The cache keeps
// pointers into p, which the caller gives up.
func (c *localCache) claimed(p []cacheSlot, epoch uint64, grace time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return
	}
	for i := range p {
		if c.pending >= c.max {
			now := time.Now()
			for _, s := range c.slots {
				if !s.cached && now.After(s.leaseUntil.Add(grace)) {
					c.removeLocked(s)
				}
			}
			if c.pending >= c.max {
				return
			}
		}
		q := &p[i]
		// Redis gave this claim the key: a cached completion of it is no
		// longer the stored record, and an older claim of it here can no
		// longer complete (its token has lost the key).
		if old := c.slots[q.rkey]; old != nil {
			c.removeLocked(old)
		}
		c.slots[q.rkey] = q
		c.pending++
		if c.epoch == epoch {
			q.held = true
			c.held++
		}
	}
}

// pendingLocked returns the pending slot of rkey when it is token's claim.
func (c *localCache) pendingLocked(rkey, token string) *cacheSlot {
	if s := c.slots[rkey]; s != nil && !s.cached && s.token == token {
		return s
	}
	return nil
}

// renewed moves the lease of token's pending claim on rkey: until on the
// server's clock, answerUntil on this one's.
func (c *localCache) renewed(rkey, token string, until, answerUntil time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.pendingLocked(rkey, token); s != nil {
		s.leaseUntil = until
		s.answerUntil = answerUntil
	}
}

// dropPending forgets token's claim on rkey, which will not be completed
// by this Store, or whose record will have steps.
func (c *localCache) dropPending(rkey, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.pendingLocked(rkey, token); s != nil {
		c.removeLocked(s)
	}
}

// unholdLocked ends the local answers of the pending slot s: it no longer
// answers claims, and its waiters wake to ask again.
func (c *localCache) unholdLocked(s *cacheSlot) {
	if s.held {
		s.held = false
		c.held--
	}
	if s.ended != nil {
		close(s.ended)
		s.ended = nil
	}
}

// removeLocked takes s, the current slot of its key, out of the cache:
// out of the list when cached, else ending its claim's local answers.
func (c *localCache) removeLocked(s *cacheSlot) {
	if s.cached {
		c.list.Remove(s)
		c.cached--
	} else {
		c.unholdLocked(s)
		c.pending--
	}
	delete(c.slots, s.rkey)
}

// snapshot returns the epoch before a completion is sent.
func (c *localCache) snapshot() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// completedKey is what a Complete call learnt of one completion: its Redis
// key, whether it was written by this call (not a retry that found it
// done), and its completed_at on the server's clock.
type completedKey struct {
	rkey    string
	written bool
	at      time.Time
}

// completed caches the records a Complete call wrote, done[i] telling of
// completion i: the pending slot of each claim becomes its cached record.
// Nothing is cached when the epoch moved since snapshot (an invalidation or
// a change of trust raced the call) or the cache is not trusted; the
// pending claims are dropped either way. The results of one call are
// copied into one allocation: they were made at once and leave the list,
// oldest first, nearly together.
func (c *localCache) completed(epoch uint64, start time.Time, cs []idempotency.Completion, done []completedKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := c.trusted && c.epoch == epoch
	now := time.Now()
	expires := now.Add(c.ttl)
	var results []byte
	if ok {
		size := 0
		for i := range cs {
			if done[i].written && cs[i].Outcome == idempotency.RecordOutcomeOK {
				size += len(cs[i].Result)
			}
		}
		results = make([]byte, 0, size)
	}
	for i := range cs {
		cp := &cs[i]
		s := c.pendingLocked(done[i].rkey, cp.Token)
		if s == nil {
			continue
		}
		end := expires
		if e := start.Add(cp.Retention); e.Before(end) {
			end = e // the record expires in Redis first
		}
		// Only successful completions: a dead-lettered key is what an
		// operator redrives (forget, then republish), and the republished
		// message may reach this process before the forget's invalidation.
		if !ok || !done[i].written || cp.Outcome != idempotency.RecordOutcomeOK || !now.Before(end) {
			c.removeLocked(s)
			continue
		}
		// Its waiters wake once the lock is let go, after the record is
		// cached.
		c.unholdLocked(s)
		c.pending--
		s.cached, s.completedAt, s.expires = true, done[i].at, end
		if len(cp.Result) > 0 {
			off := len(results)
			results = append(results, cp.Result...)
			s.result = results[off:len(results):len(results)]
		}
		if len(cp.Meta) > 0 {
			s.meta = make(map[string]string, len(cp.Meta))
			for k, v := range cp.Meta {
				s.meta[k] = v
			}
		}
		c.list.PushBack(s)
		c.cached++
		for c.cached > c.max {
			c.removeLocked(c.list.Front())
		}
	}
}

// invalidate drops the cached record of rkey and ends the local answers of
// the claim held on it, or does so for every key when rkey is "" (a bulk
// forget of the namespace).
func (c *localCache) invalidate(rkey string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	if rkey == "" {
		c.flushLocked()
		return
	}
	switch s := c.slots[rkey]; {
	case s == nil:
	case s.cached:
		c.removeLocked(s)
	default:
		c.unholdLocked(s)
	}
}

// setTrusted empties the cache and trusts it, or not, from now on: at a
// confirmed subscription every entry from before may have missed an
// invalidation, and without one none is answered.
func (c *localCache) setTrusted(trusted bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.trusted = trusted
	c.flushLocked()
	for _, s := range c.slots {
		c.removeLocked(s) // every slot left is a pending claim
	}
}

// flushLocked empties the cache and ends every held claim's local answers
// (their completions may still be cached).
func (c *localCache) flushLocked() {
	c.flushes.Add(1)
	for _, s := range c.slots {
		if s.cached {
			c.removeLocked(s)
		} else {
			c.unholdLocked(s)
		}
	}
}

func (c *localCache) stats() LocalCacheStats {
	c.mu.Lock()
	n, held, trusted := c.cached, c.held, c.trusted
	c.mu.Unlock()
	return LocalCacheStats{
		Hits: c.hits.Load(), InFlightHits: c.inFlightHits.Load(), LocalWaits: c.localWaits.Load(),
		Entries: n, Held: held, Flushes: c.flushes.Load(), Subscribed: trusted,
	}
}

// invalidator keeps the subscription to the namespace's invalidation
// channel that the local cache is trusted by: it runs from New to Close,
// resubscribing with backoff when the connection fails.
type invalidator struct {
	client  redis.UniversalClient
	channel string
	cache   *localCache
	log     *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	ps     *redis.PubSub // the subscription being read, for close to end the read
	closed bool
}

func startInvalidator(client redis.UniversalClient, channel string, cache *localCache, log *slog.Logger) *invalidator {
	ctx, cancel := context.WithCancel(context.Background())
	v := &invalidator{client: client, channel: channel, cache: cache, log: log, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go v.run()
	return v
}

// close stops the subscriber and waits for it.
func (v *invalidator) close() {
	v.cancel()
	v.mu.Lock()
	v.closed = true // a subscription made after this is closed by run
	ps := v.ps
	v.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // unblocks a read in progress
	}
	<-v.done
}

func (v *invalidator) run() {
	defer close(v.done)
	defer v.cache.setTrusted(false)
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	for {
		ps := v.client.Subscribe(v.ctx, v.channel)
		v.mu.Lock()
		if v.closed {
			v.mu.Unlock()
			_ = ps.Close()
			return
		}
		v.ps = ps
		v.mu.Unlock()
		subscribed, err := v.receive(ps)
		v.cache.setTrusted(false)
		v.mu.Lock()
		v.ps = nil
		v.mu.Unlock()
		_ = ps.Close()
		if v.ctx.Err() != nil {
			return
		}
		if subscribed {
			backoff = minBackoff
		}
		v.log.Warn("dedup: redis local cache has no invalidation subscription; the cache answers nothing until it is back (a NOPERM error: grant the Redis user the channel)",
			"channel", v.channel, "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-v.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// receive reads invalidations until the connection fails or close; it
// reports whether the subscription was confirmed first. Health is checked
// as the notifier does: a ping after subscriberHealth of silence, dead after
// as long again unanswered.
func (v *invalidator) receive(ps *redis.PubSub) (subscribed bool, err error) {
	heard := time.Now()
	var pinged time.Time
	for {
		msg, err := ps.ReceiveTimeout(v.ctx, subscriberHealth)
		if err != nil {
			if v.ctx.Err() != nil {
				return subscribed, v.ctx.Err()
			}
			if !isTimeout(err) {
				return subscribed, err
			}
			switch {
			case pinged.IsZero():
				if time.Since(heard) >= subscriberHealth {
					if err := ps.Ping(v.ctx); err != nil {
						return subscribed, err
					}
					pinged = time.Now()
				}
			case time.Since(pinged) >= subscriberHealth:
				return subscribed, errors.New("subscriber ping unanswered")
			}
			continue
		}
		heard, pinged = time.Now(), time.Time{}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == v.channel {
				subscribed = true
				v.cache.setTrusted(true)
			}
		case *redis.Message:
			v.cache.invalidate(m.Payload)
		}
	}
}
