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

// The claim's horizon (DESIGN principle 8, REVIEW fence E). A claim is ours for StaleAfter from its last accepted
// heartbeat (the claim itself is the first); a reaper may take it after that. So the run writes nothing, and no
// attempt of a fenced write is sent, later than half of StaleAfter after the claim was last known good: that is
// the horizon. Every fenced store call is checked against it before each attempt (the first included) and carries
// a context deadline at it; the store adapters check it again before each attempt of their own (the AWS SDK
// retries inside one call) through the write gate the context carries (agent.WithWriteGate).

// horizon is the time after which the run must not write: half of StaleAfter past the claim's last known good
// moment.
func (t *Turn) horizon() time.Time { return t.goodAt().Add(t.e.cfg.StaleAfter / 2) }

// goodAt is when the claim was last known good: its claim, or the newest heartbeat the store accepted (the
// keeper's batches while the run streams, keepClaim's during a long close-out).
func (t *Turn) goodAt() time.Time {
	if n := t.keptAt.Load(); n > t.claimedAt.UnixNano() {
		return time.Unix(0, n)
	}
	return t.claimedAt
}

// kept records an accepted heartbeat at now (heartbeats run beside each other: the newest wins).
func (t *Turn) kept(now time.Time) {
	for {
		old := t.keptAt.Load()
		if now.UnixNano() <= old || t.keptAt.CompareAndSwap(old, now.UnixNano()) {
			return
		}
	}
}

// mayWrite is the write gate: nil while the run may still write; errFenced once it lost its claim, errInDoubt
// once the horizon has passed.
func (t *Turn) mayWrite() error {
	if g := t.guardp.Load(); g != nil {
		return g.check()
	}
	if t.e.clock.Now().After(t.horizon()) {
		return errInDoubt
	}
	return nil
}

// fresh reports whether the claim is still surely ours (mayWrite, as a bool).
func (t *Turn) fresh() bool { return t.mayWrite() == nil }

// attempt is the context of one attempt of a fenced store call: a deadline at the horizon (on the engine's
// timers, counted from now on its clock, so a virtual clock cuts it) and the write gate for the adapter's own
// retries. cancel must be called.
func (t *Turn) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel, _ := t.attemptTo(ctx)
	return ctx, cancel
}

// attemptTo is attempt, also returning the deadline it set: the horizon as it is now.
func (t *Turn) attemptTo(ctx context.Context) (context.Context, context.CancelFunc, time.Time) {
	h := t.horizon()
	ctx, cancel := t.e.timers.WithTimeoutCause(agent.WithWriteGate(ctx, t.mayWrite), h.Sub(t.e.clock.Now()), errInDoubt)
	return ctx, cancel, h
}

// maxCutReattempts bounds how often one fenced call sends again an attempt cut at a deadline that a heartbeat
// has since moved on (gated). One is what a healthy run needs: a write parked past the horizon it began under
// while the guard's heartbeats went on. The bound is for a store that hangs writes but accepts heartbeats:
// without it such a run would send the write again once per horizon for as long as its claim lives, and a
// write that hangs through a whole horizon more than once is not a store's hiccup but a store the run cannot
// count on; after the bound the cut is doubt, as any other cut.
const maxCutReattempts = 2

// fenced runs op, a store write that carries the run's fence, retried on transient errors (retry); each attempt
// goes through gated, and the re-attempts of cut attempts are counted across the retries (maxCutReattempts).
func (t *Turn) fenced(ctx context.Context, op func(ctx context.Context) error) error {
	reattempts := 0
	return t.e.retry(ctx, func() error { return t.gated(ctx, op, &reattempts) })
}

