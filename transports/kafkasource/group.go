package kafkasource

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Keeping the membership through a rebalance.
//
// kafka-go's ConsumerGroup runs JoinGroup and SyncGroup itself. Two things
// it does cost a real Kafka group extra rebalances, or ghosts, when members
// drain slowly or their connections are cut:
//
//  1. It sends no heartbeat between generations: when a rebalance begins it
//     stops heartbeating, waits for the member's partitions to drain and
//     commit (up to RevokeTimeout), then sends JoinGroup. Kafka expires a
//     member that sends nothing for session.timeout.ms, also while the group
//     prepares a rebalance, so a drain longer than the session timeout got
//     the member removed, and its rejoin as a new member cost one more
//     rebalance (TestDrainHeartbeats). The keeper heartbeats the member id of
//     the generation that ended, on its own connections, from the end of the
//     generation until the coordinator answers that a new generation formed.
//     Kafka counts a member waiting in JoinGroup or SyncGroup as alive, so
//     nothing is needed after the JoinGroup is sent.
//  2. A JoinGroup that fails (i/o timeout, EOF after a cut) makes kafka-go
//     forget the member id without leaving the group, and join again as a
//     new member. The old member then stays in the group until its session
//     expires, and the next rebalance waits for it. The source leaves with
//     the member id kafka-go dropped.
//
// The JoinGroup deadline is kafka-go's Timeout + RebalanceTimeout; Kafka
// holds a JoinGroup for at most the rebalance timeout from the start of the
// rebalance, and members rejoin within RevokeTimeout of it, so the source
// gives the group a Timeout of NetworkTimeout + RebalanceTimeout
// (groupTimeout).

// groupTimeout is the ConsumerGroup's Timeout: kafka-go waits Timeout +
// RebalanceTimeout for a JoinGroup and Timeout + SessionTimeout for a
// SyncGroup, and bounds every other coordinator request by Timeout.
func (c *Config) groupTimeout() time.Duration { return c.NetworkTimeout + c.RebalanceTimeout }

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

// keeper heartbeats, on its own connections, the member id of a generation
// that ended while kafka-go does not: while the member drains and until the
// coordinator says a new generation formed (IllegalGeneration) or no longer
// knows the member. See the top of this file.
type keeper struct {
	c *groupClient

	mu      sync.Mutex
	stopCur func()
}

func newKeeper(c *groupClient) *keeper {
	return &keeper{c: c, stopCur: func() {}}
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
	go func() {
		defer close(done)
		t := time.NewTicker(k.c.s.cfg.HeartbeatInterval)
		defer t.Stop()
		for {
			err := k.c.heartbeat(ctx, member, generation)
			switch {
			case errors.Is(err, kafka.UnknownMemberId), errors.Is(err, kafka.IllegalGeneration), errors.Is(err, kafka.FencedInstanceID):
				// A generation formed, or the member is gone: kafka-go's
				// JoinGroup learns which; nothing left to keep alive.
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

// stop stops heartbeating and waits for the heartbeat goroutine.
func (k *keeper) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopCur()
	k.stopCur = func() {}
}
