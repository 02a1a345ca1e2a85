package reaper_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
)

// ReapAllClaims reaps every claim at once, fresh heartbeats too, through the same takeover as a tick (the caller
// knows every writer of the store is dead: the local stack holding its data directory's lock). A tick leaves the
// fresh claims alone; ReapAllClaims finishes them failed (stale) and gives back the threads. Its batch is smaller than the claims, so it lists until none is left.
func TestReapAllClaimsReapsFreshClaims(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	now := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		f.claim(t, id, "run_"+id, now)
	}
	if st, err := f.r.Tick(ctx); err != nil || st.Reaped != 0 {
		t.Fatalf("Tick = %+v, %v; want fresh claims left alone", st, err)
	}
	r := reaper.New(reaper.Deps{Store: f.store, Clock: agent.SystemClock{}}, reaper.Config{StaleAfter: time.Hour, Batch: 2})
	n, err := r.ReapAllClaims(ctx)
	if err != nil || n != 3 {
		t.Fatalf("ReapAllClaims = %d, %v; want 3", n, err)
	}
	for _, id := range []string{"a", "b", "c"} {
		f.idle(t, id)
		run, _ := f.store.GetRun(ctx, id, "run_"+id)
		if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale {
			t.Fatalf("run %s = %+v, want failed (stale)", id, run)
		}
	}
	if n, err := r.ReapAllClaims(ctx); err != nil || n != 0 {
		t.Fatalf("second ReapAllClaims = %d, %v; want nothing left", n, err)
	}
}
