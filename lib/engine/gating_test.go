package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

// beatStore records the heartbeats the store accepted (a canceled run's heartbeat is accepted too: it answers
// run_canceled), so a test that moves the clock can wait until the run's claim is known good at the new time.
type beatStore struct {
	agent.Store
	mu   sync.Mutex
	cond *sync.Cond
	last time.Time // the newest accepted heartbeat's time
}

func newBeatStore() *beatStore {
	b := &beatStore{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *beatStore) wrap(s agent.Store) agent.Store { b.Store = s; return b }

func (b *beatStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return keepEach(ctx, claims, now, b.Heartbeat)
}

func (b *beatStore) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	err := b.Store.Heartbeat(ctx, threadID, f, now)
	if err == nil || errors.Is(err, agent.ErrRunCanceled) {
		b.mu.Lock()
		if now.After(b.last) {
			b.last = now
		}
		b.cond.Broadcast()
		b.mu.Unlock()
	}
	return err
}

// waitBeat waits until a heartbeat at or after at was accepted. The bound only turns a run that stopped
// heartbeating (the defect) into a failure instead of a hang.
func (b *beatStore) waitBeat(t *testing.T, at time.Time) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		b.mu.Lock()
		for b.last.Before(at) {
			b.cond.Wait()
		}
		b.mu.Unlock()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		b.mu.Lock()
		b.cond.Broadcast() // let the waiter go on once it is unblocked by a later beat (never, here)
		b.mu.Unlock()
		t.Fatalf("no heartbeat accepted at or after %s (the last at %s): the run stopped holding its claim", at, b.last)
	}
}

// slowTool ignores its context: it returns "done" only when released, however long after a stop.
func slowTool(started chan<- struct{}, release <-chan struct{}) agent.Tool {
	return agent.Tool{Name: "slow", Description: "ignores its context", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			close(started)
			<-release
			return json.RawMessage(`"done"`), nil
		}}
}

// A stop while a slow tool runs never loses the turn (REVIEW D2, issue 16 item 3): the tool ignores its context
// and returns "done" more than StaleAfter/2 after the stop. The run ends canceled with the tool's output kept,
// its claim released and its usage counted: no persist_failed, no reply left to the reaper. A cancel request is
// not a fence, so the run's heartbeats go on being accepted while it waits for the tool.
func TestStopWhileASlowToolRunsKeepsTheTurn(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			beats := newBeatStore()
			started, release := make(chan struct{}), make(chan struct{})
			f := setup(t, store(t), withStore(beats.wrap), withClock(clock), withTools(slowTool(started, release)))
			ctx := context.Background()
			tr, err := f.eng.Begin(ctx, submit("th", "u1", "/tool slow {}"))
			if err != nil {
				t.Fatal(err)
			}
			ran := make(chan agent.Run, 1)
			go func() { ran <- tr.Stream(ctx, io.Discard) }()
			<-started
			if _, err := f.stack.Threads.Stop(ctx, "alice", "th", ""); err != nil {
				t.Fatalf("stop: %v", err)
			}
			// Time passes while the tool ignores the stop: past StaleAfter, in steps a heartbeat can follow (each
			// well inside the horizon, StaleAfter/2).
			for range 6 {
				clock.add(fixtureStaleAfter / 5)
				beats.waitBeat(t, clock.Now())
			}
			close(release)
			run := <-ran

			if run.Status != agent.RunCanceled || run.Error != nil {
				t.Fatalf("run %s %+v, want canceled with no error", run.Status, run.Error)
			}
			stored, err := f.store.GetRun(ctx, "th", run.ID)
			if err != nil || stored.Status != agent.RunCanceled || stored.Usage.TotalTokens == 0 {
				t.Fatalf("stored run %s usage %+v (%v), want canceled with the usage counted", stored.Status, stored.Usage, err)
			}
			th, err := f.store.GetThread(ctx, "th")
			if err != nil || th.ActiveRun != nil || th.Usage != stored.Usage {
				t.Fatalf("thread claim %+v usage %+v (%v), want released with the run's usage %+v", th.ActiveRun, th.Usage, err, stored.Usage)
			}
			rec, err := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
			if err != nil {
				t.Fatalf("reply: %v", err)
			}
			if st := rec.Message.Meta().Status; st != agent.MessageCanceled {
				t.Fatalf("reply status %s, want canceled", st)
			}
			var kept bool
			for _, raw := range rec.Message.Parts {
				p, _ := agent.DecodePart(raw)
				kept = kept || p.Type == "tool-slow" && p.State == agent.StateOutputAvailable && strings.Contains(string(p.Output), "done")
			}
			if !kept {
				t.Fatalf("the tool's returned output is not kept: %s", rec.Message.Parts)
			}
		})
	}
}

