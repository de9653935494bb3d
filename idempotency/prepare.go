package idempotency

import (
	"context"

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

func (p *processor) claimRequest(pr *prepared) ClaimRequest {
	return ClaimRequest{Key: pr.ekey, Fingerprint: pr.fp, FingerprintVersion: FingerprintVersion, Lease: p.cfg.lease, Retention: p.cfg.retention}
}

func (p *processor) take(d consumer.Delivery) *prepared {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr, ok := p.prepared[d]
	if ok {
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
	delete(p.held, pr.ekey)
	pr.claimed, pr.res, pr.err, pr.claimAt = true, h.res, nil, h.claimAt
	h.claimed, h.res = false, ClaimResult{}
	return true
}
