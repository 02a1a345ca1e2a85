package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// BenchmarkHandOver: a run's hand-over to its continuation (HandOver: the claim's conditional write on a realistic
// thread, then the run item's epoch), one every 10 s of the run's time; WCU/op includes the running index's share.
func BenchmarkHandOver(b *testing.B) {
	f := setup(b)
	measureIndexes(b, f)
	ctx := context.Background()
	th := realisticThread(b, f.store)
	req := claimReq(th.ID, "r1", t0)
	req.Owner = th.Owner
	res, err := f.store.ClaimRun(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	fence := res.Run.Fence()
	f.counter.Reset()
	i := 0
	for b.Loop() {
		i++
		got, err := f.store.HandOver(ctx, agent.HandOverRequest{ThreadID: th.ID, Fence: fence, Now: t0.Add(time.Duration(i) * 10 * time.Second)})
		if err != nil {
			b.Fatal(err)
		}
		fence = got.Run.Fence()
	}
	reportRequests(b, f.counter.Counts(), i)
}
