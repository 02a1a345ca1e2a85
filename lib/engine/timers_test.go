package engine_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
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
	tr, err := f.eng.Begin(context.Background(), submit("th", "u1", "/tool slow {}"))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan agent.Run, 1)
	go func() { ran <- tr.Stream(context.Background(), io.Discard) }()
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
	tr, err := f.eng.Begin(context.Background(), submit("th", "u1", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan agent.Run, 1)
	go func() { ran <- tr.Stream(context.Background(), io.Discard) }()
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
