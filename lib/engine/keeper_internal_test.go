package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// keeperClock is a virtual clock with timers: time moves only in add. Every After sends on armed, so a test
// knows when the keeper's loop waits for its next tick (and so has applied the answers of the batch before).
type keeperClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []keeperTimer
	armed  chan struct{}
}

type keeperTimer struct {
	at   time.Time
	fire func()
}

func newKeeperClock() *keeperClock {
	return &keeperClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC), armed: make(chan struct{}, 100)}
}

func (c *keeperClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *keeperClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []keeperTimer
	c.timers = slices.DeleteFunc(c.timers, func(t keeperTimer) bool {
		if t.at.After(c.now) {
			return false
		}
		due = append(due, t)
		return true
	})
	c.mu.Unlock()
	for _, t := range due {
		t.fire()
	}
}

func (c *keeperClock) at(d time.Duration, fire func()) {
	c.mu.Lock()
	c.timers = append(c.timers, keeperTimer{at: c.now.Add(d), fire: fire})
	c.mu.Unlock()
	c.add(0)
}

func (c *keeperClock) Sleep(ctx context.Context, d time.Duration) error { c.add(d); return ctx.Err() }

func (c *keeperClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.at(d, func() { ch <- c.now })
	c.armed <- struct{}{}
	return ch
}

func (c *keeperClock) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	c.at(d, func() { cancel(cause) })
	return ctx, func() { cancel(context.Canceled) }
}

// keeperStore hands every batch to the test, which answers it.
type keeperStore struct {
	Store
	batches chan keeperCall
}

type keeperCall struct {
	ctx    context.Context
	claims []agent.KeptClaim
	now    time.Time
	answer chan []agent.KeepResult
}

func (s *keeperStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	c := keeperCall{ctx: ctx, claims: claims, now: now, answer: make(chan []agent.KeepResult)}
	s.batches <- c
	return <-c.answer
}

// keeperRig is an engine with a scripted store and streaming runs registered with its keeper.
type keeperRig struct {
	t     *testing.T
	clock *keeperClock
	store *keeperStore
	e     *Engine
	runs  map[string]*keeperRun
}

type keeperRun struct {
	turn  *Turn
	guard *guard
	ctx   context.Context // the run's context: canceled with the cause the guard gives
}

const keeperBeat, keeperStale = time.Second, 10 * time.Second

func newKeeperRig(t *testing.T, threads ...string) *keeperRig {
	r := &keeperRig{t: t, clock: newKeeperClock(), store: &keeperStore{batches: make(chan keeperCall)}, runs: map[string]*keeperRun{}}
	// No reader probe: its loop would wait on the same timers (probe_internal_test.go has its own rig).
	r.e = New(Deps{Store: r.store, Clock: r.clock}, Config{Heartbeat: keeperBeat, StaleAfter: keeperStale, ReaderProbe: -1})
	for _, th := range threads {
		r.start(th)
	}
	return r
}

// start registers a streaming run on thread th (run id "run-"+th, epoch 1), claimed now.
func (r *keeperRig) start(th string) *keeperRun {
	ctx, cancel := context.WithCancelCause(context.Background())
	r.t.Cleanup(func() { cancel(nil) })
	turn := &Turn{e: r.e, thread: agent.Thread{ID: th}, run: agent.Run{ID: "run-" + th, ThreadID: th, Epoch: 1}, claimedAt: r.clock.Now()}
	run := &keeperRun{turn: turn, ctx: ctx}
	run.guard = startGuard(turn, cancel)
	r.runs[th] = run
	return run
}

// tick waits for the keeper's loop to wait, moves the clock on one Heartbeat and returns the batch it sends
// (none: ok false, when the loop sent nothing before it waited again).
func (r *keeperRig) tick() (keeperCall, bool) {
	r.t.Helper()
	r.waitArmed()
	r.clock.add(keeperBeat)
	select {
	case c := <-r.store.batches:
		return c, true
	case <-r.clock.armed: // the loop is waiting again without having sent a batch
		r.clock.armed <- struct{}{}
		return keeperCall{}, false
	case <-time.After(10 * time.Second):
		r.t.Fatal("the keeper neither sent a batch nor waited for its next tick")
		return keeperCall{}, false
	}
}

