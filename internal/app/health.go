package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/dedupworker/internal/config"
	"github.com/idemkit/dedupworker/internal/metrics"
)

// The store health checks: Redis settings under which a
// record can vanish, so that a duplicate runs again. Each has a name, the
// check label of dedup_store_risk:
//
//   - eviction: maxmemory-policy is not noeviction. Every record has a TTL,
//     so volatile-* policies evict records as surely as allkeys-*.
//   - persistence: neither AOF (appendonly) nor RDB snapshots (save): a
//     restart comes back empty.
//   - replicas: no connected replica while redis.durability is unset (a
//     lost primary loses its records), or fewer connected replicas than
//     redis.durability.replicas (every write then fails closed).
//   - appendfsync: AOF is on, which is asking for local durability, but
//     appendfsync is "no": the kernel writes the file when it likes (about
//     every 30 s on Linux), and a host crash loses that much. "everysec",
//     Redis's default, loses at most about a second and is not reported;
//     "always" loses nothing.
//   - failover: through Sentinel, a handler's lease is shorter than
//     down-after-milliseconds plus the promotion, so a handler that
//     finishes during a failover may run again (failover.go).
//
// The settings are read with CONFIG GET, and where CONFIG is refused
// (managed Redis, an ACL without +config|get) from INFO, which shows
// maxmemory_policy, aof_enabled and connected_slaves but neither the RDB
// save points nor appendfsync; what neither could read is said, and its
// check skipped. In a Cluster every primary is checked; through Sentinel,
// the primary.

// StoreRisk is one risky setting found on one primary.
type StoreRisk struct {
	// Check is the check's name: eviction, persistence, replicas,
	// appendfsync or failover.
	Check string
	// Node is the primary it was found on.
	Node string
	// Seen is the setting as read ("maxmemory-policy allkeys-lru").
	Seen string
	// Why says what it risks; Fix what to change.
	Why, Fix string
}

// String is the risk as one line of validate --online.
func (r StoreRisk) String() string {
	return fmt.Sprintf("redis %s: store risk %q: %s: %s; fix: %s", r.Node, r.Check, r.Seen, r.Why, r.Fix)
}

// StoreHealth is what CheckStore found.
type StoreHealth struct {
	// Risks are the risky settings, in check order, per primary.
	Risks []StoreRisk
	// Unread says, per primary, which settings could not be read, why,
	// and which checks were skipped for it.
	Unread []string
}

// Risky reports whether check found a risk on some primary.
func (h *StoreHealth) Risky(check string) bool {
	return slices.ContainsFunc(h.Risks, func(r StoreRisk) bool { return r.Check == check })
}

// healthTimeout bounds the health checks and each eviction sample.
const healthTimeout = 5 * time.Second

// CheckStoreHealth connects to the store of rc as run does and runs the
// health checks (validate --online) for the handlers' leases. It fails
// only when Redis cannot be reached; refused reads are in
// StoreHealth.Unread.
func CheckStoreHealth(ctx context.Context, rc *config.Redis, handlers []config.Handler) (*StoreHealth, error) {
	client, err := RedisClient(ctx, rc)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	return checkStore(ctx, client, rc, handlers)
}

// checkStore reads the settings of every primary of client, and of the
// Sentinels, within healthTimeout, and judges them.
func checkStore(ctx context.Context, client redis.UniversalClient, rc *config.Redis, handlers []config.Handler) (*StoreHealth, error) {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var mu sync.Mutex
	var nodes []nodeSettings
	err := forEachPrimary(ctx, client, rc, func(ctx context.Context, c *redis.Client, node string) error {
		n := readSettings(ctx, c, node)
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return n.fatal
	})
	if err != nil {
		return nil, fmt.Errorf("redis: reading the store's settings: %w", err)
	}
	slices.SortFunc(nodes, func(a, b nodeSettings) int { return strings.Compare(a.node, b.node) })
	h := &StoreHealth{}
	for _, n := range nodes {
		h.Risks = append(h.Risks, n.risks(rc.Durability.Replicas)...)
		if u := n.unreadText(); u != "" {
			h.Unread = append(h.Unread, u)
		}
	}
	rs, unread := failoverRisks(ctx, rc, handlers)
	h.Risks = append(h.Risks, rs...)
	if unread != "" {
		h.Unread = append(h.Unread, unread)
	}
	slices.SortStableFunc(h.Risks, func(a, b StoreRisk) int {
		return slices.Index(metrics.StoreRiskChecks, a.Check) - slices.Index(metrics.StoreRiskChecks, b.Check)
	})
	return h, nil
}

