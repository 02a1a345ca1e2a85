package reaper

import (
	"context"
	"errors"

	"github.com/agentloop/agentloop/lib/agent"
)

// finishEdit does the cleanup an editing run left undone when it died (fence D): its edit committed in one
// write on the edited message, which hides every later message, and the run deletes those afterwards and cancels
// the interrupts of the reply it dropped. The reaper, holding the thread at hold, deletes the messages the edit
// hides that a store keeps until deleted (agent.EditCleaner), and cancels every
// pending interrupt another run stored whose message is gone. Nothing a reader sees changes. Best effort, like
// the run's own cleanup: a failure is logged, and the edit stands either way. A run whose edit never landed
// hides nothing, so this finds nothing to do.
func (r *Reaper) finishEdit(ctx context.Context, run agent.Run, hold agent.Fence) {
	if run.Trigger != agent.TriggerEdit {
		return
	}
	log := r.log.With("thread_id", run.ThreadID, "run_id", run.ID, "message_id", run.UserMessageID)
	// The run item names the edited message where the store needs it named (fence B); a store that names no
	// hidden message (SQLite: the edit's write deleted them) does not keep it.
	if c, ok := r.store.(agent.EditCleaner); ok && run.UserMessageID != "" {
		ids, err := c.HiddenByEdit(ctx, run.ThreadID, run.UserMessageID)
		if err != nil {
			log.Warn("reaper: edit cleanup: list the hidden messages", "err", err)
			return
		}
		for _, id := range ids {
			if err := retry(ctx, func() error { return r.store.DeleteMessage(ctx, run.ThreadID, id, hold) }); err != nil {
				log.Warn("reaper: edit cleanup: delete a hidden message (it stays hidden)", "hidden_id", id, "err", err)
				return
			}
		}
		// The store's edit record (agent.EditSettler) stays: settling it deletes an item, which the reaper's
		// policy never grants (REVIEW H11); it only costs readers its look-up, and the next edit of the message
		// settles it.
	}
	ins, err := r.store.ListInterrupts(ctx, run.ThreadID)
	if err != nil {
		log.Warn("reaper: edit cleanup: list interrupts", "err", err)
		return
	}
	now := r.clock.Now()
	for _, in := range ins {
		if in.Status != agent.InterruptPending || in.RunID == run.ID { // the run's own: cancelAsked
			continue
		}
		if _, err := r.store.GetMessage(ctx, run.ThreadID, in.MessageID); !agent.IsKind(err, agent.KindNotFound) {
			continue
		}
		st := agent.InterruptCanceled
		if !in.Pending(now) {
			st = agent.InterruptExpired
		}
		err := retry(ctx, func() error {
			_, err := r.store.ResolveInterrupt(ctx, in.Resolve(st, now))
			return err
		})
		if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
			log.Warn("reaper: edit cleanup: cancel an interrupt of a hidden message", "interrupt_id", in.ID, "err", err)
		}
	}
}
