package redisbackend

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/idempotency"
	"github.com/idemkit/dedupworker/lua"
)

var _ idempotency.Store = (*Store)(nil)

// Store is an idempotency.Store on Redis. It is safe for concurrent use.
// Close it to stop its subscriber goroutines.
type Store struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // client, when it is one: batches split by slot
	prefix  string               // "<namespace>:"
	channel string               // "<namespace>:dedup:done"
	// invalidation is "<namespace>:dedup:forget": Delete publishes the
	// Redis key it deleted there, ForgetIf "" (every key).
	invalidation string
	graceMs      int64
	// graceArg and channelArg are graceMs and channel boxed once as
	// script arguments, not once a call.
	graceArg, channelArg any
	floor                time.Duration
	cap                  time.Duration
	log                  *slog.Logger
	hooks                consumer.Hooks

	// replicas and waitTimeout are Options.Durability: with replicas > 0,
	// writes go through execDurable.
	replicas    int
	waitTimeout time.Duration

	// nodeBySlot keeps Node's answers on a cluster, each a slot's
	// primary as its index in nodeAddrs plus one, in the low 8 bits, and
	// the low 24 bits of nodeGen when it was read above them: valid while
	// nodeGen has not moved on (a call failed since). One word a slot
	// keeps the table small enough to stay in cache; a generation that
	// wrapped round only makes a hint stale, which Node's answers may be.
	// prefixPlain says prefix has no '{' or '}', so a key's slot is found
	// from prefixCRC without building its Redis key.
	nodeBySlot  *[numSlots]atomic.Uint32
	nodeGen     atomic.Uint64
	nodeAddrs   atomic.Pointer[[]string] // the primaries Node has named, append-only
	nodeAddrsMu sync.Mutex
	prefixPlain bool
	prefixCRC   uint16

	claim, complete, renew, release, step, forget *script
	scriptsLoaded                                 atomic.Bool

	// cache is Options.LocalCache (nil when off), trusted while inval
	// holds its subscription.
	cache *localCache
	inval *invalidator

	notify     *notifier
	ownsClient bool
	closed     atomic.Bool
	closeOnce  sync.Once
}

// New returns a Store on client. The caller keeps ownership of client: Close
// stops the Store's own goroutines but leaves client open. New does no I/O
// itself; with Options.LocalCache it starts the goroutine that subscribes to
// the cache's invalidations, and the cache answers once that subscription is
// confirmed.
func New(client redis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("dedup: redisbackend: client is nil")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return newStore(client, opts)
}

// newStore builds a Store from validated options.
func newStore(client redis.UniversalClient, opts Options) (*Store, error) {
	if _, ok := client.(*redis.Ring); ok {
		return nil, errors.New("dedup: redisbackend: client: *redis.Ring is not supported (its sharding splits multi-key scripts); use a Client, a FailoverClient or a ClusterClient")
	}
	if d := opts.Durability; d.Replicas > 0 {
		// A pipeline's replies are read under the client's read timeout,
		// whatever WAIT's own timeout: a WAIT that outlasts it ends as a
		// network error, and go-redis sends the whole pipeline again.
		if rt := readTimeout(client); rt > 0 && d.Timeout >= rt {
			return nil, invalidOption("Durability.Timeout", "%s: must be shorter than the client's read timeout %s, which bounds the pipeline that carries each WAIT", d.Timeout, rt)
		}
	}
	s := &Store{
		client:   client,
		prefix:   opts.Namespace + ":",
		channel:  opts.Namespace + ":dedup:done",
		graceMs:  durMs(opts.Grace),
		floor:    opts.PollFloor,
		cap:      opts.PollCap,
		log:      opts.Logger,
		hooks:    opts.Hooks,
		replicas: opts.Durability.Replicas,
		claim:    newScript(lua.Claim),
		complete: newScript(lua.Complete),
		renew:    newScript(lua.Renew),
		release:  newScript(lua.Release),
		step:     newScript(lua.Step),
		forget:   newScript(lua.Forget),
	}
	s.invalidation = opts.Namespace + ":dedup:forget"
	s.graceArg, s.channelArg = s.graceMs, s.channel
	s.waitTimeout = opts.Durability.Timeout
	s.cluster, _ = client.(*redis.ClusterClient)
	if s.cluster != nil {
		s.nodeBySlot = new([numSlots]atomic.Uint32)
		s.nodeAddrs.Store(new([]string))
		s.prefixPlain = !strings.ContainsAny(s.prefix, "{}")
		s.prefixCRC = crc16(s.prefix)
	}
	s.notify = newNotifier(client, s.channel, opts.Logger)
	if opts.LocalCache.Entries > 0 {
		s.cache = newLocalCache(opts.LocalCache)
		s.inval = startInvalidator(client, s.invalidation, s.cache, opts.Logger)
	}
	return s, nil
}

// readTimeout is the read timeout of client's connections, or 0 when it is
// not known (another kind of UniversalClient) or not set.
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// Close stops the subscriber goroutine and waits for it, then closes the
// client if NewFromURL made it. Waits in progress return ErrClosed; later
// calls of any method return ErrClosed. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.notify.close()
		if s.inval != nil {
			s.inval.close()
		}
		if s.ownsClient {
			err = s.client.Close()
		}
	})
	return err
}

var _ idempotency.NodeRouter = (*Store)(nil)

