package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// queueLauncher is a RunLauncher the test drives: each Launch queues the continuation, and the test runs it when
// it chooses (engine.Continue), as a fresh invocation would.
type queueLauncher struct {
	mu   sync.Mutex
	got  []agent.Continuation
	fail bool // Launch fails (nothing is launched)
}

func (l *queueLauncher) Launch(_ context.Context, c agent.Continuation) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable, "launch refused by the test")
	}
	l.got = append(l.got, c)
	return nil
}

// next takes the oldest continuation not yet run.
func (l *queueLauncher) next(t *testing.T) agent.Continuation {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.got) == 0 {
		t.Fatal("no continuation was launched")
	}
	c := l.got[0]
	l.got = l.got[1:]
	return c
}

func (l *queueLauncher) pending() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.got) }

// tickTool moves the clock on by d when it runs: a step that takes that long on the run's clock.
func tickTool(clock *stepClock, d time.Duration) agent.Tool {
	return agent.Tool{Name: "tick", Description: "time passes", Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			clock.add(d)
			return json.RawMessage(`"ticked"`), nil
		}}
}

// handOverEngine builds an engine over f's store and model with the test's launcher and cfg.
func handOverEngine(f *fixture, l agent.RunLauncher, mut func(*engine.Config)) *engine.Engine {
	cfg := f.eng.Config()
	if mut != nil {
		mut(&cfg)
	}
	return engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Tools: f.stack.Tools, Reaper: f.stack.Reaper,
		Signer: f.stack.Signer, Clock: f.clock, Launcher: l}, cfg)
}

// soon is an invocation deadline due at the run's next step boundary after one tick (the tool moves the clock
// past it), and not at the boundary before.
func soon(clock *stepClock, margin time.Duration) context.Context {
	return engine.WithDeadline(context.Background(), clock.Now().Add(margin+tick/2))
}

const (
	// tick: a claim's whole life in these tests (at most handOverStep ticks) stays below the fixture's horizon
	// (StaleAfter/2) whether or not a heartbeat lands between two ticks: heartbeats are asynchronous, and with
	// 20 s ticks a continuation that took two steps before its first heartbeat landed was in doubt (run_fenced,
	// about 1 run in 10 of TestHandOverAllHandsOverRunningRuns; TestHandOverThreeTimes' last continuation too).
	tick         = 5 * time.Second
	handOverStep = 5 // MaxSteps of the hand-over runs
)

