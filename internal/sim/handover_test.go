package sim

// Hand-overs as a fault kind (issue 21 item 2): seeded schedules of runs that cross invocations, with crashes at
// and during the hand-over, lost, duplicated and late continuations, over both stores, and the invariants checked
// on the store once a clean reaper has swept: nothing lost, nothing twice, every claim released.
//
// These schedules run beside the world of sim_test.go rather than inside it: a process here is a real engine (the
// openai adapter over the offline model, as `agentloop dev` runs) whose store dies at its crash point, and the
// scheduler is the test's goroutine, which runs one invocation at a time to its end. So a schedule is drawn from
// its seed (which process crashes where, which continuation is delivered, twice, late or never), but the order of
// a process's own store calls is its engine's (its keeper's heartbeats run on real timers beside its writes): a
// crash "at call k" is at the k-th call that process makes, not at a replayable point. A failure prints the seed
// and the plan.
//
// Faults, per invocation (the first one of a run crashes only at its hand-over, so its user message is stored):
//   - crash at the hand-over: the old holder dies as it launches its continuation, before the launch is sent (the
//     continuation is lost: the reaper finishes the run) or after (the continuation goes on);
//   - crash at store call k of a continuation (1-10, before or after that call applies): at its HandOver (the
//     claim stays the old holder's, or is the dead continuation's), its reply's write-back, any later write;
//   - a continuation delivered twice (the second finds the claim moved), never delivered, or delivered after the
//     claim went stale and the reaper finished the run (it finds the claim moved).
//
// Invariants, per thread: no claim left; one run, terminal; the user message and one reply, its id the run's; the
// reply final, with the run's status; every tool call in it once, each with a result; the stream's segments one
// sequence from 0, one start (the reply's id) and one finish, the last chunk (a run's own outcome may leave it
// without its end, as any run's may: readers end it); every tool call the reply holds was streamed, and a
// completed run's reply holds every step it streamed.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// hoStaleAfter is the schedules' stale window, on the offset clock (moved past it in one jump, never waited for).
const hoStaleAfter = 30 * time.Second

// offsetClock is the wall clock moved on by the schedule (timers stay real: heartbeats and flushes tick in real
// time, and every stale window is passed by a jump).
type offsetClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *offsetClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return agent.SystemClock{}.Now().Add(c.off)
}

func (c *offsetClock) add(d time.Duration) { c.mu.Lock(); c.off += d; c.mu.Unlock() }

// dyingStore is one invocation's store: at its crash point it dies, and every write after that fails as a dead
// process's would (reads change nothing and pass).
type dyingStore struct {
	agent.Store
	mu      sync.Mutex
	calls   int
	crashAt int  // the write (from 1) that kills the process; 0: none
	after   bool // it dies after that write applied
	dead    bool
}

var errHoDead = agent.E(agent.KindInternal, agent.CodeInternal, "sim: the process died")

func (s *dyingStore) kill() { s.mu.Lock(); s.dead = true; s.mu.Unlock() }

func (s *dyingStore) isDead() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.dead }

// write runs one write unless the process is dead, and counts it towards the crash point.
func (s *dyingStore) write(do func() error) error {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return errHoDead
	}
	s.calls++
	crash := s.calls == s.crashAt
	if crash && !s.after {
		s.dead = true
		s.mu.Unlock()
		return errHoDead
	}
	s.mu.Unlock()
	err := do()
	if crash {
		s.kill()
		return errHoDead
	}
	return err
}

