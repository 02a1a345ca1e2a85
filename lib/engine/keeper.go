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
// Readers. A resumed-stream reader in another process marks its presence on the run's claim (MarkReader); the
// batch's answer carries the claim back (readers hurries the run's segments), but only once a Heartbeat, so a
// reader that attaches would see the run's regular (slow) flushes for up to a Heartbeat. So every ReaderProbe
// (Config.ReaderProbe; negative: never) the keeper also sends one read, agent.RunStore.ReadersOf, of every
// member's thread at once: O(1) store calls per process per probe, whatever its number of runs. For each member
// whose claim names its run with a mark still ahead, the probe hurries its Segmenter until the mark, and, the
// first time it sees the mark, cuts what the run appended since its last flush at once, so the reader gets it
// within a probe and its own poll. The probe only reads: it writes nothing (no write unit while nobody reads),
// moves no horizon and answers nothing about a claim (a read is not a heartbeat: principle 8 stays the
// batches'), and runs on its own loop beside the batches', neither waiting for the other. A probe that fails is
// dropped; one slower than a Heartbeat is cut (what it would learn, the next batch says); the next probe goes
// a ReaderProbe after the last one ended, so probes never queue behind one another.
//
// Stops. There is no poll for a stop request: a stop that reaches this process (the stop endpoint, multitask
// interrupt) is delivered in memory through StopLocal once the store holds it; a stop stored by another process
// comes back as run_canceled in the next batch, within one Heartbeat.
type keeper struct {
	e *Engine

	mu      sync.Mutex
	members map[runKey]*guard
	quit    chan struct{} // closed when the last member leaves: the loops then end (nil: no loop)
	// hurried is how far the probe has hurried each member (the latest reader mark it saw): a mark it already
	// acted on cuts nothing more.
	hurried map[runKey]time.Time
}

type runKey struct{ thread, run string }

func newKeeper(e *Engine) *keeper {
	return &keeper{e: e, members: map[runKey]*guard{}, hurried: map[runKey]time.Time{}}
}

func keyOf(g *guard) runKey { return runKey{g.t.thread.ID, g.t.run.ID} }

// join makes g a member, starting the loop when it is the first.
func (k *keeper) join(g *guard) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.members[keyOf(g)] = g
	if k.quit == nil {
		k.quit = make(chan struct{})
		go k.loop(k.quit)
		if k.e.cfg.ReaderProbe > 0 {
			go k.probeLoop(k.quit)
		}
	}
}

// leave ends g's membership, then waits until no batch that carries g is still in flight, so that every answer
// about g's claim has reached g when it returns (the run reads its cause of stopping next).
func (k *keeper) leave(g *guard) {
	k.mu.Lock()
	if k.members[keyOf(g)] == g {
		delete(k.members, keyOf(g))
		delete(k.hurried, keyOf(g))
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

// loop sends a batch every Heartbeat until quit is closed. It waits on the timers itself, not through a helper
// shared with probeLoop: internal/sim tells the keeper's heartbeat timer from every other by its caller.
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

// snapshot is the members at this moment, in no order.
func (k *keeper) snapshot() []*guard {
	k.mu.Lock()
	defer k.mu.Unlock()
	gs := make([]*guard, 0, len(k.members))
	for _, g := range k.members {
		gs = append(gs, g)
	}
	return gs
}

// beat sends one batch: every member whose claim is still surely its own, in a stable order.
func (k *keeper) beat() {
	e := k.e
	gs := k.snapshot()
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

// probeLoop sends a reader probe a ReaderProbe after the last one ended, until quit is closed.
func (k *keeper) probeLoop(quit chan struct{}) {
	for {
		select {
		case <-quit:
			return
		case <-k.e.timers.After(k.e.cfg.ReaderProbe):
		}
		k.probe()
	}
}

// probe reads the reader marks of every member's claim in one store call and hurries each member a live mark
// names (the Readers part of the keeper's doc).
func (k *keeper) probe() {
	e := k.e
	gs := k.snapshot()
	var threads []string
	for _, g := range gs {
		if g.writable() {
			threads = append(threads, g.t.thread.ID)
		}
	}
	if len(threads) == 0 {
		return
	}
	slices.Sort(threads)
	threads = slices.Compact(threads)
	ctx, cancel := e.timers.WithTimeoutCause(context.Background(), e.cfg.Heartbeat, errProbeSlow)
	marks, err := e.store.ReadersOf(ctx, threads)
	cancel()
	if err != nil {
		e.log.Debug("reader probe failed", "runs", len(gs), "err", err)
		return
	}
	now := e.clock.Now()
	live := make(map[runKey]time.Time, len(marks))
	for _, m := range marks {
		if m.RunID != "" && m.Until.After(now) {
			live[runKey{m.ThreadID, m.RunID}] = m.Until
		}
	}
	for _, g := range gs {
		until, ok := live[keyOf(g)]
		if !ok {
			continue
		}
		k.mu.Lock()
		member := k.members[keyOf(g)] == g
		first := member && !k.hurried[keyOf(g)].After(now)
		if member && until.After(k.hurried[keyOf(g)]) {
			k.hurried[keyOf(g)] = until
		}
		k.mu.Unlock()
		if member {
			g.t.attached(until, first)
		}
	}
}

// errProbeSlow cuts a reader probe that outlasts a Heartbeat.
var errProbeSlow = errors.New("engine: reader probe slower than a heartbeat")

// attached hurries the run's segments until until (a resumed-stream reader in another process is attached, as
// the keeper's probe read it) and, when cut, sends what is pending to the store at once.
func (t *Turn) attached(until time.Time, cut bool) {
	o := t.outp.Load()
	if o == nil || o.seg == nil {
		return
	}
	o.seg.Hurry(until)
	if cut {
		o.seg.Cut()
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

// LocalRun names a run streaming in this process.
type LocalRun struct{ ThreadID, RunID string }

// LocalRuns lists the runs streaming in this process (the keeper's members), in no order: what a drain that
// outlasted its grace stops (`agentloop serve`, lib/devserver), each as the stop endpoint does (the stop stored,
// then StopLocal). A run claimed but not yet streaming is not listed yet; Load counts it.
func (e *Engine) LocalRuns() []LocalRun {
	k := e.keeper
	k.mu.Lock()
	defer k.mu.Unlock()
	runs := make([]LocalRun, 0, len(k.members))
	for key := range k.members {
		runs = append(runs, LocalRun{ThreadID: key.thread, RunID: key.run})
	}
	return runs
}