// lateWrites wraps the store: it fails and delays calls as a case says (hooks run inside the call, so time passes
// exactly where the case puts it), and records every fenced message or outcome write that reaches the store
// after the claim's horizon.
type lateWrites struct {
	agent.Store
	clock   *manualClock
	horizon time.Time
	// before runs as a call starts (an error fails it without applying); after runs once it applied.
	before func(call string, n int) error
	after  func(call string, n int)
	// afterMessage, when set, runs once a message write applied.
	afterMessage func(id string)

	mu    sync.Mutex
	calls map[string]int
	late  []string
}

func (l *lateWrites) wrap(s agent.Store) agent.Store { l.Store = s; return l }

func (l *lateWrites) call(name string, fenced bool, apply func() error) error {
	l.mu.Lock()
	if l.calls == nil {
		l.calls = map[string]int{}
	}
	l.calls[name]++
	n := l.calls[name]
	l.mu.Unlock()
	if err := l.before(name, n); err != nil {
		return err
	}
	l.mu.Lock()
	if now := l.clock.Now(); fenced && now.After(l.horizon) {
		l.late = append(l.late, fmt.Sprintf("%s #%d at horizon+%s", name, n, now.Sub(l.horizon)))
	}
	l.mu.Unlock()
	if err := apply(); err != nil {
		return err
	}
	l.after(name, n)
	return nil
}

func (l *lateWrites) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return keepEach(ctx, claims, now, l.Heartbeat)
}

func (l *lateWrites) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	return l.call("Heartbeat", false, func() error { return l.Store.Heartbeat(ctx, threadID, f, now) })
}

func (l *lateWrites) GetMessage(ctx context.Context, threadID, id string) (rec agent.MessageRecord, err error) {
	err = l.call("GetMessage", false, func() error { rec, err = l.Store.GetMessage(ctx, threadID, id); return err })
	return rec, err
}

func (l *lateWrites) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	name := "PutMessage(" + string(w.Message.Role) + ")"
	err := l.call(name, true, func() error { return l.Store.PutMessage(ctx, w) })
	l.mu.Lock()
	after := l.afterMessage
	l.mu.Unlock()
	if err == nil && after != nil {
		after(w.Message.ID)
	}
	return err
}

func (l *lateWrites) TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error {
	return l.call("TakeQueued", true, func() error { return l.Store.TakeQueued(ctx, threadID, messageID, now) })
}

func (l *lateWrites) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return l.call("DeleteMessage", true, func() error { return l.Store.DeleteMessage(ctx, threadID, id, f) })
}

func (l *lateWrites) FinishRun(ctx context.Context, run agent.Run) error {
	return l.call("FinishRun", true, func() error { return l.Store.FinishRun(ctx, run) })
}

func (l *lateWrites) ResolveInterrupt(ctx context.Context, req agent.ResolveRequest) (in agent.Interrupt, err error) {
	err = l.call("ResolveInterrupt("+string(req.Status)+")", true, func() error { in, err = l.Store.ResolveInterrupt(ctx, req); return err })
	return in, err
}

func (l *lateWrites) AppendSegment(ctx context.Context, s agent.Segment) error {
	name := "AppendSegment"
	if s.Final {
		name = "AppendSegment(final)"
	}
	return l.call(name, true, func() error { return l.Store.AppendSegment(ctx, s) })
}

func (l *lateWrites) ListMessageInterrupts(ctx context.Context, threadID, messageID string) (ins []agent.Interrupt, err error) {
	err = l.call("ListMessageInterrupts", false, func() error { ins, err = l.Store.ListMessageInterrupts(ctx, threadID, messageID); return err })
	return ins, err
}

func (l *lateWrites) ListQueued(ctx context.Context, threadID string) (q []agent.QueuedMessage, err error) {
	err = l.call("ListQueued", false, func() error { q, err = l.Store.ListQueued(ctx, threadID); return err })
	return q, err
}

// setHorizon moves the horizon the writes are judged against (a later claim's).
func (l *lateWrites) setHorizon(at time.Time) {
	l.mu.Lock()
	l.horizon = at
	l.mu.Unlock()
}