// gated runs one attempt of op, a fenced write: the horizon is checked before it, and it runs under attempt's
// context. An attempt cut at its deadline, or refused by the gate inside the adapter, is errInDoubt: its
// outcome is unknown and the claim is no longer surely ours. Unless a heartbeat accepted meanwhile has moved the
// horizon on past that deadline (the horizon as it was when the attempt began) and the gate still says the claim
// is ours: then the attempt, whose outcome is unknown like a transient error's, is sent again at once under the
// new horizon (the stores accept a rewrite of what the same run wrote, so retries converge), at most
// maxCutReattempts times per call, counted in *reattempts. No attempt is ever sent past the current horizon.
func (t *Turn) gated(ctx context.Context, op func(ctx context.Context) error, reattempts *int) error {
	for {
		if err := t.mayWrite(); err != nil {
			return err
		}
		actx, cancel, deadline := t.attemptTo(ctx)
		err := op(actx)
		cut := errors.Is(context.Cause(actx), errInDoubt)
		cancel()
		if err == nil || !(cut || errors.Is(err, errInDoubt)) {
			return err
		}
		if ctx.Err() != nil || *reattempts >= maxCutReattempts || !t.horizon().After(deadline) || t.mayWrite() != nil {
			return errInDoubt
		}
		*reattempts++
		t.e.log.Warn("fenced write cut at a horizon a heartbeat has moved on; writing again", "thread_id", t.thread.ID,
			"run_id", t.run.ID, "reattempt", *reattempts, "err", err)
	}
}

// endSegments is the store abort and release write a run's final segment to. Once FinishRun stored the outcome
// (finished), the final segment goes out whatever the horizon says, as output's does (REVIEW D7): the run ended
// well and its readers must learn it. Otherwise the claim was left to go stale, and the segment is a fenced write
// like any other: each append goes through gated (checked at the horizon, with a deadline there, sent again as a
// fenced call's attempts are), so it can never land after the reaper's takeover and tell readers an end the
// reaper did not record.
func (t *Turn) endSegments(finished bool) agent.SegmentStore {
	if finished {
		return t.e.store
	}
	return gatedSegments{SegmentStore: t.e.store, t: t}
}

type gatedSegments struct {
	agent.SegmentStore
	t *Turn
}

func (g gatedSegments) AppendSegment(ctx context.Context, s agent.Segment) error {
	reattempts := 0
	return g.t.gated(ctx, func(ctx context.Context) error { return g.SegmentStore.AppendSegment(ctx, s) }, &reattempts)
}

// guard watches the run's claim while it streams, as a member of the engine's keeper (keeper.go), whose batches
// heartbeat it with the process's other runs. It cancels the run with errCanceled (a stop), errFenced or
// errInDoubt. A stop is not a fence (REVIEW D2): the heartbeats go on after it, until the run has finished
// (stop), so a run that waits for a slow tool after a stop still holds its claim and stores its outcome.
type guard struct {
	t      *Turn
	cancel context.CancelCauseFunc
	// inflight counts the keeper's batches in flight that carry this run's claim (stop waits for them).
	inflight sync.WaitGroup

	mu   sync.Mutex
	lost error         // errFenced or errInDoubt once seen
	gone chan struct{} // closed when lost is set
}

// startGuard starts the guard: the run joins its engine's keeper.
func startGuard(t *Turn, cancel context.CancelCauseFunc) *guard {
	g := &guard{t: t, cancel: cancel, gone: make(chan struct{})}
	t.guardp.Store(g)
	t.e.keeper.join(g)
	return g
}

// stop ends the watch: the run leaves the keeper, and every answer of a batch already sent has reached it.
func (g *guard) stop() { g.t.e.keeper.leave(g) }

// writable reports whether the run may still write: it has not lost its claim, and the horizon has not passed
// (after that a reaper may soon take the claim, so the run stops itself).
func (g *guard) writable() bool { return g.check() == nil }

// check is writable with the reason: errFenced or errInDoubt (the run is then canceled with it).
func (g *guard) check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost != nil {
		return g.lost
	}
	if g.t.e.clock.Now().After(g.t.horizon()) {
		g.loseLocked(errInDoubt)
		return errInDoubt
	}
	return nil
}

// lose records that the claim is gone and stops the run.
func (g *guard) lose(cause error) {
	g.mu.Lock()
	g.loseLocked(cause)
	g.mu.Unlock()
}

func (g *guard) loseLocked(cause error) {
	if g.lost == nil {
		g.lost = cause
		close(g.gone)
	}
	g.cancel(cause)
}