// Node returns the address of the Redis Cluster primary that serves key's
// slot, as the client's cached cluster layout says, so that callers batch
// per node (idempotency.NodeRouter); "" on a single node or a
// Sentinel-managed primary, whose batches have one outcome.
//
// The answers are kept per slot, and all dropped when a call fails (a node
// down, a slot moved), so that the next ones read the client's layout
// again: a kept answer costs no clock read and no lookup.
func (s *Store) Node(ctx context.Context, key string) string {
	if s.cluster == nil {
		return ""
	}
	var slot uint16
	if s.prefixPlain {
		slot = prefixedSlot(s.prefixCRC, key)
	} else {
		slot = hashSlot(s.prefix + key)
	}
	gen := uint32(s.nodeGen.Load())
	if v := s.nodeBySlot[slot].Load(); v>>8 == gen&(1<<24-1) && v&0xff != 0 {
		return (*s.nodeAddrs.Load())[v&0xff-1]
	}
	node, err := s.cluster.MasterForKey(ctx, s.prefix+key)
	if err != nil {
		return ""
	}
	addr := node.Options().Addr
	if i := s.nodeIndex(addr); i > 0 {
		s.nodeBySlot[slot].Store(gen<<8 | uint32(i))
	}
	return addr
}

// onePrimary returns the client of the primary that serves the slots of
// all of groups, when Node's answers kept for them name one primary: a
// batch the engine sent to one node (idempotency.NodeRouter). Their calls
// then go in one pipeline on that node's own client, without the
// ClusterClient's work to split a pipeline per node, which costs a
// goroutine and a slot lookup per command. It returns nil, and the
// ClusterClient routes the calls, when the groups are one or span
// primaries, when not on a cluster, and when a slot's answer is not kept
// (a call failed since, and the layout is read again). With durability it
// returns nil: execDurable pipelines each node's calls on its own client
// already.
func (s *Store) onePrimary(ctx context.Context, groups []group) *redis.Client {
	if s.cluster == nil || s.replicas > 0 || len(groups) < 2 {
		return nil
	}
	gen := uint32(s.nodeGen.Load()) & (1<<24 - 1)
	var node uint32
	for _, g := range groups {
		v := s.nodeBySlot[g.slot].Load()
		if v>>8 != gen || v&0xff == 0 || node != 0 && v&0xff != node {
			return nil
		}
		node = v & 0xff
	}
	c, err := s.cluster.MasterForKey(ctx, groups[0].keys[0])
	if err != nil || c.Options().Addr != (*s.nodeAddrs.Load())[node-1] {
		return nil
	}
	return c
}

// nodeIndex returns addr's index in nodeAddrs plus one, adding it when it
// is new; 0 when the list is full (Node then answers from the client).
func (s *Store) nodeIndex(addr string) int {
	addrs := *s.nodeAddrs.Load()
	for i, a := range addrs {
		if a == addr {
			return i + 1
		}
	}
	s.nodeAddrsMu.Lock()
	defer s.nodeAddrsMu.Unlock()
	addrs = *s.nodeAddrs.Load()
	for i, a := range addrs {
		if a == addr {
			return i + 1
		}
	}
	if len(addrs) == 0xff {
		return 0
	}
	next := append(addrs[:len(addrs):len(addrs)], addr)
	s.nodeAddrs.Store(&next)
	return len(next)
}

// MultiNode reports whether the client is a ClusterClient, whose batches
// go to several primaries (idempotency.NodeRouter).
func (s *Store) MultiNode() bool { return s.cluster != nil }

// Namespace returns the namespace the Store prefixes to keys.
func (s *Store) Namespace() string { return s.prefix[:len(s.prefix)-1] }

// RedisKey returns the Redis key holding the record of key: "<namespace>:<key>".
func (s *Store) RedisKey(key string) string { return s.prefix + key }

// Channel returns the Pub/Sub channel on which Complete and Release publish
// the Redis keys they settle.
func (s *Store) Channel() string { return s.channel }

func (s *Store) live(op string) error {
	if s.closed.Load() {
		return storeErr(op, ErrClosed)
	}
	return nil
}

func invalid(op, format string, args ...any) error {
	return fmt.Errorf("dedup: redis %s: %w: %s", op, ErrInvalidRequest, fmt.Sprintf(format, args...))
}