func (l *lateWrites) lateOnes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.late)
}

// No attempt of a fenced write leaves after the claim's horizon (REVIEW D1, fence E): the horizon is checked
// before every attempt, the first included. The REVIEW's scenario, compressed: heartbeats fail transiently (a
// throttled partition), so the claim is known good only at its own time; a write fails transiently while time
// passes the horizon (StaleAfter/2), and then the store would take it. A retry (or the next write's
// first attempt) sent then could land after a reaper took the thread, or in a re-created thread of another user.
func TestNoFencedWriteAfterTheHorizon(t *testing.T) {
	t.Parallel()
	unavailable := func(call string) error {
		return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "injected: %s throttled", call)
	}
	// An approval the continuation answers (approve) or finds expired (expire), and a delivery pass that finds
	// nothing to answer (release): each is prepared first, with the case's hooks not yet armed.
	guarded := agent.Tool{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: emptySchema,
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			return json.RawMessage(`"ok"`), nil
		}}
	answer := func(expired bool) func(t *testing.T, f *fixture, l *lateWrites, clock *manualClock, arm func()) {
		return func(t *testing.T, f *fixture, l *lateWrites, clock *manualClock, arm func()) {
			if run, _ := f.run(t, submit("th", "u1", "/tool guarded {}")); run.Status != agent.RunInterrupted {
				t.Fatalf("ask: %s %+v", run.Status, run.Error)
			}
			if expired {
				clock.add(25 * time.Hour) // past the interrupt's age
			}
			l.setHorizon(clock.Now().Add(fixtureStaleAfter / 2)) // the continuation claims at clock.Now()
			req := approveNewest(t, f, "th")
			arm()
			if tr, err := f.eng.Begin(context.Background(), req); err == nil {
				tr.Stream(context.Background(), io.Discard)
			}
		}
	}
	slowList := func(list string) func(clock *manualClock, call string, n int) error {
		return func(clock *manualClock, call string, n int) error {
			if call == list && n == 1 {
				clock.add(pastHorizon) // the read after the claim is slow: time passes the horizon
			}
			return nil
		}
	}
	cases := []struct {
		name   string
		tools  []agent.Tool
		drive  func(t *testing.T, f *fixture, l *lateWrites, clock *manualClock, arm func())
		before func(clock *manualClock, call string, n int) error
		after  func(clock *manualClock, call string, n int)
	}{
		// begin.go's user message write was retried unchecked for FinishRetry.
		{name: "user message retried", before: func(clock *manualClock, call string, n int) error {
			if call == "PutMessage(user)" && n == 1 {
				clock.add(pastHorizon) // the attempt fails slowly: time passes the horizon
				return unavailable(call)
			}
			return nil
		}},
		// FinishRun's first attempt was not checked after the final message's write.
		{name: "outcome after the final message", after: func(clock *manualClock, call string, n int) {
			if call == "PutMessage(assistant)" {
				clock.add(pastHorizon) // its answer comes back after the horizon
			}
		}},
		// abort's FinishRun (a begin that failed after its claim) was not checked at all, and its final segment
		// was written whatever the horizon said.
		{name: "abort", before: func(clock *manualClock, call string, n int) error {
			if call == "GetMessage" {
				clock.add(pastHorizon)
				return agent.E(agent.KindInternal, agent.CodeInternal, "injected: read failed for good")
			}
			return nil
		}},
		// The continuation's answer was resolved with no horizon check (issue 16 "Left" 5).
		{name: "answer resolved", tools: []agent.Tool{guarded}, drive: answer(false), before: slowList("ListMessageInterrupts")},
		// An interrupt found past its age was marked expired with no horizon check.
		{name: "interrupt expired", tools: []agent.Tool{guarded}, drive: answer(true), before: slowList("ListMessageInterrupts")},
		// A delivery pass with nothing to answer wrote its final segment whatever the horizon said.
		{name: "release", drive: func(t *testing.T, f *fixture, l *lateWrites, clock *manualClock, arm func()) {
			ctx := context.Background()
			if run, _ := f.run(t, submit("th", "u1", "hello")); run.Status != agent.RunCompleted {
				t.Fatalf("first turn: %s %+v", run.Status, run.Error)
			}
			q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Message: *userMsg("u1", "hello"), Owner: "alice",
				Status: agent.QueueQueued, CreatedAt: clock.Now()}
			if _, _, err := f.store.Enqueue(ctx, q, 0); err != nil {
				t.Fatal(err)
			}
			arm()
			if _, err := f.eng.BeginQueued(ctx, "th"); !errors.Is(err, engine.ErrNothingQueued) {
				t.Fatalf("a pass over a message the thread holds: %v, want ErrNothingQueued", err)
			}
		}, before: func(clock *manualClock, call string, n int) error {
			if call == "ListQueued" && n == 2 { // the pass's own read, after its claim (BeginQueued's is #1)
				clock.add(pastHorizon)
			}
			return nil
		}},
	}
	for name, store := range limitStores(t) {
		for _, tc := range cases {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				clock := newManualClock()
				l := &lateWrites{clock: clock, horizon: clock.Now().Add(fixtureStaleAfter / 2)}
				var armed atomic.Bool
				armed.Store(tc.drive == nil)
				counts := map[string]int{} // calls since the case was armed
				var cmu sync.Mutex
				l.before = func(call string, _ int) error {
					if call == "Heartbeat" {
						return unavailable(call)
					}
					if tc.before == nil || !armed.Load() {
						return nil
					}
					cmu.Lock()
					counts[call]++
					n := counts[call]
					cmu.Unlock()
					return tc.before(clock, call, n)
				}
				l.after = func(call string, n int) {
					if tc.after != nil && armed.Load() {
						tc.after(clock, call, n)
					}
				}
				// No reaper ticks: a sweep would start delivery passes and reap on the test's clock.
				opts := []option{store(t), withStore(l.wrap), withClock(clock), withConfig(func(c *config.Config) { c.ReaperInterval = time.Hour })}
				if len(tc.tools) > 0 {
					opts = append(opts, withTools(tc.tools...))
				}
				f := setup(t, opts...)
				if tc.drive != nil {
					tc.drive(t, f, l, clock, func() { armed.Store(true) })
				} else if tr, err := f.eng.Begin(context.Background(), submit("th", "u1", "hello")); err == nil {
					tr.Stream(context.Background(), io.Discard)
				}
				if late := l.lateOnes(); len(late) > 0 {
					t.Fatalf("fenced writes sent after the claim's horizon: %s", strings.Join(late, "; "))
				}
			})
		}
	}
}

