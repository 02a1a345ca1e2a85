package engine

import (
	"cmp"
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
// the end of a stream), though the provider may bill the prompt and the partial output.
//
// A run left to the reaper while its claim is still its own (heartbeats failing: in doubt; or its reply could not
// be stored: unsaved) is reaped only once that claim is stale, after the run has answered its client. It waits
// for that in the background (Engine.Wait), reading the run every StaleAfter/8 (50 ms to 5 s) until a reaper's outcome is stored, for
// at most two stale windows and lateReaperPeriod (the AWS reaper's schedule; in `agentloop dev` the reaper ticks
// every few seconds, and a claim or a read of the thread reaps lazily) (REVIEW D6). A process that ends first
// (a Lambda frozen after its response) loses only that run's late part, logged with recorded=false.

// lateReads bounds how often recordLate reads the run for the reaper's outcome, lateWaitPoll apart, before it
// waits in the background. The reaper records the outcome right after its takeover, and a fenced run learns of
// it only at its next store write or heartbeat, so the first read nearly always finds it.
const (
	lateReads         = 3
	lateWaitPoll      = 50 * time.Millisecond
	lateReaperPeriod  = time.Minute
	latePollMax       = 5 * time.Second
	latePollMinimum   = 50 * time.Millisecond
	latePollPerWindow = 8 // reads per stale window while waiting in the background
)

// recordLate records the run's late usage once the reaper's outcome is stored: at once when it is there, else in
// the background.
func (s *stepper) recordLate(ctx context.Context) {
	if s.usage == (agent.Usage{}) {
		return
	}
	log := s.lateLog()
	for i := range lateReads {
		if i > 0 {
			_ = s.turn.e.timers.Sleep(context.WithoutCancel(ctx), lateWaitPoll)
		}
		if late, done := s.tryLate(ctx, log); done {
			s.late = late
			return
		}
	}
	if s.turn.e.cfg.LateWait < 0 {
		log.Warn("agent.late_usage", "recorded", false, "reason", "the run is not finished by a reaper yet")
		return
	}
	s.lateInBackground(ctx, log)
}

func (s *stepper) lateLog() *slog.Logger {
	return s.log.With("input_tokens", s.usage.InputTokens, "output_tokens", s.usage.OutputTokens,
		"cost_micro_usd", s.usage.CostMicroUSD)
}

// lateInBackground waits for the reaper's outcome beside the engine's other work (Engine.Wait) and records the
// late usage then. It reads only what no longer changes (the turn's fence, the run's usage).
func (s *stepper) lateInBackground(ctx context.Context, log *slog.Logger) {
	e := s.turn.e
	poll := min(max(e.cfg.StaleAfter/latePollPerWindow, latePollMinimum), latePollMax)
	until := e.timers.After(cmp.Or(e.cfg.LateWait, 2*e.cfg.StaleAfter+lateReaperPeriod))
	e.background.Add(1)
	go func() {
		defer e.background.Done()
		for !passed(until) {
			_ = e.timers.Sleep(context.WithoutCancel(ctx), poll)
			if _, done := s.tryLate(ctx, log); done {
				return
			}
		}
		log.Warn("agent.late_usage", "recorded", false, "reason", "the run was not finished by a reaper in time")
	}()
}

// tryLate reads the run once: done when the late usage is recorded (returned, nil when there was none to add) or
// cannot be; not done while no reaper has finished the run.
func (s *stepper) tryLate(ctx context.Context, log *slog.Logger) (*agent.Usage, bool) {
	t, e := s.turn, s.turn.e
	run, err := e.store.GetRun(ctx, t.thread.ID, t.run.ID)
	switch {
	case err != nil && agent.KindOf(err) != agent.KindUnavailable:
		log.Warn("agent.late_usage", "recorded", false, "err", err)
		return nil, true
	case err != nil:
		return nil, false
	case run.Epoch != t.run.Epoch:
		return nil, true // not this run's record (cannot happen: a run id is claimed once)
	case run.LateUsage != nil:
		return run.LateUsage, true // recorded before (a retry of this very call)
	case run.Status.Terminal():
		return s.writeLate(ctx, log, subUsage(s.usage, run.Usage)), true
	}
	return nil, false
}

// writeLate stores late, unless there is nothing to add; it returns what it stored.
func (s *stepper) writeLate(ctx context.Context, log *slog.Logger, late agent.Usage) *agent.Usage {
	t, e := s.turn, s.turn.e
	if late == (agent.Usage{}) {
		return nil
	}
	if late.InputTokens < 0 || late.OutputTokens < 0 || late.TotalTokens < 0 || late.CachedInputTokens < 0 ||
		late.ReasoningTokens < 0 || late.CostMicroUSD < 0 {
		// The reaper counted more than this run knows it spent: nothing of ours is missing.
		log.Warn("agent.late_usage", "recorded", false, "reason", "the reaper counted more than the run reported")
		return nil
	}
	err := e.retry(ctx, func() error {
		return e.store.RecordLateUsage(ctx, agent.LateUsage{ThreadID: t.thread.ID, ThreadCreatedAt: t.thread.CreatedAt,
			Fence: t.run.Fence(), Usage: late})
	})
	if err != nil {
		log.Warn("agent.late_usage", "recorded", false, "err", err)
		return nil
	}
	log.Info("agent.late_usage", "recorded", true, "late_input_tokens", late.InputTokens, "late_output_tokens", late.OutputTokens)
	return &late
}

// subUsage is a-b, field by field.
func subUsage(a, b agent.Usage) agent.Usage {
	return agent.Usage{InputTokens: a.InputTokens - b.InputTokens, OutputTokens: a.OutputTokens - b.OutputTokens,
		TotalTokens: a.TotalTokens - b.TotalTokens, CachedInputTokens: a.CachedInputTokens - b.CachedInputTokens,
		ReasoningTokens: a.ReasoningTokens - b.ReasoningTokens, CacheWriteTokens: a.CacheWriteTokens - b.CacheWriteTokens,
		CostMicroUSD: a.CostMicroUSD - b.CostMicroUSD}
}
