package sim

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// check reads every thread of the schedule from the underlying store, after the quiesce, and records each
// invariant that does not hold. (Invariant "one writer" is checked on the way, at every write: checkOwnWrite;
// "valid transcript" at every model request: validTranscript; "retries converge" at every stream's end; the
// steer invariants at every steer write: steerStored; "no steer waits through more than one answering turn" at
// every model request: steerWaitsThroughAnswer. Jobs, steers and the queue: checkJobs, jobscheck_test.go.)
func (w *world) check(ctx context.Context) {
	for _, th := range w.threads {
		w.checkThread(ctx, th)
	}
	w.checkReaders(ctx)
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
	ins, err := w.base.ListInterrupts(ctx, th.id)
	if err != nil {
		w.violate("sim", "list interrupts %s: %v", th.id, err)
		return
	}
	if !exists && (len(recs) > 0 || len(runs) > 0 || len(ins) > 0) {
		// A delete that stopped half way (DynamoDB deletes in several requests; seed 4496052508813027081 on
		// dynamo: the process died after the tombstone) leaves its tombstone and what is under it, and its
		// client was never told 204: it sends the DELETE again, which reads the thread as not found and
		// finishes the delete (threads.Service.Delete, FinishDelete; a new thread on the id does the same
		// first). The sim does not resend it, so the check does, on the underlying store. FinishDelete touches
		// only a tombstone: leftovers of a thread without one stay, and are reported.
		if err := w.base.FinishDelete(ctx, th.id); err != nil {
			w.violate("sim", "finish the delete of %s: %v", th.id, err)
			return
		}
		recs, runs, ins = w.leftovers(ctx, th.id)
	}
	msgs := make([]agent.Message, len(recs))
	for i, rec := range recs {
		msgs[i] = rec.Message
	}
	visible := agent.Visible(msgs)
	shown := map[string]bool{}
	for _, m := range visible {
		shown[m.ID] = true
	}
	asking := "" // the message readers see asking: the newest one, an assistant message that ended interrupted
	if n := len(visible); n > 0 && visible[n-1].Role == agent.RoleAssistant && visible[n-1].Meta().Status == agent.MessageInterrupted {
		asking = visible[n-1].ID
	}
	byCall := map[string]agent.Interrupt{}
	for _, in := range ins {
		byCall[in.ToolCallID] = in
	}
	if !exists {
		// Deleted (or never created): nothing may be left under it, or it comes back when the id is used again
		// (REVIEW H3).
		if len(recs) > 0 || len(runs) > 0 || len(ins) > 0 {
			w.violate("deleted-is-gone", "thread %s does not exist but keeps %d messages, %d runs and %d interrupts", th.id, len(recs), len(runs), len(ins))
		}
	}

	// Every claim is released or reapable: after the quiesce none is left, no run is still running and no
	// reply is still streaming (a run whose claim was released but whose story was never finished is stuck).
	if exists && thread.ActiveRun != nil {
		w.violate("claims-released", "thread %s still claimed by %s@%d after the quiesce", th.id, thread.ActiveRun.RunID, thread.ActiveRun.Epoch)
	}
	epochOf, continues := map[string]int64{}, map[string]bool{}
	var sum agent.Usage
	for _, r := range runs {
		epochOf[r.ID] = r.Epoch
		continues[r.ID] = r.Trigger == agent.TriggerContinuation
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
		case continues[md.RunID]:
			// A continued reply keeps the position the run that asked was given: it is older than its writer.
		case ep <= lastEpoch:
			w.violate("one-writer", "thread %s: reply %s (epoch %d) stored after a reply of epoch %d", th.id, m.ID, ep, lastEpoch)
		default:
			lastEpoch = ep
		}
		if md.Status == agent.MessageStreaming || md.Status == "" {
			w.violate("claims-released", "thread %s: reply %s is still %q after the quiesce", th.id, m.ID, md.Status)
		}
		w.checkToolResults(ctx, th.id, m, w.waitRule(m, shown[m.ID], asking, byCall))
	}
	w.checkInterrupts(ctx, th, visible, ins, asking)

	// No accepted user message is lost, unless its thread was deleted since, or an edit dropped it since (an edit
	// drops every message after the edited one, deliberately).
	for _, a := range th.accepted {
		if a.gen != th.gen || th.dropped[a.id] > a.at {
			continue
		}
		if !ids[a.id] && w.mustKeep(a) {
			w.violate("accepted-kept", "thread %s: accepted user message %s (by %s) is not stored", th.id, a.id, a.proc.name)
		}
	}
	w.checkJobs(ctx, th, exists, recs)
}

