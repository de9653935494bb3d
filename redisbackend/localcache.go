package redisbackend

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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

// cacheEntry is one COMPLETED record this Store wrote. The entries form a
// list, oldest first, through prev and next: an entry is its own list
// element, so caching a record allocates no element of its own.
type cacheEntry struct {
	rkey       string
	rec        idempotency.Record
	expires    time.Time // monotonic: min(completion + TTL, call start + retention)
	prev, next *cacheEntry
}

// pendingClaim is what a claim this Store made knows of its record, kept
// until its completion so that the completed record can be cached: the
// completion itself carries no fingerprint, fence or attempts. While it is
// the held claim of its key (localCache.held) and answerUntil has not
// passed, it also answers the key's other claims IN_FLIGHT and its Waits.
type pendingClaim struct {
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
	// held reports whether the claim is localCache.held's entry for rkey,
	// so that ending it needs no lookup to tell.
	held bool
	// ended is made by the first local Wait on the claim and closed when
	// the claim stops answering locally (completed, released, renewed
	// unsuccessfully, invalidated, replaced, or trust lost).
	ended chan struct{}
}

// leaseMargin is how long before its lease end, as this process reckons
// it, a claim stops answering locally: a tenth of the lease, at most 1s,
// room for the Redis server's clock to run ahead of this one.
func leaseMargin(lease time.Duration) time.Duration {
	return min(lease/10, time.Second)
}

// record is the CLAIMED record the claim stands for, as Redis holds it.
func (p *pendingClaim) record() *idempotency.Record {
	return &idempotency.Record{
		Key:                p.key,
		State:              idempotency.StateClaimed,
		Fingerprint:        p.fp,
		FingerprintVersion: p.fpv,
		Token:              p.token,
		Fence:              p.fence,
		ClaimedAt:          p.claimedAt,
		LeaseUntil:         p.leaseUntil,
		Attempts:           p.attempts,
	}
}

// localCache is the cache of LocalCache, keyed by Redis key, and the owned
// claims this Store holds. Trust follows the invalidation subscription:
// entries and held claims are answered only while it is confirmed, and
// every change of trust, every invalidation and every flush moves epoch, so
// that a completion or a claim that raced one is not answered from.
type localCache struct {
	max int
	ttl time.Duration

	mu      sync.Mutex
	entries map[string]*cacheEntry
	// oldest and newest are the ends of the list of entries.
	oldest, newest *cacheEntry
	pending        map[string]*pendingClaim // by token: every claim awaiting its completion
	held           map[string]*pendingClaim // by Redis key: the claims that answer locally
	trusted        bool
	epoch          uint64

	hits, inFlightHits, localWaits, flushes atomic.Int64
}

func newLocalCache(o LocalCache) *localCache {
	return &localCache{
		max:     o.Entries,
		ttl:     o.TTL,
		entries: make(map[string]*cacheEntry),
		pending: make(map[string]*pendingClaim),
		held:    make(map[string]*pendingClaim),
	}
}

// answer is the local answer to a claim of rkey with fp and fpv, when
// there is one: DUPLICATE with the cached record when it is trusted, not
// expired and of the same fingerprint and version; IN_FLIGHT with the
// CLAIMED record when this Store holds a live claim on rkey of the same
// fingerprint and version. Any other claim goes to Redis, which reports a
// MISMATCH or a fingerprint version change. The record is a copy the
// caller may keep. rkey is bytes so that the caller can build it in place:
// the lookups do not copy it.
func (c *localCache) answer(rkey []byte, fp string, fpv int, now time.Time) (idempotency.ClaimResult, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return idempotency.ClaimResult{}, false
	}
	if p := c.held[string(rkey)]; p != nil {
		if !now.Before(p.answerUntil) || p.fp != fp || p.fpv != fpv {
			return idempotency.ClaimResult{}, false
		}
		c.inFlightHits.Add(1)
		return idempotency.ClaimResult{Outcome: idempotency.ClaimInFlight, Record: p.record()}, true
	}
	rec, ok := c.liveLocked(c.entries[string(rkey)], now)
	if !ok || rec.Fingerprint != fp || rec.FingerprintVersion != fpv {
		return idempotency.ClaimResult{}, false
	}
	c.hits.Add(1)
	return idempotency.ClaimResult{Outcome: idempotency.ClaimDuplicate, Record: rec}, true
}

