package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Human in the loop (DESIGN "Human in the loop"). A run that meets a tool call needing approval, or a client
// tool, stores one interrupt per call (insert-if-absent, signed) before its final message, and ends
// interrupted. The client answers by re-posting that message with approval-responded parts or tool outputs;
// under a new claim the answers are matched to the stored interrupts (interrupts.Match), resolved by
// compare-and-set, and the same message continues in the new run. A turn that moves on instead (a new user
// message, a regenerate, an edit) cancels what still waits, and writes a result for it, so the transcript stays
// provider-valid and true.

// waiting is what a run asks before it ends interrupted: one interrupt per call, created before the message.
type waiting struct{ asks []agent.Interrupt }

// ask records that the call at part index i waits for a human or the client, and marks the part and the
// stream accordingly: an approval request carries its id (the signature stays on the stored part).
func (s *stepper) ask(tool agent.Tool, c agent.ToolCall, input json.RawMessage, i int) error {
	t, e := s.turn, s.turn.e
	kind := agent.InterruptApproval
	if tool.Kind == agent.ToolClient {
		kind = agent.InterruptClientTool
	}
	id := interrupts.ID(t.thread.ID, t.run.ID, c.ID)
	sig, err := e.signer.Sign(id, c.ID, c.Name, input)
	if err != nil {
		return err
	}
	now := e.clock.Now()
	s.waiting.asks = append(s.waiting.asks, agent.Interrupt{ID: id, ThreadID: t.thread.ID, RunID: t.run.ID,
		Epoch: t.run.Epoch, MessageID: t.run.AssistantMessageID, Kind: kind, ToolCallID: c.ID, ToolName: c.Name,
		Input: input, Signature: sig, Status: agent.InterruptPending, CreatedAt: now, ExpiresAt: now.Add(e.cfg.InterruptTTL)})
	if kind == agent.InterruptApproval {
		s.parts[i].State = agent.StateApprovalRequested
		s.parts[i].Approval = &agent.PartApproval{ID: id, Signature: sig}
		s.out.send(uistream.ToolApprovalRequest{ApprovalID: id, ToolCallID: c.ID})
	}
	return nil
}

// storeInterrupts creates the run's interrupts before the message that shows them is written: a message that
// says "waiting" always has its interrupt, so no answer can find nothing. A run whose claim is in doubt
// creates none (the reaper cancels those of a run it reaps).
func (s *stepper) storeInterrupts(ctx context.Context) error {
	e := s.turn.e
	if err := s.turn.awaitUser(); err != nil {
		return err
	}
	for _, in := range s.waiting.asks {
		err := s.turn.fenced(ctx, func(ctx context.Context) error {
			_, _, err := e.store.CreateInterrupt(ctx, in)
			return err
		})
		if err != nil {
			return fmt.Errorf("store interrupt %s: %w", in.ID, err)
		}
		s.log.InfoContext(s.logCtx, "agent.interrupt", "interrupt_id", in.ID, "kind", in.Kind, "tool", in.ToolName, "tool_call_id", in.ToolCallID)
	}
	return nil
}

