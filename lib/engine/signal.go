package engine

import "context"

// Completion signals (issue 21 item 4; lib/signals). Every write of a run's outcome (FinishRun: finish,
// finishEmpty, abort) goes through finishRun, which arms the run's signal in that same write: the store keeps it
// pending with the outcome, so a process that dies after the run ended leaves it to the reaper's sweep. The turn
// then delivers it itself, once: Stream does, after everything else (the final segment and [DONE] are out, the
// titler has run), so the signal never holds the stream's end; a turn that ends outside Stream (a run refused after
// its claim, abort; a delivery pass with nothing to do, release) answers its caller first and leaves the signal to
// the sweep, armed due at once. A run that lost its claim records no outcome and signals nothing: whoever records
// its outcome (the reaper) signals it. Nothing of it changes the run: a failed delivery is only logged (and retried
// by the sweep).

// finishRun records the run's outcome (FinishRun, fenced), its completion signal armed in the same write.
func (t *Turn) finishRun(ctx context.Context) error {
	e := t.e
	if e.signals != nil {
		t.run.Signal = e.signals.Arm(t.owner, t.run.FinishedAt)
		if !t.streaming {
			t.run.Signal.DueAt = t.run.FinishedAt // nobody delivers it here: the next sweep does
		}
	}
	err := t.fenced(ctx, func(ctx context.Context) error { return e.store.FinishRun(ctx, t.run) })
	t.signalArmed = err == nil && t.run.Signal != nil
	return err
}

// signal delivers the run's completion signal when this turn stored its outcome (once).
func (t *Turn) signal(ctx context.Context) {
	if !t.signalArmed || !t.streaming {
		return
	}
	t.signalArmed = false
	t.e.signals.Deliver(context.WithoutCancel(ctx), t.run)
}