// A run crossing three hand-overs (each invocation's deadline shortened on the injected clock) on both stores:
// one stored reply; the POST's stream ends without finish, marked handover; a reader attached from the start sees
// one continuous stream (one start, one finish, every step) that the AI SDK's parsers accept; the segments are one
// sequence; the old holder's late writes are refused.
func TestHandOverThreeTimes(t *testing.T) {
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			clock := newStepClock()
			f := setup(t, store(t), withClock(clock), withTools(tickTool(clock, tick)))
			l := &queueLauncher{}
			eng := handOverEngine(f, l, func(c *engine.Config) { c.MaxSteps = handOverStep })
			margin := eng.Config().HandOverMargin
			thread := "th-handover-" + name

			tr, err := eng.Begin(context.Background(), submit(thread, "u1", "/loop tick {}"))
			if err != nil {
				t.Fatal(err)
			}
			first := tr.Run()
			// A reader attached from the start, as GET /chat/{id}/stream is.
			var resumed bytes.Buffer
			read := make(chan error, 1)
			go func() {
				_, err := f.stack.Threads.Attach(context.Background(), "alice", thread, func() {}, &resumed, func() {})
				read <- err
			}()
			var post bytes.Buffer
			if run := tr.Stream(soon(clock, margin), &post); run.Status != agent.RunRunning {
				t.Fatalf("first invocation ended %s (%+v), want running (handed over)", run.Status, run.Error)
			}
			chunks := parseSSE(t, post.Bytes())
			if n := count(chunks, "finish"); n != 0 {
				t.Fatalf("POST stream has %d finish chunks, want none (it resumes): %v", n, types(chunks))
			}
			if last := chunks[len(chunks)-1]; last["type"] != "message-metadata" || last["messageMetadata"].(map[string]any)["handover"] != true {
				t.Fatalf("POST stream ends with %v, want message-metadata with handover", last)
			}
			if n := count(chunks, "start-step"); n != 1 {
				t.Fatalf("POST stream has %d steps, want 1 before the hand-over", n)
			}

			var run agent.Run
			for i := 1; ; i++ {
				c := l.next(t)
				if c.HandOvers != i || c.RunID != first.ID || c.Epoch != first.Epoch+int64(i-1) {
					t.Fatalf("continuation %d = %+v, want hand-over %d of %s at epoch %d", i, c, i, first.ID, first.Epoch+int64(i-1))
				}
				ctx := context.Background()
				if i < 3 {
					ctx = soon(clock, margin)
				}
				run, err = eng.Continue(ctx, c)
				if err != nil {
					t.Fatalf("continue %d: %v", i, err)
				}
				if i == 1 {
					oldHolderWrites(t, f.store, first)
				}
				if run.Status != agent.RunRunning {
					if i != 3 {
						t.Fatalf("continuation %d ended %s, want a hand-over", i, run.Status)
					}
					break
				}
			}
			if l.pending() != 0 {
				t.Fatalf("%d continuations left after the run ended", l.pending())
			}
			if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStepLimit || run.Steps != handOverStep {
				t.Fatalf("run = %s %+v after %d steps, want failed step_limit after %d", run.Status, run.Error, run.Steps, handOverStep)
			}
			stored, err := f.store.GetRun(context.Background(), thread, first.ID)
			if err != nil || stored.Status != agent.RunFailed || stored.Epoch != first.Epoch+3 || stored.Steps != handOverStep {
				t.Fatalf("stored run = %+v (%v), want failed at epoch %d after %d steps", stored, err, first.Epoch+3, handOverStep)
			}

			// One stored reply, with every step's tool call and result.
			recs, err := f.store.ListMessages(context.Background(), thread)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 2 || recs[1].Message.ID != first.AssistantMessageID {
				t.Fatalf("thread holds %d messages, want the user's and one reply %s", len(recs), first.AssistantMessageID)
			}
			reply := recs[1].Message
			if st := reply.Meta().Status; st != agent.MessageFailed {
				t.Fatalf("reply status = %s, want failed (step_limit)", st)
			}
			if n := partsOfType(t, reply, "tool-tick"); n != handOverStep {
				t.Fatalf("reply has %d tick calls, want %d (one per step, across the invocations)", n, handOverStep)
			}

			// One continuous resumed stream.
			if err := <-read; err != nil {
				t.Fatalf("resume: %v", err)
			}
			rs := parseSSE(t, resumed.Bytes())
			if count(rs, "start") != 1 || count(rs, "finish") != 1 || count(rs, "start-step") != handOverStep {
				t.Fatalf("resumed stream: %d start, %d finish, %d steps; want 1, 1, %d: %v", count(rs, "start"), count(rs, "finish"),
					count(rs, "start-step"), handOverStep, types(rs))
			}
			for _, c := range rs {
				if c["type"] == "message-metadata" && c["messageMetadata"].(map[string]any)["handover"] == true {
					t.Fatal("the resumed stream carries the POST's hand-over metadata; it is the client's alone")
				}
			}
			segs, err := f.store.ListSegments(context.Background(), first.ID, 0, clock.Now())
			if err != nil {
				t.Fatal(err)
			}
			var all []byte
			for i, s := range segs {
				if s.Seq != int64(i) {
					t.Fatalf("segment %d has seq %d: the hand-overs broke the sequence", i, s.Seq)
				}
				all = append(all, s.Data...)
			}
			if !bytes.Equal(all, resumed.Bytes()) {
				t.Fatalf("the reader's stream is not the stored segments:\n%s\n---\n%s", tail(resumed.String()), tail(string(all)))
			}
			for _, p := range aisdktest.CheckStreams(t, resumed.Bytes()) {
				parts, err := p.Parts()
				if err != nil {
					t.Fatal(err)
				}
				ticks := 0
				for _, part := range parts {
					if part.Type == "tool-tick" {
						ticks++
					}
				}
				if p.Message.ID != first.AssistantMessageID || ticks != handOverStep {
					t.Fatalf("ai@%s made message %s with %d tick calls of the resumed stream, want %s with %d", p.SDK, p.Message.ID,
						ticks, first.AssistantMessageID, handOverStep)
				}
			}
		})
	}
}