// mustKeep reports whether an accepted user message must be stored. The engine stores it beside the first model
// request, after Begin returned; a process that died before that write was answered ok, or whose run was fenced
// or failed to store it for good, lost it in a way its client saw, and the client sends it again.
func (w *world) mustKeep(a acceptedMsg) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := a.proc
	fenced := p.expectUW && p.result != nil && p.result.Error != nil && p.result.Error.Code == agent.CodeRunFenced
	if fenced && !p.uwApplied {
		// The run lost its claim before its message's write landed, and the write was refused (the fences:
		// the reaper stubs the message first, SQLite checks the claim) or never sent: its client was told the
		// run stopped, and sends the message again. A write the store answered ok is kept, and checked like any
		// other.
		return false
	}
	if p.expectUW && p.dead && !p.uwApplied {
		// The process died before its message's write was answered ok (a crash before the write, or between
		// the requests of it on DynamoDB, or after that write failed for good: a permanent fault, or the write
		// gate's refusal once the claim fell in doubt): the client's stream broke without a finish, and it sends
		// the message again. Not a window: nothing reached the store that could be kept.
		return false
	}
	if p.expectUW && !p.uwApplied && p.result != nil && p.result.Error != nil && p.result.Error.Code == agent.CodePersistFailed {
		// By design, not a window: the write failed for good (the engine's retries spent), so the run stored
		// nothing after it and ended persist_failed, whose message tells the client to send it again.
		return false
	}
	return true
}

// closeInterrupts cancels what the schedule leaves pending, on the underlying store: schedules that share a store
// (one SQLite file per worker, one DynamoDB table) would otherwise fill each other's lists of expired interrupts,
// which are bounded (the reaper's batch) and in no promised order, so what a reaper sweep expires would depend on
// which schedules ran before on the same store.
func (w *world) closeInterrupts(ctx context.Context) {
	for _, th := range w.threads {
		ins, err := w.base.ListInterrupts(ctx, th.id)
		if err != nil {
			continue
		}
		for _, in := range ins {
			if in.Status == agent.InterruptPending {
				_, _ = w.base.ResolveInterrupt(ctx, in.Resolve(agent.InterruptCanceled, w.clock.Now()))
			}
		}
	}
}

// waitRule says when a tool call of m may have no result: only in the message readers see asking (the newest,
// ended interrupted), and only while its interrupt waits (pending and not past its age), or has expired (the
// engine writes an expired call's result at the next turn, which settles what waits; readers no longer list it),
// or was resolved by a continuation that stored nothing on the message.
// A message readers never see (a reply a regenerate replaced) is held to nothing more than its status.
func (w *world) waitRule(m agent.Message, visible bool, asking string, byCall map[string]agent.Interrupt) func(agent.Part) (bool, string) {
	st := m.Meta().Status
	return func(p agent.Part) (bool, string) {
		if !visible {
			return st == agent.MessageInterrupted, "a hidden reply that did not end interrupted"
		}
		in, ok := byCall[p.ToolCallID]
		if m.ID != asking {
			return false, "not in the asking message"
		}
		switch {
		case !ok || in.MessageID != m.ID:
			return false, "no interrupt for it"
		case in.Status == agent.InterruptPending, in.Status == agent.InterruptExpired:
			return true, ""
		case in.Status != agent.InterruptCanceled && m.Meta().RunID == in.RunID:
			// Resolved (answered, approved, denied) while the message is still as the run that asked stored it: a
			// continuation took the answer and failed before it stored anything on the message (seed
			// 2879027694859487754: its second resolve failed for good, so it ended failed in Begin). The message
			// still asks; the answer again repeats what is resolved (interrupts.Match), and the next turn settles
			// the call with what the resolution says (engine settledPart). A continuation that stored the message
			// (its run id) and still left an answered call waiting is held to the rule.
			return true, ""
		}
		return false, "its interrupt " + in.ID + " is " + string(in.Status)
	}
}

