package reaper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/transcript"
)

// Seed 688 of the simulation (SQLite, -gaps): a continuation (a run that goes on with an asking reply after its
// answer) wrote its draft, streamed a further step, and died without storing its reply (its final write failed).
// The reaper must store what the run's readers saw: the continued message's parts as they were before the
// continuation, the answer, and every step the run streamed, each once. Before, a continuation's own draft was
// taken alone (the segments were rebuilt on top of a draft only when another run wrote it), so the step after the
// draft, which readers had seen, was lost.
//
// Each case is a crash point: the draft holds the answer only (written before an approved tool ran), or the answer
// and a step, with the segments ahead of it by a step; or the draft is ahead of the segments (the step's draft
// write landed, its segment flush did not).
func TestReapedContinuationKeepsWhatItStreamed(t *testing.T) {
	t.Parallel()
	onBothStores(t, reapedContinuation)
}

func reapedContinuation(t *testing.T, st agent.Store) {
	const (
		stepStart = `{"type":"step-start"}`
		asked     = `{"type":"tool-delete_note","toolCallId":"call_1","state":"approval-requested","input":{"key":"k"},"approval":{"id":"apr_1"}}`
		approved  = `{"type":"tool-delete_note","toolCallId":"call_1","state":"approval-responded","input":{"key":"k"},"approval":{"id":"apr_1","approved":true}}`
		deleted   = `{"type":"tool-delete_note","toolCallId":"call_1","state":"output-available","input":{"key":"k"},"output":{"deleted":true},"approval":{"id":"apr_1","approved":true}}`
		listed    = `{"type":"tool-list_notes","toolCallId":"call_2","state":"output-available","input":{},"output":{"keys":[]}}`
	)
	text := func(s string) string { return fmt.Sprintf(`{"type":"text","text":%q,"state":"done"}`, s) }
	chunk := func(s string) string { return "data: " + s + "\n\n" }
	// What the continuation streams: the approved tool's result, a step with a tool call, and a last step.
	answer := chunk(`{"type":"start","messageId":"msg_a"}`) +
		chunk(`{"type":"tool-output-available","toolCallId":"call_1","output":{"deleted":true}}`)
	step2 := chunk(`{"type":"start-step"}`) + chunk(`{"type":"text-start","id":"run_cont-t0"}`) +
		chunk(`{"type":"text-delta","id":"run_cont-t0","delta":"Checking."}`) + chunk(`{"type":"text-end","id":"run_cont-t0"}`) +
		chunk(`{"type":"tool-input-start","toolCallId":"call_2","toolName":"list_notes"}`) +
		chunk(`{"type":"tool-input-available","toolCallId":"call_2","toolName":"list_notes","input":{}}`) +
		chunk(`{"type":"tool-output-available","toolCallId":"call_2","output":{"keys":[]}}`) + chunk(`{"type":"finish-step"}`)
	step3 := chunk(`{"type":"start-step"}`) + chunk(`{"type":"text-start","id":"run_cont-t1"}`) +
		chunk(`{"type":"text-delta","id":"run_cont-t1","delta":"All "}`) + chunk(`{"type":"text-delta","id":"run_cont-t1","delta":"done."}`) +
		chunk(`{"type":"text-end","id":"run_cont-t1"}`) + chunk(`{"type":"finish-step"}`)
	base := []string{stepStart, text("Let me check."), asked}
	whole := []string{stepStart, text("Let me check."), deleted, stepStart, text("Checking."), listed, stepStart, text("All done.")}

	for i, c := range []struct {
		name     string
		draft    []string // the continuation's own draft (after the base)
		segments []string // what it flushed to its segments, in order
		want     []string
	}{
		{"draft holds the answer, segments two steps more", []string{approved}, []string{answer, step2, step3}, whole},
		{"draft holds a step, segments a step more", []string{deleted, stepStart, text("Checking."), listed},
			[]string{answer, step2, step3}, whole},
		{"draft ahead of the segments", []string{deleted, stepStart, text("Checking."), listed, stepStart, text("All done.")},
			[]string{answer, step2}, whole},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
			r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
			ctx := context.Background()
			th := fmt.Sprintf("th%d", i)
			now := clock.Now()
			claim := claimsOn(t, st, clock, th)
			put := func(run agent.Run, seq int64, final bool, md string, parts []string) {
				t.Helper()
				m := agent.Message{ID: "msg_a", Role: agent.RoleAssistant, Metadata: json.RawMessage(md)}
				for _, p := range parts {
					m.Parts = append(m.Parts, json.RawMessage(p))
				}
				if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: th, Seq: seq, Fence: run.Fence(), Final: final, Now: clock.Now(), Message: m}); err != nil {
					t.Fatal(err)
				}
			}

			// The first run asks for an approval and finishes interrupted.
			first := claim("run_first", agent.TriggerUser)
			in, _, err := st.CreateInterrupt(ctx, agent.Interrupt{ID: "apr_1", ThreadID: th, RunID: first.ID, Epoch: first.Epoch, MessageID: "msg_a",
				Kind: agent.InterruptApproval, ToolCallID: "call_1", ToolName: "delete_note", Input: json.RawMessage(`{"key":"k"}`),
				Status: agent.InterruptPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			put(first, first.AssistantSeq(), true, `{"status":"interrupted","runId":"run_first"}`, base)
			done := first
			done.Status, done.Steps, done.FinishedAt, done.UpdatedAt = agent.RunInterrupted, 1, clock.Now(), clock.Now()
			if err := st.FinishRun(ctx, done); err != nil {
				t.Fatal(err)
			}

			// The answer approves; the continuation writes its draft, streams, and dies.
			clock.add(time.Second)
			req := in.Resolve(agent.InterruptApproved, clock.Now())
			req.Response = json.RawMessage(`{"approved":true}`)
			if _, err := st.ResolveInterrupt(ctx, req); err != nil {
				t.Fatal(err)
			}
			cont := claim("run_cont", agent.TriggerContinuation)
			put(cont, cont.AssistantSeq(), false, `{"status":"streaming","runId":"run_cont"}`, append(base[:2:2], c.draft...))
			for n, s := range c.segments {
				if err := st.AppendSegment(ctx, agent.Segment{ThreadID: th, RunID: cont.ID, Seq: int64(n), ExpiresAt: clock.Now().Add(time.Hour), Data: []byte(s)}); err != nil {
					t.Fatal(err)
				}
			}

			clock.add(2 * staleAfter)
			if _, err := r.Reap(ctx, th, agent.Claim{RunID: cont.ID, Epoch: cont.Epoch}); err != nil {
				t.Fatal(err)
			}
			got, err := st.GetMessage(ctx, th, "msg_a")
			if err != nil {
				t.Fatal(err)
			}
			if md := got.Message.Meta(); md.Status != agent.MessageFailed || md.RunID != cont.ID {
				t.Errorf("the reply: %s by %q, want failed by %q", md.Status, md.RunID, cont.ID)
			}
			if g, w := summary(transcript.Decode(got.Message.Parts)), summary(decode(c.want)); g != w {
				t.Errorf("the reaped reply:\n got  %s\n want %s", g, w)
			}
		})
	}
}