// planContinue plans a turn that answers the interrupts of assistant message m (the request's copy). The
// stored message must be the thread's newest; the answers are matched to the stored interrupts, never to the
// client's copy of the request.
func (t *Turn) planContinue(ctx context.Context, msgs []agent.Message, all []agent.Interrupt, m agent.Message) (turnPlan, error) {
	e := t.e
	now := e.clock.Now()
	var ins []agent.Interrupt
	for _, in := range all {
		if in.MessageID == m.ID {
			if in.Status == agent.InterruptPending && !in.Pending(now) {
				in = t.expire(ctx, in, now) // lazily, so the answer and every reader see it expired
			}
			ins = append(ins, in)
		}
	}
	idx := -1
	for i, old := range msgs {
		if old.ID == m.ID {
			idx = i
		}
	}
	if idx < 0 {
		return turnPlan{}, agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q not found", m.ID)
	}
	if msgs[idx].Role != agent.RoleAssistant || len(ins) == 0 {
		return turnPlan{}, agent.E(agent.KindInvalid, agent.CodeNotInterrupted, "message %q waits for no tool output or approval", m.ID)
	}
	answers, err := interrupts.Match(e.signer, ins, transcript.Decode(m.Parts), now)
	if err != nil {
		return turnPlan{}, err
	}
	stored := msgs[idx]
	draft := transcript.Decode(stored.Parts)
	if idx != len(msgs)-1 && slices.ContainsFunc(answers, func(a interrupts.Answer) bool { return !a.Repeat }) {
		// The thread moved on past the message (its later turn canceled what waited, or failed to write that).
		return turnPlan{}, agent.E(agent.KindConflict, agent.CodeAlreadyResolved, "message %q is no longer the newest; its requests were left behind", m.ID)
	}
	for _, a := range answers {
		if !a.Repeat && !callWaits(draft, a.Interrupt.ToolCallID) {
			// The message no longer waits for this call (a turn that moved on settled it and died before it
			// canceled the interrupt): the request is closed.
			return turnPlan{}, agent.E(agent.KindConflict, agent.CodeAlreadyResolved, "tool call %q no longer waits for an answer", a.Interrupt.ToolCallID)
		}
	}
	if idx != len(msgs)-1 || !waits(draft, answers) {
		// Every answer was applied already (a repeated request, or a retry whose first reply was lost).
		return turnPlan{noop: true, noopMessage: stored}, nil
	}
	// A regenerated reply that asked keeps naming the reply it replaces, for readers that still find that one.
	return turnPlan{history: msgs[:idx], draft: draft, answers: answers, replaces: stored.Meta().Replaces}, nil
}

// waits reports whether one of the answered calls still waits in the stored parts (its answer not applied).
func waits(parts []agent.Part, answers []interrupts.Answer) bool {
	return slices.ContainsFunc(answers, func(a interrupts.Answer) bool { return callWaits(parts, a.Interrupt.ToolCallID) })
}

// callWaits reports whether the call's part waits for a result.
func callWaits(parts []agent.Part, toolCallID string) bool {
	return slices.ContainsFunc(parts, func(p agent.Part) bool { return p.ToolCallID == toolCallID && p.Waiting() })
}

// expire marks a pending interrupt past its age expired (compare-and-set; a concurrent resolution wins). It is a
// write after the claim like any other: gated at the claim's horizon, with a deadline there (fence E).
func (t *Turn) expire(ctx context.Context, in agent.Interrupt, now time.Time) agent.Interrupt {
	var got agent.Interrupt
	err := t.fenced(ctx, func(ctx context.Context) error {
		var err error
		got, err = t.e.store.ResolveInterrupt(ctx, in.Resolve(agent.InterruptExpired, now))
		return err
	})
	if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
		t.e.log.Warn("expire interrupt", "thread_id", in.ThreadID, "interrupt_id", in.ID, "err", err)
		in.Status = agent.InterruptExpired // it is expired whether or not the write landed
		return in
	}
	return got
}

// resolve writes the plan's new answers by compare-and-set, under the claim and before any tool runs, each
// fenced (gated at the claim's horizon before every attempt, with a deadline there). An interrupt that turns out
// resolved already is fine when it holds this very answer (our own retried write); anything else was decided by
// someone else and refuses the request.
func (t *Turn) resolve(ctx context.Context) error {
	e := t.e
	now := e.clock.Now()
	for _, a := range t.plan.answers {
		if a.Repeat {
			continue
		}
		req := a.Interrupt.Resolve(a.Status, now)
		req.Response = a.Response
		var got agent.Interrupt
		err := t.fenced(ctx, func(ctx context.Context) error {
			var err error
			got, err = e.store.ResolveInterrupt(ctx, req)
			return err
		})
		if errors.Is(err, agent.ErrAlreadyResolved) {
			if _, merr := interrupts.Match(e.signer, []agent.Interrupt{got}, t.requestParts(a), now); merr != nil {
				return merr
			}
			err = nil
		}
		if err != nil {
			return fmt.Errorf("resolve interrupt %s: %w", a.Interrupt.ID, err)
		}
		e.log.Info("agent.interrupt.resolved", "thread_id", t.thread.ID, "run_id", t.run.ID, "interrupt_id", a.Interrupt.ID, "status", a.Status)
	}
	return nil
}