// checkToolResults: every tool call of a finished reply has exactly one result, and the result tells the truth
// about the call's effect (DESIGN principle 9): "not executed" means the effect is absent, a result means it is
// there. A call may wait for a human or the client only where waits says so.
func (w *world) checkToolResults(ctx context.Context, threadID string, m agent.Message, waits func(agent.Part) (bool, string)) {
	st := m.Meta().Status
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
		if !result {
			if ok, why := waits(p); !ok {
				w.violate("tool-results", "thread %s: %s reply %s: call %s (%s) has no result (state %q): %s", threadID, st, m.ID, p.ToolCallID, p.ToolNameOf(), p.State, why)
			}
			continue
		}
		if p.ToolNameOf() == "research" {
			w.checkDispatch(ctx, threadID, p)
			continue
		}
		if p.ToolNameOf() != "sim_effect" && p.ToolNameOf() != "sim_approve" {
			continue
		}
		key := agent.IdempotencyKey(threadID, m.ID, p.ToolCallID)
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

// checkInterrupts: the thread's interrupts agree with its messages and with the tools' effects.
//
//   - An approval's effect happens at most once, and only when it was approved (the tool also checks, when it
//     runs, that the approval came first: checkApproved); a call denied, canceled, expired or never answered has
//     no effect.
//   - A call shown with a result says what its interrupt says: denied is output-denied and output-denied is
//     denied; a call that was never approved has no output.
//   - What readers list as waiting (threads.Service.Get, read by the final reader) is a call that waits in the
//     asking message. The store may keep a pending interrupt for a call that has a result or for another
//     message (a late insert of a run that lost its claim, say) as long as no reader ever lists it.
func (w *world) checkInterrupts(ctx context.Context, th *simThread, visible []agent.Message, ins []agent.Interrupt, asking string) {
	parts := map[string]agent.Part{}
	var askingParts map[string]agent.Part
	for _, m := range visible {
		mine := map[string]agent.Part{}
		for _, p := range transcript.Decode(m.Parts) {
			if agent.IsToolPart(p.Type) {
				parts[p.ToolCallID], mine[p.ToolCallID] = p, p
			}
		}
		if m.ID == asking {
			askingParts = mine
		}
	}
	w.mu.Lock()
	w.stats.interrupts += len(ins)
	w.mu.Unlock()
	for _, in := range ins {
		if in.ToolName == "sim_approve" {
			key := agent.IdempotencyKey(th.id, in.MessageID, in.ToolCallID)
			w.mu.Lock()
			applied := w.effects[simEffectNS(w.owner)+"\x00"+key]
			w.mu.Unlock()
			_, err := w.base.GetValue(ctx, simEffectNS(w.owner), key)
			has := err == nil
			switch {
			case in.Status == agent.InterruptApproved && applied > 1:
				w.violate("exactly-once", "thread %s: approved call %s applied its effect %d times", th.id, in.ToolCallID, applied)
			case in.Status != agent.InterruptApproved && (applied > 0 || has):
				w.violate("approval-first", "thread %s: call %s has its effect (%d writes) but its interrupt is %s", th.id, in.ToolCallID, applied, in.Status)
			}
		}
		p, ok := parts[in.ToolCallID]
		if !ok || unresolvedPart(p) {
			continue
		}
		switch {
		case in.Status == agent.InterruptDenied && p.State != agent.StateOutputDenied:
			w.violate("interrupt-agrees", "thread %s: call %s was denied but shows %q %s", th.id, in.ToolCallID, p.State, p.ErrorText)
		case in.Status != agent.InterruptDenied && p.State == agent.StateOutputDenied:
			w.violate("interrupt-agrees", "thread %s: call %s shows output-denied but its interrupt is %s", th.id, in.ToolCallID, in.Status)
		case in.Kind == agent.InterruptApproval && in.Status != agent.InterruptApproved && p.State == agent.StateOutputAvailable:
			w.violate("interrupt-agrees", "thread %s: call %s shows an output but its approval is %s", th.id, in.ToolCallID, in.Status)
		}
	}
	w.mu.Lock()
	v, read := w.views[th.id]
	w.mu.Unlock()
	if !read {
		return
	}
	w.mu.Lock()
	w.stats.listed += len(v.Interrupts)
	w.mu.Unlock()
	for _, in := range v.Interrupts {
		p, ok := askingParts[in.ToolCallID]
		switch {
		case in.MessageID != asking:
			w.violate("pending-listed", "thread %s: readers list interrupt %s of message %s, which is not the asking message (%q)", th.id, in.ID, in.MessageID, asking)
		case !ok:
			w.violate("pending-listed", "thread %s: readers list interrupt %s for call %s, which message %s does not hold", th.id, in.ID, in.ToolCallID, asking)
		case !unresolvedPart(p):
			w.violate("pending-listed", "thread %s: readers list interrupt %s for call %s, which has a result (%q)", th.id, in.ID, in.ToolCallID, p.State)
		case !in.Pending(w.clock.Now()):
			w.violate("pending-listed", "thread %s: readers list interrupt %s, which expired at %s", th.id, in.ID, in.ExpiresAt)
		}
	}
}

// unresolvedPart reports whether a tool part has no result yet.
func unresolvedPart(p agent.Part) bool {
	switch p.State {
	case agent.StateOutputAvailable, agent.StateOutputError, agent.StateOutputDenied:
		return false
	}
	return agent.IsToolPart(p.Type)
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

// steerWaitsThroughAnswer is the invariant "no steer waits through more than one answering turn" (issue 16 item
// 6, continuation coalescing), checked at every model request: a turn that answers a question (a continuation)
// while steers wait takes them, applying the answers without a model step and answering question and steers in
// the delivery pass it chains. So a continuation asks the model only when no steer queued before its claim waits
// in the queue (one whose message the thread does not hold yet).
func (w *world) steerWaitsThroughAnswer(p *proc) {
	w.mu.Lock()
	run := p.run
	w.mu.Unlock()
	if run.Trigger != agent.TriggerContinuation {
		return
	}
	ctx := context.Background()
	q, err := w.base.ListQueued(ctx, run.ThreadID)
	if err != nil {
		return
	}
	for _, e := range q {
		if e.Kind != agent.QueueSteer || !e.CreatedAt.Before(run.CreatedAt) {
			continue
		}
		if _, err := w.base.GetMessage(ctx, run.ThreadID, e.Message.ID); err == nil {
			continue
		}
		w.violate("steer-waits-answer", "%s: continuation %s asks the model while steer %s, queued before its claim, waits", p.name, run.ID, e.Message.ID)
	}
}

// leftovers lists what the store still keeps under a thread id (read errors count as nothing: the caller has read
// the same lists once already).
func (w *world) leftovers(ctx context.Context, id string) ([]agent.MessageRecord, []agent.Run, []agent.Interrupt) {
	recs, _ := w.base.ListMessages(ctx, id)
	runs, _ := w.base.ListRuns(ctx, id)
	ins, _ := w.base.ListInterrupts(ctx, id)
	return recs, runs, ins
}
