package engine_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

// faultyStore wraps the real store and fails chosen calls with a transient error, the way a throttled or briefly
// unreachable DynamoDB does after the SDK's own retries gave up. fail decides per call: method name, the call's
// ordinal for that method (from 1), and for PutMessage whether the write finalizes the message.
type faultyStore struct {
	agent.Store
	mu     sync.Mutex
	calls  map[string]int
	failed map[string]int
	fail   func(method string, n int, final bool) bool
}

func newFaulty(fail func(method string, n int, final bool) bool) *faultyStore {
	return &faultyStore{calls: map[string]int{}, failed: map[string]int{}, fail: fail}
}

func (f *faultyStore) check(method string, final bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if f.fail(method, f.calls[method], final) {
		f.failed[method]++
		return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "injected fault in %s", method)
	}
	return nil
}

func (f *faultyStore) failures(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed[method]
}

func (f *faultyStore) AppendSegment(ctx context.Context, s agent.Segment) error {
	if err := f.check("AppendSegment", s.Final); err != nil {
		return err
	}
	return f.Store.AppendSegment(ctx, s)
}

func (f *faultyStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return keepEach(ctx, claims, now, f.Heartbeat)
}

func (f *faultyStore) Heartbeat(ctx context.Context, threadID string, fence agent.Fence, now time.Time) error {
	if err := f.check("Heartbeat", false); err != nil {
		return err
	}
	return f.Store.Heartbeat(ctx, threadID, fence, now)
}

func (f *faultyStore) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if err := f.check("PutMessage", w.Final && w.Message.Role == agent.RoleAssistant); err != nil {
		return err
	}
	return f.Store.PutMessage(ctx, w)
}

func (f *faultyStore) FinishRun(ctx context.Context, run agent.Run) error {
	if err := f.check("FinishRun", false); err != nil {
		return err
	}
	return f.Store.FinishRun(ctx, run)
}

func (f *faultyStore) wrap(s agent.Store) agent.Store { f.Store = s; return f }

// Transient store faults during a run (segment writes, heartbeats, the final message and the outcome) cost
// nothing: the run completes, and the persisted stream is still exactly what the client received. The final
// message write and FinishRun failures exercise the finish retries (REVIEW M3: a failed final write used to
// lose the reply for good).
func TestTransientStoreFaults(t *testing.T) {
	t.Parallel()
	fs := newFaulty(func(method string, n int, final bool) bool {
		switch method {
		case "AppendSegment":
			return n <= 3
		case "Heartbeat":
			return n <= 2
		case "PutMessage":
			return final && n <= 4 // the first final attempts (user message writes pass)
		case "FinishRun":
			return n <= 2
		}
		return false
	})
	f := setup(t, withStore(fs.wrap), withConfig(func(c *config.Config) { c.Heartbeat = 20 * time.Millisecond }))
	run, client := f.run(t, submit("th", "u1", "/slow 30"))
	if run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v", run)
	}
	for _, m := range []string{"AppendSegment", "Heartbeat", "PutMessage", "FinishRun"} {
		if fs.failures(m) == 0 {
			t.Fatalf("faults in %s not exercised", m)
		}
	}
	if replay := f.segments(t, run.ID); !bytes.Equal(replay, client) {
		t.Fatalf("persisted stream differs from the client's after faults:\n%s\n---\n%s", replay, client)
	}
	msgs := f.messages(t, "th")
	if len(msgs) != 2 || msgs[1].Meta().Status != agent.MessageCompleted || !strings.Contains(msgs[1].Text(), "word30") {
		t.Fatalf("messages %v", ids(msgs))
	}
	f.idle(t, "th")
}

// A reply whose final write keeps failing is never reported completed: the client gets an error, the claim is
// left to go stale, and the reaper recovers the reply from the stream segments (REVIEW M3).
func TestUnsavedReplyIsRecovered(t *testing.T) {
	t.Parallel()
	fs := newFaulty(func(method string, n int, final bool) bool { return method == "PutMessage" && final })
	// The clock stands still while the run runs (so no load makes it doubt its claim), then moves past staleAfter
	// for the reaper.
	clock := newManualClock()
	f := setup(t, withStore(fs.wrap), withClock(clock))
	run, client := f.run(t, submit("th", "u1", "hello there"))
	chunks := parseSSE(t, client)
	if run.Status == agent.RunCompleted || run.Error == nil || run.Error.Code != agent.CodePersistFailed || count(chunks, "error") != 1 {
		t.Fatalf("run %+v, chunks %v", run, types(chunks))
	}
	th, _ := f.stack.SQLite.GetThread(context.Background(), "th")
	if th.ActiveRun == nil || th.ActiveRun.RunID != run.ID {
		t.Fatalf("the claim of an unsaved reply was released: %+v", th.ActiveRun)
	}
	clock.add(pastStale) // the claim is stale
	fs.mu.Lock()
	fs.fail = func(string, int, bool) bool { return false } // the store is back
	fs.mu.Unlock()
	if st, err := f.stack.Reaper.Tick(context.Background()); err != nil || st.Reaped != 1 {
		t.Fatalf("reaper tick: %+v %v", st, err)
	}
	msgs := f.messages(t, "th")
	if len(msgs) != 2 || msgs[1].ID != run.AssistantMessageID || msgs[1].Text() != "You said: hello there" || msgs[1].Meta().Status != agent.MessageFailed {
		t.Fatalf("recovered messages %v (text %q)", ids(msgs), msgs[len(msgs)-1].Text())
	}
	f.idle(t, "th")
}