// Claim claims a batch of keys: one script call on a
// single node, one per hash slot in one pipeline on a cluster. Results are in
// request order. A key twice in reqs is refused with ErrInvalidRequest.
//
// A claim's key lives lease + max(grace, the request's Retention), and
// renewals keep that tail: a claim whose worker died is RECLAIMED, its
// attempt counted, until then.
//
// On a cluster each node's keys have their own fate: when some nodes
// fail (a node down, or its replicas short of Options.Durability), Claim
// returns the results of the keys the other nodes answered and an
// *idempotency.BatchError holding each failed key's error, which names its
// node (idempotency.NodeError). Claims that fell short of replicas are
// given back at once (see ErrReplicaShortfall); those that were
// acknowledged are kept. On a single node or a Sentinel-managed primary
// the call has one outcome.
func (s *Store) Claim(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	const op = "claim"
	if err := s.live(op); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return []idempotency.ClaimResult{}, nil
	}
	for i := range reqs {
		r := &reqs[i]
		if r.Key == "" {
			return nil, invalid(op, "request %d has an empty key", i)
		}
		if r.Lease <= 0 {
			return nil, invalid(op, "request %d (key hash %s) has a non-positive lease %s", i, keyHash(r.Key), r.Lease)
		}
	}
	if err := noDuplicates(op, len(reqs), func(i int) string { return reqs[i].Key }); err != nil {
		return nil, err
	}
	if s.cache == nil {
		return s.claimRedis(ctx, reqs)
	}
	// Duplicates of keys this Store completed, and claims of keys it holds
	// a live claim on, are answered locally; the rest go to Redis, and
	// their results are put back in request order. Until the first local
	// answer every request is still going to Redis, and nothing is copied.
	var results []idempotency.ClaimResult
	var rest []idempotency.ClaimRequest
	var restIdx []int
	var rkey []byte // the Redis key looked up, built in place
	now := time.Now()
	for i := range reqs {
		r := &reqs[i]
		rkey = append(append(rkey[:0], s.prefix...), r.Key...)
		res, ok := s.cache.answer(rkey, r.Fingerprint, r.FingerprintVersion, now)
		switch {
		case ok && results == nil:
			results = make([]idempotency.ClaimResult, len(reqs))
			rest = append(make([]idempotency.ClaimRequest, 0, len(reqs)-1), reqs[:i]...)
			restIdx = make([]int, i, len(reqs)-1)
			for j := range restIdx {
				restIdx[j] = j
			}
			fallthrough
		case ok:
			results[i] = res
		case results != nil:
			rest = append(rest, *r)
			restIdx = append(restIdx, i)
		}
	}
	if results == nil {
		return s.claimRedis(ctx, reqs)
	}
	if len(rest) == 0 {
		return results, nil
	}
	got, err := s.claimRedis(ctx, rest)
	var be *idempotency.BatchError
	if err != nil && !errors.As(err, &be) {
		return nil, err
	}
	var errs []error
	if be != nil {
		errs = make([]error, len(reqs))
	}
	for j, i := range restIdx {
		if be != nil && be.Errs[j] != nil {
			errs[i] = be.Errs[j]
			continue
		}
		results[i] = got[j]
	}
	if errs != nil {
		return results, &idempotency.BatchError{Errs: errs}
	}
	return results, nil
}

// claimRedis is Claim of valid requests, all sent to Redis.
func (s *Store) claimRedis(ctx context.Context, reqs []idempotency.ClaimRequest) ([]idempotency.ClaimResult, error) {
	return s.claimForm(ctx, reqs, false)
}

// claimForm is claimRedis, in claim.lua's long form for every call when
// long is set. The short form answers DUPLICATE from a completion's start
// (claim.lua): a key whose DUPLICATE record this store cannot read is
// claimed again, once, in the long form, which reads the whole record and
// recovers one that is not a record. A key whose call was in
// the long form already is claimed again too; it gets the same answer,
// and the error.
func (s *Store) claimForm(ctx context.Context, reqs []idempotency.ClaimRequest, long bool) ([]idempotency.ClaimResult, error) {
	const op = "claim"
	var epoch uint64
	start := time.Now() // before the server starts any lease of this call
	if s.cache != nil {
		epoch = s.cache.snapshot()
	}
	tokens := newTokens(len(reqs))
	groups := s.groups(len(reqs), func(i int) string { return reqs[i].Key })
	calls := make([]*call, len(groups))
	for gi, g := range groups {
		if !long && uniformClaims(reqs, g.idx) {
			// The short form of claim.lua: version, lease and the claims'
			// key TTL once (the script then converts no retention or grace).
			r0 := &reqs[g.idx[0]]
			durable := 0
			if s.replicas > 0 {
				durable = 1 // duplicates are written back for the WAIT
			}
			c := newCall(s.claim, g.keys, replyStrings, 5+2*len(g.idx))
			c.argv = append(c.argv, "=", r0.FingerprintVersion, durMs(r0.Lease), claimTTLMs(r0.Lease, r0.Retention, s.graceMs), durable)
			for _, i := range g.idx {
				c.argv = append(c.argv, &tokens[i], &reqs[i].Fingerprint)
			}
			calls[gi] = c
			continue
		}
		c := newCall(s.claim, g.keys, replyStrings, 2+5*len(g.idx))
		args := append(c.argv, s.graceArg)
		var lease, retention msBox
		for _, i := range g.idx {
			r := &reqs[i]
			// Pointers: go-redis writes a *string or *int as its value,
			// and a pointer is not copied to the heap to fit in an
			// interface, as a string or an int is.
			args = append(args, &tokens[i], &r.Fingerprint, &r.FingerprintVersion, lease.of(r.Lease), retention.of(r.Retention))
		}
		if s.replicas > 0 {
			args = append(args, 1) // durable: duplicates are written back for the WAIT
		}
		c.argv = args
		calls[gi] = c
	}
	var errs []error // per request, when some of the calls failed
	if err := s.write(ctx, op, calls, s.onePrimary(ctx, groups)); err != nil {
		s.undoClaims(ctx, reqs, tokens, groups, calls) // those that fell short of replicas
		if s.cluster == nil {
			return nil, err
		}
		errs = s.keyErrors(op, len(reqs), groups, calls)
	}
	results := make([]idempotency.ClaimResult, len(reqs))
	// The owned claims' Claims, one allocation for the batch.
	claims := make([]idempotency.Claim, len(reqs))
	var pending []cacheSlot // the owned claims, for the local cache
	if s.cache != nil {
		pending = make([]cacheSlot, 0, len(reqs))
	}
	var again []int // requests to claim again in the long form
	for gi, g := range groups {
		if calls[gi].fail != nil {
			continue
		}
		vals, err := claimReply(calls[gi].strs, len(g.idx))
		if err != nil {
			return nil, storeErr(op, err)
		}
		rec := 0
		for j, i := range g.idx {
			o, js := vals.next(j, &rec)
			res, claimedAt, err := claimResult(&reqs[i], tokens[i], vals.nowUs, o, js, &claims[i])
			if !long && errors.Is(err, errUnreadable) && o == string(idempotency.ClaimDuplicate) {
				again = append(again, i)
				continue
			}
			if err != nil {
				return nil, storeErr(op, err)
			}
			results[i] = res
			// A claim with steps completes into a record with steps, which
			// the cache does not copy: such a key is answered by Redis.
			if s.cache != nil && res.Claim != nil && len(res.Claim.Steps) == 0 {
				r := &reqs[i]
				pending = append(pending, cacheSlot{
					key: r.Key, rkey: g.keys[j], token: tokens[i], fp: r.Fingerprint, fpv: r.FingerprintVersion,
					fence: res.Claim.Fence, attempts: res.Claim.Attempts, claimedAt: claimedAt, leaseUntil: res.Claim.LeaseUntil,
					answerUntil: start.Add(r.Lease - leaseMargin(r.Lease)),
				})
			}
		}
	}
	if len(pending) > 0 {
		s.cache.claimed(pending, epoch, time.Duration(s.graceMs)*time.Millisecond)
	}
	if len(again) > 0 {
		sub := make([]idempotency.ClaimRequest, len(again))
		for j, i := range again {
			sub[j] = reqs[i]
		}
		got, err := s.claimForm(ctx, sub, true)
		var be *idempotency.BatchError
		if err != nil && !errors.As(err, &be) {
			return nil, err
		}
		for j, i := range again {
			if kerr := idempotency.KeyError(err, j, len(sub)); kerr != nil {
				if errs == nil {
					errs = make([]error, len(reqs))
				}
				errs[i] = kerr
				continue
			}
			results[i] = got[j]
		}
	}
	if errs != nil {
		return results, &idempotency.BatchError{Errs: errs}
	}
	return results, nil
}

