package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentloop/agentloop/lib/agent"
)

// Continuing a handed-over run (issue 21 item 1). A run that handed over stored its reply with the continuation
// it handed over to (agent.MessageMetadata.HandedOver, at the epoch it stopped at). When the claim still names the
// run at that epoch once it is stale, the continuation never took it up: its launcher's process died (a drained
// replica declines to start it: lib/devserver's Serve), or its launch was lost. The sweep then continues the run
// through the reaper's own launcher (Deps.Launcher) instead of reaping it, each step conditional:
//
//  1. read the run and its reply (before any decision: a nominee that is not such a run is reaped as always);
//  2. take the claim for the run at epoch+1 with a fresh heartbeat (agent.HandOverStore.HandOver from the epoch
//     the hand-over stopped at: the decision; of two reapers, or a reaper and the late original continuation, one
//     moves it and the other does nothing). The fresh heartbeat gives the relaunched continuation a stale window
//     to start in, and no sweep relaunches it again before then;
//  3. store the reply at the new epoch with the continuation counted (HandedOver.Epoch the new one, Relaunches+1);
//  4. launch the continuation from the new epoch (its own HandOver moves the claim once more, so a duplicate
//     launch does nothing). A launch that fails reaps the run at once, at the claim step 2 took.
//
// A run whose whole-run time is spent (Config.RunTimeout from its creation, as the engine counts it), or that was
// relaunched MaxRelaunches times without taking a step (a continuation's own draft writes carry no HandedOver, so
// a continuation that took a step resets the count), is reaped as any. A reaper without a launcher (Deps.Launcher
// nil) reaps them; one held (Hold: a draining replica, a function with no grant to launch) leaves them to other
// reapers until they are past those bounds, then reaps them.

// DefaultMaxRelaunches bounds the relaunches of a run's continuation without progress.
const DefaultMaxRelaunches = 3

// Hold makes the reaper leave handed-over runs within their bounds to other reapers (neither continued here nor
// reaped): a draining replica's, whose continuations would start in a process about to exit, and in AWS the lazy
// reaps of the functions that cannot launch (the reaper function and the chat function do).
func (r *Reaper) Hold() { r.held.Store(true) }

// relaunched is what relaunch did with a stale claim.
type relaunched int

const (
	notHandedOver relaunched = iota // not a handed-over run within its bounds: reap it as any
	continued                       // its continuation launched (or another reaper, or the continuation, moved it)
	left                            // left to another reaper (Hold)
	reapedNow                       // the launch failed: reaped here
)

// relaunch continues the run that stale claim c names when it handed over and its continuation never took the
// claim (notHandedOver: the caller reaps it as any).
func (r *Reaper) relaunch(ctx context.Context, threadID string, c agent.Claim) (relaunched, error) {
	if (r.launcher == nil && !r.held.Load()) || agent.IsReapClaim(c.RunID) {
		return notHandedOver, nil
	}
	run, err := r.store.GetRun(ctx, threadID, c.RunID)
	if err != nil || run.Status != agent.RunRunning || run.Epoch != c.Epoch || run.AssistantMessageID == "" {
		return notHandedOver, nil // Reap reads it again and decides
	}
	rec, err := r.store.GetMessage(ctx, threadID, run.AssistantMessageID)
	if err != nil {
		return notHandedOver, nil
	}
	md := rec.Message.Meta()
	ho := md.HandedOver
	if ho == nil || ho.RunID != run.ID || ho.Epoch != c.Epoch {
		return notHandedOver, nil // not handed over at this epoch: the run died in a step
	}
	log := r.log.With("thread_id", threadID, "run_id", run.ID, "epoch", c.Epoch)
	now := r.clock.Now()
	if ho.Relaunches >= r.cfg.MaxRelaunches || now.Sub(run.CreatedAt) >= r.cfg.RunTimeout {
		log.Info("agent.relaunch", "outcome", "reaped", "relaunches", ho.Relaunches, "age", now.Sub(run.CreatedAt))
		return notHandedOver, nil
	}
	if r.held.Load() {
		return left, nil
	}
	res, err := r.store.HandOver(ctx, agent.HandOverRequest{ThreadID: threadID, Fence: agent.Fence{RunID: c.RunID, Epoch: c.Epoch}, Now: now})
	if errors.Is(err, agent.ErrRunFenced) {
		return continued, nil // another reaper, or the continuation itself, moved it first
	} else if err != nil {
		return continued, fmt.Errorf("reaper: relaunch: take the claim: %w", err)
	}
	next := *ho
	next.Epoch, next.Relaunches = res.Run.Epoch, ho.Relaunches+1
	md.HandedOver = &next
	msg := rec.Message
	if msg.Metadata, err = json.Marshal(md); err != nil {
		return continued, err
	}
	hold := res.Run.Fence()
	w := agent.MessageWrite{ThreadID: threadID, Seq: res.Run.AssistantSeq(), Message: msg, Fence: hold, Now: now}
	if err := r.store.PutMessage(ctx, w); err != nil {
		// The claim at the new epoch goes stale with the reply's HandedOver at the old one: reaped then.
		return continued, fmt.Errorf("reaper: relaunch: store the reply: %w", err)
	}
	if err := r.launcher.Launch(ctx, next); err != nil {
		log.Warn("agent.relaunch", "outcome", "launch failed; reaped", "err", err)
		_, err := r.reap(ctx, threadID, agent.Claim{RunID: hold.RunID, Epoch: hold.Epoch}, now.Add(everyHeartbeat), now)
		return reapedNow, err
	}
	log.Info("agent.relaunch", "outcome", "continued", "epoch_to", next.Epoch, "segment", next.Segment, "steps", next.Steps,
		"relaunches", next.Relaunches)
	return continued, nil
}
