package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Why a run stops before its loop ends; context.Cause of the run's context.
var (
	errCanceled   = errors.New("run canceled")
	errRunTimeout = errors.New("run wall clock exceeded")
	errFenced     = errors.New("run fenced: another run or the reaper owns the thread")
	errInDoubt    = errors.New("run's claim in doubt: heartbeats failed for half of staleAfter")
)

// guard watches the run's claim while it streams: a fenced heartbeat every Heartbeat, a read for a stop request
// every CancelPoll (so a stop takes effect within that, not a heartbeat later), and the time of the last
// heartbeat the store accepted. It cancels the run with errCanceled, errFenced or errInDoubt.
type guard struct {
	t      *Turn
	cancel context.CancelCauseFunc
	done   chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	lastOK time.Time // clock time of the claim or the last accepted heartbeat
	lost   error     // errFenced or errInDoubt once seen
}

func startGuard(ctx context.Context, t *Turn, cancel context.CancelCauseFunc) *guard {
	g := &guard{t: t, cancel: cancel, done: make(chan struct{}), lastOK: t.claimedAt}
	g.wg.Add(2)
	go g.every(ctx, t.e.cfg.Heartbeat, func() bool { return g.heartbeat(ctx) })
	go g.every(ctx, t.e.cfg.CancelPoll, func() bool { return g.pollCancel(ctx) })
	return g
}

func (g *guard) stop() { close(g.done); g.wg.Wait() }

// writable reports whether the run may still write: it has not lost its claim, and its last accepted heartbeat
// is younger than half of staleAfter (after that a reaper may soon take the claim, so the run stops itself).
func (g *guard) writable() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost != nil {
		return false
	}
	last := g.lastOK
	if kept := g.t.goodAt(); kept.After(last) {
		last = kept // a long close-out beside the stream heartbeat the claim itself (keepClaim)
	}
	if g.t.e.clock.Now().Sub(last) > g.t.e.cfg.StaleAfter/2 {
		g.lost = errInDoubt
		g.cancel(errInDoubt)
		return false
	}
	return true
}

// lose records that the claim is gone and stops the run.
func (g *guard) lose(cause error) {
	g.mu.Lock()
	if g.lost == nil {
		g.lost = cause
	}
	g.mu.Unlock()
	g.cancel(cause)
}

// every calls beat each period until it returns false, the guard stops, or ctx ends.
func (g *guard) every(ctx context.Context, period time.Duration, beat func() bool) {
	defer g.wg.Done()
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !beat() {
			return
		}
	}
}

// heartbeat writes the fenced heartbeat; false once the run must stop.
func (g *guard) heartbeat(ctx context.Context) bool {
	e, t := g.t.e, g.t
	if !g.writable() {
		return false
	}
	now := e.clock.Now()
	err := e.store.Heartbeat(ctx, t.thread.ID, t.run.Fence(), now)
	switch {
	case err == nil:
		g.mu.Lock()
		g.lastOK = now
		g.mu.Unlock()
	case errors.Is(err, agent.ErrRunCanceled):
		g.cancel(errCanceled)
	case errors.Is(err, agent.ErrRunFenced):
		g.lose(errFenced)
		return false
	default:
		// Transient: the next tick tries again; writable() stops the run once the claim is in doubt.
		e.log.Warn("heartbeat failed", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
	}
	return true
}

// pollCancel reads the claim between heartbeats (it never writes); false once the run must stop.
func (g *guard) pollCancel(ctx context.Context) bool {
	e, t := g.t.e, g.t
	th, err := e.store.GetThread(ctx, t.thread.ID)
	switch {
	case err != nil && agent.IsKind(err, agent.KindNotFound):
		g.lose(errFenced)
		return false
	case err != nil:
		return true
	case th.ActiveRun == nil || th.ActiveRun.RunID != t.run.ID || th.ActiveRun.Epoch != t.run.Epoch:
		g.lose(errFenced)
		return false
	case th.ActiveRun.CancelRequested:
		g.cancel(errCanceled)
		return false
	}
	return true
}
