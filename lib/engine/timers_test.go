package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

// timerClock is a clock with its own timers (agent.Timers): time passes only when the test moves it or when
// someone sleeps on it (a sleep moves it on by its length), and every timer and context deadline made from it
// fires when the clock reaches it. The engine must take every wait from it: a wait on real time would hold the
// run as long as its real length, whatever the clock says.
type timerClock struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	timers []clockTimer
}

type clockTimer struct {
	at   time.Time
	fire func(time.Time)
}

func newTimerClock() *timerClock {
	return &timerClock{now: time.Date(2031, 3, 4, 5, 6, 12, 500_000_000, time.UTC)}
}

func (c *timerClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// add moves the clock on by d and fires what came due.
func (c *timerClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	now := c.now
	var due []clockTimer
	c.timers = slices.DeleteFunc(c.timers, func(t clockTimer) bool {
		if t.at.After(now) {
			return false
		}
		due = append(due, t)
		return true
	})
	c.mu.Unlock()
	for _, t := range due {
		t.fire(now)
	}
}

func (c *timerClock) at(d time.Duration, fire func(time.Time)) {
	c.mu.Lock()
	c.timers = append(c.timers, clockTimer{at: c.now.Add(d), fire: fire})
	c.mu.Unlock()
	c.add(0) // d <= 0 fires at once
}

func (c *timerClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.slept = append(c.slept, d)
	c.mu.Unlock()
	c.add(d)
	return ctx.Err()
}

func (c *timerClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.at(d, func(now time.Time) { ch <- now })
	return ch
}

func (c *timerClock) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	c.at(d, func(time.Time) { cancel(cause) })
	return ctx, func() { cancel(context.Canceled) }
}

func (c *timerClock) sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slept)
}

// hangBound turns a run that waits on real time (the defect) into a failure instead of a hang.
const hangBound = 10 * time.Second

// A tool's timeout is counted on the injected clock (issue 16, the simulation's time inside tools): a tool that
// ignores its context is abandoned once the clock passes its timeout (a minute), not after a minute of real time.
func TestToolTimeoutOnTheInjectedClock(t *testing.T) {
	t.Parallel()
	clock := newTimerClock()
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	f := setup(t, withClock(clock), withTools(slowTool(started, release)),
		withConfig(func(c *config.Config) { c.ToolTimeout, c.StaleAfter = time.Minute, 10*time.Minute }))
	ran := f.streaming(t, submit("th", "u1", "/tool slow {}"))
	<-started
	clock.add(time.Minute + time.Second)
	select {
	case run := <-ran:
		rec, err := f.store.GetMessage(context.Background(), "th", run.AssistantMessageID)
		if err != nil || run.Status != agent.RunCompleted || !strings.Contains(string(rec.Message.Parts[1]), "timed out") {
			t.Fatalf("run %s %+v, reply %s (%v): want completed with the tool timed out", run.Status, run.Error, rec.Message.Parts, err)
		}
	case <-time.After(hangBound):
		t.Fatal("the tool's timeout passed on the clock, and the run still waits for the tool")
	}
}

// A fenced store call's deadline at the claim's horizon is on the injected clock: a write that hangs is cut once
// the clock passes the horizon (StaleAfter/2 = 5 min here), with the claim in doubt as its cause, and the run
// ends without its reply stored, instead of waiting five minutes of real time.
func TestHorizonDeadlineOnTheInjectedClock(t *testing.T) {
	t.Parallel()
	clock := newTimerClock()
	hung := make(chan struct{})
	var once sync.Once
	hang := &hangingFinal{entered: func() { once.Do(func() { close(hung) }) }}
	f := setup(t, withClock(clock), withStore(hang.wrap), withConfig(func(c *config.Config) { c.StaleAfter = 10 * time.Minute }))
	ran := f.streaming(t, submit("th", "u1", "hello"))
	select {
	case <-hung:
	case <-time.After(hangBound):
		t.Fatal("the final message write never came")
	}
	clock.add(5*time.Minute + time.Second)
	select {
	case run := <-ran:
		if run.Status == agent.RunCompleted || run.Error == nil {
			t.Fatalf("run %s %+v, want it ended without its reply", run.Status, run.Error)
		}
		if cause := hang.cause(); !strings.Contains(cause, "in doubt") {
			t.Fatalf("the hung write was cut by %q, want the claim's horizon (in doubt)", cause)
		}
	case <-time.After(hangBound):
		t.Fatal("the clock passed the claim's horizon, and the write at it still hangs")
	}
}

// hangingFinal is a store whose final assistant message write hangs until its context is done.
type hangingFinal struct {
	agent.Store
	entered func()
	mu      sync.Mutex
	cut     string // the cause of the hung write's end
}

func (h *hangingFinal) cause() string { h.mu.Lock(); defer h.mu.Unlock(); return h.cut }

