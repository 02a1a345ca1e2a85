package engine

import (
	"context"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/uistream"
)

// finish stores the final message (fenced, finalized, retried), records the run's outcome and releases the claim
// (adding usage in that same write), hides a regenerated reply, and ends the stream. A reply that could not be
// stored is never reported completed: the run then keeps its claim, which goes stale, and the reaper recovers the
// reply from the stream segments.
func (s *stepper) finish(ctx context.Context, status agent.RunStatus, runErr *agent.RunError) agent.Run {
	t, e := s.turn, s.turn.e
	if err := t.awaitUser(); err != nil {
		s.log.Error("store user message", "err", err)
		if lostClaim(err) || errors.Is(err, errInDoubt) {
			return s.abandon(ctx, errFenced)
		}
		// The reply has nothing to answer: leave no message, release the claim, tell the client.
		runErr := &agent.RunError{Code: agent.CodePersistFailed, Message: "Your message could not be saved; please send it again."}
		if errors.Is(err, agent.ErrThreadTooLarge) { // sending it again cannot pass (REVIEW D12)
			code, msg := agent.Public(err)
			runErr = &agent.RunError{Code: code, Message: msg}
		}
		t.run.Status, t.run.Error, t.run.Usage, t.run.Steps, t.run.Model = agent.RunFailed, runErr, s.usage, s.steps, s.model
		t.run.FinishedAt = e.clock.Now()
		t.run.UpdatedAt = t.run.FinishedAt
		t.run.Store = s.storeUsage()
		if err := t.finishRun(ctx); err != nil {
			s.log.Error("finish run", "err", err)
		}
		s.end(agent.MessageFailed, runErr, agent.FinishError)
		return t.run
	}
	if status != agent.RunInterrupted {
		// These tools never started (the run stopped first), so "not executed" is true.
		s.parts = transcript.Synthesize(s.parts, "Not executed: the run was "+string(status)+".", nil)
	}
	msgStatus := status.MessageStatus()
	if msgStatus == agent.MessageFailed && runErr != nil {
		s.failure = runErr // the stored reply and the stream show it alike (message, end)
	}
	if err := s.putMessage(ctx, msgStatus, true); err != nil {
		s.failure = nil // not this run's reply: the reaper stores it (or someone else owns the thread)
		if lostClaim(err) {
			return s.abandon(ctx, errFenced)
		}
		// Failing for good, or for so long that the claim is in doubt: either way the reply is not stored, and
		// the reaper recovers it from the segments once the claim is stale.
		s.log.Error("persist final message; leaving the run to the reaper", "err", err)
		return s.unsaved(ctx)
	}
	if old := t.plan.replaces; old != "" && (status == agent.RunCompleted || status == agent.RunInterrupted) && s.guard.writable() {
		// Hidden while the claim is still ours (the new reply names it, so readers skip it even if this fails).
		if err := t.fenced(ctx, func(ctx context.Context) error { return e.store.DeleteMessage(ctx, t.thread.ID, old, t.run.Fence()) }); err != nil {
			s.log.Warn("hide regenerated reply", "message_id", old, "err", err)
		}
	}
	t.run.Status, t.run.Error, t.run.Usage, t.run.Steps, t.run.Model = status, runErr, s.usage, s.steps, s.model
	t.run.FinishedAt = e.clock.Now()
	t.run.UpdatedAt = t.run.FinishedAt
	t.run.Store = s.storeUsage()
	if err := t.finishRun(ctx); err != nil {
		if lostClaim(err) || errors.Is(err, errInDoubt) {
			return s.abandon(ctx, errFenced)
		}
		// The reaper finishes the run from its stored final message (the claim goes stale).
		s.log.Error("finish run; leaving the run to the reaper", "err", err)
	} else {
		s.out.released.Store(true) // the outcome is stored: the final segment goes out (REVIEW D7)
	}
	s.end(msgStatus, runErr, finishReason(status, s.finishReason))
	return t.run
}

// finishNoop ends a turn that had nothing to do (every answer it carried was applied already): the run is
// recorded completed with no steps, and the stream reports the stored message as it is. When that record fails
// (finishEmpty), the stream reports a failed finish as finish does: refused or in doubt, the run lost its claim
// (abandon); failing for good, the run is left to the reaper (unsaved), which records it failed and rewrites the
// reply under its own fence. Either way the stream gets no end of this run's, so readers read the reaper's, never
// the stored reply's metadata (which names the run that stored it) for a run the store ends up calling failed.
func (s *stepper) finishNoop(ctx context.Context) agent.Run {
	t := s.turn
	t.run.Store = s.storeUsage()
	if err := t.finishEmpty(ctx); err != nil {
		if lostClaim(err) || errors.Is(err, errInDoubt) {
			return s.abandon(ctx, errFenced)
		}
		s.log.Error("finish a run with nothing to do; leaving the run to the reaper", "err", err)
		return s.unsaved(ctx)
	}
	s.out.released.Store(true) // the outcome is stored: the final segment goes out (REVIEW D7), as finish's
	md := t.plan.noopMessage.Metadata
	if len(md) == 0 {
		md = metadataJSON(agent.MessageMetadata{RunID: t.run.ID, Status: agent.MessageCompleted})
	}
	s.out.send(uistream.Finish{FinishReason: agent.FinishStop, Metadata: md})
	s.out.close()
	return t.run
}