func (s *dyingStore) CreateThread(ctx context.Context, t agent.Thread) (th agent.Thread, created bool, err error) {
	err = s.write(func() error { th, created, err = s.Store.CreateThread(ctx, t); return err })
	return th, created, err
}
func (s *dyingStore) ClaimRun(ctx context.Context, r agent.ClaimRequest) (res agent.ClaimResult, err error) {
	err = s.write(func() error { res, err = s.Store.ClaimRun(ctx, r); return err })
	return res, err
}
func (s *dyingStore) HandOver(ctx context.Context, r agent.HandOverRequest) (res agent.ClaimResult, err error) {
	err = s.write(func() error { res, err = s.Store.HandOver(ctx, r); return err })
	return res, err
}
func (s *dyingStore) Heartbeat(ctx context.Context, id string, f agent.Fence, now time.Time) error {
	return s.write(func() error { return s.Store.Heartbeat(ctx, id, f, now) })
}
func (s *dyingStore) KeepClaims(ctx context.Context, cs []agent.KeptClaim, now time.Time) []agent.KeepResult {
	var res []agent.KeepResult
	err := s.write(func() error { res = s.Store.KeepClaims(ctx, cs, now); return nil })
	if err != nil {
		res = make([]agent.KeepResult, len(cs))
		for i := range res {
			res[i].Err = err
		}
	}
	return res
}
func (s *dyingStore) FinishRun(ctx context.Context, r agent.Run) error {
	return s.write(func() error { return s.Store.FinishRun(ctx, r) })
}
func (s *dyingStore) NoteTakes(ctx context.Context, r agent.Run, ids []string) error {
	return s.write(func() error { return s.Store.NoteTakes(ctx, r, ids) })
}
func (s *dyingStore) RecordLateUsage(ctx context.Context, l agent.LateUsage) error {
	return s.write(func() error { return s.Store.RecordLateUsage(ctx, l) })
}
func (s *dyingStore) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	return s.write(func() error { return s.Store.PutMessage(ctx, w) })
}
func (s *dyingStore) FenceMessage(ctx context.Context, id, msg string, f agent.Fence) error {
	return s.write(func() error { return s.Store.FenceMessage(ctx, id, msg, f) })
}
func (s *dyingStore) DeleteMessage(ctx context.Context, id, msg string, f agent.Fence) error {
	return s.write(func() error { return s.Store.DeleteMessage(ctx, id, msg, f) })
}
func (s *dyingStore) AppendSegment(ctx context.Context, seg agent.Segment) error {
	return s.write(func() error { return s.Store.AppendSegment(ctx, seg) })
}
func (s *dyingStore) PutValue(ctx context.Context, ns, key string, v []byte) error {
	return s.write(func() error { return s.Store.PutValue(ctx, ns, key, v) })
}
func (s *dyingStore) TakeOver(ctx context.Context, r agent.TakeRequest) (f agent.Fence, err error) {
	err = s.write(func() error { f, err = s.Store.TakeOver(ctx, r); return err })
	return f, err
}
func (s *dyingStore) RecordOutcome(ctx context.Context, r agent.Run, h agent.Fence) error {
	return s.write(func() error { return s.Store.RecordOutcome(ctx, r, h) })
}
func (s *dyingStore) ReleaseClaim(ctx context.Context, r agent.ReleaseRequest) error {
	return s.write(func() error { return s.Store.ReleaseClaim(ctx, r) })
}
func (s *dyingStore) AcquireLease(ctx context.Context, r agent.LeaseRequest) (d time.Duration, err error) {
	err = s.write(func() error { d, err = s.Store.AcquireLease(ctx, r); return err })
	return d, err
}
func (s *dyingStore) RenewLease(ctx context.Context, r agent.LeaseRequest) error {
	return s.write(func() error { return s.Store.RenewLease(ctx, r) })
}
func (s *dyingStore) ReleaseLease(ctx context.Context, scope, holder string) error {
	return s.write(func() error { return s.Store.ReleaseLease(ctx, scope, holder) })
}
func (s *dyingStore) Count(ctx context.Context, r agent.CountRequest) (d time.Duration, err error) {
	err = s.write(func() error { d, err = s.Store.Count(ctx, r); return err })
	return d, err
}
func (s *dyingStore) MarkReader(ctx context.Context, id, run string, until time.Time) error {
	return s.write(func() error { return s.Store.MarkReader(ctx, id, run, until) })
}

// hoLauncher is an invocation's launcher: it records the continuation for the schedule, or, at the crash at the
// hand-over, kills the invocation before or after recording it.
type hoLauncher struct {
	h     *hoWorld
	store *dyingStore
	crash string // "", "before", "after"
}

func (l *hoLauncher) Launch(_ context.Context, c agent.Continuation) error {
	if l.store.isDead() {
		return errHoDead // a dead process launches nothing (the engine would go on, writing nothing)
	}
	if l.crash == "before" {
		l.store.kill()
		return errHoDead
	}
	l.h.mu.Lock()
	l.h.pending = append(l.h.pending, c)
	l.h.mu.Unlock()
	if l.crash == "after" {
		l.store.kill()
	}
	return nil
}