func (h *hangingFinal) wrap(s agent.Store) agent.Store { h.Store = s; return h }

func (h *hangingFinal) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Final && w.Message.Role == agent.RoleAssistant {
		h.entered()
		<-ctx.Done()
		h.mu.Lock()
		h.cut = context.Cause(ctx).Error()
		h.mu.Unlock()
		return ctx.Err()
	}
	return h.Store.PutMessage(ctx, w)
}

// The retries of a transient store error back off on the injected clock (20 ms, then 40 ms), so time passes
// inside a retry loop for whoever owns the clock.
func TestRetryBackoffOnTheInjectedClock(t *testing.T) {
	t.Parallel()
	clock := newTimerClock()
	faulty := newFaulty(func(method string, n int, final bool) bool { return method == "PutMessage" && final && n <= 4 })
	f := setup(t, withClock(clock), withStore(faulty.wrap), withConfig(func(c *config.Config) { c.StaleAfter = 10 * time.Minute }))
	done := make(chan agent.Run, 1)
	go func() { run, _ := f.run(t, submit("th", "u1", "hello")); done <- run }()
	var run agent.Run
	select {
	case run = <-done:
	case <-time.After(hangBound):
		t.Fatal("the run never ended")
	}
	if run.Status != agent.RunCompleted || faulty.failures("PutMessage") == 0 {
		t.Fatalf("run %s %+v after %d failed writes, want completed after some", run.Status, run.Error, faulty.failures("PutMessage"))
	}
	got := clock.sleeps()
	if !slices.Contains(got, 20*time.Millisecond) || !slices.Contains(got, 40*time.Millisecond) {
		t.Fatalf("sleeps on the clock %v, want the retry's backoff (20ms, 40ms) among them", got)
	}
}

// An attempt cut at a horizon that a heartbeat has since moved on is attempted again, not taken as a claim in
// doubt (the simulation's retries-converge, time-mode seeds 1499343207840167894 and 8810487078489471603): the
// user message's first write hangs from the claim (its deadline at claim+5 min); the guard's heartbeat is accepted
// at +78 s, so at +5 min 30 s, when that deadline cuts the write, the claim is still surely the run's (horizon at
// +6 min 18 s). The run must write the message again and complete, not end run_fenced while it holds its claim.
func TestAttemptCutAtAMovedHorizonIsRetried(t *testing.T) {
	t.Parallel()
	const beat = 77 * time.Second // the guard's period, unique among the engine's waits
	clock := &beatClock{timerClock: newTimerClock(), period: beat, armed: make(chan struct{}, 8)}
	h := &hangingUser{entered: make(chan struct{})}
	f, ran, wait := hungUserTurn(t, clock, h, func(c *config.Config) { c.StaleAfter, c.Heartbeat, c.CancelPoll = 10*time.Minute, beat, time.Hour })
	wait(h.entered, "the user message write")
	wait(clock.armed, "the guard's first heartbeat timer")
	clock.add(beat + time.Second)                                  // heartbeat #1 at +78 s
	wait(clock.armed, "the guard's timer after heartbeat #1")      // armed once #1 was recorded: horizon +6 min 18 s
	clock.add(5*time.Minute + 30*time.Second - beat - time.Second) // past the first attempt's deadline (+5 min)
	select {
	case run := <-ran:
		if run.Status != agent.RunCompleted {
			t.Fatalf("run %s %+v (first attempt cut by %q), want completed: its claim held and was not in doubt",
				run.Status, run.Error, h.cause())
		}
		if _, err := f.store.GetMessage(context.Background(), "th", "u1"); err != nil {
			t.Fatalf("user message: %v, want it stored by the second attempt", err)
		}
	case <-time.After(hangBound):
		t.Fatal("the run never ended")
	}
}

// beatClock is a timerClock that signals armed each time a timer of period (the guard's heartbeat) is set.
type beatClock struct {
	*timerClock
	period time.Duration
	armed  chan struct{}
}

func (c *beatClock) After(d time.Duration) <-chan time.Time {
	ch := c.timerClock.After(d)
	if d == c.period {
		select {
		case c.armed <- struct{}{}:
		default:
		}
	}
	return ch
}

// hangingUser is a store whose first user-message write (every one, if always) hangs until its context is done.
// entered is closed when the first write comes.
type hangingUser struct {
	agent.Store
	entered chan struct{}
	always  bool
	// next, when set, gets one signal per attempt as it comes (buffered by the test).
	next   chan struct{}
	mu     sync.Mutex
	writes int
	cut    string
	cur    context.Context // the newest attempt's context
}

// current is the newest attempt's context (nil before the first).
func (h *hangingUser) current() context.Context { h.mu.Lock(); defer h.mu.Unlock(); return h.cur }

