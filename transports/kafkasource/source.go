package kafkasource

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/dedupworker/consumer"
	"github.com/idemkit/dedupworker/internal/bytebudget"
	"github.com/idemkit/dedupworker/internal/sleep"
)

// ErrRevoked is the cause of a Process context cancelled because its
// partition was revoked in a rebalance and RevokeTimeout ran out.
var ErrRevoked = errors.New("dedup: kafka: partition revoked")

// ErrStopping is the cause of the already-cancelled context with which
// deliveries that were fetched (and prepared) but had not started are handed
// to Runner.Process when the source stops or loses their partition: the
// processor releases their claims and the offsets stay uncommitted.
var ErrStopping = errors.New("dedup: kafka: source stopping: delivery not started")

// Source consumes one topic as a member of a Kafka consumer group and
// implements consumer.Source. Create it with New.
type Source struct {
	cfg Config
	// unfinishedDefault: MaxUnfinished was left to its default
	// (unfinishedFor).
	unfinishedDefault bool
	dialer            *kafka.Dialer
	log               *slog.Logger
	// budget bounds the fetched messages held across all partitions
	// (Config.FetchBufferBytes); Consume calls do not overlap, so one
	// budget serves them all.
	budget *bytebudget.Budget
	// probe is held by a fetch whose size is not known yet
	// (partition.fetchBudgeted): one at a time.
	probe chan struct{}

	// gen is the generation Consume runs now, nil between generations
	// (Lag).
	gen atomic.Pointer[generation]

	noCommit atomic.Bool // tests: simulate a crash before any commit
	noKeeper atomic.Bool // tests: run without the group keeper (group.go)
	// fetchRequests and fetchPartitions are FetchStats's (rounds.go).
	fetchRequests   atomic.Int64
	fetchPartitions atomic.Int64
	// widestRound is the most partitions one round has fetched, for tests.
	widestRound atomic.Int32
}

var _ consumer.Source = (*Source)(nil)

// New validates cfg, fills in its defaults and returns a Source. It does not
// connect: Consume does.
func New(cfg Config) (*Source, error) {
	unfinishedDefault := cfg.MaxUnfinished == 0
	cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, err := cfg.dialer()
	if err != nil {
		return nil, err
	}
	cfg.Brokers = append([]string(nil), cfg.Brokers...)
	return &Source{
		cfg:               cfg,
		unfinishedDefault: unfinishedDefault,
		dialer:            d,
		budget:            bytebudget.New(int64(cfg.FetchBufferBytes)),
		probe:             make(chan struct{}, 1),
		log:               cfg.Logger.With("transport", "kafka", "topic", cfg.Topic, "group", cfg.GroupID),
	}, nil
}

// FetchBufferStats is a snapshot of a Source's bound on fetched messages
// (Config.FetchBufferBytes).
type FetchBufferStats struct {
	// Size is Config.FetchBufferBytes.
	Size int64
	// Held is what the fetched messages not yet done count, with what the
	// fetches in progress set aside; a decoded fetch larger than it set
	// aside can take Held past Size.
	Held int64
	// Waited is the time the partitions' fetchers have spent waiting for
	// room since New, summed over the fetchers: when it grows about as
	// fast as the wall clock times the partitions, the bound, not the
	// broker or the handlers, sets the pace.
	Waited time.Duration
}

// FetchBufferStats returns the state of s's bound on fetched messages. It
// may be called at any time, from any goroutine.
func (s *Source) FetchBufferStats() FetchBufferStats {
	st := s.budget.Stats()
	return FetchBufferStats{Size: st.Size, Held: st.Held, Waited: st.Waited}
}

// FetchStats counts a Source's fetch requests since New. The partitions a
// broker leads fetch in shared requests (see the package doc): Partitions
// ÷ Requests is how many a request carried on average. At a topic's end a
// request long-polls for MaxWait, so each broker gets about one request a
// MaxWait; a far higher rate of requests with few partitions each means
// some partitions are held (their handlers slow, their lanes full) while
// the others wait for records.
type FetchStats struct {
	// Requests is the fetch requests sent.
	Requests int64
	// Partitions is the partitions those requests carried, summed.
	Partitions int64
}

// FetchStats returns s's fetch counts. It may be called at any time, from
// any goroutine.
func (s *Source) FetchStats() FetchStats {
	return FetchStats{Requests: s.fetchRequests.Load(), Partitions: s.fetchPartitions.Load()}
}

