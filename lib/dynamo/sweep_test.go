package dynamo_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"
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
