package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// fixture is the whole local stack (lib/devserver): SQLite, the openai-go adapter, the offline endpoint over HTTP.
type fixture struct {
	stack *devserver.Stack
	eng   *engine.Engine
	store agent.Store // as the engine sees it (wrapped when the test asked)
	model *offline.Server
	log   *slog.Logger // the components' logger (Options.Logger)
	clock agent.Clock  // the injected clock (Options.Clock), nil for real time
}

// option adjusts a fixture before it is built.
type option func(*devserver.Options)

func withConfig(mut func(*config.Config)) option {
	return func(o *devserver.Options) { mut(&o.Config) }
}

func withTools(extra ...agent.Tool) option {
	return func(o *devserver.Options) {
		o.Tools = func(agent.ValueStore, agent.Clock) []agent.Tool { return extra }
	}
}

func withStore(wrap func(agent.Store) agent.Store) option {
	return func(o *devserver.Options) { o.Wrap = wrap }
}

// fixtureStaleAfter is the fixture's StaleAfter: a claim's horizon (half of it) that no loaded machine reaches in
// real time, so no test's run fences itself because the machine was slow (issue 16 item 12; 2 s, a horizon of
// 1 s, let runs under two -race test runs at once end run_fenced). A test that needs a claim in doubt or stale
// moves an injected clock past it (pastHorizon, pastStale); every wait on real time the engine makes then (an
// attempt's deadline at the horizon, a tool's horizon timer) is counted from that clock's now, so it is at least
// StaleAfter/2 of real time whenever the clock says the claim is good.
const fixtureStaleAfter = time.Minute

// Moves of an injected clock, relative to fixtureStaleAfter: pastHorizon leaves a claim in doubt (past its
// horizon, StaleAfter/2) but not yet stale; pastStale lets the reaper take it.
const (
	pastHorizon = fixtureStaleAfter * 3 / 4
	pastStale   = fixtureStaleAfter * 3 / 2
)

// latePoll is how often a run left to the reaper reads its run for the reaper's outcome (lib/engine late.go:
// StaleAfter/8, at most 5 s): moving a stepClock on by it wakes the run's next read.
const latePoll = min(fixtureStaleAfter/8, 5*time.Second)

// setup builds the stack with fast heartbeats and segment flushes.
func setup(t *testing.T, opts ...option) *fixture {
	t.Helper()
	srv := offline.New(offline.WithWordDelay(5 * time.Millisecond))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	o := devserver.Options{Data: t.TempDir(), ModelURL: hs.URL + "/v1/",
		Config: config.Config{Heartbeat: 50 * time.Millisecond, StaleAfter: fixtureStaleAfter, SegmentFlush: 20 * time.Millisecond,
			CancelPoll: 20 * time.Millisecond},
		OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond; c.MaxRetries = 2 }}
	// No generated titles: what the suite checks of usage is the runs' (a thread's totals are its runs' sum plus
	// its title's spend, lib/titles; the title after a first reply is lib/httpapi's title_test.go and lib/titles').
	o.Config.TitlesOff = true
	for _, opt := range opts {
		opt(&o)
	}
	matrix.UseProviderFromEnv(t, &o.Config) // make test-matrix: the suite over each adapter
	stack, err := devserver.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	return &fixture{stack: stack, eng: stack.Engine, store: stack.Store, model: srv, log: o.Logger, clock: o.Clock}
}

// engineWith builds a second engine over the fixture's store, model, tools and clock with an adjusted engine config
// (for settings the environment does not carry).
func engineWith(t *testing.T, f *fixture, mut func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := f.eng.Config()
	mut(&cfg)
	return engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer,
		Clock: f.clock}, cfg)
}

func userMsg(id, text string) *agent.Message {
	p, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	return &agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{p}}
}

func submit(thread, msgID, text string) engine.Request {
	return engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit, Message: userMsg(msgID, text)}
}

// turn runs one submit turn and returns the run and the decoded chunks the client received.
func (f *fixture) turn(t *testing.T, thread, msgID, text string) (agent.Run, []map[string]any) {
	t.Helper()
	run, raw := f.run(t, submit(thread, msgID, text))
	return run, parseSSE(t, raw)
}

// run begins and streams req, returning the run and the raw stream.
func (f *fixture) run(t *testing.T, req engine.Request) (agent.Run, []byte) {
	t.Helper()
	tr, err := f.eng.Begin(context.Background(), req)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	return run, buf.Bytes()
}

