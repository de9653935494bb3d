package memstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/idemkit/dedupworker/idempotency"
)

// DefaultGrace is the grace of a Store whose Options leave it zero: how long
// an expired claim or a released record is kept at least, as the Redis
// store's default.
const DefaultGrace = 60 * time.Second

// Options configures a Store. The zero value is usable.
type Options struct {
	// Grace is how long an expired claim, and a released record, is kept
	// at least. Default DefaultGrace.
	Grace time.Duration
	// Now is the store's clock: every lease, TTL and timestamp is measured
	// on it, as the Redis store measures them on the server's. Default
	// time.Now. A test that advances its own clock makes leases expire and
	// records age without waiting; Wait's max is still real time.
	Now func() time.Time
}

// Store is an idempotency.Store held in the process's memory. It keeps the
// Redis store's semantics (atomic claims, fenced writes, leases,
// grace, retention, attempts and steps carried over), so a handler tested
// against it meets the same answers in production. It is safe for
// concurrent use. Records live in one map; an expired record is removed
// when it is next touched, or by a sweep every few thousand calls.
type Store struct {
	grace time.Duration
	now   func() time.Time

	mu      sync.Mutex
	recs    map[string]*entry
	waiters map[string]chan struct{} // closed, and removed, when the key changes
	fence   int64                    // the largest fence handed out
	calls   int                      // since the last sweep
}

// entry is a stored record and when it expires.
type entry struct {
	rec     idempotency.Record
	expires time.Time
}

// New returns an empty Store.
func New(opts Options) *Store {
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{
		grace:   opts.Grace,
		now:     opts.Now,
		recs:    make(map[string]*entry),
		waiters: make(map[string]chan struct{}),
	}
}

var _ idempotency.Store = (*Store)(nil)

// ErrDuplicateKey is returned by Claim and Complete for a batch that names a
// key twice. Nothing in the batch is changed.
var ErrDuplicateKey = errors.New("memstore: a key appears twice in one batch")

// sweepEvery is how many calls pass between sweeps of expired records.
const sweepEvery = 4096

// live returns key's entry when it has not expired, removing it when it
// has. s.mu is held.
func (s *Store) live(key string, now time.Time) *entry {
	e := s.recs[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.expires) {
		delete(s.recs, key)
		return nil
	}
	return e
}

// tick counts a call and, every sweepEvery calls, drops expired records.
// s.mu is held.
func (s *Store) tick(now time.Time) {
	s.calls++
	if s.calls < sweepEvery {
		return
	}
	s.calls = 0
	for k, e := range s.recs {
		if !now.Before(e.expires) {
			delete(s.recs, k)
		}
	}
}

// changed wakes the waiters of key. s.mu is held.
func (s *Store) changed(key string) {
	if ch, ok := s.waiters[key]; ok {
		close(ch)
		delete(s.waiters, key)
	}
}

// newFence is the fence of a new owner of a key whose record held old (0 when
// there was none): larger than old and than every fence this store handed
// out, and at least the clock in microseconds, as the Redis store's. s.mu is held.
func (s *Store) newFence(old int64, now time.Time) int64 {
	f := max(old+1, s.fence+1, now.UnixMicro())
	s.fence = f
	return f
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func uniqueKeys[T any](items []T, key func(T) string) error {
	seen := make(map[string]struct{}, len(items))
	for _, it := range items {
		k := key(it)
		if _, ok := seen[k]; ok {
			return fmt.Errorf("%w: %q", ErrDuplicateKey, k)
		}
		seen[k] = struct{}{}
	}
	return nil
}

// Claim claims a batch of keys atomically. The call has one outcome: a
// memstore has one server, and never fails one key of a batch alone.
func (s *Store) Claim(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := uniqueKeys(reqs, func(r idempotency.ClaimRequest) string { return r.Key }); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.tick(now)
	out := make([]idempotency.ClaimResult, len(reqs))
	for i, r := range reqs {
		out[i] = s.claim(r, now)
	}
	return out, nil
}

// claim decides one request as the claim script does. s.mu is held.
func (s *Store) claim(r idempotency.ClaimRequest, now time.Time) idempotency.ClaimResult {
	e := s.live(r.Key, now)
	var (
		outcome  = idempotency.ClaimNew
		fence    int64
		attempts = 1
		steps    map[string][]byte
	)
	if e != nil {
		rec := &e.rec
		switch {
		case rec.FingerprintVersion == r.FingerprintVersion && rec.Fingerprint != r.Fingerprint:
			return idempotency.ClaimResult{Outcome: idempotency.ClaimMismatch, Record: clone(rec)}
		case rec.State == idempotency.StateCompleted:
			return idempotency.ClaimResult{Outcome: idempotency.ClaimDuplicate, Record: clone(rec)}
		case rec.Released:
			outcome = idempotency.ClaimNew
		case rec.LeaseUntil.Before(now):
			outcome = idempotency.ClaimReclaimed
		default:
			return idempotency.ClaimResult{Outcome: idempotency.ClaimInFlight, Record: clone(rec)}
		}
		fence, attempts, steps = rec.Fence, rec.Attempts+1, rec.Steps
	}
	rec := idempotency.Record{
		Key:                r.Key,
		State:              idempotency.StateClaimed,
		Fingerprint:        r.Fingerprint,
		FingerprintVersion: r.FingerprintVersion,
		Token:              newToken(),
		Fence:              s.newFence(fence, now),
		ClaimedAt:          now,
		LeaseUntil:         now.Add(r.Lease),
		Attempts:           attempts,
		Steps:              steps,
	}
	s.recs[r.Key] = &entry{rec: rec, expires: rec.LeaseUntil.Add(max(s.grace, r.Retention))}
	return idempotency.ClaimResult{Outcome: outcome, Claim: &idempotency.Claim{
		Key:        r.Key,
		Token:      rec.Token,
		Fence:      rec.Fence,
		LeaseUntil: rec.LeaseUntil,
		Attempts:   rec.Attempts,
		Steps:      maps.Clone(rec.Steps),
	}}
}

// owned returns key's record when it is a live claim held by token. s.mu is
// held.
func (s *Store) owned(key, token string, now time.Time) *entry {
	e := s.live(key, now)
	if e == nil || e.rec.State != idempotency.StateClaimed || e.rec.Token != token || e.rec.Released {
		return nil
	}
	return e
}

// Complete stores results of owned claims atomically, with one outcome for
// the call, as Claim.
func (s *Store) Complete(ctx context.Context, cs []idempotency.Completion) ([]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := uniqueKeys(cs, func(c idempotency.Completion) string { return c.Key }); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.tick(now)
	ok := make([]bool, len(cs))
	for i, c := range cs {
		e := s.owned(c.Key, c.Token, now)
		if e == nil {
			// A completion repeated by the token that completed the key
			// (its first reply was lost) is reported done.
			d := s.live(c.Key, now)
			ok[i] = d != nil && d.rec.State == idempotency.StateCompleted && d.rec.Token == c.Token
			continue
		}
		e.rec.State = idempotency.StateCompleted
		e.rec.CompletedAt = now
		e.rec.Outcome = c.Outcome
		e.rec.Result = cloneBytes(c.Result)
		e.rec.Meta = maps.Clone(c.Meta)
		e.expires = now.Add(c.Retention)
		s.changed(c.Key)
		ok[i] = true
	}
	return ok, nil
}

// Renew extends an owned claim's lease to lease from now. The
// record keeps outliving its lease by what its claim gave it, and at least
// by the grace.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) (time.Time, bool, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.owned(key, token, now)
	if e == nil {
		return time.Time{}, false, nil
	}
	tail := max(s.grace, e.expires.Sub(e.rec.LeaseUntil))
	e.rec.LeaseUntil = now.Add(lease)
	e.expires = e.rec.LeaseUntil.Add(tail)
	return e.rec.LeaseUntil, true, nil
}

