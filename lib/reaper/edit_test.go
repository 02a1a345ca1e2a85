package reaper_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
)

// Fence D (issue 16 "Left" 5): an edit commits in one write on the edited message, which hides every later
// message; deleting them and canceling the interrupts of a reply it dropped is cleanup the editing run does
// afterwards. When that run dies right after its edit's write, the reaper finishes the cleanup: the messages the
// edit hid are deleted (DynamoDB keeps them stored until then: agent.EditCleaner), the pending approval of the
// dropped reply is canceled, and what readers see is unchanged: the edited message and the reaper's failed reply.
// On both stores.
func TestReapFinishesADeadEditsCleanup(t *testing.T) {
	t.Parallel()
	onBothStores(t, reapDeadEdit)
}

func reapDeadEdit(t *testing.T, st agent.Store) {
	ctx := context.Background()
	old := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	clock := &stepClock{now: old}
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	const th = "th"
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: th, Owner: "alice", CreatedAt: old, UpdatedAt: old}); err != nil {
		t.Fatal(err)
	}
	text := func(s string) []json.RawMessage {
		return []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: s})}
	}
	put := func(run agent.Run, seq int64, m agent.Message, hideBefore int64) {
		t.Helper()
		if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: th, Seq: seq, Message: m, Fence: run.Fence(), Final: true, Now: clock.Now(),
			HideBefore: hideBefore}); err != nil {
			t.Fatalf("PutMessage %s: %v", m.ID, err)
		}
	}
	turn := func(n string, trigger agent.Trigger, userID string) agent.Run {
		t.Helper()
		res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: th, Owner: "alice", RunID: "run_" + n, Trigger: trigger,
			AssistantMessageID: "a" + n, UserMessageID: userID, Now: clock.Now(), Reserve: 2})
		if err != nil {
			t.Fatal(err)
		}
		return res.Run
	}
	finish := func(run agent.Run, status agent.RunStatus) {
		t.Helper()
		run.Status, run.FinishedAt, run.UpdatedAt = status, clock.Now(), clock.Now()
		if err := st.FinishRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	reply := func(run agent.Run, status agent.MessageStatus, parts []json.RawMessage) agent.Message {
		md, _ := json.Marshal(agent.MessageMetadata{Status: status, RunID: run.ID})
		return agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: parts, Metadata: md}
	}

	// Turn 1 answered; turn 2 asks for an approval.
	run1 := turn("1", agent.TriggerUser, "u1")
	u1 := agent.Message{ID: "u1", Role: agent.RoleUser, Parts: text("first")}
	put(run1, run1.FirstSeq, u1, 0)
	put(run1, run1.AssistantSeq(), reply(run1, agent.MessageCompleted, text("You said: first")), 0)
	finish(run1, agent.RunCompleted)
	run2 := turn("2", agent.TriggerUser, "u2")
	put(run2, run2.FirstSeq, agent.Message{ID: "u2", Role: agent.RoleUser, Parts: text("delete it")}, 0)
	put(run2, run2.AssistantSeq(), reply(run2, agent.MessageInterrupted, []json.RawMessage{agent.EncodePart(agent.Part{
		Type: "tool-delete_note", ToolCallID: "c1", State: agent.StateApprovalRequested, Input: json.RawMessage(`{"id":"n1"}`),
		Approval: &agent.PartApproval{ID: "apr_1"}})}), 0)
	if _, _, err := st.CreateInterrupt(ctx, agent.Interrupt{ID: "apr_1", ThreadID: th, RunID: run2.ID, Epoch: run2.Epoch, MessageID: "a2",
		Kind: agent.InterruptApproval, ToolCallID: "c1", ToolName: "delete_note", Input: json.RawMessage(`{"id":"n1"}`),
		Status: agent.InterruptPending, CreatedAt: clock.Now(), ExpiresAt: clock.Now().Add(24 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	finish(run2, agent.RunInterrupted)

	// Turn 3 edits u1: its one write lands (hiding a1, u2, a2), then its process dies.
	run3 := turn("3", agent.TriggerEdit, "u1")
	edited := agent.Message{ID: "u1", Role: agent.RoleUser, Parts: text("first, edited")}
	put(run3, run1.FirstSeq, edited, run3.FirstSeq)

	clock.add(time.Hour)
	if ok, err := r.Reap(ctx, th, agent.Claim{RunID: run3.ID, Epoch: run3.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	for _, id := range []string{"a1", "u2", "a2"} {
		if rec, err := st.GetMessage(ctx, th, id); !agent.IsKind(err, agent.KindNotFound) {
			t.Errorf("message %s the edit hid: %v (%s), want deleted by the reap", id, err, rec.Message.Parts)
		}
	}
	if in, err := st.GetInterrupt(ctx, th, "a2", "apr_1"); err != nil || in.Status != agent.InterruptCanceled {
		t.Errorf("the dropped reply's approval: %s %v, want canceled", in.Status, err)
	}
	recs, err := st.ListMessages(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Message.ID != "u1" || recs[0].Message.Text() != "first, edited" || recs[1].Message.ID != "a3" ||
		recs[1].Message.Meta().Status != agent.MessageFailed {
		var ids []string
		for _, rec := range recs {
			ids = append(ids, rec.Message.ID)
		}
		t.Errorf("readers see %v, want the edited u1 and the reaper's failed reply a3", ids)
	}
	if th, err := st.GetThread(ctx, th); err != nil || th.ActiveRun != nil {
		t.Errorf("thread: %+v %v, want the claim given back", th.ActiveRun, err)
	}
}
