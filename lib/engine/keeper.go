package engine

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The keeper (issue 18 item 3): one per Engine, that is one per process, it keeps the claims of all the process's
// running runs alive with one store call per Heartbeat period, whatever their number. A run's guard joins it when
// the run starts streaming and leaves it when the run loop ends; every Heartbeat (on the engine's timers) the
// keeper sends one agent.RunStore.KeepClaims batch of every member whose claim is still surely its own, each
// claim with its run's write gate (Turn.mayWrite), stamped with one now. The batch carries a deadline at the
// earliest horizon among its members (a cut batch is a failed heartbeat for each of them). Each member's answer
// is its own, exactly as its guard's own heartbeat answered before: accepted moves that run's horizon on
// (Turn.kept at the now sent); run_canceled moves it too and cancels that run (a stop is not a fence, REVIEW D2:
// it stays a member until its loop ends, so its claim lives while it stores its outcome); run_fenced cancels
// that run as fenced; a transient error changes nothing, and a run whose horizon passes stops itself as in doubt
// (guard.check) and is left out of later batches. No member's answer touches another member.
//
// Stops. There is no poll for a stop request: a stop that reaches this process (the stop endpoint, multitask
// interrupt) is delivered in memory through StopLocal once the store holds it; a stop stored by another process
// comes back as run_canceled in the next batch, within one Heartbeat.
type keeper struct {
	e *Engine

	mu      sync.Mutex
	members map[runKey]*guard
	quit    chan struct{} // closed when the last member leaves: the loop then ends (nil: no loop)
}

type runKey struct{ thread, run string }

func newKeeper(e *Engine) *keeper { return &keeper{e: e, members: map[runKey]*guard{}} }

func keyOf(g *guard) runKey { return runKey{g.t.thread.ID, g.t.run.ID} }

// join makes g a member, starting the loop when it is the first.
func (k *keeper) join(g *guard) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.members[keyOf(g)] = g
	if k.quit == nil {
		k.quit = make(chan struct{})
		go k.loop(k.quit)
	}
}

// leave ends g's membership, then waits until no batch that carries g is still in flight, so that every answer
// about g's claim has reached g when it returns (the run reads its cause of stopping next).
func (k *keeper) leave(g *guard) {
	k.mu.Lock()
	if k.members[keyOf(g)] == g {
		delete(k.members, keyOf(g))
	}
	if len(k.members) == 0 && k.quit != nil {
		close(k.quit)
		k.quit = nil
	}
	k.mu.Unlock()
	g.inflight.Wait()
}

// stop cancels the member runs of threadID (only runID's when it is set) as stopped: true when one was here.
func (k *keeper) stop(threadID, runID string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	found := false
	for key, g := range k.members {
		if key.thread == threadID && (runID == "" || key.run == runID) {
			g.cancel(errCanceled)
			found = true
		}
	}
	return found
}

// loop sends a batch every Heartbeat until quit is closed.
func (k *keeper) loop(quit chan struct{}) {
	for {
		select {
		case <-quit:
			return
		case <-k.e.timers.After(k.e.cfg.Heartbeat):
		}
		k.beat()
	}
}

// beat sends one batch: every member whose claim is still surely its own, in a stable order.
func (k *keeper) beat() {
	e := k.e
	k.mu.Lock()
	gs := make([]*guard, 0, len(k.members))
	for _, g := range k.members {
		gs = append(gs, g)
	}
	k.mu.Unlock()
	slices.SortFunc(gs, func(a, b *guard) int {
		return cmp.Or(cmp.Compare(a.t.thread.ID, b.t.thread.ID), cmp.Compare(a.t.run.ID, b.t.run.ID))
	})
	now := e.clock.Now()
	var (
		sent     []*guard
		batch    []agent.KeptClaim
		earliest time.Time
	)
	for _, g := range gs {
		if !g.writable() { // lost, or in doubt: it has stopped itself (check cancels the run)
			continue
		}
		if !k.carry(g) {
			continue // it left meanwhile
		}
		h := g.t.horizon()
		if earliest.IsZero() || h.Before(earliest) {
			earliest = h
		}
		sent = append(sent, g)
		batch = append(batch, agent.KeptClaim{ThreadID: g.t.thread.ID, Fence: g.t.run.Fence(), Gate: g.t.mayWrite})
	}
	if len(batch) == 0 {
		return
	}
	ctx, cancel := e.timers.WithTimeoutCause(context.Background(), earliest.Sub(now), errInDoubt)
	res := e.store.KeepClaims(ctx, batch, now)
	cancel()
	for i, g := range sent {
		r := agent.KeepResult{Err: agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "the store answered no result for this claim")}
		if i < len(res) {
			r = res[i]
		}
		g.answer(now, r)
		g.inflight.Done()
	}
}

// carry counts a batch in flight on g while g is a member (leave waits for it); false once g has left.
func (k *keeper) carry(g *guard) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.members[keyOf(g)] != g {
		return false
	}
	g.inflight.Add(1)
	return true
}

// answer applies the store's answer for g's claim in a batch sent at now: the guard's heartbeat, as before.
func (g *guard) answer(now time.Time, r agent.KeepResult) {
	t := g.t
	switch {
	case r.Err == nil:
		t.kept(now)
		t.readers(r.Claim, now)
	case errors.Is(r.Err, agent.ErrRunCanceled):
		t.kept(now) // recorded: the claim is good, and the run is asked to stop
		g.cancel(errCanceled)
	case errors.Is(r.Err, agent.ErrRunFenced):
		g.lose(errFenced)
	default:
		// Transient: the next batch tries again; check stops the run once the claim is in doubt.
		t.e.log.Warn("heartbeat failed", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", r.Err)
	}
}

// StopLocal stops the run runID of thread threadID (any running run of the thread when runID is empty) if it is
// running in this process, at once, as the stop endpoint's stop does (the run finishes as canceled): true when
// it was here. Call it after the stop request is stored (RequestCancel), so that the claim says what the run
// does; a run of another process learns of the stop from its keeper's next batch, within one Heartbeat.
func (e *Engine) StopLocal(threadID, runID string) bool { return e.keeper.stop(threadID, runID) }