// A run whose heartbeats keep failing stops itself at half of staleAfter, before anyone may take it over, and
// writes nothing more (REVIEW M1).
func TestHeartbeatFailuresStopTheRun(t *testing.T) {
	t.Parallel()
	fs := newFaulty(func(method string, n int, final bool) bool { return method == "Heartbeat" })
	streaming := make(chan struct{})
	var once sync.Once
	// The clock stands still while the run begins and streams (so no load makes it doubt its claim sooner), and
	// passes the horizon once the reply is streaming: the guard's next tick, and any write's deadline, fire then.
	clock := newStepClock()
	f := setup(t, withClock(clock), withConfig(func(c *config.Config) { c.Heartbeat = 20 * time.Millisecond }),
		withStore(func(s agent.Store) agent.Store {
			fs.Store = s
			return signalSegments{Store: fs, first: func() { once.Do(func() { close(streaming) }) }}
		}))
	go func() {
		<-streaming
		clock.add(pastHorizon)
	}()
	// A reply of 10 s at the least (2,000 words, 5 ms apart): the run stops itself long before, and the run's
	// error says so (no wall-clock bound on how soon).
	run, client := f.run(t, submit("th", "u1", "/slow 2000"))
	if run.Error == nil || run.Error.Code != agent.CodeRunFenced {
		t.Fatalf("run = %+v", run)
	}
	if !strings.Contains(string(client), "taken over") {
		t.Fatalf("the client was not told: %s", tail(string(client)))
	}
	if n := fs.calls["PutMessage"]; n > 1 { // the user message only
		t.Fatalf("a run in doubt wrote %d messages", n)
	}
	if fs.calls["FinishRun"] != 0 {
		t.Fatal("a run in doubt recorded its outcome")
	}
}

// signalSegments calls first on every segment append (the run is streaming).
type signalSegments struct {
	agent.Store
	first func()
}

func (s signalSegments) AppendSegment(ctx context.Context, seg agent.Segment) error {
	s.first()
	return s.Store.AppendSegment(ctx, seg)
}

// A store that keeps refusing segments cannot hold the response open: closing the stream gives up after the
// close timeout (REVIEW L16: Close used to retry forever, keeping useChat "streaming" until the Lambda timeout).
func TestSegmentCloseIsBounded(t *testing.T) {
	t.Parallel()
	fs := newFaulty(func(method string, n int, final bool) bool { return method == "AppendSegment" })
	// A long staleAfter, so that only the close timeout can end the wait (a run also stops writing once its
	// claim is in doubt, at half of staleAfter).
	f := setup(t, withStore(fs.wrap), withConfig(func(c *config.Config) { c.StaleAfter = time.Minute }))
	f.eng = engineWith(t, f, func(c *engine.Config) { c.CloseTimeout = 200 * time.Millisecond })
	// The store refuses every segment for good: the turn ending at all shows the close gave up (no wall-clock
	// bound on how soon).
	run, client := f.run(t, submit("th", "u1", "hello"))
	if run.Status != agent.RunCompleted || !strings.HasSuffix(string(client), "data: [DONE]\n\n") {
		t.Fatalf("run %s, stream %q", run.Status, tail(string(client)))
	}
}

// A turn that fails after its claim (here: an edit of a message that does not exist, found only once the
// messages are read) releases the claim and writes a final segment, so a reader attached meanwhile ends too (REVIEW M10).
func TestFailedBeginEndsItsStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if run, _ := f.turn(t, "th", "u1", "hello"); run.Status != agent.RunCompleted {
		t.Fatal(run.Status)
	}
	edit := engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u9", "other text"), MessageID: "u9"}
	if _, err := f.eng.Begin(context.Background(), edit); agent.CodeOf(err) != agent.CodeMessageNotFound {
		t.Fatalf("begin: %v", err)
	}
	runs, _ := f.store.ListRuns(context.Background(), "th")
	last := runs[len(runs)-1]
	if len(runs) != 2 || last.Status != agent.RunFailed {
		t.Fatalf("runs %+v", runs)
	}
	if data := f.segments(t, last.ID); !strings.Contains(string(data), `"type":"finish"`) {
		t.Fatalf("no final segment for the failed begin: %q", data)
	}
	f.idle(t, "th")
}

// A regenerate that crashed after storing its new reply, before hiding the old one, shows one reply, not both:
// the new reply names the one it replaces.
func TestRegenerateCrashBeforeHidingShowsOneReply(t *testing.T) {
	t.Parallel()
	fs := newFaulty(func(string, int, bool) bool { return false })
	f := setup(t, withStore(func(s agent.Store) agent.Store { fs.Store = s; return deleteFails{fs} }))
	first, _ := f.turn(t, "th", "u1", "hello")
	run, _ := f.run(t, engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate})
	if run.Status != agent.RunCompleted || len(f.messages(t, "th")) != 3 {
		t.Fatalf("regenerate %s; stored %v", run.Status, ids(f.messages(t, "th")))
	}
	v, err := f.stack.Threads.Get(context.Background(), "alice", "th")
	if err != nil || len(v.Messages) != 2 || v.Messages[1].ID != run.AssistantMessageID {
		t.Fatalf("visible %v, want u1 and the new reply (not %s)", ids(v.Messages), first.AssistantMessageID)
	}
	// The next regenerate replaces the new reply, and the model never sees the old one.
	again, _ := f.run(t, engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate, MessageID: run.AssistantMessageID})
	if again.Status != agent.RunCompleted {
		t.Fatalf("second regenerate %s", again.Status)
	}
}

// deleteFails fails every DeleteMessage for good (a crash between the new reply and hiding the old one).
type deleteFails struct{ *faultyStore }

func (d deleteFails) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return agent.E(agent.KindInternal, agent.CodeInternal, "injected: the process died before hiding %s", id)
}