// oldHolderWrites injects writes of the old holder (the first invocation, at its epoch) after its continuation took
// the claim: every one is refused.
func oldHolderWrites(t *testing.T, s agent.Store, old agent.Run) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	w := agent.MessageWrite{ThreadID: old.ThreadID, Seq: old.AssistantSeq(), Fence: old.Fence(), Now: now, Message: agent.Message{
		ID: old.AssistantMessageID, Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"late"}`)}}}
	if err := s.PutMessage(ctx, w); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("late reply write of the old holder: %v, want run_fenced", err)
	}
	if err := s.Heartbeat(ctx, old.ThreadID, old.Fence(), now); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("late heartbeat of the old holder: %v, want run_fenced", err)
	}
	fin := old
	fin.Status, fin.FinishedAt, fin.UpdatedAt = agent.RunCompleted, now, now
	if err := s.FinishRun(ctx, fin); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("late finish of the old holder: %v, want run_fenced", err)
	}
	if _, err := s.HandOver(ctx, agent.HandOverRequest{ThreadID: old.ThreadID, Fence: old.Fence(), Now: now}); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("a second continuation of the same hand-over: %v, want run_fenced", err)
	}
}

func partsOfType(t *testing.T, m agent.Message, typ string) int {
	t.Helper()
	n := 0
	for _, raw := range m.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil {
			t.Fatal(err)
		}
		if p.Type == typ {
			n++
		}
	}
	return n
}

// The whole-run time limit counts from the run's creation across hand-overs: a continuation that starts past it
// ends the run run_timeout.
func TestHandOverKeepsTheRunTimeout(t *testing.T) {
	clock := newStepClock()
	f := setup(t, withClock(clock), withTools(tickTool(clock, tick)))
	l := &queueLauncher{}
	eng := handOverEngine(f, l, func(c *engine.Config) { c.MaxSteps = 50; c.RunTimeout = 5 * time.Minute })
	tr, err := eng.Begin(context.Background(), submit("th-ho-timeout", "u1", "/loop tick {}"))
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(soon(clock, eng.Config().HandOverMargin), &bytes.Buffer{}); run.Status != agent.RunRunning {
		t.Fatalf("first invocation ended %s, want handed over", run.Status)
	}
	// Each invocation's time is the run's: the next continuation starts past the run's five minutes.
	clock.add(5 * time.Minute)
	run, err := eng.Continue(context.Background(), l.next(t))
	if err != nil {
		t.Fatal(err)
	}
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeRunTimeout {
		t.Fatalf("continuation past the run's time: %s %+v, want failed run_timeout", run.Status, run.Error)
	}
	if run.Steps != 1 {
		t.Fatalf("steps = %d, want the first invocation's 1 and none after the time limit", run.Steps)
	}
}

// A launcher that fails keeps the run in its invocation: it goes on to its end there.
func TestHandOverLaunchFailsRunGoesOn(t *testing.T) {
	clock := newStepClock()
	f := setup(t, withClock(clock))
	l := &queueLauncher{fail: true}
	eng := handOverEngine(f, l, nil)
	tr, err := eng.Begin(context.Background(), submit("th-ho-fail", "u1", "hello there"))
	if err != nil {
		t.Fatal(err)
	}
	tr.HandOverNow()
	var post bytes.Buffer
	run := tr.Stream(context.Background(), &post)
	if run.Status != agent.RunCompleted || l.pending() != 0 {
		t.Fatalf("run = %s with %d continuations, want completed here", run.Status, l.pending())
	}
	if textOf(parseSSE(t, post.Bytes())) != "You said: hello there" {
		t.Fatalf("reply = %q", textOf(parseSSE(t, post.Bytes())))
	}
}

// A continuation whose claim moved on (a duplicate delivery of the same hand-over, the run reaped or stopped
// meanwhile) writes nothing and says so.
func TestContinueAfterTheClaimMoved(t *testing.T) {
	f := setup(t)
	l := &queueLauncher{}
	eng := handOverEngine(f, l, nil)
	tr, err := eng.Begin(context.Background(), submit("th-ho-dup", "u1", "hello"))
	if err != nil {
		t.Fatal(err)
	}
	tr.HandOverNow()
	tr.Stream(context.Background(), &bytes.Buffer{})
	c := l.next(t)
	// The reply the hand-over stored names the continuation (what a reaper continues the run from when it never
	// starts: lib/reaper relaunch.go).
	if msgs := f.messages(t, "th-ho-dup"); len(msgs) != 2 || msgs[1].Meta().HandedOver == nil || *msgs[1].Meta().HandedOver != c {
		t.Fatalf("the handed-over reply's metadata: %s, want handedOver %+v", msgs[len(msgs)-1].Metadata, c)
	}
	run, err := eng.Continue(context.Background(), c)
	if err != nil || run.Status != agent.RunCompleted {
		t.Fatalf("continuation = %s, %v; want completed", run.Status, err)
	}
	if _, err := eng.Continue(context.Background(), c); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("duplicate continuation: %v, want run_fenced", err)
	}
	msgs := f.messages(t, "th-ho-dup")
	if len(msgs) != 2 || msgs[1].Text() != "You said: hello" {
		t.Fatalf("thread = %d messages, want the user's and one reply", len(msgs))
	}
}

// HandOverAll (a drain's end) hands every run over at its next step boundary, through the launcher, and the
// continuation finishes it.
func TestHandOverAllHandsOverRunningRuns(t *testing.T) {
	clock := newStepClock()
	f := setup(t, withClock(clock), withTools(tickTool(clock, tick)))
	l := &queueLauncher{}
	eng := handOverEngine(f, l, func(c *engine.Config) { c.MaxSteps = 3 })
	tr, err := eng.Begin(context.Background(), submit("th-ho-all", "u1", "/loop tick {}"))
	if err != nil {
		t.Fatal(err)
	}
	eng.HandOverAll()
	var post bytes.Buffer
	if run := tr.Stream(context.Background(), &post); run.Status != agent.RunRunning {
		t.Fatalf("run under HandOverAll ended %s, want handed over", run.Status)
	}
	if count(parseSSE(t, post.Bytes()), "finish") != 0 {
		t.Fatal("the handed-over stream has a finish")
	}
	// The continuation runs where the drain sent it (an engine that is not draining).
	other := handOverEngine(f, l, func(c *engine.Config) { c.MaxSteps = 3 })
	run, err := other.Continue(context.Background(), l.next(t))
	if err != nil || run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStepLimit || run.Steps != 3 {
		t.Fatalf("continuation = %s %+v after %d steps (%v), want step_limit after 3", run.Status, run.Error, run.Steps, err)
	}
}