// entryLocked returns a copy of the unexpired entry of rkey, dropping an
// expired one; c.mu is held and the cache trusted.
func (c *localCache) entryLocked(rkey string, now time.Time) (*idempotency.Record, bool) {
	return c.liveLocked(c.entries[rkey], now)
}

// liveLocked returns a copy of the record of e (nil when there is no
// entry) when it has not expired, dropping it when it has; c.mu is held
// and the cache trusted.
func (c *localCache) liveLocked(e *cacheEntry, now time.Time) (*idempotency.Record, bool) {
	if e == nil {
		return nil, false
	}
	if !now.Before(e.expires) {
		c.removeLocked(e)
		return nil, false
	}
	rec := e.rec
	if e.rec.Result != nil {
		rec.Result = append([]byte(nil), e.rec.Result...)
	}
	if e.rec.Meta != nil {
		rec.Meta = make(map[string]string, len(e.rec.Meta))
		for k, v := range e.rec.Meta {
			rec.Meta[k] = v
		}
	}
	return &rec, true
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
	if p := c.held[rkey]; p != nil && now.Before(p.answerUntil) {
		if p.ended == nil {
			p.ended = make(chan struct{})
		}
		return localWait{claim: p.record(), ended: p.ended, until: p.answerUntil}, true
	}
	if rec, ok := c.entryLocked(rkey, now); ok {
		return localWait{completed: rec}, true
	}
	return localWait{}, false
}

// claimed remembers the owned claims a Claim call made, while trusted and
// while fewer than max claims wait for their completion; when full, claims
// whose lease (plus grace) has passed are dropped first. A claim answers
// locally only when the epoch is still the one the call started in: an
// invalidation that raced the call may have deleted it. The cache keeps
// pointers into p, which the caller gives up.
func (c *localCache) claimed(p []pendingClaim, epoch uint64, grace time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return
	}
	for i := range p {
		if len(c.pending) >= c.max {
			now := time.Now()
			for _, q := range c.pending {
				if now.After(q.leaseUntil.Add(grace)) {
					c.dropLocked(q)
				}
			}
			if len(c.pending) >= c.max {
				return
			}
		}
		q := &p[i]
		c.pending[q.token] = q
		// Redis gave this claim the key: a cached completion of it is no
		// longer the stored record, and an older claim of it here is lost.
		if e := c.entries[q.rkey]; e != nil {
			c.removeLocked(e)
		}
		if old := c.held[q.rkey]; old != nil {
			c.unholdLocked(old)
		}
		if c.epoch == epoch {
			c.held[q.rkey] = q
			q.held = true
		}
	}
}

// renewed moves the lease of a pending claim: until on the server's clock,
// answerUntil on this one's.
func (c *localCache) renewed(token string, until, answerUntil time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.pending[token]; p != nil {
		p.leaseUntil = until
		p.answerUntil = answerUntil
	}
}

// dropPending forgets a claim that will not be completed by this Store, or
// whose record will have steps.
func (c *localCache) dropPending(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.pending[token]; p != nil {
		c.dropLocked(p)
	}
}

// dropLocked forgets p, and ends its local answers.
func (c *localCache) dropLocked(p *pendingClaim) {
	delete(c.pending, p.token)
	c.unholdLocked(p)
}

// unholdLocked ends p's local answers: it no longer answers claims, and
// its waiters wake to ask again.
func (c *localCache) unholdLocked(p *pendingClaim) {
	if p.held {
		delete(c.held, p.rkey)
		p.held = false
	}
	if p.ended != nil {
		close(p.ended)
		p.ended = nil
	}
}

// snapshot returns the epoch before a completion is sent.
func (c *localCache) snapshot() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// completedKey is what a Complete call learnt of one completion: whether
// it was written by this call (not a retry that found it done), and its
// completed_at on the server's clock.
type completedKey struct {
	written bool
	at      time.Time
}

