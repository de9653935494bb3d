package redisbackend

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
)

// LocalCache bounds the Store's in-process tier of COMPLETED records: a
// duplicate of a key this Store completed is answered from it without a
// Redis call. The zero value turns it off.
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
type LocalCache struct {
	// Entries is the most records kept; the oldest is dropped first. 0
	// turns the cache off.
	Entries int
	// TTL is the longest an entry answers for its key after the completion
	// (at least 1ms; required when Entries > 0): the staleness bound.
	TTL time.Duration
}

// LocalCacheStats are the counters of a Store's local cache.
type LocalCacheStats struct {
	// Hits counts claims answered DUPLICATE from the cache, without Redis.
	Hits int64
	// Entries is the number of records held now.
	Entries int
	// Flushes counts the times the cache was emptied: a bulk forget, or its
	// invalidation subscription lost or (re)established.
	Flushes int64
	// Subscribed reports whether the invalidation subscription is
	// confirmed: only then does the cache answer.
	Subscribed bool
}

// cacheEntry is one COMPLETED record this Store wrote.
type cacheEntry struct {
	rkey    string
	rec     idempotency.Record
	expires time.Time // monotonic: min(completion + TTL, call start + retention)
	elem    *list.Element
}

// pendingClaim is what a claim this Store made knows of its record, kept
// until its completion so that the completed record can be cached: the
// completion itself carries no fingerprint, fence or attempts.
type pendingClaim struct {
	rkey       string
	fp         string
	fpv        int
	fence      int64
	attempts   int
	claimedAt  time.Time
	leaseUntil time.Time
}

// localCache is the cache of LocalCache, keyed by Redis key. Trust follows
// the invalidation subscription: entries are answered only while it is
// confirmed, and every change of trust, every invalidation and every flush
// moves epoch, so that a completion that raced one is not cached.
type localCache struct {
	max int
	ttl time.Duration

	mu      sync.Mutex
	entries map[string]*cacheEntry
	order   *list.List // of *cacheEntry, oldest first
	pending map[string]pendingClaim
	trusted bool
	epoch   uint64

	hits, flushes atomic.Int64
}

func newLocalCache(o LocalCache) *localCache {
	return &localCache{
		max:     o.Entries,
		ttl:     o.TTL,
		entries: make(map[string]*cacheEntry),
		order:   list.New(),
		pending: make(map[string]pendingClaim),
	}
}

// lookup returns the cached record of rkey when it answers a claim with fp
// and fpv: trusted, not expired, same fingerprint and version. The record is
// a copy the caller may keep.
func (c *localCache) lookup(rkey, fp string, fpv int, now time.Time) (*idempotency.Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return nil, false
	}
	e := c.entries[rkey]
	if e == nil {
		return nil, false
	}
	if !now.Before(e.expires) {
		c.removeLocked(e)
		return nil, false
	}
	if e.rec.Fingerprint != fp || e.rec.FingerprintVersion != fpv {
		return nil, false
	}
	c.hits.Add(1)
	rec := e.rec
	rec.Result = append([]byte(nil), e.rec.Result...)
	if e.rec.Result == nil {
		rec.Result = nil
	}
	return &rec, true
}

// claimed remembers the owned claims a Claim call made, while trusted and
// while fewer than max claims wait for their completion; when full, claims
// whose lease (plus grace) has passed are dropped first.
func (c *localCache) claimed(p []pendingClaim, token []string, grace time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.trusted {
		return
	}
	for i := range p {
		if len(c.pending) >= c.max {
			now := time.Now()
			for t, q := range c.pending {
				if now.After(q.leaseUntil.Add(grace)) {
					delete(c.pending, t)
				}
			}
			if len(c.pending) >= c.max {
				return
			}
		}
		c.pending[token[i]] = p[i]
	}
}

// renewed moves the lease of a pending claim.
func (c *localCache) renewed(token string, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pending[token]; ok {
		p.leaseUntil = until
		c.pending[token] = p
	}
}

// dropPending forgets a claim that will not be completed by this Store.
func (c *localCache) dropPending(token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, token)
}

// snapshot returns the epoch before a completion is sent.
func (c *localCache) snapshot() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// completed caches the records a Complete call wrote: written[i] tells
// whether completion i was written by this call (not a retry that found it
// done), completedAt[i] its completed_at on the server's clock. Nothing is
// cached when the epoch moved since snapshot (an invalidation or a change of
// trust raced the call) or the cache is not trusted; the pending claims are
// dropped either way.
func (c *localCache) completed(epoch uint64, start time.Time, cs []idempotency.Completion, written []bool, completedAt []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := c.trusted && c.epoch == epoch
	now := time.Now()
	for i := range cs {
		cp := &cs[i]
		p, had := c.pending[cp.Token]
		delete(c.pending, cp.Token)
		// Only successful completions: a dead-lettered key is what an
		// operator redrives (forget, then republish), and the republished
		// message may reach this process before the forget's invalidation.
		if !ok || !had || !written[i] || cp.Outcome != idempotency.RecordOutcomeOK {
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
			CompletedAt:        completedAt[i],
			Outcome:            cp.Outcome,
			Attempts:           p.attempts,
		}
		if len(cp.Result) > 0 {
			rec.Result = append([]byte(nil), cp.Result...)
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
		e := &cacheEntry{rkey: p.rkey, rec: rec, expires: expires}
		e.elem = c.order.PushBack(e)
		c.entries[p.rkey] = e
		for len(c.entries) > c.max {
			c.removeLocked(c.order.Front().Value.(*cacheEntry))
		}
	}
}

func (c *localCache) removeLocked(e *cacheEntry) {
	c.order.Remove(e.elem)
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
	clear(c.pending)
}

func (c *localCache) flushLocked() {
	c.flushes.Add(1)
	clear(c.entries)
	c.order.Init()
}

func (c *localCache) stats() LocalCacheStats {
	c.mu.Lock()
	n, trusted := len(c.entries), c.trusted
	c.mu.Unlock()
	return LocalCacheStats{Hits: c.hits.Load(), Entries: n, Flushes: c.flushes.Load(), Subscribed: trusted}
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