// hoWorld is one schedule: the shared store, the model and tools, the clock, the continuations waiting.
type hoWorld struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	base    agent.Store
	stack   *devserver.Stack
	clock   *offsetClock
	cfg     engine.Config
	plan    []string
	mu      sync.Mutex
	pending []agent.Continuation
}

func (h *hoWorld) note(format string, args ...any) {
	h.plan = append(h.plan, fmt.Sprintf(format, args...))
}

// invocation builds one process's engine over a store that dies at its crash point.
func (h *hoWorld) invocation(crashAt int, after bool, atHandOver string) (*engine.Engine, *dyingStore) {
	ds := &dyingStore{Store: h.base, crashAt: crashAt, after: after}
	l := &hoLauncher{h: h, store: ds, crash: atHandOver}
	rp := reaper.New(reaper.Deps{Store: ds, Tools: h.stack.Tools, Clock: h.clock}, reaper.Config{StaleAfter: hoStaleAfter})
	eng := engine.New(engine.Deps{Store: ds, Model: h.stack.Model, Tools: h.stack.Tools, Reaper: rp, Signer: h.stack.Signer,
		Clock: h.clock, Launcher: l}, h.cfg)
	return eng, ds
}

// deadline is an invocation's: most hand over at every step boundary after their first step, some never.
func (h *hoWorld) deadline(name string) context.Context {
	if h.rng.IntN(10) < 7 {
		h.note("%s: deadline past", name)
		return engine.WithDeadline(context.Background(), time.Unix(0, 0))
	}
	h.note("%s: no deadline", name)
	return context.Background()
}

func (h *hoWorld) takePending() (agent.Continuation, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pending) == 0 {
		return agent.Continuation{}, false
	}
	c := h.pending[0]
	h.pending = h.pending[1:]
	return c, true
}

// sweep moves the clock past the stale window and runs a clean reaper twice. The clean reaper continues a run
// that handed over and whose continuation never took the claim (lib/reaper relaunch.go) through the stack's
// launcher: each tick waits for what it launched.
func (h *hoWorld) sweep() {
	h.clock.add(2 * hoStaleAfter)
	for range 2 {
		if _, err := h.stack.Reaper.Tick(context.Background()); err != nil {
			h.t.Fatalf("seed %d: clean reaper: %v\nplan:\n%s", h.seed, err, strings.Join(h.plan, "\n"))
		}
		h.stack.Launcher.Wait()
	}
}

// continueOne delivers one continuation under a fault drawn for it.
func (h *hoWorld) continueOne(c agent.Continuation) {
	name := fmt.Sprintf("continuation %d of %s", c.HandOvers, c.RunID)
	switch r := h.rng.IntN(20); {
	case r == 0:
		h.note("%s: never delivered", name)
		return
	case r == 1:
		h.note("%s: late (the reaper swept first)", name)
		h.sweep()
	}
	crashAt, after := 0, false
	if h.rng.IntN(3) == 0 {
		crashAt, after = 1+h.rng.IntN(10), h.rng.IntN(2) == 0
	}
	atHandOver := []string{"", "", "", "", "before", "after"}[h.rng.IntN(6)]
	h.note("%s: crash at write %d (after: %v), at its own hand-over %q", name, crashAt, after, atHandOver)
	eng, _ := h.invocation(crashAt, after, atHandOver)
	run, err := eng.Continue(h.deadline(name), c)
	h.note("%s: %s %v", name, run.Status, err)
	if h.rng.IntN(10) == 0 {
		h.note("%s: delivered again", name)
		eng2, _ := h.invocation(0, false, "")
		if run, err := eng2.Continue(context.Background(), c); err == nil && run.Status != "" {
			h.note("%s (again): %s", name, run.Status)
		}
	}
}

