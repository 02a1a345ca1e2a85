package engine_test

import (
	"context"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// keepEach answers a KeepClaims batch with one call of heartbeat per claim (under the claim's gate), so that a
// test store that injects faults, crashes or delays into Heartbeat does the same to the keeper's batches. The
// claims come back zero: the engine reads only the errors.
func keepEach(ctx context.Context, claims []agent.KeptClaim, now time.Time,
	heartbeat func(ctx context.Context, threadID string, f agent.Fence, now time.Time) error) []agent.KeepResult {
	out := make([]agent.KeepResult, len(claims))
	for i, k := range claims {
		if k.Gate != nil {
			if err := k.Gate(); err != nil {
				out[i].Err = agent.Wrap(err, agent.KindUnavailable, agent.CodeStoreUnavailable, "write gate: attempt not sent")
				continue
			}
		}
		out[i].Err = heartbeat(agent.WithWriteGate(ctx, k.Gate), k.ThreadID, k.Fence, now)
	}
	return out
}