// A tool's deadline never passes the claim's horizon (REVIEW D5): with the run's heartbeats failing, a tool
// (one that ignores its context) is abandoned once the horizon has passed, its context canceled, instead of
// being waited for until its own timeout (a minute here) while a reaper may hand the thread on.
func TestToolAbandonedAtTheHorizon(t *testing.T) {
	t.Parallel()
	clock := newStepClock() // the tool's horizon timer fires when the clock passes it
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	canceled := make(chan struct{})
	tool := agent.Tool{Name: "slow", Description: "ignores its context", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, _ agent.ToolInvocation) (json.RawMessage, error) {
			close(started)
			go func() { <-ctx.Done(); close(canceled) }()
			<-release
			return json.RawMessage(`"done"`), nil
		}}
	failBeats := newFaulty(func(method string, n int, final bool) bool { return method == "Heartbeat" })
	f := setup(t, withStore(failBeats.wrap), withClock(clock), withTools(tool),
		withConfig(func(c *config.Config) { c.ToolTimeout = time.Minute }))
	ran := f.streaming(t, submit("th", "u1", "/tool slow {}"))
	<-started
	clock.add(pastHorizon) // past the horizon (StaleAfter/2), no heartbeat accepted
	select {
	case run := <-ran:
		if run.Error == nil || run.Error.Code != agent.CodeRunFenced {
			t.Fatalf("run %s %+v, want it stopped as in doubt (run_fenced)", run.Status, run.Error)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run still waits for its tool past the claim's horizon")
	}
	<-canceled
}

