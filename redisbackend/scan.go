package redisbackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/lua"
)

// Class is what an operator filters records by (dedupworker records and
// forget --state). The classes are disjoint: every record is of
// exactly one of ClassClaimed, ClassReleased, ClassCompleted and
// ClassDeadLettered; ClassAll matches them all.
type Class string

// The classes of records.
const (
	ClassAll          Class = "all"
	ClassClaimed      Class = "claimed"       // CLAIMED, not released (a live or expired lease)
	ClassReleased     Class = "released"      // CLAIMED, released for a retry
	ClassCompleted    Class = "completed"     // COMPLETED with any outcome but dead_lettered
	ClassDeadLettered Class = "dead_lettered" // COMPLETED with outcome dead_lettered
)

// Classes lists the classes in the order operators read them.
var Classes = []Class{ClassAll, ClassClaimed, ClassReleased, ClassCompleted, ClassDeadLettered}

// ClassOf returns the class of rec (never ClassAll).
func ClassOf(rec *idempotency.Record) Class {
	switch {
	case rec.State == idempotency.StateCompleted && rec.Outcome == idempotency.RecordOutcomeDeadLettered:
		return ClassDeadLettered
	case rec.State == idempotency.StateCompleted:
		return ClassCompleted
	case rec.Released:
		return ClassReleased
	}
	return ClassClaimed
}

// Matches reports whether rec is of class c.
func (c Class) Matches(rec *idempotency.Record) bool { return c == ClassAll || ClassOf(rec) == c }

// Since returns the time a record's age counts from: completed_at for a
// COMPLETED record, claimed_at for a CLAIMED one; zero when the record has
// none (only values written by hand).
func Since(rec *idempotency.Record) time.Time {
	if rec.State == idempotency.StateCompleted {
		return rec.CompletedAt
	}
	return rec.ClaimedAt
}

// ScannedRecord is one record found by Scan.
type ScannedRecord struct {
	// Key is the effective key, without the namespace ("<scope>:<key>").
	Key    string
	Record *idempotency.Record
	// TTL is what the key had left to live when it was read; 0 when it has
	// no expiry.
	TTL time.Duration
	// Bytes is the length of the stored value.
	Bytes int
}

// ScanStats is what Scan has read so far.
type ScanStats struct {
	// Keys is how many keys SCAN returned; Records how many of them held a
	// record (the others expired in between or hold no record).
	Keys, Records int
}

// DefaultScanCount is Scan's SCAN COUNT hint and the number of values it
// reads per pipeline.
const DefaultScanCount = 500