func (r *keeperRig) waitArmed() {
	r.t.Helper()
	select {
	case <-r.clock.armed:
	case <-time.After(10 * time.Second):
		r.t.Fatal("the keeper's loop never waited for a tick")
	}
}

// answer answers c with errs by thread (nil: accepted) and waits until the keeper has applied the answers.
func (r *keeperRig) answer(c keeperCall, errs map[string]error) {
	r.t.Helper()
	res := make([]agent.KeepResult, len(c.claims))
	for i, k := range c.claims {
		res[i].Err = errs[k.ThreadID]
	}
	c.answer <- res
	r.waitArmed()
	r.clock.armed <- struct{}{} // tick waits for it again
}

func threadsOf(c keeperCall) []string {
	var out []string
	for _, k := range c.claims {
		out = append(out, k.ThreadID)
	}
	return out
}

func (r *keeperRig) cause(th string) error { return context.Cause(r.runs[th].ctx) }

var (
	errTransient = agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "the store is busy")
	errCanceledR = agent.E(agent.KindCanceled, agent.CodeRunCanceled, "asked to stop")
	errFencedR   = agent.E(agent.KindConflict, agent.CodeRunFenced, "taken over")
)

// One batch per Heartbeat carries every registered run, each with its own fence and write gate, stamped with the
// clock's time; a run that leaves is in no later batch; with no run left the keeper sends nothing.
func TestKeeperBatchCarriesEveryRun(t *testing.T) {
	t.Parallel()
	r := newKeeperRig(t, "th-b", "th-a", "th-c")
	c, ok := r.tick()
	if !ok {
		t.Fatal("no batch after a Heartbeat")
	}
	if got, want := threadsOf(c), []string{"th-a", "th-b", "th-c"}; !slices.Equal(got, want) {
		t.Fatalf("batch = %v, want %v", got, want)
	}
	for _, k := range c.claims {
		if k.Fence != (agent.Fence{RunID: "run-" + k.ThreadID, Epoch: 1}) || k.Gate == nil || k.Gate() != nil {
			t.Fatalf("claim %+v: want the run's fence and an open gate", k)
		}
	}
	if !c.now.Equal(r.clock.Now()) {
		t.Fatalf("batch stamped %s, want the clock's %s", c.now, r.clock.Now())
	}
	r.answer(c, nil)
	r.runs["th-b"].guard.stop()
	c, _ = r.tick()
	if got, want := threadsOf(c), []string{"th-a", "th-c"}; !slices.Equal(got, want) {
		t.Fatalf("batch after th-b left = %v, want %v", got, want)
	}
	r.answer(c, nil)
	r.runs["th-a"].guard.stop()
	r.runs["th-c"].guard.stop()
	r.e.keeper.mu.Lock()
	idle := r.e.keeper.quit == nil && len(r.e.keeper.members) == 0
	r.e.keeper.mu.Unlock()
	if !idle {
		t.Fatal("the keeper still runs with no member")
	}
}

// Each run's horizon follows its own answer: accepted moves it to the batch's time, a transient error leaves
// it, a cancel (recorded) moves it and cancels only that run, a fence cancels only that run as fenced and takes
// it out of later batches.
func TestKeeperAnswersAreEachRunsOwn(t *testing.T) {
	t.Parallel()
	r := newKeeperRig(t, "th-ok", "th-busy", "th-stop", "th-gone")
	claimed := r.clock.Now()
	c, _ := r.tick()
	r.answer(c, map[string]error{"th-busy": errTransient, "th-stop": errCanceledR, "th-gone": errFencedR})
	for th, want := range map[string]time.Time{"th-ok": c.now, "th-busy": claimed, "th-stop": c.now, "th-gone": claimed} {
		if got := r.runs[th].turn.goodAt(); !got.Equal(want) {
			t.Errorf("%s: claim known good at %s, want %s", th, got, want)
		}
	}
	for th, want := range map[string]error{"th-ok": nil, "th-busy": nil, "th-stop": errCanceled, "th-gone": errFenced} {
		if got := r.cause(th); !errors.Is(got, want) || (want == nil && got != nil) {
			t.Errorf("%s: run's cause %v, want %v", th, got, want)
		}
	}
	c, _ = r.tick()
	// A stop is not a fence: the stopped run is still kept (it stores its outcome); the fenced one is not.
	if got, want := threadsOf(c), []string{"th-busy", "th-ok", "th-stop"}; !slices.Equal(got, want) {
		t.Fatalf("next batch = %v, want %v", got, want)
	}
	r.answer(c, nil)
}