// PartitionLag is how far a Source's handling of one partition is behind
// the partition's end.
type PartitionLag struct {
	// Partition is the partition's ID.
	Partition int
	// Offset is where the group would resume the partition now: its
	// lowest offset not yet finished, or the next one to fetch when every
	// fetched offset is finished. The next commit stores it.
	Offset int64
	// End is the partition's end when last read: the offset its next
	// record gets (the high watermark), or under read_committed its last
	// stable offset.
	End int64
	// Lag is End − Offset, at least 0: the offsets not finished yet.
	// Transaction markers and the records of aborted transactions take
	// offsets too, so on a transactional topic Lag also counts records no
	// handler will see.
	Lag int64
	// Seen is when End was read. Every fetch reads it; while the
	// partition's fetcher waits for room (FetchBufferBytes,
	// MaxUnfinished), a listing of the partition's offsets reads it every
	// few seconds instead, so a stuck handler's lag keeps growing.
	Seen time.Time
}

// Lag returns the lag of each partition the source holds in the current
// group generation, in partition order; nil when it holds none (Consume is
// not running, or the group is rebalancing). A partition whose position or
// end is not known yet (its first fetch has not returned) is left out. It
// may be called at any time, from any goroutine.
func (s *Source) Lag() []PartitionLag {
	g := s.gen.Load()
	if g == nil {
		return nil
	}
	out := make([]PartitionLag, 0, len(g.parts))
	for _, p := range g.parts {
		if l, ok := p.lag(); ok {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b PartitionLag) int { return cmp.Compare(a.Partition, b.Partition) })
	return out
}

// Consume joins the group and processes the partitions assigned to this
// member until ctx is cancelled or the source cannot go on (see
// consumer.Source). On cancellation it stops fetching, waits for the
// deliveries it handed to r.Process, commits the finished offsets, leaves
// the group and returns nil. It returns an error for an unknown topic, a
// refused authentication or a configuration the broker rejects.
//
// Consume may be called again after it returned; calls must not overlap.
func (s *Source) Consume(ctx context.Context, r consumer.Runner) error {
	if err := s.checkTopic(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	dlq := s.newDeadLetterWriter()
	defer func() {
		if dlq != nil {
			if err := dlq.close(); err != nil {
				s.log.Warn("closing the dead-letter writer", "err", err)
			}
		}
	}()

	gc := s.newGroupClient()
	defer gc.close()
	keep := newKeeper(gc)
	defer keep.stop()
	newGroup := func() (*kafka.ConsumerGroup, error) {
		return kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
			ID:                s.cfg.GroupID,
			Brokers:           s.cfg.Brokers,
			Dialer:            s.dialer,
			Topics:            []string{s.cfg.Topic},
			HeartbeatInterval: s.cfg.HeartbeatInterval,
			SessionTimeout:    s.cfg.SessionTimeout,
			RebalanceTimeout:  s.cfg.RebalanceTimeout,
			JoinGroupBackoff:  time.Second,
			StartOffset:       s.cfg.startOffset(),
			// Bounds every coordinator request; JoinGroup waits this plus
			// RebalanceTimeout (see group.go).
			Timeout:     s.cfg.groupTimeout(),
			Logger:      kafkaLogger(s.log, slog.LevelDebug),
			ErrorLogger: kafkaLogger(s.log, slog.LevelDebug),
		})
	}
	cg, err := newGroup()
	if err != nil {
		return fmt.Errorf("dedup: kafka: consumer group %q: %w", s.cfg.GroupID, err)
	}

	m := &member{
		s:   s,
		r:   r,
		dlq: dlq,
		// Member-wide cap on deliveries in Process.
		sem:        make(chan struct{}, max(r.Concurrency(), 1)),
		base:       context.WithoutCancel(ctx),
		unfinished: s.unfinishedFor(r.Batching()),
	}
	m.procs = newProcPool(r, max(r.Concurrency(), 1), m.sem)
	// Every generation's lanes returned before Consume does: the pool's
	// goroutines are idle.
	defer m.procs.close()
	var fatal error
	// The member id kafka-go rejoins with: the keeper heartbeats it while
	// the member drains, and the source leaves with it when kafka-go
	// forgets it.
	var lastMember string
	for ctx.Err() == nil {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if isFatal(err) {
				fatal = fmt.Errorf("dedup: kafka: joining group %q: %w", s.cfg.GroupID, err)
				break
			}
			if errors.Is(err, kafka.RebalanceInProgress) {
				// From SyncGroup: kafka-go keeps its member id and
				// rejoins with it.
				s.log.Debug("rebalance in progress; rejoining", "err", err)
				continue
			}
			s.log.Warn("joining the group failed; retrying", "err", err)
			keep.stop()
			if lastMember != "" {
				// kafka-go forgot the member id (a failed JoinGroup
				// returns none) and joins again as a new member without
				// leaving: leave for it, or the old member stays in the
				// group until its session expires and the next rebalance
				// waits for it. When kafka-go left with it already, the
				// coordinator answers UnknownMemberId.
				lctx, cancel := context.WithTimeout(ctx, s.cfg.NetworkTimeout)
				if lerr := gc.leave(lctx, lastMember); lerr != nil && !errors.Is(lerr, kafka.UnknownMemberId) {
					s.log.Debug("leaving with the forgotten member id failed", "member", lastMember, "err", lerr)
				}
				cancel()
				lastMember = ""
			}
			continue
		}
		// kafka-go heartbeats during the generation; the keeper from
		// its end.
		keep.stop()
		lastMember = gen.MemberID
		g := m.newGeneration(gen)
		stopKeepOnEnd := context.AfterFunc(g.gctx, func() { keep.keep(gen.MemberID, gen.ID) })
		revoked, err := g.run(ctx)
		if err != nil {
			fatal = err
		}
		if revoked {
			// The generation ended by itself (rebalance): its work is
			// drained and committed; join the next one.
			g.release()
			continue
		}
		// Stopping (ctx cancelled or a fatal error): the generation is still
		// alive, so its heartbeats kept the member in the group while it
		// drained and committed. Now leave: Close ends the generation, whose
		// end must not be released before Close began, or the group would
		// rejoin once before leaving.
		stopKeepOnEnd()
		keep.stop()
		closed := make(chan struct{})
		go func() {
			_ = cg.Close()
			close(closed)
		}()
		<-g.gctx.Done()
		g.release()
		<-closed
		return fatal
	}
	// Stopped while joining. Close leaves the group, after kafka-go's
	// pending JoinGroup returns (by its deadline, NetworkTimeout +
	// 2×RebalanceTimeout): wait for it only NetworkTimeout, then let it
	// finish in the background.
	closed := make(chan struct{})
	go func() {
		_ = cg.Close()
		close(closed)
	}()
	t := time.NewTimer(s.cfg.NetworkTimeout)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		s.log.Debug("stopped while joining: leaving the group in the background")
	}
	return fatal
}