// forEachPrimary calls fn with a client of every primary: each master of a
// Cluster (concurrently), else the client itself (a failover client talks
// to the primary).
func forEachPrimary(ctx context.Context, client redis.UniversalClient, rc *config.Redis, fn func(ctx context.Context, c *redis.Client, node string) error) error {
	switch c := client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return fn(ctx, n, n.Options().Addr) })
	case *redis.Client:
		node := c.Options().Addr
		if rc.Sentinel != nil {
			node = fmt.Sprintf("primary of %q", rc.Sentinel.Master)
		}
		return fn(ctx, c, node)
	}
	return fmt.Errorf("unsupported client %T", client)
}

// nodeSettings are the settings read from one primary; a setting that
// could not be read is absent from conf.
type nodeSettings struct {
	node     string
	conf     map[string]string // maxmemory-policy, appendonly, save, appendfsync
	replicas int               // connected replicas; -1 when not read
	unread   []string          // what could not be read, and why
	fatal    error             // Redis did not answer at all
}

// settingNames are the CONFIG GET parameters the checks read.
var settingNames = []string{"maxmemory-policy", "appendonly", "save", "appendfsync"}

// readSettings reads a primary's settings: CONFIG GET each, then INFO for
// what CONFIG did not give and for connected_slaves, which only INFO has.
func readSettings(ctx context.Context, c *redis.Client, node string) nodeSettings {
	n := nodeSettings{node: node, conf: map[string]string{}, replicas: -1}
	var configErr error
	for _, name := range settingNames {
		v, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			if !isRefusal(err) {
				n.fatal = fmt.Errorf("%s: CONFIG GET %s: %w", node, name, err)
				return n
			}
			configErr = err
			break
		}
		if val, ok := v[name]; ok {
			n.conf[name] = val
		}
	}
	info, err := c.Info(ctx).Result()
	switch {
	case err == nil:
		f := parseInfo(info)
		if _, ok := n.conf["maxmemory-policy"]; !ok && f["maxmemory_policy"] != "" {
			n.conf["maxmemory-policy"] = f["maxmemory_policy"]
		}
		if _, ok := n.conf["appendonly"]; !ok && f["aof_enabled"] != "" {
			n.conf["appendonly"] = map[string]string{"1": "yes", "0": "no"}[f["aof_enabled"]]
		}
		if r, err := strconv.Atoi(f["connected_slaves"]); err == nil {
			n.replicas = r
		}
	case isRefusal(err):
		n.unread = append(n.unread, "INFO ("+firstLine(err)+")")
	default:
		n.fatal = fmt.Errorf("%s: INFO: %w", node, err)
		return n
	}
	if configErr != nil {
		var missing []string
		for _, name := range settingNames {
			if _, ok := n.conf[name]; !ok {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			n.unread = append([]string{strings.Join(missing, ", ") + " (CONFIG GET: " + firstLine(configErr) + ")"}, n.unread...)
		}
	}
	return n
}

// risks judges the settings; durable is redis.durability.replicas.
func (n *nodeSettings) risks(durable int) []StoreRisk {
	var rs []StoreRisk
	risk := func(check, seen, why, fix string) {
		rs = append(rs, StoreRisk{Check: check, Node: n.node, Seen: seen, Why: why, Fix: fix})
	}
	if p, ok := n.conf["maxmemory-policy"]; ok && p != "noeviction" {
		risk("eviction", "maxmemory-policy "+p,
			"Redis evicts records when memory is full (every record has a TTL, so volatile-* policies evict them too), and an evicted record lets a duplicate run again",
			"CONFIG SET maxmemory-policy noeviction, and size maxmemory for the records the retention holds (records × bytes per record); a full Redis then refuses writes and the worker fails closed")
	}
	aof, aofKnown := n.conf["appendonly"]
	if save, saveKnown := n.conf["save"]; aofKnown && aof == "no" && saveKnown && strings.TrimSpace(save) == "" {
		risk("persistence", "appendonly no, save \"\"",
			"a restart of Redis comes back without records, and every key of the retention can run again",
			"turn on AOF (appendonly yes) or RDB snapshots (save 60 1000), or run a replica with redis.durability")
	}
	switch {
	case n.replicas == 0 && durable == 0:
		risk("replicas", "connected_slaves 0, redis.durability unset",
			"a lost primary loses its records",
			"add a replica and set redis.durability: {replicas: 1, timeout: 50ms}")
	case n.replicas >= 0 && n.replicas < durable:
		risk("replicas", fmt.Sprintf("connected_slaves %d, redis.durability.replicas %d", n.replicas, durable),
			"no write can be acknowledged by enough replicas: every claim and completion fails closed and nothing is processed",
			"connect more replicas, or lower redis.durability.replicas")
	}
	if fs, ok := n.conf["appendfsync"]; aof == "yes" && ok && fs == "no" {
		risk("appendfsync", "appendonly yes, appendfsync no",
			"the kernel writes the AOF when it likes (about every 30s), and a host crash loses the records of that time",
			"CONFIG SET appendfsync everysec (at most about a second lost) or always")
	}
	return rs
}