// keyErrors spreads the fail of each call of a batch of n keys split into
// groups over the group's keys, and logs once per node how many keys it
// failed: on a cluster a node's trouble fails its own keys only.
func (s *Store) keyErrors(op string, n int, groups []group, calls []*call) []error {
	errs := make([]error, n)
	type nodeFail struct {
		keys int
		err  error
	}
	var nodes map[string]*nodeFail
	for gi, g := range groups {
		err := calls[gi].fail
		if err == nil {
			continue
		}
		for _, i := range g.idx {
			errs[i] = err
		}
		node := ""
		if ne := (*idempotency.NodeError)(nil); errors.As(err, &ne) {
			node = ne.Node
		}
		if nodes == nil {
			nodes = make(map[string]*nodeFail, 1)
		}
		if f := nodes[node]; f != nil {
			f.keys += len(g.idx)
		} else {
			nodes[node] = &nodeFail{keys: len(g.idx), err: err}
		}
	}
	for node, f := range nodes {
		s.log.Warn("dedup: a redis cluster node failed its keys of a batch; they fail closed and are retried, the other nodes' keys go on",
			"op", op, "node", node, "keys", f.keys, "batch", n, "err", f.err)
	}
	return errs
}

// errUnreadable is claimResult's error for a record this store cannot read.
var errUnreadable = errors.New("a record this store cannot read")

// claimTTLMs is the TTL in ms of a claim's key, as claim.lua's long form
// works it out: lease + max(grace, retention), so that an expired claim
// nobody completed is found and reclaimed for as long as its completion
// would be remembered.
func claimTTLMs(lease, retention time.Duration, graceMs int64) int64 {
	return durMs(lease) + max(graceMs, durMs(retention))
}

// uniformClaims reports whether the requests idx of reqs share fingerprint
// version, lease and retention, and have fingerprints that stand in a JSON
// string as they are, so that claim.lua takes them in its short form. The
// version has fewer than 15 digits: claim.lua's short form writes its
// text as sent, which is then what Lua's tostring of it would write.
func uniformClaims(reqs []idempotency.ClaimRequest, idx []int) bool {
	r0 := &reqs[idx[0]]
	if v := r0.FingerprintVersion; v <= -1e14 || v >= 1e14 {
		return false
	}
	lease, retention := durMs(r0.Lease), durMs(r0.Retention)
	for _, i := range idx {
		r := &reqs[i]
		if r.FingerprintVersion != r0.FingerprintVersion || durMs(r.Lease) != lease || durMs(r.Retention) != retention ||
			!jsonPlain(r.Fingerprint) {
			return false
		}
	}
	return true
}

// jsonPlain reports whether s is the text of a JSON string as it stands:
// printable ASCII other than '"' and backslash, which need no escape.
func jsonPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// claimVals is the claim script's reply for one call, read in KEYS order
// by next: the outcome codes, one byte a key, the records of the keys
// whose code is not 'n', and the call's TIME in microseconds.
type claimVals struct {
	codes string
	recs  []string
	nowUs int64
}