// A run whose outcome is stored ends its stream for its readers, however slow its finish was (REVIEW D7): the
// final segment is written insert-if-absent after a successful FinishRun even once the horizon has passed (it
// used to be dropped, and resume readers were told "The run ended without finishing its stream").
func TestFinalSegmentAfterASlowFinish(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			l := &lateWrites{clock: clock, horizon: clock.Now().Add(time.Hour),
				before: func(string, int) error { return nil },
				after: func(call string, _ int) {
					if call == "FinishRun" {
						clock.add(pastHorizon) // its answer comes back after the horizon
					}
				}}
			f := setup(t, store(t), withStore(l.wrap), withClock(clock))
			run, _ := f.run(t, submit("th", "u1", "hello"))
			if run.Status != agent.RunCompleted {
				t.Fatalf("run %s %+v", run.Status, run.Error)
			}
			segs, err := f.store.ListSegments(context.Background(), run.ID, 0, clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			// The finish chunk may sit in the final segment or in one a flush tick cut just before it (the
			// segmenter's ticker is real time): what readers need is the stream, read up to a final segment, to hold it.
			var stream strings.Builder
			for _, s := range segs {
				stream.Write(s.Data)
			}
			if n := len(segs); n == 0 || !segs[n-1].Final || !strings.Contains(stream.String(), `"type":"finish"`) {
				t.Fatalf("the run's segments do not end with a final segment after its finish (%d segments, last final %v)",
					len(segs), len(segs) > 0 && segs[len(segs)-1].Final)
			}
		})
	}
}

// lostClaimAnswer applies the first ClaimRun and loses its answer (every SDK attempt timed out after the write
// applied), as a transient error.
type lostClaimAnswer struct {
	agent.Store
	mu    sync.Mutex
	calls int // claims that applied
}

func (l *lostClaimAnswer) wrap(s agent.Store) agent.Store { l.Store = s; return l }

func (l *lostClaimAnswer) ClaimRun(ctx context.Context, req agent.ClaimRequest) (agent.ClaimResult, error) {
	res, err := l.Store.ClaimRun(ctx, req)
	l.mu.Lock()
	if err == nil {
		l.calls++
	}
	first := l.calls == 1 && err == nil
	l.mu.Unlock()
	if first {
		return agent.ClaimResult{}, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "injected: the claim applied, its answer was lost")
	}
	return res, err
}

// A claim whose answer was lost is retried by the engine with the same run id, which the store recognises as
// ours (REVIEW D9): the turn runs. It used to fail the request with the transient error and leave the thread
// claimed by a run that never ran (409 run_active until the claim went stale).
func TestClaimRetriedWithTheSameRunID(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lost := &lostClaimAnswer{}
			f := setup(t, store(t), withStore(lost.wrap))
			tr, err := f.eng.Begin(context.Background(), submit("th", "u1", "hello"))
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
				t.Fatalf("run %s %+v", run.Status, run.Error)
			}
			runs, err := f.store.ListRuns(context.Background(), "th")
			if err != nil || len(runs) != 1 {
				t.Fatalf("%d runs (%v), want the one claimed once", len(runs), err)
			}
			if th, _ := f.store.GetThread(context.Background(), "th"); th.ActiveRun != nil {
				t.Fatalf("claim left: %+v", th.ActiveRun)
			}
		})
	}
}

// A run whose reply could not be stored is left to the reaper, which counts only what its draft recorded: for a
// one-step reply, nothing. The run records the rest as late usage once the reaper has finished it (REVIEW D6),
// so the thread's usage is what the model reported, counted once.
func TestUnsavedRunsUsageRecordedLate(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newStepClock()
			fs := newFaulty(func(method string, n int, final bool) bool { return method == "PutMessage" && final })
			f := setup(t, store(t), withStore(fs.wrap), withClock(clock))
			f.eng = engineWith(t, f, func(c *engine.Config) { c.FinishRetry = 100 * time.Millisecond })
			run, _ := f.run(t, submit("th", "u1", "hello there"))
			if run.Error == nil || run.Error.Code != agent.CodePersistFailed || run.Usage.TotalTokens == 0 {
				t.Fatalf("run %s %+v usage %+v, want persist_failed with usage", run.Status, run.Error, run.Usage)
			}
			reapThenLateUsage(t, f, fs, clock, run)
		})
	}
}

// reapThenLateUsage heals the store, moves the clock until the run's claim is stale, reaps it, moves the clock on
// by one of the run's late-usage polls (StaleAfter/8, at most 5 s) so that its next read finds the reaper's
// outcome, waits for the run's late usage (recorded once the reaper finished it) and checks that the thread counts
// what the run reported. Real time plays no part: the poll waits on the clock (its real fallback only makes it
// read again), and the run waits for the reaper for two stale windows and a minute of that clock.
func reapThenLateUsage(t *testing.T, f *fixture, fs *faultyStore, clock *stepClock, run agent.Run) {
	t.Helper()
	fs.mu.Lock()
	fs.fail = func(string, int, bool) bool { return false }
	fs.mu.Unlock()
	clock.add(pastStale)
	if st, err := f.stack.Reaper.Tick(context.Background()); err != nil || st.Reaped != 1 {
		t.Fatalf("reaper tick: %+v %v", st, err)
	}
	clock.add(latePoll)
	f.eng.Wait()
	th, err := f.store.GetThread(context.Background(), "th")
	if err != nil || th.Usage.InputTokens != run.Usage.InputTokens || th.Usage.OutputTokens != run.Usage.OutputTokens {
		t.Fatalf("thread usage %+v (%v), want the run's %+v", th.Usage, err, run.Usage)
	}
}