// requestParts rebuilds the client's decision for a as a part, to match it again against a stored resolution.
func (t *Turn) requestParts(a interrupts.Answer) []agent.Part {
	in := a.Interrupt
	p := agent.Part{Type: "tool-" + in.ToolName, ToolCallID: in.ToolCallID, Input: in.Input}
	switch in.Kind {
	case agent.InterruptApproval:
		ok := a.Status == agent.InterruptApproved
		p.State, p.Approval = agent.StateApprovalResponded, &agent.PartApproval{ID: in.ID, Approved: &ok, Reason: a.Reason}
	default:
		p.State, p.Output, p.ErrorText = agent.StateOutputAvailable, a.Output, a.ErrorText
		if a.Failed() {
			p.State = agent.StateOutputError
		}
	}
	return []agent.Part{p}
}

// applyAnswers puts the answers on the continued message's parts and streams them: denied calls get
// output-denied (the model reads that the user denied them), client tools their output, and approved server
// tools run now, like any step's tools. It reports false when the answers could not be stored before an approved
// tool would run (none ran then).
func (s *stepper) applyAnswers(ctx context.Context) bool {
	t := s.turn
	if len(t.plan.answers) == 0 {
		return true
	}
	index := map[string]int{}
	for i, p := range s.parts {
		if p.Waiting() {
			index[p.ToolCallID] = i
		}
	}
	var run []toolCallAt
	for _, a := range t.plan.answers {
		i, ok := index[a.Interrupt.ToolCallID]
		if !ok {
			continue
		}
		p := &s.parts[i]
		switch a.Status {
		case agent.InterruptApproved:
			yes := true
			p.State, p.Approval = agent.StateApprovalResponded, &agent.PartApproval{ID: a.Interrupt.ID, Approved: &yes, Reason: a.Reason}
			if tool, ok := s.tools.byName[a.Interrupt.ToolName]; !ok || tool.Execute == nil {
				// The tool went away between the request and the answer (a new deployment): it cannot run.
				s.result(i, toolResult{err: agent.E(agent.KindNotFound, agent.CodeUnknownTool, "tool %q is not available any more; it was not executed", a.Interrupt.ToolName)})
				continue
			}
			run = append(run, toolCallAt{part: i, call: agent.ToolCall{ID: a.Interrupt.ToolCallID, Name: a.Interrupt.ToolName, Arguments: string(a.Interrupt.Input)}})
		case agent.InterruptDenied:
			no := false
			p.State, p.Approval = agent.StateOutputDenied, &agent.PartApproval{ID: a.Interrupt.ID, Approved: &no, Reason: a.Reason}
			s.out.send(uistream.ToolOutputDenied{ToolCallID: p.ToolCallID})
			s.logTool(a.Interrupt.ToolName, p.ToolCallID, toolDenied, 0)
		case agent.InterruptAnswered:
			if a.Failed() {
				p.State, p.ErrorText = agent.StateOutputError, a.ErrorText
				s.out.send(uistream.ToolOutputError{ToolCallID: p.ToolCallID, ErrorText: a.ErrorText})
			} else {
				p.State, p.Output = agent.StateOutputAvailable, a.Output
				s.out.send(uistream.ToolOutputAvailable{ToolCallID: p.ToolCallID, Output: a.Output})
			}
		}
	}
	// The answers are stored on the message, under this run's id, before an approved tool has an effect: a
	// crash from here on is this run's own draft, which the reaper (or a reader finding the run orphaned)
	// finishes with the outcome each tool recorded (principle 9). When they cannot be stored, no tool runs
	// (REVIEW H5): the message would still ask, and a later turn would report the call not executed.
	if len(run) > 0 {
		if err := s.putMessage(ctx, agent.MessageStreaming, false); err != nil {
			s.log.Warn("store the answers before running approved tools", "err", err)
			for _, c := range run {
				s.logTool(c.call.Name, c.call.ID, toolNotExecuted, 0)
			}
			return false
		}
	}
	s.execute(ctx, run)
	return true
}