// claimCodes maps each outcome code of claim.lua's reply to its outcome;
// 'n' is a NEW key whose record the reply leaves out.
var claimCodes = [256]idempotency.ClaimOutcome{
	'n': idempotency.ClaimNew,
	'N': idempotency.ClaimNew,
	'R': idempotency.ClaimReclaimed,
	'V': idempotency.ClaimRecovered,
	'D': idempotency.ClaimDuplicate,
	'I': idempotency.ClaimInFlight,
	'M': idempotency.ClaimMismatch,
}

// claimReply checks the claim script's reply for n keys: a string of n
// outcome codes, one record for each code other than 'n', then the call's
// TIME in microseconds. The reply is read as strings (an integer as its
// decimal text), so that no value is boxed into an interface.
func claimReply(cmd *redis.StringSliceCmd, n int) (claimVals, error) {
	vals, err := cmd.Result()
	if err != nil {
		return claimVals{}, err
	}
	if len(vals) < 2 || len(vals[0]) != n {
		return claimVals{}, fmt.Errorf("script returned %d values, the first of %d codes, for %d keys, want %d codes", len(vals), firstLen(vals), n, n)
	}
	codes := vals[0]
	recs := 0
	for i := 0; i < n; i++ {
		switch c := codes[i]; {
		case claimCodes[c] == "":
			return claimVals{}, fmt.Errorf("script returned outcome code %q for key %d", c, i)
		case c != 'n':
			recs++
		}
	}
	if len(vals) != recs+2 {
		return claimVals{}, fmt.Errorf("script returned %d values for %d keys with %d records, want %d", len(vals), n, recs, recs+2)
	}
	last := vals[len(vals)-1]
	nowUs, err := strconv.ParseInt(last, 10, 64)
	if err != nil || nowUs <= 0 {
		return claimVals{}, fmt.Errorf("script returned %q as its time, want microseconds", last)
	}
	return claimVals{codes: codes, recs: vals[1 : len(vals)-1], nowUs: nowUs}, nil
}

// firstLen is the length of vals[0], or 0 for none.
func firstLen(vals []string) int {
	if len(vals) == 0 {
		return 0
	}
	return len(vals[0])
}

// next returns key j's outcome and record ("" for code 'n'); *rec counts
// the records taken, and the keys are read in order, j from 0.
func (v *claimVals) next(j int, rec *int) (outcome, js string) {
	c := v.codes[j]
	if c == 'n' {
		return string(idempotency.ClaimNew), ""
	}
	js = v.recs[*rec]
	*rec++
	return string(claimCodes[c]), js
}

// claimResult turns one (outcome, record JSON) pair of the claim script
// into the ClaimResult of r, and the record's claimed_at. nowUs is the
// call's TIME: with it, a NEW claim the script left out of its reply (”)
// is the template it wrote from r, token and that time. An owned claim's
// Claim is written to slot, which the result then points to.
func claimResult(r *idempotency.ClaimRequest, token string, nowUs int64, o, js string, slot *idempotency.Claim) (idempotency.ClaimResult, time.Time, error) {
	key := r.Key
	if js == "" && o == string(idempotency.ClaimNew) {
		nowMs := nowUs / 1000
		claimedAt := time.UnixMilli(nowMs)
		*slot = idempotency.Claim{
			Key: key, Token: token, Fence: nowUs, LeaseUntil: time.UnixMilli(nowMs + durMs(r.Lease)), Attempts: 1,
		}
		return idempotency.ClaimResult{Outcome: idempotency.ClaimNew, Claim: slot}, claimedAt, nil
	}
	// Nearly every other reply is in the scripts' template: read it in
	// place, into a record on the stack (an owned claim keeps only a Claim).
	var fresh idempotency.Record
	rec := &fresh
	if !decodeFreshInto(rec, key, js) {
		var ok bool
		if rec, ok = decodeGeneral(key, []byte(js)); !ok {
			return idempotency.ClaimResult{}, time.Time{}, fmt.Errorf("key hash %s: script returned %q with %w", keyHash(key), o, errUnreadable)
		}
	}
	res := idempotency.ClaimResult{Outcome: idempotency.ClaimOutcome(o)}
	if res.Outcome == idempotency.ClaimInFlight && rec.Token == token && !rec.Released {
		// The live claim is this request's own: the script ran before, its
		// reply was lost, and the client sent it again (go-redis retries on
		// network errors). The claim is ours; which outcome it had is not
		// known, so a first claim (attempt 1) says NEW and a later one
		// RECLAIMED.
		res.Outcome = idempotency.ClaimNew
		if rec.Attempts > 1 {
			res.Outcome = idempotency.ClaimReclaimed
		}
	}
	switch res.Outcome {
	case idempotency.ClaimNew, idempotency.ClaimReclaimed, idempotency.ClaimRecovered:
		if rec.Token != token {
			return idempotency.ClaimResult{}, time.Time{}, fmt.Errorf("key hash %s: script returned a claim under another token", keyHash(key))
		}
		*slot = idempotency.Claim{
			Key:        key,
			Token:      token,
			Fence:      rec.Fence,
			LeaseUntil: rec.LeaseUntil,
			Attempts:   rec.Attempts,
			Steps:      rec.Steps,
		}
		res.Claim = slot
	case idempotency.ClaimDuplicate, idempotency.ClaimInFlight, idempotency.ClaimMismatch:
		cp := *rec
		res.Record = &cp
	default:
		return idempotency.ClaimResult{}, time.Time{}, fmt.Errorf("key hash %s: unknown outcome %q from script", keyHash(key), o)
	}
	return res, rec.ClaimedAt, nil
}

