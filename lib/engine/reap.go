package engine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// ReapRun finishes a run whose Lambda died (DESIGN.md "Reaper"): mark the run failed with code stale (fenced by
// epoch) and release the claim if it still names the run; finalize the draft assistant message as failed with a
// synthesized result for every call without one; write a final error + finish segment so attached readers end.
// Every step is conditional or idempotent, so two reapers (or a reaper and a lazy claimer) do no harm.
func (e *Engine) ReapRun(ctx context.Context, threadID, runID string, epoch int64) error {
	run, err := e.store.GetRun(ctx, threadID, runID)
	if agent.IsKind(err, agent.KindNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reap: get run: %w", err)
	}
	if run.Epoch != epoch {
		return nil
	}
	if run.Status == agent.RunRunning {
		now := e.clock.Now()
		run.Status = agent.RunFailed
		run.Error = &agent.RunError{Code: agent.CodeStale, Message: "the run stopped sending heartbeats"}
		run.FinishedAt, run.UpdatedAt = now, now
		switch err := e.store.FinishRun(ctx, run); {
		case err == nil:
		case agent.CodeOf(err) == agent.CodeRunFenced:
			// Someone finished it first (another reaper, or the run itself): go on only if that was a reap.
			if run, err = e.store.GetRun(ctx, threadID, runID); err != nil {
				return fmt.Errorf("reap: re-read run: %w", err)
			}
		default:
			return fmt.Errorf("reap: finish run: %w", err)
		}
	}
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale {
		return nil // the run ended on its own terms; its message and stream are its own
	}
	rec, err := e.store.GetMessage(ctx, threadID, run.AssistantMessageID)
	switch {
	case agent.IsKind(err, agent.KindNotFound):
	case err != nil:
		return fmt.Errorf("reap: get message: %w", err)
	case rec.Message.Meta().Status == agent.MessageStreaming || rec.Message.Meta().Status == "":
		md := rec.Message.Meta()
		md.Status = agent.MessageFailed
		md.RunID = run.ID
		rec.Message.Metadata, _ = json.Marshal(md)
		rec.Message.Parts = synthesizeMissingResults(rec.Message.Parts, "stopped")
		if err := e.store.PutMessage(ctx, threadID, rec.Seq, rec.Message, e.clock.Now()); err != nil {
			return fmt.Errorf("reap: finalize message: %w", err)
		}
	}
	segs, err := e.store.ListSegments(ctx, runID, 0, e.clock.Now())
	if err != nil {
		return fmt.Errorf("reap: list segments: %w", err)
	}
	var next int64
	for _, s := range segs {
		if s.Final {
			return nil
		}
		next = s.Seq + 1
	}
	data, err := uistream.Frames(uistream.Error{ErrorText: "The run stopped unexpectedly."}, uistream.Finish{FinishReason: agent.FinishError})
	if err != nil {
		return err
	}
	data = uistream.AppendDone(data)
	now := e.clock.Now()
	return e.store.AppendSegment(ctx, agent.Segment{ThreadID: threadID, RunID: runID, Seq: next, Data: data, Final: true,
		CreatedAt: now, ExpiresAt: now.Add(agent.SegmentTTL)})
}

// ReapStale reaps up to limit runs whose claim's heartbeat is older than StaleAfter (the reaper's tick). It
// returns how many claims it found; a failure on one run is logged and the others go on.
func (e *Engine) ReapStale(ctx context.Context, limit int) (int, error) {
	claims, err := e.store.ListStaleClaims(ctx, e.clock.Now().Add(-e.cfg.StaleAfter), limit)
	if err != nil {
		return 0, fmt.Errorf("reap: list stale claims: %w", err)
	}
	for _, sc := range claims {
		if err := ctx.Err(); err != nil {
			return len(claims), err
		}
		if err := e.ReapRun(ctx, sc.ThreadID, sc.Claim.RunID, sc.Claim.Epoch); err != nil {
			e.log.Warn("reap", "thread_id", sc.ThreadID, "run_id", sc.Claim.RunID, "err", err)
			continue
		}
		e.log.Info("reaped", "thread_id", sc.ThreadID, "run_id", sc.Claim.RunID, "epoch", sc.Claim.Epoch)
	}
	return len(claims), nil
}