// unreadText says what could not be read on the node and which checks that
// skipped, or "" when everything was read.
func (n *nodeSettings) unreadText() string {
	if len(n.unread) == 0 {
		return ""
	}
	var skipped []string
	if _, ok := n.conf["maxmemory-policy"]; !ok {
		skipped = append(skipped, "eviction")
	}
	aof, aofKnown := n.conf["appendonly"]
	if _, ok := n.conf["save"]; !aofKnown || aof == "no" && !ok {
		skipped = append(skipped, "persistence")
	}
	if n.replicas < 0 {
		skipped = append(skipped, "replicas")
	}
	if _, ok := n.conf["appendfsync"]; !aofKnown || aof == "yes" && !ok {
		skipped = append(skipped, "appendfsync")
	}
	if len(skipped) == 0 {
		return ""
	}
	return fmt.Sprintf("redis %s: could not read %s: skipped the %s check(s); the user needs +info (and +config|get to read save and appendfsync) for them",
		n.node, strings.Join(n.unread, " nor "), strings.Join(skipped, ", "))
}

// isRefusal: Redis answered with an error (NOPERM, an unknown or renamed
// command), as opposed to not answering.
func isRefusal(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// parseInfo reads the field:value lines of an INFO reply.
func parseInfo(info string) map[string]string {
	f := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			f[k] = v
		}
	}
	return f
}

// reportStoreHealth runs the checks at the start of run: one warning per
// risk, dedup_store_risk{check} set, and what could not be read said. A
// store that does not answer here is left to the worker (it fails closed).
func (a *App) reportStoreHealth(ctx context.Context) {
	h, err := checkStore(ctx, a.client, &a.cfg.Redis, a.cfg.Handlers)
	if err != nil {
		a.log.Warn("store health checks failed", "err", err)
		return
	}
	for _, r := range h.Risks {
		a.log.Warn("store risk: "+r.Why, "check", r.Check, "node", r.Node, "seen", r.Seen, "fix", r.Fix)
	}
	for _, c := range metrics.StoreRiskChecks {
		a.metrics.SetStoreRisk(c, h.Risky(c))
	}
	for _, u := range h.Unread {
		a.log.Warn("store health checks incomplete", "detail", u)
	}
}

// evictionSampleInterval is how often Run samples INFO stats evicted_keys
// (App.evictionInterval, which tests of this package shorten).
const evictionSampleInterval = 30 * time.Second

// sampleEvictions adds the growth of evicted_keys on every primary to
// dedup_store_evictions_total, with an error log line, every interval until
// ctx ends. The first sample is the baseline; a counter that went down (a
// restarted node) starts a new one. A node that refuses INFO stops the
// sampling, said once.
func (a *App) sampleEvictions(ctx context.Context, interval time.Duration) {
	last := map[string]int64{}
	sample := func() bool {
		sctx, cancel := context.WithTimeout(ctx, healthTimeout)
		defer cancel()
		var mu sync.Mutex
		now := map[string]int64{}
		err := forEachPrimary(sctx, a.client, &a.cfg.Redis, func(ctx context.Context, c *redis.Client, node string) error {
			info, err := c.Info(ctx, "stats").Result()
			if err != nil {
				return fmt.Errorf("%s: %w", node, err)
			}
			v, err := strconv.ParseInt(parseInfo(info)["evicted_keys"], 10, 64)
			if err != nil {
				return fmt.Errorf("%s: INFO stats has no evicted_keys", node)
			}
			mu.Lock()
			now[node] = v
			mu.Unlock()
			return nil
		})
		if err != nil {
			if isRefusal(err) {
				a.log.Warn("not counting evicted records: INFO refused (grant +info)", "err", firstLine(err))
				return false
			}
			if ctx.Err() == nil {
				a.log.Warn("sampling evicted_keys", "err", err)
			}
			return true
		}
		for node, v := range now {
			prev, seen := last[node]
			if grew := v - prev; seen && grew > 0 {
				a.metrics.AddEvictions(grew)
				a.log.Error("Redis evicted keys: an evicted record lets a duplicate run again; set maxmemory-policy noeviction and size maxmemory",
					"node", node, "evicted", grew, "evicted_keys", v)
			}
			last[node] = v
		}
		return true
	}
	if !sample() {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !sample() {
				return
			}
		}
	}
}