// summary is parts in short: type, tool call, state, text.
func summary(parts []agent.Part) string {
	var b strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&b, "[%s %s %s %q]", p.Type, p.ToolCallID, p.State, p.Text)
	}
	return b.String()
}

func decode(parts []string) []agent.Part {
	raw := make([]json.RawMessage, len(parts))
	for i, p := range parts {
		raw[i] = json.RawMessage(p)
	}
	return transcript.Decode(raw)
}

// diesAfterOutcome is a reaper's store whose process dies right after the run's outcome applied: the reaper still
// holds the thread, and the dead run's message is not finalized.
type diesAfterOutcome struct{ agent.Store }

func (d diesAfterOutcome) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	if err := d.Store.RecordOutcome(ctx, run, holder); err != nil {
		return err
	}
	return agent.E(agent.KindInternal, agent.CodeInternal, "injected: the reaper's process dies here")
}

// A continuation that took its answer and died before its first write is reaped by a reaper that dies after the
// run's outcome, before the message. The next reaper finishes the message: the continued message (still the
// earlier run's) gets the answer the dead run took, failed. Before, the next reaper took a message last written by
// another run for one that needs no finalizing, and the message kept asking for an answer already taken (seed
// 8590996860698516015 of the simulation on SQLite, invariant tool-results).
func TestDeadReaperFinishesAContinuedMessage(t *testing.T) {
	t.Parallel()
	onBothStores(t, deadReaperFinishesAContinuedMessage)
}