// A batch that fails as a whole leaves every run running until its own horizon (half of StaleAfter past its last
// accepted heartbeat), then each stops itself as in doubt and is sent no more; the batch's deadline is the
// earliest horizon among its members.
func TestKeeperFailingBatchesRunToTheHorizon(t *testing.T) {
	t.Parallel()
	r := newKeeperRig(t, "th-early")
	c, _ := r.tick()
	r.answer(c, nil)
	c, _ = r.tick()
	r.answer(c, map[string]error{"th-early": errTransient})
	r.start("th-late") // claimed now: its horizon is a Heartbeat later than th-early's
	horizon := r.runs["th-early"].turn.horizon()
	for !r.clock.Now().Add(2 * keeperBeat).After(horizon) {
		c, ok := r.tick()
		if !ok || len(c.claims) != 2 {
			t.Fatalf("at %s: batch %v, want both runs", r.clock.Now(), threadsOf(c))
		}
		r.answer(c, map[string]error{"th-early": errTransient, "th-late": errTransient})
		for _, th := range []string{"th-early", "th-late"} {
			if err := r.cause(th); err != nil {
				t.Fatalf("at %s, before the horizon %s: %s stopped (%v)", r.clock.Now(), horizon, th, err)
			}
		}
	}
	// The last batch before the horizon hangs: its deadline (the earliest horizon) cuts it.
	c, _ = r.tick()
	r.clock.add(horizon.Sub(r.clock.Now()))
	if err := context.Cause(c.ctx); !errors.Is(err, errInDoubt) {
		t.Fatalf("batch context at the earliest horizon: %v, want cut with errInDoubt", err)
	}
	r.answer(c, map[string]error{"th-early": errTransient, "th-late": errTransient})
	c, _ = r.tick()
	if got := threadsOf(c); !slices.Equal(got, []string{"th-late"}) {
		t.Fatalf("batch past th-early's horizon = %v, want only th-late", got)
	}
	if err := r.cause("th-early"); !errors.Is(err, errInDoubt) {
		t.Fatalf("th-early past its horizon: cause %v, want errInDoubt", err)
	}
	if err := r.cause("th-late"); err != nil {
		t.Fatalf("th-late before its horizon: cause %v, want running", err)
	}
	r.answer(c, nil)
}

// StopLocal cancels the named run of this process at once, with no tick of the clock and no store call; it
// answers false for a run that is not here, and leaves the other runs alone.
func TestKeeperStopLocal(t *testing.T) {
	t.Parallel()
	r := newKeeperRig(t, "th-a", "th-b")
	for _, c := range []struct{ thread, run string }{{"th-a", "run-other"}, {"th-x", ""}} {
		if r.e.StopLocal(c.thread, c.run) {
			t.Fatalf("StopLocal(%q, %q) = true for a run that is not here", c.thread, c.run)
		}
	}
	if !r.e.StopLocal("th-a", "run-th-a") {
		t.Fatal("StopLocal of a running run = false")
	}
	if err := r.cause("th-a"); !errors.Is(err, errCanceled) {
		t.Fatalf("stopped run's cause %v, want errCanceled at once", err)
	}
	if err := r.cause("th-b"); err != nil {
		t.Fatalf("the other run's cause %v, want running", err)
	}
	if !r.e.StopLocal("th-b", "") {
		t.Fatal("StopLocal(thread, \"\") of a running run = false")
	}
	if err := r.cause("th-b"); !errors.Is(err, errCanceled) {
		t.Fatalf("th-b's cause %v, want errCanceled", err)
	}
	select {
	case c := <-r.store.batches:
		t.Fatalf("a stop sent a store call: %s", fmt.Sprint(threadsOf(c)))
	default:
	}
}