// Complete stores the results of owned claims: one script call
// on a single node, one per slot in one pipeline on a cluster. ok[i] is false
// when completion i was no longer owned (gone, completed by another token,
// released, another token); that completion changed nothing. A completion
// sent again after it was stored (its reply was lost, and the client or the
// caller retried it) finds the record COMPLETED under its own token and
// reports true, as the Store contract says, changing nothing.
func (s *Store) Complete(ctx context.Context, cs []idempotency.Completion) ([]bool, error) {
	const op = "complete"
	if err := s.live(op); err != nil {
		return nil, err
	}
	if len(cs) == 0 {
		return []bool{}, nil
	}
	for i := range cs {
		c := &cs[i]
		switch {
		case c.Key == "":
			return nil, invalid(op, "completion %d has an empty key", i)
		case c.Retention <= 0:
			return nil, invalid(op, "completion %d (key hash %s) has a non-positive retention %s", i, keyHash(c.Key), c.Retention)
		case c.Outcome != idempotency.RecordOutcomeOK && c.Outcome != idempotency.RecordOutcomeDeadLettered:
			return nil, invalid(op, "completion %d (key hash %s) has outcome %q, want %q or %q", i, keyHash(c.Key), c.Outcome,
				idempotency.RecordOutcomeOK, idempotency.RecordOutcomeDeadLettered)
		}
	}
	if err := noDuplicates(op, len(cs), func(i int) string { return cs[i].Key }); err != nil {
		return nil, err
	}
	var epoch uint64
	start := time.Now()
	if s.cache != nil {
		epoch = s.cache.snapshot()
	}
	groups := s.groups(len(cs), func(i int) string { return cs[i].Key })
	results := encodeResults(cs)
	calls := make([]*call, len(groups))
	for gi, g := range groups {
		if uniformCompletions(cs, g.idx) {
			// The short form of complete.lua: outcome and retention once.
			c0 := &cs[g.idx[0]]
			c := newCall(s.complete, g.keys, replyString, 4+2*len(g.idx))
			c.argv = append(c.argv, s.channelArg, "=", &c0.Outcome, durMs(c0.Retention))
			for _, i := range g.idx {
				c.argv = append(c.argv, &cs[i].Token, &results[i])
			}
			calls[gi] = c
			continue
		}
		c := newCall(s.complete, g.keys, replyString, 1+5*len(g.idx))
		args := append(c.argv, s.channelArg)
		var retention msBox
		for _, i := range g.idx {
			c := &cs[i]
			meta := ""
			if len(c.Meta) > 0 {
				b, err := json.Marshal(c.Meta)
				if err != nil {
					return nil, invalid(op, "completion %d (key hash %s): meta: %v", i, keyHash(c.Key), err)
				}
				meta = string(b)
			}
			args = append(args, &c.Token, &c.Outcome, &results[i], meta, retention.of(c.Retention))
		}
		c.argv = args
		calls[gi] = c
	}
	var errs []error // per completion, when some of the calls failed
	if err := s.write(ctx, op, calls, s.onePrimary(ctx, groups)); err != nil {
		if s.cluster == nil {
			return nil, err
		}
		errs = s.keyErrors(op, len(cs), groups, calls)
	}
	ok := make([]bool, len(cs))
	var done []completedKey // for the local cache
	if s.cache != nil {
		done = make([]completedKey, len(cs))
	}
	for gi, g := range groups {
		if calls[gi].fail != nil {
			continue // its completions stay pending: the caller sends them again
		}
		codes, atMs, err := completeReply(calls[gi].str, len(g.idx))
		if err != nil {
			return nil, storeErr(op, err)
		}
		at := time.UnixMilli(atMs)
		for j, i := range g.idx {
			ok[i] = codes[j] == '1' || codes[j] == '2'
			if done != nil {
				done[i] = completedKey{rkey: g.keys[j], written: codes[j] == '1', at: at}
			}
		}
	}
	if s.cache != nil {
		s.cache.completed(epoch, start, cs, done)
	}
	if errs != nil {
		return ok, &idempotency.BatchError{Errs: errs}
	}
	return ok, nil
}

// completeReply checks the completion script's reply for n keys: one
// string, n codes ('1' completed, '2' completed before under the same
// token, '0' not owned), then in decimal the completed_at_ms of the keys it
// completed.
func completeReply(cmd *redis.StringCmd, n int) (codes string, atMs int64, err error) {
	v, err := cmd.Result()
	if err != nil {
		return "", 0, err
	}
	if len(v) <= n {
		return "", 0, fmt.Errorf("script returned %q for %d keys, want %d codes and a time", v, n, n)
	}
	codes = v[:n]
	for i := 0; i < n; i++ {
		if c := codes[i]; c != '0' && c != '1' && c != '2' {
			return "", 0, fmt.Errorf("script returned code %q for key %d, want 0, 1 or 2", c, i)
		}
	}
	atMs, err = strconv.ParseInt(v[n:], 10, 64)
	if err != nil || atMs < 0 {
		return "", 0, fmt.Errorf("script returned %q after its %d codes as its completion time, want milliseconds", v[n:], n)
	}
	return codes, atMs, nil
}

