package sim

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// check reads every thread of the schedule from the underlying store, after the quiesce, and records each
// invariant that does not hold. (Invariant "one writer" is checked on the way, at every write: checkOwnWrite;
// "valid transcript" at every model request: validTranscript; "retries converge" at every stream's end.)
func (w *world) check(ctx context.Context) {
	for _, th := range w.threads {
		w.checkThread(ctx, th)
	}
}

func (w *world) checkThread(ctx context.Context, th *simThread) {
	thread, err := w.base.GetThread(ctx, th.id)
	exists := err == nil
	if err != nil && !agent.IsKind(err, agent.KindNotFound) {
		w.violate("sim", "get thread %s: %v", th.id, err)
		return
	}
	recs, err := w.base.ListMessages(ctx, th.id)
	if err != nil {
		w.violate("sim", "list messages %s: %v", th.id, err)
		return
	}
	runs, err := w.base.ListRuns(ctx, th.id)
	if err != nil {
		w.violate("sim", "list runs %s: %v", th.id, err)
		return
	}
	if !exists {
		// Deleted (or never created): nothing may be left under it, or it comes back when the id is used again
		// (REVIEW H3).
		if len(recs) > 0 || len(runs) > 0 {
			w.violate("deleted-is-gone", "thread %s does not exist but keeps %d messages and %d runs", th.id, len(recs), len(runs))
		}
	}

	// Every claim is released or reapable: after the quiesce none is left, no run is still running and no
	// reply is still streaming (a run whose claim was released but whose story was never finished is stuck).
	if exists && thread.ActiveRun != nil {
		w.violate("claims-released", "thread %s still claimed by %s@%d after the quiesce", th.id, thread.ActiveRun.RunID, thread.ActiveRun.Epoch)
	}
	epochOf := map[string]int64{}
	var sum agent.Usage
	for _, r := range runs {
		epochOf[r.ID] = r.Epoch
		sum = sum.Add(r.Usage)
		if !r.Status.Terminal() {
			w.violate("claims-released", "thread %s: run %s@%d is still %q after the quiesce", th.id, r.ID, r.Epoch, r.Status)
		}
	}

	// The thread's usage is the sum of its runs'.
	if exists && thread.Usage != sum {
		w.violate("usage", "thread %s usage %+v, its runs' sum %+v", th.id, thread.Usage, sum)
	}

	// No message id twice, no two messages at one position; replies in the order of their runs' epochs.
	ids, seqs := map[string]bool{}, map[int64]string{}
	lastEpoch := int64(-1)
	for _, rec := range recs {
		m := rec.Message
		if ids[m.ID] {
			w.violate("unique-ids", "thread %s: message %s twice", th.id, m.ID)
		}
		ids[m.ID] = true
		if other, ok := seqs[rec.Seq]; ok {
			w.violate("unique-ids", "thread %s: messages %s and %s both at seq %d", th.id, other, m.ID, rec.Seq)
		}
		seqs[rec.Seq] = m.ID
		if m.Role != agent.RoleAssistant {
			continue
		}
		md := m.Meta()
		ep, known := epochOf[md.RunID]
		switch {
		case !known:
			w.violate("one-writer", "thread %s: reply %s names run %q, which the thread does not have", th.id, m.ID, md.RunID)
		case ep <= lastEpoch:
			w.violate("one-writer", "thread %s: reply %s (epoch %d) stored after a reply of epoch %d", th.id, m.ID, ep, lastEpoch)
		default:
			lastEpoch = ep
		}
		if md.Status == agent.MessageStreaming || md.Status == "" {
			w.violate("claims-released", "thread %s: reply %s is still %q after the quiesce", th.id, m.ID, md.Status)
		}
		w.checkToolResults(ctx, th.id, m, md.Status)
	}

	// No accepted user message is lost, unless its thread was deleted since.
	for _, a := range th.accepted {
		if a.gen != th.gen {
			continue
		}
		if !ids[a.id] && w.mustKeep(a) {
			w.violate("accepted-kept", "thread %s: accepted user message %s (by %s) is not stored", th.id, a.id, a.proc.name)
		}
	}
}

// mustKeep reports whether an accepted user message must be stored. The engine stores it beside the first model
// request, after Begin returned; a process that died before that write reached the store, or whose write failed
// for good (the run then ends persist_failed, telling the client to send it again), lost it in a way its client
// saw. Those are exempt unless the sim explores the known gaps (-gaps), which reports them.
func (w *world) mustKeep(a acceptedMsg) bool {
	if w.gaps {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p := a.proc
	if !p.expectUW {
		return true // a re-post of a stored message
	}
	if p.dead && !p.uwDone {
		return false
	}
	if p.result != nil && p.result.Error != nil && p.result.Error.Code == agent.CodePersistFailed {
		return false
	}
	return true
}

// checkToolResults: every tool call of a finished reply has exactly one result, and the result tells the truth
// about the call's effect (DESIGN principle 9): "not executed" means the effect is absent, a result means it is
// there. An interrupted reply may leave only calls that wait for a human or the client.
func (w *world) checkToolResults(ctx context.Context, threadID string, m agent.Message, st agent.MessageStatus) {
	seen := map[string]bool{}
	for _, raw := range m.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil || !agent.IsToolPart(p.Type) {
			continue
		}
		if seen[p.ToolCallID] {
			w.violate("tool-results", "thread %s: reply %s has call %s twice", threadID, m.ID, p.ToolCallID)
		}
		seen[p.ToolCallID] = true
		result := p.State == agent.StateOutputAvailable || p.State == agent.StateOutputError || p.State == agent.StateOutputDenied
		switch {
		case result:
		case st == agent.MessageInterrupted && (p.ToolNameOf() == "ask_user_question" || p.ToolNameOf() == "delete_note"):
			continue
		default:
			w.violate("tool-results", "thread %s: %s reply %s: call %s (%s) has no result (state %q)", threadID, st, m.ID, p.ToolCallID, p.ToolNameOf(), p.State)
			continue
		}
		if p.ToolNameOf() != "sim_effect" {
			continue
		}
		key := agent.IdempotencyKey(threadID, p.ToolCallID)
		stored, err := w.base.GetValue(ctx, simEffectNS(w.owner), key)
		has := err == nil
		w.mu.Lock()
		applied := w.effects[simEffectNS(w.owner)+"\x00"+key]
		w.mu.Unlock()
		if applied > 1 {
			w.violate("exactly-once", "thread %s: call %s applied its effect %d times", threadID, p.ToolCallID, applied)
		}
		switch {
		case p.State == agent.StateOutputAvailable && !has:
			w.violate("crash-never-lies", "thread %s: call %s reports output %s but its effect is absent", threadID, p.ToolCallID, p.Output)
		case p.State == agent.StateOutputAvailable && !jsonEqual(p.Output, stored):
			w.violate("crash-never-lies", "thread %s: call %s reports %s, its effect recorded %s", threadID, p.ToolCallID, p.Output, stored)
		case p.State == agent.StateOutputError && strings.HasPrefix(p.ErrorText, "Not executed") && has:
			w.violate("crash-never-lies", "thread %s: call %s is marked %q but its effect was applied", threadID, p.ToolCallID, p.ErrorText)
		}
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}
