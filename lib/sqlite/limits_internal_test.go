package sqlite

import (
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// A file written by version 4 (the schema before per-user limits) is migrated in place: what it holds reads
// back, and its users take leases and counts.
func TestMigratesVersion4(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := migrated(t, 4,
		`INSERT INTO threads VALUES ('th1', 'u1', 'old', '{"reviewTools":true}', 1, 2, 3, 0, 1000, 2000, 2, NULL, NULL, NULL, 0, 5, 0)`,
		`INSERT INTO messages VALUES ('th1', 'a1', 4, 'assistant', '[{"type":"text","text":"yo"}]', NULL, 1000, 1000, 'r1', 2, 1, 0)`,
	)
	if th, err := s.GetThread(ctx, "th1"); err != nil || th.Title != "old" || th.Epoch != 2 {
		t.Fatalf("GetThread after migration = %+v, %v", th, err)
	}
	if msgs, err := s.ListMessages(ctx, "th1"); err != nil || len(msgs) != 1 || msgs[0].Seq != 4 {
		t.Fatalf("ListMessages after migration = %+v, %v", msgs, err)
	}
	now := time.UnixMilli(3000).UTC()
	lease := agent.LeaseRequest{Scope: "runs/u1", Holder: "r1", Limit: 1, TTL: time.Minute, Now: now}
	if retry, err := s.AcquireLease(ctx, lease); err != nil || retry != 0 {
		t.Fatalf("AcquireLease after migration = %v, %v", retry, err)
	}
	lease.Holder = "r2"
	if retry, err := s.AcquireLease(ctx, lease); err != nil || retry != time.Minute {
		t.Fatalf("AcquireLease over the limit after migration = %v, %v; want refused for a minute", retry, err)
	}
	if retry, err := s.Count(ctx, agent.CountRequest{Scope: "threads/u1", Window: time.Minute, Limit: 1, Now: now}); err != nil || retry != 0 {
		t.Fatalf("Count after migration = %v, %v", retry, err)
	}
}
