package kafka

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	kafka "github.com/segmentio/kafka-go"
)

// Keeping the membership through a rebalance.
//
// kafka-go's ConsumerGroup runs JoinGroup and SyncGroup itself; three things
// it does made a group that is cut and rebalanced often (the chaos run:
// session timeout 2s, a cut or a killed member every few seconds) stop
// forming for good, with every member's JoinGroup ending in "i/o timeout":
//
//  1. Its JoinGroup deadline is Timeout + RebalanceTimeout from the moment
//     the member joins. A coordinator may hold a JoinGroup longer than that:
//     kfake restarts the rebalance timeout on every join, leave and session
//     expiry, and completes the rebalance only when every member rejoined or
//     the timeout passed with no such event; until then a member that left
//     without a word (killed, or cut while its JoinGroup was held) keeps the
//     rebalance open. A member that gives up its JoinGroup joins again, which
//     restarts the timeout for every other member: when the members' joins
//     are spread over more than Timeout, some member always gives up just
//     before the others would be answered.
//  2. A JoinGroup that fails (i/o timeout, EOF after a cut) makes kafka-go
//     forget the member id without leaving the group (it leaves with the id
//     joinGroup returned on error, which is empty) and join again as a new
//     member. The old member stays: with its JoinGroup held on a dead
//     connection it is one more member that never answers, and a member that
//     joined as new and whose JoinGroup reply could not be delivered stays in
//     kfake's group without any session timer, holding an assignment, until a
//     rebalance completes by its timeout.
//  3. It sends no heartbeat between generations: not while the member
//     drains, nor while its JoinGroup or SyncGroup is held. kfake keeps the
//     session timer of such a member running, so a member that waits longer
//     than the session timeout is removed from the group and its JoinGroup
//     or SyncGroup is never answered: the member waits out its deadline.
//
// The source therefore gives the group a JoinGroup deadline longer than the
// rebalance timeout plus a rejoin spread (groupTimeout); a keeper heartbeats
// the member id kafka-go uses from the end of a generation and from each
// successful JoinGroup until the next generation is handed out (so the
// coordinator keeps the member, and a member the coordinator removed stops
// waiting at once: the ConsumerGroup is re-created and joins as a new
// member); and the source leaves with the member id kafka-go dropped after
// a failed JoinGroup.

// groupTimeout is the ConsumerGroup's Timeout: kafka-go waits Timeout +
// RebalanceTimeout for a JoinGroup and Timeout + SessionTimeout for a
// SyncGroup, and bounds every other coordinator request by Timeout. A
// JoinGroup must outlast the rebalance timeout counted from the last member's
// join, and the members rejoin within RevokeTimeout (their drain) plus a few
// network round trips of each other; so Timeout is NetworkTimeout +
// RebalanceTimeout, and JoinGroup waits NetworkTimeout + 2×RebalanceTimeout.
func (c *Config) groupTimeout() time.Duration { return c.NetworkTimeout + c.RebalanceTimeout }

// errEvicted: the coordinator no longer knows the member whose JoinGroup
// the ConsumerGroup is waiting for; that JoinGroup will not be answered.
var errEvicted = errors.New("kafka: removed from the group while rejoining")

// groupClient sends the few group requests the source makes itself
// (heartbeats between generations, leaving with a forgotten member id),
// on its own connections, each bounded by NetworkTimeout.
type groupClient struct {
	s  *Source
	tr *kafka.Transport
	cl *kafka.Client
}

func (s *Source) newGroupClient() *groupClient {
	d := s.dialer
	nd := &net.Dialer{Timeout: d.Timeout, KeepAlive: d.KeepAlive, LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay}
	if !d.DualStack {
		nd.FallbackDelay = -1
	}
	dial := nd.DialContext
	if d.DialFunc != nil {
		dial = d.DialFunc
	}
	tr := &kafka.Transport{
		Dial:        dial,
		DialTimeout: s.cfg.NetworkTimeout,
		IdleTimeout: 30 * time.Second,
		ClientID:    d.ClientID,
		TLS:         d.TLS,
		SASL:        d.SASLMechanism,
	}
	return &groupClient{
		s:  s,
		tr: tr,
		cl: &kafka.Client{Addr: kafka.TCP(s.cfg.Brokers...), Timeout: s.cfg.NetworkTimeout, Transport: tr},
	}
}

func (c *groupClient) close() { c.tr.CloseIdleConnections() }