// runSchedule runs one seed on base.
func runHandOverSchedule(t *testing.T, seed uint64, base agent.Store, stack *devserver.Stack, clock *offsetClock) {
	h := &hoWorld{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x68616e646f766572)), base: base, stack: stack, clock: clock}
	h.cfg = stack.Engine.Config()
	h.cfg.StaleAfter, h.cfg.Heartbeat, h.cfg.MaxSteps = hoStaleAfter, 50*time.Millisecond, 2+h.rng.IntN(4)
	h.cfg.LateWait = -1
	threads := 1 + h.rng.IntN(2)
	var ids []string
	for i := range threads {
		id := fmt.Sprintf("ho-%d-%d", seed, i)
		ids = append(ids, id)
		text := []string{`/loop add_note {"text":"n"}`, `/tool add_note {"text":"n"}`, "hello there"}[h.rng.IntN(3)]
		atHandOver := []string{"", "", "before", "after"}[h.rng.IntN(4)]
		h.note("%s: %q, max steps %d, crash at its hand-over %q", id, text, h.cfg.MaxSteps, atHandOver)
		eng, _ := h.invocation(0, false, atHandOver)
		tr, err := eng.Begin(context.Background(), agent0Submit(id, text))
		if err != nil {
			t.Fatalf("seed %d: begin %s: %v", seed, id, err)
		}
		run := tr.Stream(h.deadline(id), &bytes.Buffer{})
		h.note("%s: first invocation %s", id, run.Status)
	}
	for {
		c, ok := h.takePending()
		if !ok {
			break
		}
		h.continueOne(c)
	}
	h.sweep()
	for _, id := range ids {
		if err := checkHandOverThread(context.Background(), base, id, clock); err != nil {
			t.Fatalf("seed %d: %s: %v\nplan:\n%s", seed, id, err, strings.Join(h.plan, "\n"))
		}
	}
}

func agent0Submit(thread, text string) engine.Request {
	p, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	return engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit,
		Message: &agent.Message{ID: "u-" + thread, Role: agent.RoleUser, Parts: []json.RawMessage{p}}}
}

// checkHandOverThread checks the invariants of the file's doc on one thread.
func checkHandOverThread(ctx context.Context, s agent.Store, id string, clock agent.Clock) error {
	th, err := s.GetThread(ctx, id)
	if err != nil {
		return err
	}
	if th.ActiveRun != nil {
		return fmt.Errorf("claim left: %+v", *th.ActiveRun)
	}
	runs, err := s.ListRuns(ctx, id)
	if err != nil {
		return err
	}
	if len(runs) != 1 || !runs[0].Status.Terminal() {
		return fmt.Errorf("runs %+v, want one, terminal", runs)
	}
	run := runs[0]
	recs, err := s.ListMessages(ctx, id)
	if err != nil {
		return err
	}
	if len(recs) != 2 || recs[0].Message.ID != "u-"+id || recs[1].Message.ID != run.AssistantMessageID {
		var got []string
		for _, r := range recs {
			got = append(got, r.Message.ID)
		}
		return fmt.Errorf("messages %v, want the user's and the reply %s", got, run.AssistantMessageID)
	}
	reply := recs[1].Message
	if st := reply.Meta().Status; st != run.Status.MessageStatus() {
		return fmt.Errorf("reply %s, run %s (%+v)", st, run.Status, run.Error)
	}
	var calls, steps []string
	for _, raw := range reply.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil {
			return err
		}
		if p.Type == "step-start" {
			steps = append(steps, "")
		}
		if p.ToolCallID == "" {
			continue
		}
		if slices.Contains(calls, p.ToolCallID) {
			return fmt.Errorf("tool call %s twice in the reply", p.ToolCallID)
		}
		calls = append(calls, p.ToolCallID)
		if p.State != "output-available" && p.State != "output-error" && p.State != "output-denied" {
			return fmt.Errorf("tool call %s left %s", p.ToolCallID, p.State)
		}
	}
	segs, err := s.ListSegments(ctx, run.ID, 0, clock.Now())
	if err != nil {
		return err
	}
	var stream []byte
	for i, seg := range segs {
		if seg.Seq != int64(i) {
			return fmt.Errorf("segment %d has seq %d", i, seg.Seq)
		}
		stream = append(stream, seg.Data...)
	}
	chunks, ended, err := chunksOf(stream)
	if err != nil {
		return fmt.Errorf("%w: %d segments, ending %q", err, len(segs), tailOf(string(stream)))
	}
	if !ended {
		// A process that died after its run's own FinishRun and before its final segment leaves the stream
		// without its end (readers end it themselves: lib/segments Follower), as any run's may; a run the reaper
		// finished always has one.
		if run.Error != nil && run.Error.Code == agent.CodeStale {
			return fmt.Errorf("a reaped run's stream has no end: %d segments, ending %q", len(segs), tailOf(string(stream)))
		}
	}
	starts, finishes, streamed := 0, 0, map[string]bool{}
	streamSteps := 0
	for _, c := range chunks {
		switch c["type"] {
		case "start":
			starts++
			if c["messageId"] != run.AssistantMessageID {
				return fmt.Errorf("stream starts %v, want the reply %s", c["messageId"], run.AssistantMessageID)
			}
		case "finish":
			finishes++
		case "start-step":
			streamSteps++
		case "tool-input-available":
			streamed[fmt.Sprint(c["toolCallId"])] = true
		}
	}
	if !ended {
		if starts != 1 || finishes != 0 {
			return fmt.Errorf("stream without its end has %d starts and %d finishes, want one start", starts, finishes)
		}
		return nil
	}
	if starts != 1 || finishes != 1 || chunks[len(chunks)-1]["type"] != "finish" {
		return fmt.Errorf("stream has %d starts and %d finishes (last %v), want one each, finish last", starts, finishes, chunks[len(chunks)-1]["type"])
	}
	for _, c := range calls {
		if !streamed[c] {
			return fmt.Errorf("tool call %s in the reply was never streamed", c)
		}
	}
	// Nothing a reader saw is lost from a completed reply. (The reply may hold more than the stream: a process
	// that dies after its final reply write and before its final segment, whose frames carry the last step, leaves
	// the reaper to adopt the reply and end the stream without that step, with or without a hand-over.)
	if run.Status == agent.RunCompleted && (len(calls) != len(streamed) || len(steps) < streamSteps) {
		return fmt.Errorf("completed reply holds %d calls and %d steps, the stream %d and %d", len(calls), len(steps), len(streamed), streamSteps)
	}
	return nil
}