// checkTopic fails when the topic does not exist after a few tries (a topic
// may be created concurrently with the consumer's start), or when the
// brokers refuse the credentials. Brokers that do not answer are waited for,
// as the group and the fetchers wait for them later, until ctx ends.
func (s *Source) checkTopic(ctx context.Context) error {
	unknown := 0
	for attempt := 1; ; attempt++ {
		parts, err := s.lookupPartitions(ctx)
		var kerr kafka.Error
		switch {
		case err == nil && len(parts) > 0:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case isFatal(err):
			return fmt.Errorf("dedup: kafka: topic %q: %w", s.cfg.Topic, err)
		case err == nil || errors.As(err, &kerr):
			if err == nil {
				err = kafka.UnknownTopicOrPartition
			}
			if unknown++; unknown >= 5 {
				return fmt.Errorf("dedup: kafka: topic %q: %w", s.cfg.Topic, err)
			}
			s.log.Debug("topic not available yet", "attempt", attempt, "err", err)
		default:
			s.log.Warn("brokers do not answer; retrying", "brokers", s.cfg.Brokers, "attempt", attempt, "err", err)
		}
		if !sleep.For(ctx, backoff(attempt+1)) {
			return ctx.Err()
		}
	}
}

func (s *Source) lookupPartitions(ctx context.Context) ([]kafka.Partition, error) {
	var err error
	for _, b := range s.cfg.Brokers {
		c, cancel := context.WithTimeout(ctx, s.cfg.NetworkTimeout)
		var parts []kafka.Partition
		parts, err = s.dialer.LookupPartitions(c, "tcp", b, s.cfg.Topic)
		cancel()
		if err == nil {
			return parts, nil
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) {
			return nil, err
		}
	}
	return nil, err
}