func deadReaperFinishesAContinuedMessage(t *testing.T, st agent.Store) {
	clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	ctx := context.Background()
	now := clock.Now()
	claim := claimsOn(t, st, clock, "th")
	first := claim("run_first", agent.TriggerUser)
	in, _, err := st.CreateInterrupt(ctx, agent.Interrupt{ID: "apr_1", ThreadID: "th", RunID: first.ID, Epoch: first.Epoch, MessageID: "msg_a",
		Kind: agent.InterruptApproval, ToolCallID: "call_1", ToolName: "delete_note", Input: json.RawMessage(`{"key":"k"}`),
		Status: agent.InterruptPending, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Message{ID: "msg_a", Role: agent.RoleAssistant, Metadata: json.RawMessage(`{"status":"interrupted","runId":"run_first"}`),
		Parts: []json.RawMessage{json.RawMessage(`{"type":"step-start"}`),
			json.RawMessage(`{"type":"tool-delete_note","toolCallId":"call_1","state":"approval-requested","input":{"key":"k"},"approval":{"id":"apr_1"}}`)}}
	if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: "th", Seq: first.AssistantSeq(), Fence: first.Fence(), Final: true, Now: now, Message: m}); err != nil {
		t.Fatal(err)
	}
	done := first
	done.Status, done.Steps, done.FinishedAt, done.UpdatedAt = agent.RunInterrupted, 1, now, now
	if err := st.FinishRun(ctx, done); err != nil {
		t.Fatal(err)
	}

	// The answer denies the call; its continuation claims the thread and dies before it writes anything.
	clock.add(time.Second)
	req := in.Resolve(agent.InterruptDenied, clock.Now())
	req.Response = json.RawMessage(`{"approved":false}`)
	if _, err := st.ResolveInterrupt(ctx, req); err != nil {
		t.Fatal(err)
	}
	cont := claim("run_cont", agent.TriggerContinuation)

	clock.add(2 * staleAfter)
	dying := reaper.New(reaper.Deps{Store: diesAfterOutcome{st}, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	if _, err := dying.Reap(ctx, "th", agent.Claim{RunID: cont.ID, Epoch: cont.Epoch}); err == nil {
		t.Fatal("setup: the dying reaper reported success")
	}
	clock.add(2 * staleAfter)
	r := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: staleAfter})
	if stats, err := r.Tick(ctx); err != nil || stats.Reaped != 1 {
		t.Fatalf("next sweep: %+v %v, want the dead reaper's claim reaped", stats, err)
	}
	got, err := st.GetMessage(ctx, "th", "msg_a")
	if err != nil {
		t.Fatal(err)
	}
	parts := transcript.Decode(got.Message.Parts)
	if md := got.Message.Meta(); md.Status != agent.MessageFailed || md.RunID != cont.ID || len(parts) != 2 || parts[1].State != agent.StateOutputDenied {
		t.Errorf("the continued message: %s by %q, parts %s; want failed by %q, the call output-denied", md.Status, md.RunID, summary(parts), cont.ID)
	}
	if th, err := st.GetThread(ctx, "th"); err != nil || th.ActiveRun != nil {
		t.Errorf("thread: %+v %v, want idle", th.ActiveRun, err)
	}
}

// claimsOn creates thread th (owner alice) and returns a claim of it for a run answering in msg_a, at the clock's
// time.
func claimsOn(t *testing.T, st agent.Store, clock agent.Clock, th string) func(runID string, trigger agent.Trigger) agent.Run {
	t.Helper()
	now := clock.Now()
	if _, _, err := st.CreateThread(context.Background(), agent.Thread{ID: th, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	return func(runID string, trigger agent.Trigger) agent.Run {
		t.Helper()
		res, err := st.ClaimRun(context.Background(), agent.ClaimRequest{ThreadID: th, Owner: "alice", RunID: runID, Trigger: trigger,
			AssistantMessageID: "msg_a", Now: clock.Now(), Reserve: 2})
		if err != nil {
			t.Fatal(err)
		}
		return res.Run
	}
}