// encodeResults returns the base64 of each completion's result, all
// substrings of one string: one allocation for the batch, not one a key.
func encodeResults(cs []idempotency.Completion) []string {
	enc := base64.StdEncoding
	n := 0
	for i := range cs {
		n += enc.EncodedLen(len(cs[i].Result))
	}
	var b strings.Builder
	b.Grow(n)
	var chunk [256]byte
	const step = len(chunk) / 4 * 3 // whole groups of 3 bytes: the chunks' encodings join into the whole's
	for i := range cs {
		for r := cs[i].Result; len(r) > 0; {
			m := min(len(r), step)
			enc.Encode(chunk[:], r[:m])
			b.Write(chunk[:enc.EncodedLen(m)])
			r = r[m:]
		}
	}
	all := b.String()
	out := make([]string, len(cs))
	off := 0
	for i := range cs {
		l := enc.EncodedLen(len(cs[i].Result))
		out[i] = all[off : off+l]
		off += l
	}
	return out
}

// uniformCompletions reports whether the completions idx of cs share outcome
// and retention and have no meta, so that complete.lua takes them in its
// short form.
func uniformCompletions(cs []idempotency.Completion, idx []int) bool {
	c0 := &cs[idx[0]]
	for _, i := range idx {
		c := &cs[i]
		if len(c.Meta) > 0 || c.Outcome != c0.Outcome || c.Retention != c0.Retention {
			return false
		}
	}
	return true
}

// Renew extends an owned claim's lease to lease from now on the server's
// clock. The key keeps outliving the lease by as much as it did (the claim's
// max(grace, retention)), and by at least grace.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) (time.Time, bool, error) {
	const op = "renew"
	if err := s.live(op); err != nil {
		return time.Time{}, false, err
	}
	if key == "" {
		return time.Time{}, false, invalid(op, "empty key")
	}
	if lease <= 0 {
		return time.Time{}, false, invalid(op, "key hash %s: non-positive lease %s", keyHash(key), lease)
	}
	start := time.Now() // before the server moves the lease
	c := &call{script: s.renew, keys: []string{s.prefix + key}, args: []any{token, durMs(lease), s.graceMs}}
	if err := s.exec(ctx, op, []*call{c}); err != nil {
		return time.Time{}, false, err
	}
	until, err := c.cmd.Int64()
	if err != nil {
		return time.Time{}, false, storeErr(op, err)
	}
	if until == 0 {
		if s.cache != nil {
			s.cache.dropPending(c.keys[0], token) // the claim is not this Store's any more
		}
		return time.Time{}, false, nil
	}
	if s.cache != nil {
		s.cache.renewed(c.keys[0], token, time.UnixMilli(until), start.Add(lease-leaseMargin(lease)))
	}
	return time.UnixMilli(until), true, nil
}

// Release gives up an owned claim: the record stays, marked released with
// an expired lease, for keep (at least the store's grace), so the next claim
// takes it as NEW with its fence, attempts and steps carried over. The key
// is published so waiters claim again at once.
func (s *Store) Release(ctx context.Context, key, token string, keep time.Duration) (bool, error) {
	const op = "release"
	if err := s.live(op); err != nil {
		return false, err
	}
	if key == "" {
		return false, invalid(op, "empty key")
	}
	rkey := s.prefix + key
	if s.cache != nil {
		s.cache.dropPending(rkey, token)
	}
	keepMs := max(durMs(keep), s.graceMs)
	c := &call{script: s.release, keys: []string{rkey}, args: []any{token, keepMs, s.channel}}
	return s.writeFlag(ctx, op, c)
}

// writeFlag runs one script call that answers 1 when it changed the
// record and 0 when the claim was no longer the caller's.
func (s *Store) writeFlag(ctx context.Context, op string, c *call) (bool, error) {
	if err := s.write(ctx, op, []*call{c}, nil); err != nil {
		return false, err
	}
	n, err := c.cmd.Int64()
	if err != nil {
		return false, storeErr(op, err)
	}
	return n == 1, nil
}

// SaveStep stores the result of a finished step in an owned claim; the
// key's TTL is unchanged.
func (s *Store) SaveStep(ctx context.Context, key, token, step string, result []byte) (bool, error) {
	const op = "save step"
	if err := s.live(op); err != nil {
		return false, err
	}
	if key == "" || step == "" {
		return false, invalid(op, "empty key or step name (key hash %s, step %q)", keyHash(key), step)
	}
	rkey := s.prefix + key
	if s.cache != nil {
		s.cache.dropPending(rkey, token) // its record will have steps: not cached
	}
	c := &call{script: s.step, keys: []string{rkey}, args: []any{token, step, base64.StdEncoding.EncodeToString(result)}}
	return s.writeFlag(ctx, op, c)
}

// Get returns the record of key, or nil when there is none or the stored
// value is not a record.
func (s *Store) Get(ctx context.Context, key string) (*idempotency.Record, error) {
	const op = "get"
	if err := s.live(op); err != nil {
		return nil, err
	}
	return s.get(ctx, op, key)
}

func (s *Store) get(ctx context.Context, op, key string) (*idempotency.Record, error) {
	raw, err := s.client.Get(ctx, s.prefix+key).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, nil
	case redis.HasErrorPrefix(err, "WRONGTYPE"):
		s.log.Debug("dedup: redis value is not a string: treated as absent", "key_hash", keyHash(key))
		return nil, nil
	case err != nil:
		return nil, storeErr(op, err)
	}
	rec, ok := decodeRecord(key, raw)
	if !ok {
		s.log.Debug("dedup: redis value is not a record: treated as absent", "key_hash", keyHash(key))
		return nil, nil
	}
	return rec, nil
}

