package engine

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Runs longer than one invocation (issue 21 item 2; agent.HandOverStore has the store's side).
//
// When a hand-over is due (HandOverMargin before the invocation's deadline: the Lambda context's, or the one
// WithDeadline gives; at once for a background run, Turn.HandOverNow; at the next step boundary of every run after
// HandOverAll, a drain's end), the run stops at its next step boundary and:
//
//  1. stops feeding this process's readers (they go on from the store) and flushes its stream segments: every
//     segment before the next number is stored, and the run writes none after;
//  2. stores its reply as it stands (one fenced write of the draft, as at every step end), with the continuation
//     it hands over to in its metadata (agent.MessageMetadata.HandedOver);
//  3. asks the launcher (Deps.Launcher) to continue it: agent.Continuation names the run, the epoch it stops at, the
//     next segment number and the steps taken. A launcher that fails leaves the run going here; it tries again at
//     its next step boundary;
//  4. leaves the keeper (no more heartbeats: the claim keeps its last one, so the continuation has a stale window
//     to start in) and ends its client's stream without a finish chunk (endHandedOver, README "Runs longer than
//     one invocation"). Its run slot is kept (renewals stop; the continuation renews it).
//
// The continuation (Continue) takes the claim at epoch+1 (HandOver, a conditional write: the decision), writes the
// reply back at the new epoch at once (so any write of the old holder's reply is refused by the message fence
// too), reads the thread's window for the history before the reply, and streams on with no client: no start
// chunk, steps counted on from the continuation's, its segments numbered on from the continuation's, the run's
// usage as the reply stored it, and the whole-run time limit (RunTimeout) counted from the run's creation, not the
// invocation's. A continuation that finds the claim moved (reaped, stopped and released, handed over already by
// a duplicate delivery) does nothing. One that never starts leaves a claim that goes stale: the reaper continues
// the run through its own launcher from the reply the hand-over stored (MessageMetadata.HandedOver; lib/reaper),
// or, past its bounds, finishes it from its stored reply and segments as any dead run (no loss).

// DefaultHandOverMargin is how long before its invocation's deadline a run hands over: room for the step in
// flight to end (a model step is bounded by the model's idle gap, its tools by ToolTimeout) and for the hand-over's
// writes. Below it a run's step could be cut by the platform; the reaper would then finish the run as stale.
const DefaultHandOverMargin = 2 * time.Minute

// handovers is the engine's part: the launcher, and the drain switch.
type handovers struct {
	launcher agent.RunLauncher
	// all: every run hands over at its next step boundary (HandOverAll).
	all atomic.Bool
}

// handOverState is a turn's part.
type handOverState struct {
	// at is when the run hands over (zero: only when HandOverAll says so); now: at once (a background run).
	at  time.Time
	now bool
	// from is the continuation this turn is (nil: the run's first invocation); usage and model are what the
	// stored reply recorded.
	from  *agent.Continuation
	usage agent.Usage
	model string
	// count is how many hand-overs the run has made before this turn.
	count int
}

// deadlineKey carries an invocation deadline (WithDeadline).
type deadlineKey struct{}

// WithDeadline gives ctx an invocation deadline on the engine's clock: a run streamed under it hands over
// HandOverMargin before it. Without it, a context's own deadline is the invocation's (a Lambda's context has one).
// Tests set it to hand runs over on an injected clock.
func WithDeadline(ctx context.Context, at time.Time) context.Context {
	return context.WithValue(ctx, deadlineKey{}, at)
}

// arm sets when the run hands over, from ctx's invocation deadline.
func (h *handOverState) arm(ctx context.Context, e *Engine) {
	if h.now {
		return
	}
	at, ok := ctx.Value(deadlineKey{}).(time.Time)
	if !ok {
		at, ok = ctx.Deadline()
	}
	if ok {
		h.at = at.Add(-e.cfg.HandOverMargin)
	}
}

// segment is the number of the run's first segment in this turn.
func (h *handOverState) segment() int64 {
	if h.from == nil {
		return 0
	}
	return h.from.Segment
}

// HandOverNow makes the run hand over at its first step boundary: a background run (POST /chat with background:
// true) whose request answers at once, while a continuation runs it with no client. False when the engine has no
// launcher: the caller must then refuse the request (before Stream).
func (t *Turn) HandOverNow() bool {
	if t.e.handovers.launcher == nil {
		return false
	}
	t.ho.now = true
	return true
}

// CanLaunch reports whether runs can be continued elsewhere (a launcher is configured).
func (e *Engine) CanLaunch() bool { return e.handovers.launcher != nil }

// HandOverAll makes every run of this engine hand over at its next step boundary, and every run that starts later
// too: the end of a drain's grace (agentloop serve on SIGTERM). Each run stops as at its invocation's deadline and
// is continued through the launcher; with none, nothing changes.
func (e *Engine) HandOverAll() { e.handovers.all.Store(true) }

// runTimeLeft is what is left of the run's whole-run time limit: RunTimeout from the run's creation for a
// continuation (every hand-over counts against it), all of it for a run's first invocation.
func (t *Turn) runTimeLeft() time.Duration {
	if t.ho.from == nil {
		return t.e.cfg.RunTimeout
	}
	return t.e.cfg.RunTimeout - t.e.clock.Now().Sub(t.run.CreatedAt)
}

// handOverDue reports whether the run should hand over at this step boundary.
func (s *stepper) handOverDue() bool {
	t := s.turn
	h := &t.e.handovers
	if h.launcher == nil || s.out.seg == nil {
		return false
	}
	if t.ho.from != nil && s.steps == t.ho.from.Steps {
		// A continuation takes a step before it hands over again: a deadline closer than its margin (or a drain
		// that continues runs in the same place) must not pass the run on forever without progress.
		return false
	}
	return t.ho.now || h.all.Load() || !t.ho.at.IsZero() && !t.e.clock.Now().Before(t.ho.at)
}

// handOver stops the run at this step boundary and launches its continuation (the steps in the file's doc). True
// when the continuation is launched: the run then writes nothing more.
func (s *stepper) handOver(ctx context.Context) bool {
	t, e := s.turn, s.turn.e
	s.out.seg.Unpublish() // readers here go on from the store, where the continuation writes
	if err := s.out.seg.Flush(ctx); err != nil {
		s.log.Warn("hand over: store the stream; the run goes on here", "err", err)
		return false
	}
	if err := t.mayWrite(); err != nil {
		return false // the claim is in doubt or lost: the run stops as such
	}
	c := agent.Continuation{ThreadID: t.thread.ID, RunID: t.run.ID, Epoch: t.run.Epoch, Segment: s.out.seg.Next(),
		Steps: s.steps, HandOvers: t.ho.count + 1}
	// The reply is stored with the continuation it hands over to (MessageMetadata.HandedOver): a reaper that finds
	// the claim stale at this epoch (the continuation never started) continues the run from it.
	s.handing = &c
	if err := s.putMessage(ctx, agent.MessageStreaming, false); err != nil {
		s.handing = nil
		s.log.Warn("hand over: store the reply; the run goes on here", "err", err)
		return false
	}
	s.handing = nil
	if err := e.handovers.launcher.Launch(ctx, c); err != nil {
		s.log.Warn("hand over: launch the continuation; the run goes on here", "err", err)
		t.ho.now, t.ho.at = false, time.Time{} // not at every boundary: at the next deadline, or a drain
		// The reply is stored again without the continuation: should this process die in the next step (its
		// segments past c.Segment), the reaper must reap the run, not continue it from c.
		s.persistDraft(ctx)
		return false
	}
	s.handedOver = true
	s.guard.stop()
	s.out.detach()
	t.slot.keep()
	s.log.InfoContext(s.logCtx, "agent.handover", "epoch", t.run.Epoch, "segment", c.Segment, "steps", c.Steps,
		"hand_overs", c.HandOvers, "input_tokens", s.usage.InputTokens, "output_tokens", s.usage.OutputTokens)
	return true
}

// endHandedOver ends the client's stream of a run that handed over: message metadata saying so, then [DONE] and
// no finish chunk, so the AI SDK client keeps the reply as it stands (finishReason undefined) and the app resumes
// it (GET /chat/{threadId}/stream replays the run from its start and follows it to its end). Nothing of it reaches
// the store: the output is detached.
func (s *stepper) endHandedOver() agent.Run {
	t := s.turn
	md := map[string]any{"runId": t.run.ID, "status": agent.MessageStreaming, "handover": true}
	s.out.send(uistream.MessageMetadata{Metadata: metadataJSON(md)})
	s.out.close()
	run := t.run
	run.Status, run.Usage, run.Steps, run.Model = agent.RunRunning, s.usage, s.steps, s.model
	return run
}

// resume puts a continuation's carried state on the stepper: steps, usage and model as the run left them.
func (s *stepper) resume() {
	h := &s.turn.ho
	if h.from == nil {
		return
	}
	s.steps, s.usage, s.model = h.from.Steps, h.usage, h.model
}

// keep stops the slot's renewals without giving it back: the run goes on in a continuation, which renews it.
func (s *runSlot) keep() {
	if s != nil {
		s.once.Do(s.stop)
	}
}

// Continue continues a run that handed over (agent.Continuation), with no client attached, to its end or to its
// next hand-over. It returns the run as the stream left it; an error when the run could not be taken up (its claim
// moved: agent.ErrRunFenced; the store failing), in which case nothing was written.
func (e *Engine) Continue(ctx context.Context, c agent.Continuation) (agent.Run, error) {
	invocation := ctx // its deadline is the continuation's: it hands over again before it (Stream)
	ctx = context.WithoutCancel(ctx)
	meter, began := new(agent.StoreMeter), time.Now()
	ctx = agent.WithStoreMeter(ctx, meter)
	log := e.log.With("thread_id", c.ThreadID, "run_id", c.RunID)
	at := e.clock.Now()
	var res agent.ClaimResult
	err := e.retry(ctx, func() error {
		var err error
		res, err = e.store.HandOver(ctx, agent.HandOverRequest{ThreadID: c.ThreadID, Fence: agent.Fence{RunID: c.RunID, Epoch: c.Epoch}, Now: at})
		return err
	})
	if err != nil {
		log.Info("continuation not taken up", "epoch", c.Epoch, "err", err)
		return agent.Run{}, err
	}
	t := &Turn{e: e, run: res.Run, thread: res.Thread, owner: res.Thread.Owner, claimedAt: at, meter: meter, began: began,
		ho: handOverState{from: &c, count: c.HandOvers}}
	if err := t.takeUp(ctx); err != nil {
		// The claim is ours at the new epoch: it goes stale and the reaper finishes the run from what is stored.
		log.Error("continuation: read the run; leaving it to the reaper", "err", err)
		return t.run, err
	}
	t.slot = e.keepRunSlot(ctx, t.owner, t.run.ID)
	log.InfoContext(ctx, "run continued", "epoch", t.run.Epoch, "segment", c.Segment, "steps", c.Steps, "hand_overs", c.HandOvers)
	return t.Stream(invocation, io.Discard), nil
}

// takeUp reads what the continuation goes on from: the reply as stored (its parts are the draft; its metadata the
// usage, model and the reply it replaces), written back at once at the new epoch, and the thread's window before
// it (the history).
func (t *Turn) takeUp(ctx context.Context) error {
	e := t.e
	rec, err := e.store.GetMessage(ctx, t.thread.ID, t.run.AssistantMessageID)
	if err != nil {
		return fmt.Errorf("get the reply: %w", err)
	}
	w := agent.MessageWrite{ThreadID: t.thread.ID, Seq: t.run.AssistantSeq(), Message: rec.Message, Fence: t.run.Fence()}
	if err := t.fenced(ctx, func(ctx context.Context) error { w.Now = e.clock.Now(); return e.store.PutMessage(ctx, w) }); err != nil {
		return fmt.Errorf("write the reply at the new epoch: %w", err)
	}
	md := rec.Message.Meta()
	if md.Usage != nil {
		t.ho.usage = *md.Usage
	}
	t.ho.model = md.Model
	for _, raw := range rec.Message.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil {
			return fmt.Errorf("decode the reply: %w", err)
		}
		if p.Type == agent.RunErrorPart {
			continue
		}
		t.plan.draft = append(t.plan.draft, p)
	}
	t.plan.replaces = md.Replaces
	win := &window{first: e.cfg.WindowPage}
	if err := win.readOn(ctx, e.store, t.thread.ID); err != nil {
		return err
	}
	if err := win.fill(ctx, e.store, t.thread.ID, e.budget(), budgetMet(e.budget())); err != nil {
		return err
	}
	t.plan.history = slices.DeleteFunc(win.messages(), func(m agent.Message) bool {
		return m.ID == rec.Message.ID || m.ID == md.Replaces
	})
	return nil
}

// keepRunSlot takes the run's slot in its user's active-run scope again (the same holder: the run id), renewed
// while the continuation runs, whatever the count says: the run was admitted when it began.
func (e *Engine) keepRunSlot(ctx context.Context, owner, runID string) *runSlot {
	slot, err := e.acquireRunSlot(ctx, Request{Owner: owner, Kind: TurnQueued}, runID)
	if err != nil {
		e.log.Warn("continuation: take the run slot", "run_id", runID, "err", err)
	}
	return slot
}