// heartbeat sends one heartbeat for member in generation; it returns the
// coordinator's answer (nil, RebalanceInProgress, UnknownMemberID, ...) or
// the error that kept it from answering.
func (c *groupClient) heartbeat(ctx context.Context, member string, generation int32) error {
	resp, err := c.cl.Heartbeat(ctx, &kafka.HeartbeatRequest{GroupID: c.s.cfg.GroupID, GenerationID: generation, MemberID: member})
	if err != nil {
		return err
	}
	return resp.Error
}

// leave removes member from the group.
func (c *groupClient) leave(ctx context.Context, member string) error {
	resp, err := c.cl.LeaveGroup(ctx, &kafka.LeaveGroupRequest{GroupID: c.s.cfg.GroupID, Members: []kafka.LeaveGroupRequestMember{{ID: member}}})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	for _, m := range resp.Members {
		if m.Error != nil {
			return m.Error
		}
	}
	return nil
}

// keeper heartbeats, on its own connections, the member id kafka-go uses
// while kafka-go itself does not: from the end of a generation (kafka-go
// stops its heartbeats, the member drains, kafka-go rejoins) and from each
// successful JoinGroup (kafka-go waits in SyncGroup) until the next
// generation is handed out. The coordinator keeps a member that heartbeats
// while it drains and while its JoinGroup or SyncGroup is held; a member the
// coordinator no longer knows is reported on evicted.
type keeper struct {
	c *groupClient

	mu      sync.Mutex
	stopCur func()
	evicted chan struct{} // closed when the member being kept is unknown
}

func newKeeper(c *groupClient) *keeper {
	return &keeper{c: c, stopCur: func() {}, evicted: make(chan struct{})}
}

// keep heartbeats member in generation from now on, instead of what it
// kept before.
func (k *keeper) keep(member string, generation int32) {
	if k.c.s.noKeeper.Load() {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopCur()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	evicted := make(chan struct{})
	k.evicted = evicted
	go func() {
		defer close(done)
		t := time.NewTicker(k.c.s.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			err := k.c.heartbeat(ctx, member, generation)
			switch {
			case errors.Is(err, kafka.UnknownMemberId):
				close(evicted)
				return
			case errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.FencedInstanceID):
				// A generation formed without this member id and
				// generation: nothing left to keep alive.
				return
			case err != nil && !errors.Is(err, kafka.RebalanceInProgress) && ctx.Err() == nil:
				k.c.s.log.Debug("heartbeat between generations failed", "member", member, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	k.stopCur = func() {
		cancel()
		<-done
	}
}

// stop stops heartbeating.
func (k *keeper) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopCur()
	k.stopCur = func() {}
	k.evicted = make(chan struct{})
}

func (k *keeper) evictedCh() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.evicted
}

// next waits for cg's next generation. When the coordinator no longer knows
// the member the keeper keeps, the JoinGroup or SyncGroup kafka-go waits
// for will not be answered, and next returns errEvicted at once.
func (k *keeper) next(ctx context.Context, cg *kafka.ConsumerGroup) (*kafka.Generation, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// The keeper may switch to a new member id (a JoinGroup
		// succeeded): watch whichever it keeps.
		for {
			ch := k.evictedCh()
			select {
			case <-stop:
				return
			case <-ch:
				if ch == k.evictedCh() {
					cancel(errEvicted)
					return
				}
			case <-time.After(k.c.s.cfg.HeartbeatInterval):
			}
		}
	}()
	gen, err := cg.Next(wctx)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errEvicted) {
		return nil, errEvicted
	}
	return gen, err
}

// joinedAs is a member id and generation kafka-go joined with.
type joinedAs struct {
	member     string
	generation int32
}

// joinedFormat is how kafka-go (v0.4.51, consumergroup.go nextGeneration)
// logs a successful JoinGroup, the only place it tells the member id
// before SyncGroup succeeds.
const joinedFormat = "Joined group %s as member %s in generation %d"

// joinHook passes kafka-go's logs on to l and records, in joined, the
// member id and generation of each successful JoinGroup, which k keeps alive
// while kafka-go waits in SyncGroup.
func joinHook(l kafka.Logger, joined *atomic.Pointer[joinedAs], k *keeper, live *atomic.Bool) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		if format == joinedFormat && len(args) == 3 && live.Load() {
			member, ok1 := args[1].(string)
			gen, ok2 := args[2].(int32)
			if ok1 && ok2 {
				joined.Store(&joinedAs{member: member, generation: gen})
				k.keep(member, gen)
			}
		}
		l.Printf(format, args...)
	})
}