// Delete removes the record of key and reports whether there was one (the
// forget of one key). In the same script it publishes the key on
// the namespace's invalidation channel, so that every Store with a
// LocalCache drops it; this Store drops it at once.
func (s *Store) Delete(ctx context.Context, key string) (bool, error) {
	const op = "delete"
	if err := s.live(op); err != nil {
		return false, err
	}
	rkey := s.prefix + key
	c := &call{script: s.forget, keys: []string{rkey}, args: []any{s.invalidation}}
	err := s.exec(ctx, op, []*call{c})
	if s.cache != nil {
		s.cache.invalidate(rkey) // whether or not the reply came: the key may be gone
	}
	if err != nil {
		return false, err
	}
	reply, err := c.cmd.Int64Slice()
	if err != nil || len(reply) != 2 {
		return false, storeErr(op, fmt.Errorf("unexpected script reply %v (%v)", c.cmd.Val(), err))
	}
	if reply[1] == 0 {
		s.warnUnpublished(op)
	}
	return reply[0] > 0, nil
}

// warnUnpublished logs a forget whose invalidation Redis would not
// publish: the record is gone, but other processes' local caches may answer
// for it until their TTL.
func (s *Store) warnUnpublished(op string) {
	s.log.Warn("dedup: redis refused to publish the local caches' invalidation (grant the Redis user the channel, e.g. ACL &"+s.invalidation+"); other workers' redis.local_cache may answer for the forgotten keys until its ttl",
		"op", op, "channel", s.invalidation)
}

// LocalCacheStats returns the counters of the local cache (Options.LocalCache);
// zero when it is off.
func (s *Store) LocalCacheStats() LocalCacheStats {
	if s.cache == nil {
		return LocalCacheStats{}
	}
	return s.cache.stats()
}

// Ping reports whether Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	const op = "ping"
	if err := s.live(op); err != nil {
		return err
	}
	return storeErr(op, s.client.Ping(ctx).Err())
}

// group is the part of a batch that goes into one script call: indices into
// the batch and their Redis keys, in batch order.
type group struct {
	idx  []int
	keys []string
	slot uint16 // on a cluster: the keys' hash slot
}

// groups splits a batch of n keys into script calls: one group on a single
// node, one per hash slot on a cluster, in order of first appearance.
func (s *Store) groups(n int, key func(int) string) []group {
	keys := s.redisKeys(n, key)
	if s.cluster == nil {
		g := group{idx: make([]int, n), keys: keys}
		for i := range n {
			g.idx[i] = i
		}
		return []group{g}
	}
	var gs []group
	bySlot := make(map[uint16]int, n)
	for i, k := range keys {
		slot := hashSlot(k)
		gi, ok := bySlot[slot]
		if !ok {
			gi = len(gs)
			bySlot[slot] = gi
			gs = append(gs, group{slot: slot})
		}
		gs[gi].idx = append(gs[gi].idx, i)
		gs[gi].keys = append(gs[gi].keys, k)
	}
	return gs
}

// redisKeys returns the Redis keys of a batch of n keys, all substrings of
// one string: one allocation for the batch, not one a key.
func (s *Store) redisKeys(n int, key func(int) string) []string {
	size := n * len(s.prefix)
	for i := range n {
		size += len(key(i))
	}
	var b strings.Builder
	b.Grow(size)
	for i := range n {
		b.WriteString(s.prefix)
		b.WriteString(key(i))
	}
	all := b.String()
	keys := make([]string, n)
	off := 0
	for i := range n {
		l := len(s.prefix) + len(key(i))
		keys[i] = all[off : off+l]
		off += l
	}
	return keys
}

// noDuplicates refuses a batch that names one key twice: its results could
// not be told apart, and the second claim would always find the first.
func noDuplicates(op string, n int, key func(int) string) error {
	if n < 2 {
		return nil
	}
	seen := make(map[string]int, n)
	for i := range n {
		k := key(i)
		if j, dup := seen[k]; dup {
			return invalid(op, "requests %d and %d name the same key (key hash %s): a key may appear once per batch", j, i, keyHash(k))
		}
		seen[k] = i
	}
	return nil
}

// newTokens returns n claim tokens: 128 random bits each, in hex. They are
// substrings of one string (one allocation for the batch, not one a key).
func newTokens(n int) []string {
	buf := make([]byte, 48*n)    // 16n random bytes, then their 32n hex digits
	_, _ = rand.Read(buf[:16*n]) // never fails (crypto/rand crashes the program instead)
	hex.Encode(buf[16*n:], buf[:16*n])
	all := string(buf[16*n:])
	out := make([]string, n)
	for i := range out {
		out[i] = all[32*i : 32*i+32]
	}
	return out
}

// keyHash names an effective key in logs and errors without showing it
// (keys may carry personal data): the first 6 bytes of its SHA-256, as the
// engine logs it.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}

// msBox is a duration in milliseconds as a script argument, boxed into an
// interface once while consecutive keys of a batch share it (they nearly
// always do), not once a key.
type msBox struct {
	d time.Duration
	v any
}

func (b *msBox) of(d time.Duration) any {
	if b.v == nil || d != b.d {
		b.d, b.v = d, durMs(d)
	}
	return b.v
}

// durMs converts d to whole milliseconds, rounding up so a positive duration
// never becomes 0.
func durMs(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