func (h *hangingUser) attempts() int { h.mu.Lock(); defer h.mu.Unlock(); return h.writes }

func (h *hangingUser) wrap(s agent.Store) agent.Store { h.Store = s; return h }

func (h *hangingUser) cause() string { h.mu.Lock(); defer h.mu.Unlock(); return h.cut }

func (h *hangingUser) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Message.Role != agent.RoleUser {
		return h.Store.PutMessage(ctx, w)
	}
	h.mu.Lock()
	h.writes++
	h.cur = ctx
	first := h.writes == 1
	h.mu.Unlock()
	if h.next != nil {
		h.next <- struct{}{}
	}
	if !first && !h.always {
		return h.Store.PutMessage(ctx, w)
	}
	if first {
		close(h.entered)
	}
	<-ctx.Done()
	h.mu.Lock()
	h.cut = context.Cause(ctx).Error()
	h.mu.Unlock()
	return ctx.Err()
}

// The re-attempt of a cut attempt is bounded (engine.MaxCutReattempts per fenced call): a store that hangs every
// user-message write until its deadline while it accepts every heartbeat must not be written to for as long as
// the claim lives. Each attempt is cut at its deadline with the horizon moved on by the heartbeats accepted
// meanwhile; after the bounded re-attempts the cut is doubt, and the run ends run_fenced, leaving its claim to the
// reaper, instead of attempting the write once per horizon forever.
func TestAttemptCutRetriesAreBounded(t *testing.T) {
	t.Parallel()
	const beat = 77 * time.Second // the guard's period, unique among the engine's waits
	clock := &beatClock{timerClock: newTimerClock(), period: beat, armed: make(chan struct{}, 8)}
	h := &hangingUser{entered: make(chan struct{}), always: true, next: make(chan struct{}, 16)}
	_, ran, wait := hungUserTurn(t, clock, h, func(c *config.Config) {
		c.StaleAfter, c.Heartbeat, c.CancelPoll, c.RunTimeout = 10*time.Minute, beat, time.Hour, 24*time.Hour
	})
	wait(h.entered, "the user message write")
	<-h.next // the first attempt's signal
	wait(clock.armed, "the guard's first heartbeat timer")
	want := 1 + engine.MaxCutReattempts
	// Each step is one heartbeat, accepted before the next step (the guard arms its next timer once it has
	// recorded it), so every cut finds the horizon moved on past the cut attempt's deadline. The clock's timers
	// fire inside add, so a step that cut the attempt in flight is known at once; the test then waits for the
	// engine's answer to that cut (its next attempt, or the run's end) before it moves the clock again: the
	// engine's goroutines may be slow to get a core (two loaded make test runs), and must not be outpaced.
	ended := func(run agent.Run) {
		if run.Status == agent.RunCompleted || run.Error == nil || run.Error.Code != agent.CodeRunFenced {
			t.Fatalf("run %s %+v, want failed run_fenced: its user message was never stored", run.Status, run.Error)
		}
		if n := h.attempts(); n != want {
			t.Fatalf("%d attempts of the hung user-message write, want %d (1 + MaxCutReattempts)", n, want)
		}
	}
	for step := 0; ; step++ {
		if n := h.attempts(); n > want {
			t.Fatalf("%d attempts of the hung user-message write, want at most %d (1 + MaxCutReattempts)", n, want)
		}
		if step == 200 { // 200 heartbeats: more than four hours on the clock
			t.Fatalf("the run has not ended after %d attempts of the hung write", h.attempts())
		}
		clock.add(beat)
		if h.current().Err() != nil {
			select {
			case <-h.next:
			case run := <-ran:
				ended(run)
				return
			case <-time.After(hangBound):
				t.Fatal("the cut attempt was neither sent again nor did the run end")
			}
		}
		select {
		case <-clock.armed:
			continue
		case run := <-ran:
			ended(run)
			return
		case <-time.After(hangBound):
			t.Fatal("the guard never armed its next heartbeat, and the run has not ended")
		}
	}
}

// hungUserTurn begins a turn that calls a slow tool on clock, over a store that hangs user-message writes as h
// says, and streams it on a goroutine of its own: ran gets the run once it ends; wait waits on a signal of the
// test's (at most hangBound).
func hungUserTurn(t *testing.T, clock agent.Clock, h *hangingUser, cfg func(*config.Config)) (*fixture, <-chan agent.Run, func(<-chan struct{}, string)) {
	t.Helper()
	started, release := make(chan struct{}), make(chan struct{})
	close(release)
	f := setup(t, withClock(clock), withStore(h.wrap), withTools(slowTool(started, release)), withConfig(cfg))
	ran := f.streaming(t, submit("th", "u1", "/tool slow {}"))
	wait := func(c <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(hangBound):
			t.Fatal(what + " never came")
		}
	}
	return f, ran, wait
}
