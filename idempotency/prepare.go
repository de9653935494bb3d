package idempotency

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/idemkit/dedupworker/consumer"
)

// inspect reads d's fingerprint and idempotency key into a new prepared
// state, not claimed yet.
func (p *processor) inspect(d consumer.Delivery) *prepared {
	pr := &prepared{}
	p.inspectInto(pr, d)
	return pr
}

// inspectInto is inspect into the zero prepared pr, for a batch that
// allocates its prepared states together.
func (p *processor) inspectInto(pr *prepared, d consumer.Delivery) {
	m := d.Message()
	pr.fp = Fingerprint(m, p.cfg.fpHeaders)
	key, _, err := ExtractKey(m, p.cfg.keySources, pr.fp)
	if err != nil {
		p.log.Warn("key extraction failed; treating as missing key", "origin", m.Origin.String(), "err", err)
	}
	if key != "" {
		pr.key = key
		pr.ekey = EffectiveKey(p.name, key)
	}
}

// Prepare claims the keys of a fetched batch in one store call,
// which the batches other partitions fetched while an earlier
// call was in flight share (newPrepareClaimer). A key that appears twice in the batch is claimed for its first
// delivery only; the later one claims when it runs and finds the key in
// flight or done.
//
// The batch's prepared states are one allocation: each stays reachable
// until its delivery took it (take) and ran, so the slab lives as long as
// the batch's last delivery.
func (p *processor) Prepare(ctx context.Context, batch []consumer.Delivery) {
	prs := make([]prepared, len(batch))
	reqs := make([]ClaimRequest, 0, len(batch))
	idx := make([]int, 0, len(batch))
	seen := make(map[string]struct{}, len(batch))
	for i, d := range batch {
		pr := &prs[i]
		p.inspectInto(pr, d)
		if pr.key == "" || ctx.Err() != nil {
			continue
		}
		if _, dup := seen[pr.ekey]; dup {
			continue
		}
		seen[pr.ekey] = struct{}{}
		reqs = append(reqs, p.claimRequest(pr))
		idx = append(idx, i)
	}
	if len(reqs) > 0 && p.e.preparer.route != nil {
		p.prepareEach(ctx, batch, prs, reqs, idx)
		return
	}
	if len(reqs) > 0 {
		now := p.e.clock.Now()
		cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
		res, errs := p.e.preparer.doAll(cctx, reqs, false)
		cancel()
		for j, i := range idx {
			pr := &prs[i]
			pr.claimed, pr.claimAt, pr.err, pr.batched = true, now, errs[j], true
			if errs[j] == nil {
				pr.res = res[j]
			}
		}
	}
	p.mu.Lock()
	for i, d := range batch {
		pr := &prs[i]
		p.prepared[d] = pr
		if pr.claimed && pr.err == nil && pr.res.Outcome.Owned() {
			p.held[pr.ekey] = pr
		}
	}
	p.mu.Unlock()
}

// prepareEach is Prepare on a store whose keys live on several nodes
// (NodeRouter). The claims go to the preparer, which sends each node's
// part of a batch as its own call and answers it as that node answers
// (sendByNode); a node in trouble has a batcher of its own. Prepare
// returns, as one call would, once every claim was answered, so that the
// source starts the deliveries in order with their claims at hand; but no
// longer than slowNode after which a node that has not answered is in
// trouble: the deliveries of its keys then wait for their own answer when
// they run (await), and the others run at once.
func (p *processor) prepareEach(ctx context.Context, batch []consumer.Delivery, prs []prepared, reqs []ClaimRequest, idx []int) {
	now := p.e.clock.Now()
	for _, i := range idx {
		pr := &prs[i]
		pr.claimed, pr.claimAt, pr.batched = true, now, true
		pr.out.Store(true)
	}
	// Each key is held from now: a delivery of the same key that runs
	// first waits for the answer in adopt, and adopts an owned claim.
	p.mu.Lock()
	for i, d := range batch {
		p.prepared[d] = &prs[i]
	}
	for _, i := range idx {
		p.held[prs[i].ekey] = &prs[i]
	}
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, p.e.timeout)
	all := make(chan struct{})
	var left atomic.Int64
	left.Store(int64(len(reqs)))
	p.e.preparer.doEachRouted(cctx, reqs, idx, false, func(i int, res ClaimResult, err error) {
		pr := &prs[i]
		pr.res, pr.err = res, err
		p.mu.Lock()
		pr.out.Store(false)
		if pr.ready != nil {
			close(pr.ready)
		}
		if (err != nil || !res.Outcome.Owned()) && p.held[pr.ekey] == pr {
			delete(p.held, pr.ekey)
		}
		p.mu.Unlock()
		if left.Add(-1) == 0 {
			cancel()
			close(all)
		}
	})
	slow := time.NewTimer(slowNode)
	defer slow.Stop()
	select {
	case <-all:
	case <-slow.C:
	case <-ctx.Done():
	}
}

// await waits until pr's claim, sent by prepareEach, was answered: within
// the store timeout, as the claim call runs under it. A delivery whose
// context ended waits too, so that abandon can give its claim back.
func (p *processor) await(pr *prepared) {
	if pr == nil || !pr.out.Load() {
		return
	}
	p.mu.Lock()
	if !pr.out.Load() {
		p.mu.Unlock()
		return
	}
	if pr.ready == nil {
		pr.ready = make(chan struct{})
	}
	ready := pr.ready
	p.mu.Unlock()
	<-ready
}

func (p *processor) claimRequest(pr *prepared) ClaimRequest {
	return ClaimRequest{Key: pr.ekey, Fingerprint: pr.fp, FingerprintVersion: FingerprintVersion, Lease: p.cfg.lease, Retention: p.cfg.retention}
}

func (p *processor) take(d consumer.Delivery) *prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.prepared[d]
	if ok {
		pr.taken = true
		delete(p.prepared, d)
		if p.held[pr.ekey] == pr {
			delete(p.held, pr.ekey)
		}
	}
	return pr
}

// adopt moves a held claim of pr's key, made for a delivery that has not
// started, to pr. That delivery will claim afresh when it runs, and find the
// key done. It reports whether there was one.
func (p *processor) adopt(pr *prepared) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	h, ok := p.held[pr.ekey]
	if !ok || h == pr {
		return false
	}
	if h.out.Load() {
		// prepareEach's claim of the key: wait for its answer.
		if h.ready == nil {
			h.ready = make(chan struct{})
		}
		ready := h.ready
		p.mu.Unlock()
		<-ready
		p.mu.Lock()
		if p.held[pr.ekey] != h || h.err != nil || !h.res.Outcome.Owned() {
			return false
		}
	}
	delete(p.held, pr.ekey)
	pr.claimed, pr.res, pr.err, pr.claimAt = true, h.res, nil, h.claimAt
	h.claimed, h.res = false, ClaimResult{}
	return true
}