// isFatal reports whether err cannot be fixed by retrying: refused
// credentials, a missing authorization, a configuration the broker rejects,
// a TLS certificate that does not verify.
func isFatal(err error) bool {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr {
		case kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState,
			kafka.GroupAuthorizationFailed, kafka.TopicAuthorizationFailed, kafka.ClusterAuthorizationFailed,
			kafka.InvalidSessionTimeout, kafka.InvalidGroupId, kafka.InconsistentGroupProtocol:
			return true
		}
		return false
	}
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		certInvalid      x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
		recordHeader     tls.RecordHeaderError
	)
	return errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &certInvalid) ||
		errors.As(err, &verify) || errors.As(err, &recordHeader)
}

// member is the state of one Consume call that outlives generations.
type member struct {
	s     *Source
	r     consumer.Runner
	dlq   *deadLetterWriter
	sem   chan struct{}
	base  context.Context // Consume's ctx without its cancellation: the root of Process contexts
	procs *procPool       // runs Process for lanes holding a sem slot
	// unfinished is the partitions' MaxUnfinished for this runner
	// (unfinishedFor).
	unfinished int
}

// unfinishedFor is the MaxUnfinished of a member whose runner batches or
// not: the configured value, or its default, which under partition
// ordering leaves a batching runner's lanes room for two runs, one storing
// its results while the next runs.
func (s *Source) unfinishedFor(batching bool) int {
	if s.unfinishedDefault && batching && s.cfg.Ordering != OrderingKey {
		return 2 * s.cfg.BatchSize
	}
	return s.cfg.MaxUnfinished
}

// generation is this member's share of one group generation: its assigned
// partitions, their fetchers and lanes, and the committer.
type generation struct {
	m     *member
	gen   *kafka.Generation
	gctx  context.Context // done when the generation ends (rebalance or Close)
	hold  chan struct{}   // closed by release: lets the generation end
	parts []*partition

	fatalOnce sync.Once
	fatal     chan error // first unrecoverable fetch error

	commitMu sync.Mutex

	rounds *rounds // the partitions' shared fetches
}

func (m *member) newGeneration(gen *kafka.Generation) *generation {
	g := &generation{
		m:     m,
		gen:   gen,
		hold:  make(chan struct{}),
		fatal: make(chan error, 1),
	}
	// A function started on the generation keeps it from completing until
	// it returns: kafka-go waits for it before rejoining. Holding it open
	// until release lets this member drain and commit with the generation's
	// still-valid member id and generation id, on revoke and on shutdown.
	got := make(chan context.Context, 1)
	gen.Start(func(ctx context.Context) {
		got <- ctx
		<-g.hold
	})
	g.gctx = <-got
	return g
}

func (g *generation) release() { close(g.hold) }

func (g *generation) fail(err error) {
	g.fatalOnce.Do(func() { g.fatal <- err })
}

// run processes the generation's partitions until it ends (revoked=true) or
// ctx is cancelled or a fetch fails for good (revoked=false). Either way,
// when run returns, every delivery it handed out has returned from Process
// and the finished offsets are committed.
func (g *generation) run(ctx context.Context) (revoked bool, fatal error) {
	s := g.m.s
	assigned := g.gen.Assignments[s.cfg.Topic]
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		p := newPartition(g, a.ID, a.Offset)
		g.parts = append(g.parts, p)
		ids = append(ids, a.ID)
	}
	s.log.Info("generation started", "generation", g.gen.ID, "member", g.gen.MemberID, "partitions", ids)
	g.rounds = newRounds(s, g.m.base)
	for _, p := range g.parts {
		p.start()
	}
	s.gen.Store(g)
	defer s.gen.CompareAndSwap(g, nil)

	commitDone := make(chan struct{})
	// listCtx bounds refreshEnds's listings: they end with the committer.
	listCtx, endListing := context.WithCancel(g.gctx)
	defer endListing()
	var commitWG sync.WaitGroup
	commitWG.Go(func() {
		t := time.NewTicker(s.cfg.CommitInterval)
		defer t.Stop()
		var tr *kafka.Transport // refreshEnds's, made at its first listing
		defer func() {
			if tr != nil {
				tr.CloseIdleConnections()
			}
		}()
		for {
			select {
			case <-commitDone:
				return
			case <-t.C:
				g.commit()
				tr = g.refreshEnds(listCtx, tr)
			}
		}
	})

	select {
	case <-ctx.Done():
	case <-g.gctx.Done():
		revoked = true
	case fatal = <-g.fatal:
	}
	// Deliveries not started yet are handed over cancelled (ErrStopping).
	for _, p := range g.parts {
		p.stop(ErrStopping)
	}
	g.rounds.stop()

	// Drain: every goroutine of every partition returns. A revoked
	// generation gives in-flight work RevokeTimeout, then cancels it; a
	// stopping one waits, bounded by the worker's own drain deadline on the
	// Process contexts — unless the generation ends meanwhile.
	done := make(chan struct{})
	go func() {
		for _, p := range g.parts {
			p.wait()
		}
		close(done)
	}()
	var timeout <-chan time.Time
	if revoked {
		t := time.NewTimer(s.cfg.RevokeTimeout)
		defer t.Stop()
		timeout = t.C
	}
	gctxDone := g.gctx.Done()
	if revoked {
		gctxDone = nil
	}
