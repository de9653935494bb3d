package idempotency

import (
	"context"

	"github.com/idemkit/dedupworker/internal/claimctx"
	"github.com/idemkit/dedupworker/internal/ctxshare"
)

// handlerRun is what one run of the handler under a claim needs, in one
// allocation: the context that carries the run's state (claimctx.From finds
// it), the lease renewer, and the cancel of the handler's context, which is
// derived from it.
type handlerRun struct {
	ctxshare.Carrier[claimctx.Key, runState]
	renewer renewer
	cancel  context.CancelCauseFunc // the handler context's
}