func parseSSE(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	frames := strings.Split(string(b), "\n\n")
	if len(frames) < 2 || frames[len(frames)-2] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", tail(string(b)))
	}
	for _, f := range frames[:len(frames)-2] {
		data, ok := strings.CutPrefix(f, "data: ")
		if !ok {
			t.Fatalf("frame without data prefix: %q", f)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("frame is not JSON: %q", data)
		}
		out = append(out, m)
	}
	return out
}

func tail(s string) string {
	if len(s) > 300 {
		return s[len(s)-300:]
	}
	return s
}

func types(chunks []map[string]any) []string {
	var ts []string
	for _, c := range chunks {
		ts = append(ts, c["type"].(string))
	}
	return ts
}

func textOf(chunks []map[string]any) string {
	var s strings.Builder
	for _, c := range chunks {
		if c["type"] == "text-delta" {
			s.WriteString(c["delta"].(string))
		}
	}
	return s.String()
}

func count(chunks []map[string]any, typ string) int {
	n := 0
	for _, c := range chunks {
		if c["type"] == typ {
			n++
		}
	}
	return n
}

func (f *fixture) messages(t *testing.T, thread string) []agent.Message {
	t.Helper()
	recs, err := f.stack.SQLite.ListMessages(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	var ms []agent.Message
	for _, r := range recs {
		ms = append(ms, r.Message)
	}
	return ms
}

func (f *fixture) idle(t *testing.T, thread string) {
	t.Helper()
	th, err := f.stack.SQLite.GetThread(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil {
		t.Fatalf("claim not released: %+v", th.ActiveRun)
	}
}

func (f *fixture) segments(t *testing.T, runID string) []byte {
	t.Helper()
	segs, err := f.stack.SQLite.ListSegments(context.Background(), runID, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for i, s := range segs {
		if s.Seq != int64(i) {
			t.Fatalf("segment %d has seq %d", i, s.Seq)
		}
		data = append(data, s.Data...)
	}
	return data
}

// stepClock is a manualClock with timers of its own (agent.Timers): a timer fires as soon as the test moves the
// clock to or past it, or once its length of real time has passed, whichever is first. A wait the test means to
// end (a tool's horizon timer, an attempt's deadline at the horizon, a late-usage poll) therefore ends when the
// test moves the clock, not by racing real time; the real fallback only keeps the short waits going (heartbeat
// ticks, backoffs) while the clock stands still, as on a manualClock, and a wait at a claim's horizon is then at
// least StaleAfter/2 (fixtureStaleAfter: 30 s) of real time long, which no loaded machine reaches.
type stepClock struct {
	mu     sync.Mutex
	now    time.Time
	timers map[*stepTimer]struct{}
}

type stepTimer struct {
	at   time.Time
	once sync.Once
	fire func()
	real *time.Timer
}

func newStepClock() *stepClock {
	return &stepClock{now: newManualClock().Now(), timers: map[*stepTimer]struct{}{}}
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// add moves the clock on by d and fires every timer that came due.
func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*stepTimer
	for t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
			delete(c.timers, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.real.Stop()
		t.once.Do(t.fire)
	}
}

// start arms a timer of length d; once stop has returned, it never fires.
func (c *stepClock) start(d time.Duration, fire func()) (stop func()) {
	t := &stepTimer{fire: fire}
	c.mu.Lock()
	t.at = c.now.Add(d)
	t.real = time.AfterFunc(max(d, 0), func() { // it waits for the lock: t is in timers first
		c.mu.Lock()
		delete(c.timers, t)
		c.mu.Unlock()
		t.once.Do(t.fire)
	})
	c.timers[t] = struct{}{}
	c.mu.Unlock()
	if d <= 0 {
		c.add(0)
	}
	return func() {
		t.real.Stop()
		c.mu.Lock()
		delete(c.timers, t)
		c.mu.Unlock()
		t.once.Do(func() {})
	}
}

func (c *stepClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.start(d, func() { ch <- c.Now() })
	return ch
}

func (c *stepClock) Sleep(ctx context.Context, d time.Duration) error {
	done := make(chan struct{})
	stop := c.start(d, func() { close(done) })
	defer stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *stepClock) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	stop := c.start(d, func() { cancel(cause) })
	return ctx, func() { stop(); cancel(context.Canceled) }
}

// streaming begins req's turn and streams it on a goroutine of its own; the channel gets the run once it ends.
func (f *fixture) streaming(t *testing.T, req engine.Request) <-chan agent.Run {
	t.Helper()
	tr, err := f.eng.Begin(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan agent.Run, 1)
	go func() { ran <- tr.Stream(context.Background(), io.Discard) }()
	return ran
}