// settleReason is why a turn leaves the newest assistant message's requests unanswered.
type settleReason int

const (
	settleNewMessage settleReason = iota // a new user message: the message stays, its calls get results
	settleRegenerate                     // a regenerate: results too (the old reply stays if the new one fails), hidden once the new one stands
	settleDropped                        // an edit dropped the message: only its interrupts are closed
)

// settle closes what a new turn leaves behind on the thread's newest assistant message: its waiting calls get a
// result that says what happened (unless the message is dropped), and its interrupts still pending are
// canceled (or expired, past their age). ins are the thread's interrupts.
func (t *Turn) settle(ctx context.Context, p *turnPlan, msg agent.Message, ins []agent.Interrupt, why settleReason) {
	now := t.e.clock.Now()
	status := map[string]agent.InterruptStatus{} // tool call id → how its interrupt ends
	byCall := map[string]agent.Interrupt{}
	for _, in := range ins {
		if in.MessageID != msg.ID {
			continue
		}
		st := in.Status
		if st == agent.InterruptPending {
			st = agent.InterruptCanceled
			if !in.Pending(now) {
				st = agent.InterruptExpired
			}
			p.cancel = append(p.cancel, in.Resolve(st, now))
		}
		status[in.ToolCallID], byCall[in.ToolCallID] = st, in
	}
	if why == settleDropped {
		return
	}
	parts := transcript.Decode(msg.Parts)
	changed := false
	for i, part := range parts {
		if !part.Waiting() {
			continue
		}
		parts[i], changed = t.settledPart(ctx, msg, part, byCall[part.ToolCallID], status[part.ToolCallID], why), true
	}
	if !changed {
		return
	}
	raw := make([]json.RawMessage, len(parts))
	for i, part := range parts {
		raw[i] = agent.EncodePart(part)
	}
	settled := msg
	settled.Parts = raw
	// A regenerated reply is hidden by this run once the new one stands, and a finalized write would fence that.
	p.settled, p.settledFinal = &settled, why != settleRegenerate
	for i := range p.history {
		if p.history[i].ID == msg.ID {
			p.history[i] = settled
		}
	}
}

// settledPart is the result a waiting call of msg gets when a turn moves on. An answer that was resolved (its
// continuation died before it wrote anything, so the message still asks) says what it says (REVIEW H5): a denial
// is output-denied, a client's output is the output, and an approved call reports what the tool recorded under
// the call's idempotency key (as the reaper's Synthesize does). Without a record it did not run: a continuation
// runs an approved tool only once the answers are stored on the message (applyAnswers), which would no longer ask.
func (t *Turn) settledPart(ctx context.Context, msg agent.Message, part agent.Part, in agent.Interrupt, st agent.InterruptStatus, why settleReason) agent.Part {
	part.Approval = nil
	switch st {
	case agent.InterruptDenied:
		no := false
		part.State, part.Approval = agent.StateOutputDenied, &agent.PartApproval{ID: in.ID, Approved: &no, Reason: interrupts.Resolution(in).Reason}
		return part
	case agent.InterruptAnswered:
		if a := interrupts.Resolution(in); a.Failed() {
			part.State, part.ErrorText = agent.StateOutputError, a.ErrorText
		} else {
			part.State, part.Output = agent.StateOutputAvailable, a.Output
		}
		return part
	case agent.InterruptApproved:
		if out, ok := t.recorded(ctx, msg, part); ok {
			part.State, part.Output = agent.StateOutputAvailable, out
			return part
		}
	}
	part.State, part.ErrorText = agent.StateOutputError, settledText(st, why)
	return part
}

