package sqlite

import (
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// A file written by version 9 (interrupts indexed by thread and creation only) is migrated in place: it gains
// interrupts_by_message, and a message's interrupts are read through it (REVIEW S7), the older ones included.
func TestMigratesVersion9(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const cols = `(thread_id, id, run_id, epoch, message_id, kind, tool_call_id, tool_name, input, signature, status, response,
		created_at, expires_at, resolved_at)`
	s := migrated(t, 9,
		`INSERT INTO threads (id, owner, title, settings, usage_input, usage_output, usage_total, usage_cached, created_at,
			updated_at, epoch) VALUES ('th1', 'u1', 'old', '{"reviewTools":true}', 0, 0, 0, 0, 1000, 2000, 2)`,
		`INSERT INTO interrupts `+cols+` VALUES ('th1', 'i1', 'r2', 2, 'a1', 'approval', 'c1', 'delete_note', '{"id":1}',
			'sig', 'pending', NULL, 1000, 90000000, NULL)`,
		`INSERT INTO interrupts `+cols+` VALUES ('th1', 'i0', 'r1', 1, 'a0', 'approval', 'c0', 'delete_note', '{"id":0}',
			'sig', 'approved', '{"approved":true}', 500, 90000000, 600)`,
	)
	list, err := s.ListMessageInterrupts(ctx, "th1", "a1")
	if err != nil || len(list) != 1 || list[0].ID != "i1" || string(list[0].Input) != `{"id":1}` {
		t.Fatalf("ListMessageInterrupts(a1) after migration = %+v, %v; want i1", list, err)
	}
	if plan := queryPlan(t, s, listMessageSQL, "th1", "a1"); !strings.Contains(plan, "interrupts_by_message") {
		t.Fatalf("ListMessageInterrupts plan %q does not use interrupts_by_message", plan)
	}
	req := list[0].Resolve(agent.InterruptApproved, time.UnixMilli(3000).UTC())
	if got, err := s.ResolveInterrupt(ctx, req); err != nil || got.Status != agent.InterruptApproved {
		t.Fatalf("ResolveInterrupt after migration = %+v, %v", got, err)
	}
	if all, err := s.ListInterrupts(ctx, "th1"); err != nil || len(all) != 2 {
		t.Fatalf("ListInterrupts after migration = %d, %v", len(all), err)
	}
}