// Scan reads the records of scope (every record of the namespace when scope
// is "") with SCAN MATCH "<namespace>:<scope>:*" (never KEYS) on every
// primary of a Cluster, one after the other, or on the one server, reading
// each page's values and TTLs in one pipeline of GET and PTTL on the node
// SCAN ran on, and decoding them as Get does. count is the COUNT hint
// (DefaultScanCount when 0). fn gets each page's records and the totals so
// far; it returns false to stop the scan there, which Scan then does without
// reading further. Every call has ctx's deadline.
//
// SCAN guarantees to return every key that exists for the whole scan, and
// may return one twice (a rehash): the caller sees each such record once per
// return.
func (s *Store) Scan(ctx context.Context, scope string, count int64, fn func(page []ScannedRecord, st ScanStats) (bool, error)) error {
	const op = "scan"
	if err := s.live(op); err != nil {
		return err
	}
	if count <= 0 {
		count = DefaultScanCount
	}
	match := globEscape(s.prefix) + "*"
	if scope != "" {
		match = globEscape(s.prefix+scope+":") + "*"
	}
	nodes, err := s.primaries(ctx)
	if err != nil {
		return storeErr(op, err)
	}
	var st ScanStats
	for _, node := range nodes {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, match, count).Result()
			if err != nil {
				return storeErr(op, err)
			}
			page, err := s.readPage(ctx, node, keys)
			if err != nil {
				return storeErr(op, err)
			}
			st.Keys += len(keys)
			st.Records += len(page)
			more, err := fn(page, st)
			if err != nil || !more {
				return err
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return nil
}

// primaries returns the client of every primary of a Cluster, in address
// order, or the store's one client.
func (s *Store) primaries(ctx context.Context) ([]redis.Cmdable, error) {
	if s.cluster == nil {
		return []redis.Cmdable{s.client}, nil
	}
	var mu sync.Mutex
	var nodes []*redis.Client
	err := s.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		nodes = append(nodes, c)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(nodes, func(a, b *redis.Client) int { return cmp.Compare(a.Options().Addr, b.Options().Addr) })
	out := make([]redis.Cmdable, len(nodes))
	for i, n := range nodes {
		out[i] = n
	}
	return out, err
}

// readPage reads keys' values and TTLs on node in one pipeline. Keys that
// expired since SCAN, or hold no record, are left out.
func (s *Store) readPage(ctx context.Context, node redis.Cmdable, keys []string) ([]ScannedRecord, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = p.Get(ctx, k)
			ttls[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	page := make([]ScannedRecord, 0, len(keys))
	for i, k := range keys {
		raw, err := gets[i].Bytes()
		switch {
		case errors.Is(err, redis.Nil), redis.HasErrorPrefix(err, "WRONGTYPE"):
			continue
		case err != nil:
			return nil, err
		}
		key := strings.TrimPrefix(k, s.prefix)
		rec, ok := decodeRecord(key, raw)
		if !ok {
			continue
		}
		ttl, err := ttls[i].Result()
		if err != nil {
			return nil, err
		}
		if ttl < 0 {
			ttl = 0 // -1: no expiry; -2: gone since the GET
		}
		page = append(page, ScannedRecord{Key: key, Record: rec, TTL: ttl, Bytes: len(raw)})
	}
	return page, nil
}

// globEscape quotes the characters SCAN MATCH reads as a pattern.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// ForgetResult counts what ForgetIf did with its keys.
type ForgetResult struct {
	// Deleted records were still of the class and age asked for.
	Deleted int
	// Kept records had changed since they were listed (another class, or
	// younger: claimed again) and were left alone.
	Kept int
	// Gone keys held no record any more (expired, deleted, or not a record).
	Gone int
}

var forgetIfScript = newScript(lua.ForgetIf)

// ForgetIf deletes each of keys (effective keys, "<scope>:<key>") whose
// record is, when the script runs, of class and, with olderThan > 0, older
// than olderThan by the Redis server's clock: a record claimed or completed
// again since the caller listed it is kept. It is one script call per hash
// slot (one per call on a single server), sent in one pipeline; keys may
// number thousands per call. A call that deleted any record empties the
// local caches (LocalCache) of every Store on the namespace, this one at
// once, the others when the script's invalidation reaches them.
func (s *Store) ForgetIf(ctx context.Context, keys []string, class Class, olderThan time.Duration) (ForgetResult, error) {
	const op = "forget"
	var r ForgetResult
	if err := s.live(op); err != nil {
		return r, err
	}
	if !slices.Contains(Classes, class) {
		return r, invalid(op, "class %q: want one of %v", class, Classes)
	}
	if len(keys) == 0 {
		return r, nil
	}
	if err := noDuplicates(op, len(keys), func(i int) string { return keys[i] }); err != nil {
		return r, err
	}
	gs := s.groups(len(keys), func(i int) string { return keys[i] })
	calls := make([]*call, len(gs))
	for i, g := range gs {
		calls[i] = &call{script: forgetIfScript, keys: g.keys, args: []any{string(class), durMs(olderThan), s.invalidation}}
	}
	if len(calls) > 1 {
		// exec pipelines EVALSHA and falls back to EVAL per call on
		// NOSCRIPT; loading first keeps that to a restart's race.
		_ = forgetIfScript.Load(ctx, s.client).Err()
	}
	err := s.exec(ctx, op, calls)
	if s.cache != nil {
		s.cache.invalidate("") // whether or not the call failed: it may have deleted some
	}
	if err != nil {
		return r, err
	}
	for _, c := range calls {
		codes, err := c.cmd.Int64Slice()
		if err != nil || len(codes) != len(c.keys)+1 {
			return r, fmt.Errorf("dedup: forget: unexpected script reply %v (%v)", c.cmd.Val(), err)
		}
		if codes[len(c.keys)] == 0 {
			s.warnUnpublished(op)
		}
		for _, code := range codes[:len(c.keys)] {
			switch code {
			case 1:
				r.Deleted++
			case 2:
				r.Kept++
			default:
				r.Gone++
			}
		}
	}
	return r, nil
}

// Time is the Redis server's clock (TIME; on a Cluster, one primary's):
// the clock every lease and record time is on.
func (s *Store) Time(ctx context.Context) (time.Time, error) {
	const op = "time"
	if err := s.live(op); err != nil {
		return time.Time{}, err
	}
	t, err := s.client.Time(ctx).Result()
	return t, storeErr(op, err)
}