// A run that stopped itself because its claim was in doubt (heartbeats failing) is reaped later; what its draft
// never recorded is recorded late once the reaper finished it (REVIEW D6).
func TestInDoubtRunsUsageRecordedLate(t *testing.T) {
	t.Parallel()
	clock := newStepClock() // the tool's horizon timer fires when the clock passes it
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	fs := newFaulty(func(method string, n int, final bool) bool { return method == "Heartbeat" })
	f := setup(t, withStore(fs.wrap), withClock(clock), withTools(slowTool(started, release)))
	ran := f.streaming(t, submit("th", "u1", "/tool slow {}"))
	<-started
	clock.add(pastHorizon) // past the horizon: the run stops itself, its draft unwritten
	run := <-ran
	if run.Error == nil || run.Error.Code != agent.CodeRunFenced || run.Usage.TotalTokens == 0 {
		t.Fatalf("run %s %+v usage %+v, want stopped in doubt with the first step's usage", run.Status, run.Error, run.Usage)
	}
	reapThenLateUsage(t, f, fs, clock, run)
}

// A turn that takes queued messages marks them taken only while its claim is surely its own (REVIEW D1, fence
// E): here the queued message's write applies and its answer comes back after the horizon (heartbeats failing),
// and marking the entry taken must not be sent then.
func TestQueueTakeGatedAtTheHorizon(t *testing.T) {
	t.Parallel()
	clock := newManualClock()
	l := &lateWrites{clock: clock, horizon: clock.Now().Add(fixtureStaleAfter / 2),
		before: func(call string, _ int) error {
			if call == "Heartbeat" {
				return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "injected: heartbeat throttled")
			}
			return nil
		},
		after: func(string, int) {}}
	f := setup(t, withStore(l.wrap), withClock(clock))
	// No Jobs: no delivery pass takes the queue first.
	eng := engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Tools: f.stack.Tools, Reaper: f.stack.Reaper,
		Signer: f.stack.Signer, Clock: clock}, f.eng.Config())
	ctx := context.Background()
	busy, err := eng.Begin(ctx, submit("th", "u1", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	queued := submit("th", "q1", "and then?")
	queued.Multitask = engine.MultitaskEnqueue
	if tr, err := eng.Begin(ctx, queued); err != nil || tr.Queued() == nil {
		t.Fatalf("enqueue: %v", err)
	}
	if run := busy.Stream(ctx, io.Discard); run.Status != agent.RunCompleted {
		t.Fatalf("busy run %s %+v", run.Status, run.Error)
	}
	l.mu.Lock()
	l.afterMessage = func(id string) {
		if id == "q1" {
			clock.add(pastHorizon) // the queued message's answer comes back after the horizon
		}
	}
	l.mu.Unlock()
	next, err := eng.Begin(ctx, submit("th", "u2", "next"))
	if err != nil {
		t.Fatal(err)
	}
	next.Stream(ctx, io.Discard)
	if late := l.lateOnes(); len(late) > 0 {
		t.Fatalf("fenced writes sent after the claim's horizon: %s", strings.Join(late, "; "))
	}
}

// approveNewest is the client's approval of every requested approval on the thread's newest message, read from
// the engine's store (either store).
func approveNewest(t *testing.T, f *fixture, thread string) engine.Request {
	t.Helper()
	recs, err := f.store.ListMessages(context.Background(), thread)
	if err != nil || len(recs) == 0 {
		t.Fatalf("messages: %d (%v)", len(recs), err)
	}
	m := recs[len(recs)-1].Message
	for i, raw := range m.Parts {
		p, _ := agent.DecodePart(raw)
		if p.State == agent.StateApprovalRequested {
			yes := true
			p.State, p.Approval.Approved = agent.StateApprovalResponded, &yes
			m.Parts[i] = agent.EncodePart(p)
		}
	}
	return engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit, Message: &m, MessageID: m.ID}
}
