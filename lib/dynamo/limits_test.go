package dynamo_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The requests each limit operation costs (the package doc's budget): a lease taken in a scope with room, its
// renew and its release, and a counted event are one UpdateItem each; a refusal reads the item once more (from
// the failed condition on DynamoDB, a GetItem on dynalite); a scope whose entries expired is purged by the
// acquire that finds it full, with one extra read and one conditional write.
func TestLimitRequests(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	now := time.Date(2031, 5, 6, 7, 8, 9, 123_000_000, time.UTC)
	lease := func(holder string, limit int, at time.Duration) agent.LeaseRequest {
		return agent.LeaseRequest{Scope: "runs/u1", Holder: holder, Limit: limit, TTL: 10 * time.Second, Now: now.Add(at)}
	}
	for _, tc := range []struct {
		name         string
		op           func() (time.Duration, error)
		want         time.Duration
		reads, write int64
	}{
		{"first lease of a scope", func() (time.Duration, error) { return f.store.AcquireLease(ctx, lease("a", 2, 0)) }, 0, 0, 1},
		{"second lease", func() (time.Duration, error) { return f.store.AcquireLease(ctx, lease("b", 2, 0)) }, 0, 0, 1},
		{"refused", func() (time.Duration, error) { return f.store.AcquireLease(ctx, lease("c", 2, time.Second)) }, 9 * time.Second, 1, 1},
		{"renew", func() (time.Duration, error) { return 0, f.store.RenewLease(ctx, lease("a", 0, 2*time.Second)) }, 0, 0, 1},
		{"release", func() (time.Duration, error) { return 0, f.store.ReleaseLease(ctx, "runs/u1", "a") }, 0, 0, 1},
		{"release again", func() (time.Duration, error) { return 0, f.store.ReleaseLease(ctx, "runs/u1", "a") }, 0, 0, 1},
		{"lease in a freed slot", func() (time.Duration, error) { return f.store.AcquireLease(ctx, lease("c", 2, 3*time.Second)) }, 0, 0, 1},
		{"full of expired entries: purge", func() (time.Duration, error) { return f.store.AcquireLease(ctx, lease("d", 2, time.Minute)) }, 0, 1, 2},
		{"count", func() (time.Duration, error) {
			return f.store.Count(ctx, agent.CountRequest{Scope: "threads/u1", Window: time.Minute, Limit: 1, Now: now})
		}, 0, 0, 1},
		{"count refused", func() (time.Duration, error) {
			return f.store.Count(ctx, agent.CountRequest{Scope: "threads/u1", Window: time.Minute, Limit: 1, Now: now})
		}, 50*time.Second + 877*time.Millisecond, 0, 1},
	} {
		before := f.counter.Counts()
		got, err := tc.op()
		d := f.counter.Counts().Sub(before)
		if err != nil || got != tc.want {
			t.Fatalf("%s: retryAfter %s, %v; want %s", tc.name, got, err, tc.want)
		}
		if d.Reads != tc.reads || d.Writes != tc.write {
			t.Errorf("%s: %d reads and %d writes (%v), want %d and %d", tc.name, d.Reads, d.Writes, fmt.Sprint(d.ByOperation), tc.reads, tc.write)
		}
	}
}
