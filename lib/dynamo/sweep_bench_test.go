package dynamo_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// BenchmarkReaperSweep measures what one reaper sweep (ListStaleClaims with the default batch) reads from a table
// holding 10,000 finished runs, 50 live claims and 10 stale ones: requests, read units (as the server reports
// them) and claims found; and what the tick's orphan sweep (ListOrphanRuns) costs beside it, the first one (which
// takes the threads the turns left idle out of the index) and a steady one, in the same sweep as a stale-claims
// sweep (reaper.Tick). Finished runs are not in the sparse running index and live claims sit in buckets after
// the cutoff, so the sweep costs one small Query per shard plus one BatchGetItem for the stale threads, whatever
// the table holds. The table is built with the store's own ClaimRun and FinishRun, concurrently.
func BenchmarkReaperSweep(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	s := f.store
	const (
		threads       = 1000
		runsPerThread = 10 // 10,000 finished runs
		live, stale   = 50, 10
		staleAfter    = 30 * time.Second
	)
	now := t0.Add(time.Hour)
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	sem := make(chan struct{}, 16)
	for i := range threads {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			id := fmt.Sprintf("th-done-%04d", i)
			thread(b, s, id)
			for r := range runsPerThread {
				at := t0.Add(time.Duration(r) * time.Minute)
				res, err := s.ClaimRun(ctx, claimReq(id, fmt.Sprintf("r-%04d-%02d", i, r), at))
				if err != nil {
					errs <- err
					return
				}
				run := res.Run
				run.Status, run.FinishedAt = agent.RunCompleted, at.Add(time.Second)
				if err := s.FinishRun(ctx, run); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	for i := range live + stale {
		id := fmt.Sprintf("th-claimed-%03d", i)
		thread(b, s, id)
		hb := now.Add(-time.Second) // live: a heartbeat a second ago
		if i < stale {
			hb = now.Add(-staleAfter - time.Duration(i+1)*time.Second) // stale: silent for more than staleAfter
		}
		if _, err := s.ClaimRun(ctx, claimReq(id, "r-"+id, hb)); err != nil {
			b.Fatal(err)
		}
	}

	// Released threads stay in the running index until the orphan sweep finds their runs recorded (REVIEW D15):
	// the reaper's first tick after the turns takes the 1,000 idle threads out, one write each, once.
	f.counter.Reset()
	if orphans, err := s.ListOrphanRuns(ctx, now.Add(-staleAfter), 0); err != nil || len(orphans) != 0 {
		b.Fatalf("first orphan sweep: %d orphans, %v", len(orphans), err)
	}
	first := f.counter.Counts()

	f.counter.Reset()
	sweeps := 0
	for b.Loop() {
		got, err := s.ListStaleClaims(ctx, now.Add(-staleAfter), 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != stale {
			b.Fatalf("sweep found %d stale claims, want %d", len(got), stale)
		}
		sweeps++
	}
	c := f.counter.Counts()
	b.ReportMetric(float64(c.Reads)/float64(sweeps), "requests/sweep")
	b.ReportMetric(c.ReadUnits/float64(sweeps), "RCU/sweep")
	b.ReportMetric(stale, "stale/sweep")
	b.ReportMetric(threads*runsPerThread, "finished-runs")
	// The orphan sweep of the same tick reads the same index (the stale claims are claimed: read, not named); in
	// one sweep (agent.WithSweep, as reaper.Tick) it reuses the stale-claims sweep's reads of the shards.
	sweep := agent.WithSweep(ctx)
	if _, err := s.ListStaleClaims(sweep, now.Add(-staleAfter), 0); err != nil {
		b.Fatal(err)
	}
	f.counter.Reset()
	if orphans, err := s.ListOrphanRuns(sweep, now.Add(-staleAfter), 0); err != nil || len(orphans) != 0 {
		b.Fatalf("orphan sweep: %d orphans, %v", len(orphans), err)
	}
	o := f.counter.Counts()
	b.ReportMetric(float64(o.Reads), "orphan-requests/sweep")
	b.ReportMetric(o.ReadUnits, "orphan-RCU/sweep")
	b.ReportMetric(float64(first.Writes), "first-orphan-sweep-writes") // after b.Loop, which resets earlier metrics
}