// chunksOf parses a stored stream: whole SSE frames, ended (or not) with [DONE].
func chunksOf(b []byte) (chunks []map[string]any, ended bool, err error) {
	frames := strings.Split(string(b), "\n\n")
	if len(frames) < 2 || frames[len(frames)-1] != "" {
		return nil, false, errors.New("stream does not end on a frame boundary")
	}
	frames = frames[:len(frames)-1]
	if ended = frames[len(frames)-1] == "data: [DONE]"; ended {
		frames = frames[:len(frames)-1]
	}
	var out []map[string]any
	for _, f := range frames {
		data, ok := strings.CutPrefix(f, "data: ")
		if !ok {
			return nil, false, fmt.Errorf("frame %q", f)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			return nil, false, err
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, false, errors.New("empty stream")
	}
	return out, ended, nil
}

// hoStack is the model and tools the schedules share, over base.
func hoStack(t *testing.T, base agent.Store, clock agent.Clock) *devserver.Stack {
	model := httptest.NewServer(offline.New(offline.WithWordDelay(time.Millisecond)))
	t.Cleanup(model.Close)
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: model.URL + "/v1/", Store: base,
		Clock: clock, OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	return stack
}

// TestHandOverSchedules runs the hand-over schedules on SQLite (40 seeds) and dynalite (10, unless -short).
// SIM_HO_SEED=N replays one seed (with the plan it prints on failure), SIM_HO_SCHEDULES=N runs more.
func TestHandOverSchedules(t *testing.T) {
	stores := map[string]func(t *testing.T) agent.Store{
		"sqlite": func(t *testing.T) agent.Store {
			s, err := sqlite.Open(context.Background(), t.TempDir()+"/sim.db")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	}
	seeds := map[string]int{"sqlite": 40, "dynamo": 10}
	if n := int(envUint("SIM_HO_SCHEDULES", 0)); n > 0 { // more: SIM_HO_SCHEDULES=N (N on SQLite, N/4 on dynalite)
		seeds = map[string]int{"sqlite": n, "dynamo": max(n/4, 1)}
	}
	if !testing.Short() && !dynamotest.SkipRequested() {
		stores["dynamo"] = func(t *testing.T) agent.Store {
			client := dynamotest.Client(dynamotest.Start(t))
			table := fmt.Sprintf("handover_%d", time.Now().UnixNano())
			if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
				t.Fatal(err)
			}
			return dynamo.New(client, table)
		}
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			base := open(t)
			clock := &offsetClock{}
			stack := hoStack(t, base, clock)
			if one := envUint("SIM_HO_SEED", 0); one != 0 {
				runHandOverSchedule(t, one, base, stack, clock)
				return
			}
			for seed := range uint64(seeds[name]) {
				runHandOverSchedule(t, seed+1, base, stack, clock)
			}
		})
	}
}

func tailOf(s string) string {
	if len(s) > 400 {
		return s[len(s)-400:]
	}
	return s
}