// recorded asks the call's tool for the outcome it recorded (ok false: none, or the tool cannot tell).
func (t *Turn) recorded(ctx context.Context, msg agent.Message, part agent.Part) (json.RawMessage, bool) {
	tool, ok := t.e.static.byName[part.ToolNameOf()] // recovery asks the Go tools (only they record outcomes)
	if !ok || tool.Recorded == nil {
		return nil, false
	}
	out, ok, err := tool.Recorded(ctx, agent.ToolInvocation{ThreadID: t.thread.ID, Owner: t.thread.Owner, RunID: msg.Meta().RunID,
		ToolCallID: part.ToolCallID, MessageID: msg.ID, Input: part.Input, IdempotencyKey: agent.IdempotencyKey(t.thread.ID, msg.ID, part.ToolCallID)})
	if err != nil {
		t.e.log.Warn("tool outcome", "thread_id", t.thread.ID, "run_id", t.run.ID, "tool", tool.Name, "tool_call_id", part.ToolCallID, "err", err)
		return nil, false
	}
	return out, ok
}

func settledText(st agent.InterruptStatus, why settleReason) string {
	switch {
	case st == agent.InterruptExpired:
		return "Not executed: the request for approval or input expired before it was answered."
	case st == agent.InterruptCanceled && why == settleRegenerate:
		return "Not executed: the reply was regenerated instead of answered."
	case st == agent.InterruptCanceled:
		return "Not executed: a new message was sent instead of an answer."
	}
	return "Not executed: the run that was to execute it stopped."
}

// closeOut writes the settlement, before the turn's own user message. The message decides and the interrupts
// follow: first the settled message, then the cancels. Readers honour a pending interrupt only while its call
// waits in the newest message, so a crash between the two leaves nothing that could still run. (An edit commits
// first and closes out after, as cleanup: commitEdit.)
func (t *Turn) closeOut(ctx context.Context) error {
	e := t.e
	if m := t.plan.settled; m != nil {
		if !t.fresh() {
			return errInDoubt
		}
		w := agent.MessageWrite{ThreadID: t.thread.ID, Message: *m, Fence: t.run.Fence(), Final: t.plan.settledFinal}
		if err := t.putFinal(ctx, w); err != nil {
			return fmt.Errorf("settle message %s: %w", m.ID, err)
		}
	}
	for _, r := range t.plan.cancel {
		err := t.fenced(ctx, func(ctx context.Context) error {
			_, err := e.store.ResolveInterrupt(ctx, r)
			return err
		})
		if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
			return fmt.Errorf("cancel interrupt %s: %w", r.ID, err)
		}
	}
	return nil
}

// keepClaim holds the claim through a long close-out (an edit far back deletes every later message, one fenced
// write each, as the run's heartbeats may not have started): once a heartbeat interval has passed since the claim was last known
// good, it heartbeats, fenced, and counts the claim good from then. errInDoubt once it is not fresh any more.
func (t *Turn) keepClaim(ctx context.Context) error {
	e := t.e
	if now := e.clock.Now(); now.Sub(t.goodAt()) >= e.cfg.Heartbeat {
		hctx, cancel := t.attempt(ctx)
		err := e.store.Heartbeat(hctx, t.thread.ID, t.run.Fence(), now)
		cancel()
		if err == nil || errors.Is(err, agent.ErrRunCanceled) {
			t.kept(now) // recorded (a stop is not a fence)
		}
		if errors.Is(err, agent.ErrRunFenced) || errors.Is(err, agent.ErrRunCanceled) {
			return fmt.Errorf("keep the claim: %w", err)
		}
	}
	if !t.fresh() {
		return errInDoubt
	}
	return nil
}