// completed caches the records a Complete call wrote, done[i] telling of
// completion i. Nothing is cached when the epoch moved since snapshot (an
// invalidation or a change of trust raced the call) or the cache is not
// trusted; the pending claims are dropped either way. The entries of one
// call, and their results, are allocated together: they were made at once
// and leave the list, oldest first, nearly together.
func (c *localCache) completed(epoch uint64, start time.Time, cs []idempotency.Completion, done []completedKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := c.trusted && c.epoch == epoch
	now := time.Now()
	var slab []cacheEntry
	var results []byte
	if ok {
		n, size := 0, 0
		for i := range cs {
			if done[i].written && cs[i].Outcome == idempotency.RecordOutcomeOK {
				n++
				size += len(cs[i].Result)
			}
		}
		slab, results = make([]cacheEntry, 0, n), make([]byte, 0, size)
	}
	for i := range cs {
		cp := &cs[i]
		p := c.pending[cp.Token]
		if p != nil {
			// Its waiters wake once the lock is let go, after the record
			// below is cached.
			c.dropLocked(p)
		}
		// Only successful completions: a dead-lettered key is what an
		// operator redrives (forget, then republish), and the republished
		// message may reach this process before the forget's invalidation.
		if !ok || p == nil || !done[i].written || cp.Outcome != idempotency.RecordOutcomeOK {
			continue
		}
		expires := now.Add(c.ttl)
		if end := start.Add(cp.Retention); end.Before(expires) {
			expires = end // the record expires in Redis first
		}
		if !now.Before(expires) {
			continue
		}
		rec := idempotency.Record{
			Key:                cp.Key,
			State:              idempotency.StateCompleted,
			Fingerprint:        p.fp,
			FingerprintVersion: p.fpv,
			Token:              cp.Token,
			Fence:              p.fence,
			ClaimedAt:          p.claimedAt,
			LeaseUntil:         p.leaseUntil,
			CompletedAt:        done[i].at,
			Outcome:            cp.Outcome,
			Attempts:           p.attempts,
		}
		if len(cp.Result) > 0 {
			off := len(results)
			results = append(results, cp.Result...)
			rec.Result = results[off:len(results):len(results)]
		}
		if len(cp.Meta) > 0 {
			rec.Meta = make(map[string]string, len(cp.Meta))
			for k, v := range cp.Meta {
				rec.Meta[k] = v
			}
		}
		if old := c.entries[p.rkey]; old != nil {
			c.removeLocked(old)
		}
		slab = append(slab, cacheEntry{rkey: p.rkey, rec: rec, expires: expires})
		e := &slab[len(slab)-1]
		c.pushLocked(e)
		c.entries[p.rkey] = e
		for len(c.entries) > c.max {
			c.removeLocked(c.oldest)
		}
	}
}

// pushLocked puts e at the newest end of the list.
func (c *localCache) pushLocked(e *cacheEntry) {
	e.prev, e.next = c.newest, nil
	if c.newest != nil {
		c.newest.next = e
	} else {
		c.oldest = e
	}
	c.newest = e
}

// removeLocked takes e out of the list and the map.
func (c *localCache) removeLocked(e *cacheEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		c.oldest = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		c.newest = e.prev
	}
	e.prev, e.next = nil, nil
	delete(c.entries, e.rkey)
}

// invalidate drops the entry of rkey, or every entry when rkey is "" (a bulk
// forget of the namespace).
func (c *localCache) invalidate(rkey string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	if rkey == "" {
		c.flushLocked()
		return
	}
	if e := c.entries[rkey]; e != nil {
		c.removeLocked(e)
	}
	if p := c.held[rkey]; p != nil {
		c.unholdLocked(p)
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
	for _, p := range c.pending {
		c.dropLocked(p)
	}
}

// flushLocked empties the cache and ends every held claim's local answers
// (their completions may still be cached).
func (c *localCache) flushLocked() {
	c.flushes.Add(1)
	clear(c.entries)
	c.oldest, c.newest = nil, nil
	for _, p := range c.held {
		c.unholdLocked(p)
	}
}

func (c *localCache) stats() LocalCacheStats {
	c.mu.Lock()
	n, held, trusted := len(c.entries), len(c.held), c.trusted
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