// finishEmpty records a turn that had nothing to do completed, with no steps: a continuation whose answers were
// all applied already (finishNoop), a delivery pass with nothing to deliver (release). One rule for both: when it
// fails (refused, in doubt, or failing past the retries), the turn writes no end of its own. Its outcome may not be
// stored: the reaper records it (failed) once the claim is stale and writes the stream's end, or, if it landed
// after all, readers end the stream themselves; an end saying completed, or the stored reply's, could contradict
// what the store says.
func (t *Turn) finishEmpty(ctx context.Context) error {
	now := t.e.clock.Now()
	t.run.Status, t.run.FinishedAt, t.run.UpdatedAt = agent.RunCompleted, now, now
	return t.finishRun(ctx)
}

// end sends the stream's last chunks: on an error, message-metadata first (the client stops reading at the
// error chunk), then error and finish; and closes the stream (final segment, [DONE]). A failed reply the run
// stored (failure) gets the part that shows its error first, as stored (agent.RunErrorPart), and its metadata
// the error, so the client's copy of the reply is the stored one.
func (s *stepper) end(st agent.MessageStatus, runErr *agent.RunError, reason agent.FinishReason) {
	u := s.usage
	md := metadataJSON(agent.MessageMetadata{RunID: s.turn.run.ID, Model: s.model, Status: st, Usage: &u, Error: s.failure})
	if f := s.failure; f != nil {
		s.out.send(uistream.Data{Type: agent.RunErrorPart, ID: s.turn.run.ID, Data: metadataJSON(*f)})
	}
	if runErr != nil {
		s.out.send(uistream.MessageMetadata{Metadata: md})
		s.out.send(uistream.Error{ErrorText: runErr.Message})
	}
	s.out.send(uistream.Finish{FinishReason: reason, Metadata: md})
	s.out.close()
}

// abandon ends a run that lost its claim: it tells the client and writes nothing more that a reader sees of its
// messages, segments or outcome (not even a segment: the reaper or the new claim holder owns the thread's story
// now). The one write it still makes is the accounting the issue asks for: the tokens it spent beyond what the
// reaper counted from its draft (recordLate).
func (s *stepper) abandon(ctx context.Context, cause error) agent.Run {
	t := s.turn
	s.log.Warn("run lost its claim; stopping without writes", "cause", cause)
	s.out.detach()
	s.failure = nil
	s.end(agent.MessageFailed, &agent.RunError{Code: agent.CodeRunFenced, Message: "This run was taken over and stopped."}, agent.FinishError)
	s.recordLate(ctx)
	t.run.Status = agent.RunFailed
	t.run.Error = &agent.RunError{Code: agent.CodeRunFenced, Message: "the run lost its claim"}
	t.run.Usage = s.usage
	return t.run
}

// storeUsage is what the run has cost the store so far, for its outcome (the FinishRun write that stores it,
// the final segment and the queue pass after it are not in it; the agent.run line counts them).
func (s *stepper) storeUsage() *agent.StoreUsage {
	st := s.turn.meter.Snapshot()
	return &st
}

// unsaved ends a run whose reply could not be stored: the client learns it failed (never completed), the stream
// segments keep the reply, and the claim is left to go stale so the reaper recovers the message from them. The
// reaper counts the usage the draft recorded; the run records the rest once it is reaped (recordLate, REVIEW D6).
// The stream's end is the client's only: the segments get everything sent before it, and no final segment,
// because a write that failed may have landed (a lost answer, then refused retries) and the reaper adopts it;
// the final segment is the reaper's, saying the outcome it recorded, so readers learn the same as the thread.
func (s *stepper) unsaved(ctx context.Context) agent.Run {
	t := s.turn
	runErr := &agent.RunError{Code: agent.CodePersistFailed, Message: "The reply could not be saved."}
	s.out.flush()
	s.out.detach()
	s.end(agent.MessageFailed, runErr, agent.FinishError)
	s.recordLate(ctx)
	t.run.Status, t.run.Error, t.run.Usage = agent.RunFailed, runErr, s.usage
	return t.run
}

// finishReason is the finish chunk's reason: the model's, unless the run failed or was canceled.
func finishReason(status agent.RunStatus, model agent.FinishReason) agent.FinishReason {
	switch {
	case status == agent.RunFailed:
		return agent.FinishError
	case status == agent.RunCanceled || model == "":
		return agent.FinishOther
	}
	return model
}