drain:
	for {
		select {
		case <-done:
			break drain
		case <-gctxDone:
			gctxDone = nil
			t := time.NewTimer(s.cfg.RevokeTimeout)
			defer t.Stop()
			timeout = t.C
		case <-timeout:
			s.log.Warn("revoke timeout: cancelling in-flight deliveries", "generation", g.gen.ID, "timeout", s.cfg.RevokeTimeout)
			for _, p := range g.parts {
				p.cancelWork(ErrRevoked)
			}
			timeout = nil
		}
	}
	// Every fetcher has returned (p.wait): none joins the rounds any more.
	g.rounds.wait()
	endListing()
	close(commitDone)
	commitWG.Wait()
	g.commit()
	for _, p := range g.parts {
		p.cancelWork(context.Canceled)
	}
	s.log.Info("generation ended", "generation", g.gen.ID, "revoked", revoked)
	return revoked, fatal
}

// endStale is how old a partition's end may be before refreshEnds lists
// it, unless MaxWait is longer: a fetcher that fetches reads the end at
// least every MaxWait, so only one waiting for room falls behind.
const endStale = 5 * time.Second

// refreshEnds reads the ends of the generation's partitions that no fetch
// has reported for endStale (or ever), in one listing through tr (made
// when nil, and returned for the next call), so Lag stays current while
// fetchers wait. A failed listing is logged at debug level and tried again
// at the next tick: the lag is only reported, nothing depends on it.
func (g *generation) refreshEnds(ctx context.Context, tr *kafka.Transport) *kafka.Transport {
	s := g.m.s
	var ids []int
	now := time.Now()
	staleAfter := max(endStale, 2*s.cfg.MaxWait)
	for _, p := range g.parts {
		p.mu.Lock()
		stale := now.Sub(p.endAt) >= staleAfter // also a partition not fetched yet
		p.mu.Unlock()
		if stale {
			ids = append(ids, p.id)
		}
	}
	if len(ids) == 0 {
		return tr
	}
	if tr == nil {
		tr = s.transport()
	}
	ends, err := s.listEnds(ctx, tr, ids, s.cfg.isolationLevel())
	if err != nil {
		if ctx.Err() != nil {
			return tr
		}
		s.log.Debug("listing partition ends for the lag failed", "partitions", ids, "err", err)
		return tr
	}
	for _, p := range g.parts {
		if end, ok := ends[p.id]; ok {
			p.seeEnd(end)
		}
	}
	return tr
}

// commit commits, for every partition whose watermark moved, the lowest
// offset not yet finished.
func (g *generation) commit() {
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	if g.m.s.noCommit.Load() {
		return
	}
	offsets := make(map[int]int64)
	for _, p := range g.parts {
		if w, ok := p.toCommit(); ok {
			offsets[p.id] = w
		}
	}
	if len(offsets) == 0 {
		return
	}
	topic := g.m.s.cfg.Topic
	// CommitOffsets is bounded by the group's network timeout.
	if err := g.gen.CommitOffsets(map[string]map[int]int64{topic: offsets}); err != nil {
		g.m.s.log.Warn("committing offsets failed; they will be delivered again", "generation", g.gen.ID, "offsets", offsets, "err", err)
		return
	}
	for _, p := range g.parts {
		if w, ok := offsets[p.id]; ok {
			p.committed(w)
		}
	}
	g.m.s.log.Debug("committed", "generation", g.gen.ID, "offsets", offsets)
}

// kafkaLogger adapts kafka-go's Printf-style logger to slog.
func kafkaLogger(l *slog.Logger, level slog.Level) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		if l.Enabled(context.Background(), level) {
			l.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "kafka-go")
		}
	})
}