// Release gives up an owned claim: the record stays, released,
// for keep (at least the grace), so its fence, attempts and steps carry over
// to the next claim.
func (s *Store) Release(ctx context.Context, key, token string, keep time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	e := s.owned(key, token, now)
	if e == nil {
		return false, nil
	}
	e.rec.Released = true
	e.rec.LeaseUntil = now
	e.expires = now.Add(max(keep, s.grace))
	s.changed(key)
	return true, nil
}

// SaveStep stores a finished step's result in an owned claim,
// keeping the record's expiry.
func (s *Store) SaveStep(ctx context.Context, key, token, step string, result []byte) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.owned(key, token, s.now())
	if e == nil {
		return false, nil
	}
	if e.rec.Steps == nil {
		e.rec.Steps = make(map[string][]byte)
	}
	e.rec.Steps[step] = cloneBytes(result)
	return true, nil
}

// Wait waits up to max (real time) for an IN_FLIGHT key to settle: it
// returns the COMPLETED record, nil when the key was released or
// is gone, or the still-CLAIMED record when max passed.
func (s *Store) Wait(ctx context.Context, key string, max time.Duration) (*idempotency.Record, error) {
	var timeout <-chan time.Time
	if max > 0 {
		t := time.NewTimer(max)
		defer t.Stop()
		timeout = t.C
	}
	for {
		s.mu.Lock()
		e := s.live(key, s.now())
		if e == nil || e.rec.Released {
			s.mu.Unlock()
			return nil, nil
		}
		rec := clone(&e.rec)
		if rec.State == idempotency.StateCompleted || timeout == nil {
			s.mu.Unlock()
			return rec, nil
		}
		ch, ok := s.waiters[key]
		if !ok {
			ch = make(chan struct{})
			s.waiters[key] = ch
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			return s.Get(ctx, key)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Get returns a copy of key's record, or nil when there is none.
func (s *Store) Get(ctx context.Context, key string) (*idempotency.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.live(key, s.now()); e != nil {
		return clone(&e.rec), nil
	}
	return nil, nil
}

// Delete removes key's record, so its next delivery runs again.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.live(key, s.now())
	if e == nil {
		return false, nil
	}
	delete(s.recs, key)
	s.changed(key)
	return true, nil
}

// Ping reports nil: the store is always there.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }

// TTL returns how long key's record has left to live, or a negative duration
// when there is none: what Redis's PTTL reports for the Redis store.
func (s *Store) TTL(key string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if e := s.live(key, now); e != nil {
		return e.expires.Sub(now)
	}
	return -1
}

// Len returns how many live records the store holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for _, e := range s.recs {
		if now.Before(e.expires) {
			n++
		}
	}
	return n
}

func clone(r *idempotency.Record) *idempotency.Record {
	c := *r
	c.Result = cloneBytes(r.Result)
	c.Meta = maps.Clone(r.Meta)
	if r.Steps != nil {
		c.Steps = make(map[string][]byte, len(r.Steps))
		for k, v := range r.Steps {
			c.Steps[k] = cloneBytes(v)
		}
	}
	return &c
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
