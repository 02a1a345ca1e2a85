package dynamo_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// shardOfThread is the store's shard of a thread in an index of n shards (fnv-32a of the id, mod n), so that the
// test can place one stale claim in each shard.
func shardOfThread(id string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// REVIEW D11: a sweep that reaches its batch bound in the first shards must not start there again next time, or
// claims in the high shards wait for as long as the low ones stay busy. With one stale claim in every shard and a
// batch of one, consecutive sweeps name every claim, one shard after another.
func TestSweepRotatesItsFirstShard(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	const shards = 16
	ids := map[int]string{}
	for i := 0; len(ids) < shards; i++ {
		id := fmt.Sprintf("th-shard-%03d", i)
		if sh := shardOfThread(id, shards); ids[sh] == "" {
			ids[sh] = id
			thread(t, s, id)
			if _, err := s.ClaimRun(ctx, claimReq(id, "r-"+id, t0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := map[string]bool{}
	for range shards {
		got, err := s.ListStaleClaims(ctx, t0.Add(time.Hour), 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 {
			t.Fatalf("sweep with a batch of 1 named %d claims, want 1", len(got))
		}
		seen[got[0].ThreadID] = true
	}
	if len(seen) != shards {
		t.Fatalf("%d sweeps of batch 1 named %d distinct claims, want one in each of the %d shards: %v", shards, len(seen), shards, seen)
	}
}

// The orphan sweep of a reaper tick reads the running index with the same condition as the tick's stale-claims
// sweep just did: within one sweep (agent.WithSweep) it reuses those reads instead of querying the 16 shards
// again. An idle tick's two lists cost 16 Queries, not 32 (issue 16 "Left" 5; README "idle reaper tick"). It still
// finds a claimless running run (here: released, its outcome never recorded) the stale sweep read; outside a sweep,
// or in a later one, it queries as before.
func TestOrphanSweepReusesTheStaleSweepsReads(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.store
	before := t0.Add(time.Hour)
	queries := func(what string, list func(ctx context.Context) error, ctx context.Context) int64 {
		t.Helper()
		f.counter.Reset()
		if err := list(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return f.counter.Counts().ByOperation["Query"]
	}
	stale := func(ctx context.Context) error { _, err := s.ListStaleClaims(ctx, before, 0); return err }
	var orphans []agent.Run
	orphan := func(ctx context.Context) error {
		var err error
		orphans, err = s.ListOrphanRuns(ctx, before, 0)
		return err
	}

	// Idle: nothing in the index.
	sweep := agent.WithSweep(context.Background())
	if n := queries("idle stale sweep", stale, sweep); n != 16 {
		t.Fatalf("the idle stale-claims sweep made %d Queries, want 16 (one per shard)", n)
	}
	if n := queries("idle orphan sweep", orphan, sweep); n != 0 {
		t.Fatalf("the idle orphan sweep of the same tick made %d Queries, want 0 (the stale sweep's reads reused)", n)
	}
	if n := queries("orphan sweep outside a sweep", orphan, context.Background()); n != 16 {
		t.Fatalf("an orphan sweep outside a tick made %d Queries, want 16", n)
	}

	// A run released and never recorded: the next tick's orphan sweep names it from the stale sweep's reads.
	thread(t, s, "th-orphan")
	res, err := s.ClaimRun(context.Background(), claimReq("th-orphan", "r-orphan", t0))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseClaim(context.Background(), agent.ReleaseRequest{ThreadID: "th-orphan", Fence: res.Run.Fence(), Now: t0}); err != nil {
		t.Fatal(err)
	}
	sweep = agent.WithSweep(context.Background())
	queries("stale sweep", stale, sweep)
	if n := queries("orphan sweep", orphan, sweep); n != 0 || len(orphans) != 1 || orphans[0].ID != "r-orphan" {
		t.Fatalf("the orphan sweep made %d Queries and named %v, want 0 Queries and r-orphan", n, orphans)
	}
	// The reads serve one orphan sweep: another one in the same sweep queries again.
	if n := queries("second orphan sweep", orphan, sweep); n != 16 || len(orphans) != 1 {
		t.Fatalf("a second orphan sweep made %d Queries and named %v, want 16 and r-orphan", n, orphans)
	}
}
