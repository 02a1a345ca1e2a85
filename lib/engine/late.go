package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Late usage (issue 10: "reaped and fenced runs count the tokens they spent, exactly once").
//
// A run that lost its claim was finished by the reaper, which counted (into the run and the thread) the usage its
// draft message recorded when the reaper read it. The run itself knows everything its model calls reported: the
// difference (steps after the last draft write the reaper saw) is its late usage. It records that once, after
// the reaper's outcome is stored (the run item terminal at its epoch, so no FinishRun can overwrite the run's
// usage any more): RecordLateUsage is insert-once per run in the store, so a retried or duplicated write counts
// once, and a crash before it loses only this run's late part (logged below, never counted twice).
//
// This write is the one exception to DESIGN principle 8 the issue asks for: it changes no message, segment or
// outcome a reader sees, only the run's and the thread's usage, and only by what the run reported spending.
//
// What it cannot count: a model call aborted when the claim was lost reported no usage (providers report it at
// the end of a stream), though the provider may bill the prompt and the partial output; and a run that stopped
// itself because its claim was in doubt (heartbeats failing) is reaped only later, when it is gone: the reaper
// then counts what its draft holds, and the run's agent.late_usage line (recorded=false) carries the rest. So
// does a run whose final message could not be stored (engine finish, "leaving the run to the reaper").

// lateReads bounds how often recordLate reads the run for the reaper's outcome, lateWaitPoll apart. The reaper
// records the outcome right after its release, and a fenced run learns of the release only at its next store
// write or heartbeat, so the first read nearly always finds it; the bound keeps a run whose claim is merely in
// doubt (no reaper yet) from waiting.
const (
	lateReads    = 3
	lateWaitPoll = 50 * time.Millisecond
)

// recordLate records the run's late usage once the reaper's outcome is stored.
func (s *stepper) recordLate(ctx context.Context) {
	t, e := s.turn, s.turn.e
	if s.usage == (agent.Usage{}) {
		return
	}
	log := s.log.With("input_tokens", s.usage.InputTokens, "output_tokens", s.usage.OutputTokens,
		"cost_micro_usd", s.usage.CostMicroUSD)
	for i := range lateReads {
		if i > 0 {
			time.Sleep(lateWaitPoll)
		}
		run, err := e.store.GetRun(ctx, t.thread.ID, t.run.ID)
		switch {
		case err != nil && agent.KindOf(err) != agent.KindUnavailable:
			log.Warn("agent.late_usage", "recorded", false, "err", err)
			return
		case err != nil:
		case run.Epoch != t.run.Epoch:
			return // not this run's record (cannot happen: a run id is claimed once)
		case run.LateUsage != nil:
			s.late = run.LateUsage // recorded before (a retry of this very call)
			return
		case run.Status.Terminal():
			s.writeLate(ctx, log, subUsage(s.usage, run.Usage))
			return
		}
	}
	// Not finished by a reaper (the claim may only be in doubt: heartbeats failing). The reaper will count what
	// the draft holds; this line carries what the run knows it spent.
	log.Warn("agent.late_usage", "recorded", false, "reason", "the run is not finished by a reaper yet")
}

// writeLate stores late, unless there is nothing to add.
func (s *stepper) writeLate(ctx context.Context, log *slog.Logger, late agent.Usage) {
	t, e := s.turn, s.turn.e
	if late == (agent.Usage{}) {
		return
	}
	if late.InputTokens < 0 || late.OutputTokens < 0 || late.TotalTokens < 0 || late.CachedInputTokens < 0 ||
		late.ReasoningTokens < 0 || late.CostMicroUSD < 0 {
		// The reaper counted more than this run knows it spent: nothing of ours is missing.
		log.Warn("agent.late_usage", "recorded", false, "reason", "the reaper counted more than the run reported")
		return
	}
	err := e.retry(ctx, func() error {
		return e.store.RecordLateUsage(ctx, agent.LateUsage{ThreadID: t.thread.ID, ThreadCreatedAt: t.thread.CreatedAt,
			Fence: t.run.Fence(), Usage: late})
	})
	if err != nil {
		log.Warn("agent.late_usage", "recorded", false, "err", err)
		return
	}
	s.late = &late
	log.Info("agent.late_usage", "recorded", true, "late_input_tokens", late.InputTokens, "late_output_tokens", late.OutputTokens)
}

// subUsage is a-b, field by field.
func subUsage(a, b agent.Usage) agent.Usage {
	return agent.Usage{InputTokens: a.InputTokens - b.InputTokens, OutputTokens: a.OutputTokens - b.OutputTokens,
		TotalTokens: a.TotalTokens - b.TotalTokens, CachedInputTokens: a.CachedInputTokens - b.CachedInputTokens,
		ReasoningTokens: a.ReasoningTokens - b.ReasoningTokens, CostMicroUSD: a.CostMicroUSD - b.CostMicroUSD}
}
