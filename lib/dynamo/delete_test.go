package dynamo_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// A delete that dies after its tombstone (here: every batch delete fails) leaves a thread that reads as missing
// everywhere and that nothing can claim, create or rename, with its children still there; calling DeleteThread
// again finishes the job, and the id can then be used afresh (REVIEW H3).
func TestHalfDoneDeleteIsTombstoned(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	s := f.store
	th := thread(t, s, "th-tomb")
	claim, err := s.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Message{ID: "u1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
	if err := s.PutMessage(ctx, msgWrite(th.ID, 0, m, claim.Run.Fence(), true, t0)); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendSegment(ctx, agent.Segment{ThreadID: th.ID, RunID: "r1", Seq: 0, Data: []byte("x"), Final: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteThread(ctx, th.ID); !errors.Is(err, agent.ErrRunActive) {
		t.Fatalf("DeleteThread with a claim: %v, want run_active", err)
	}
	if _, err := s.GetThread(ctx, th.ID); err != nil {
		t.Fatalf("a refused delete changed the thread: %v", err)
	}
	done := claim.Run
	done.Status = agent.RunCompleted
	if err := s.FinishRun(ctx, done); err != nil {
		t.Fatal(err)
	}

	failing := dynamo.New(dynamotest.Client(endpoint, dynamotest.FailBatchWrites), f.table)
	if err := failing.DeleteThread(ctx, th.ID); err == nil {
		t.Fatal("DeleteThread with failing batch deletes succeeded")
	}

	pk := "THREAD#" + th.ID
	if n := countPrefix(t, f, pk, ""); n < 3 {
		t.Fatalf("%d items in the partition after the half-done delete, want the tombstone and its children", n)
	}
	if _, err := s.GetThread(ctx, th.ID); !agent.IsKind(err, agent.KindNotFound) {
		t.Errorf("GetThread of a tombstone: %v, want not found", err)
	}
	if list, err := s.ListThreads(ctx, th.Owner, 0); err != nil || len(list) != 0 {
		t.Errorf("ListThreads: %d threads (%v), want the tombstone left out", len(list), err)
	}
	title := "x"
	if _, err := s.UpdateThread(ctx, th.ID, agent.ThreadPatch{Title: &title}, t0); !agent.IsKind(err, agent.KindNotFound) {
		t.Errorf("UpdateThread of a tombstone: %v, want not found", err)
	}
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: th.ID, Owner: th.Owner}); !errors.Is(err, agent.ErrThreadDeleting) {
		t.Errorf("CreateThread of a tombstone: %v, want thread_deleting", err)
	}
	if _, err := s.ClaimRun(ctx, claimReq(th.ID, "r2", t0.Add(time.Hour))); !errors.Is(err, agent.ErrThreadDeleting) {
		t.Errorf("ClaimRun of a tombstone: %v, want thread_deleting", err)
	}
	if _, err := s.RequestCancel(ctx, th.ID, "", t0); !agent.IsKind(err, agent.KindNotFound) {
		t.Errorf("RequestCancel of a tombstone: %v, want not found", err)
	}

	// What a DELETE that reads the id as missing, or a POST that meets the tombstone, calls (REVIEW S10).
	if err := s.FinishDelete(ctx, th.ID); err != nil {
		t.Fatalf("FinishDelete: %v", err)
	}
	if n := countPrefix(t, f, pk, ""); n != 0 {
		t.Fatalf("%d items left in the thread partition", n)
	}
	if n := countPrefix(t, f, "RUNSEG#r1", ""); n != 0 {
		t.Fatalf("%d items left in the segment partition", n)
	}
	fresh, created, err := s.CreateThread(ctx, agent.Thread{ID: th.ID, Owner: "someone-else", CreatedAt: t0, UpdatedAt: t0})
	if err != nil || !created {
		t.Fatalf("CreateThread after the delete = %+v, %v, %v; want a new thread", fresh, created, err)
	}
	if msgs, err := s.ListMessages(ctx, th.ID); err != nil || len(msgs) != 0 {
		t.Fatalf("the new thread sees %d old messages (%v)", len(msgs), err)
	}
}

// Deleting an unknown id still sweeps its partition: what a fenced writer left after a delete goes too.
func TestDeleteSweepsOrphans(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	m := agent.Message{ID: "late", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"zombie"}`)}}
	if err := f.store.PutMessage(ctx, msgWrite("th-gone", 3, m, agent.Fence{RunID: "r-zombie", Epoch: 4}, false, t0)); err != nil {
		t.Fatal(err)
	}
	if err := f.store.DeleteThread(ctx, "th-gone"); err != nil {
		t.Fatal(err)
	}
	if n := countPrefix(t, f, "THREAD#th-gone", ""); n != 0 {
		t.Fatalf("%d orphan items left", n)
	}
}
