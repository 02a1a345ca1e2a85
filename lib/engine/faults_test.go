package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/tools"
)

// faultyStore wraps the real store and fails the first calls of chosen methods with a transient error, the way a
// throttled or briefly unreachable DynamoDB does after the SDK's own retries gave up.
type faultyStore struct {
	agent.Store
	mu       sync.Mutex
	failures map[string]int // method → failures left
	failed   map[string]int // method → failures injected
}

func (f *faultyStore) fail(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures[method] > 0 {
		f.failures[method]--
		f.failed[method]++
		return agent.E(agent.KindUnavailable, "store_unavailable", "injected fault in %s", method)
	}
	return nil
}

func (f *faultyStore) AppendSegment(ctx context.Context, s agent.Segment) error {
	if err := f.fail("AppendSegment"); err != nil {
		return err
	}
	return f.Store.AppendSegment(ctx, s)
}

func (f *faultyStore) Heartbeat(ctx context.Context, threadID, runID string, epoch int64, now time.Time) error {
	if err := f.fail("Heartbeat"); err != nil {
		return err
	}
	return f.Store.Heartbeat(ctx, threadID, runID, epoch, now)
}

// Transient store faults during a run (segment writes, heartbeats) cost nothing: the run completes, and the
// persisted stream is still exactly what the client received, in order, without gaps or duplicates.
func TestTransientStoreFaults(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	fs := &faultyStore{Store: f.store, failures: map[string]int{"AppendSegment": 3, "Heartbeat": 2}, failed: map[string]int{}}
	clock := agent.SystemClock{}
	eng := engine.New(engine.Deps{Store: fs, Model: f.llm, Tools: tools.Demo(fs, clock), Clock: clock},
		engine.Config{Model: "offline", Heartbeat: 20 * time.Millisecond, SegmentFlush: 10 * time.Millisecond, StaleAfter: 5 * time.Second})
	tr, err := eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit,
		Message: userMsg("u1", "/slow 30")})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	if run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v", run)
	}
	if fs.failed["AppendSegment"] == 0 || fs.failed["Heartbeat"] == 0 {
		t.Fatalf("faults not exercised: %v", fs.failed)
	}
	segs, err := f.store.ListSegments(context.Background(), run.ID, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var replay []byte
	for i, s := range segs {
		if s.Seq != int64(i) {
			t.Fatalf("segment %d has seq %d", i, s.Seq)
		}
		replay = append(replay, s.Data...)
	}
	if !bytes.Equal(replay, buf.Bytes()) || !segs[len(segs)-1].Final {
		t.Fatalf("persisted stream differs from the client's after faults:\n%s\n---\n%s", replay, buf.Bytes())
	}
}

// racingFinish finishes the run as completed (as the live run itself would) just before the reaper's FinishRun.
type racingFinish struct {
	agent.Store
	won agent.Run
}

func (r *racingFinish) FinishRun(ctx context.Context, run agent.Run) error {
	if run.Error != nil && run.Error.Code == agent.CodeStale && r.won.ID == "" {
		r.won = run
		r.won.Status, r.won.Error = agent.RunCompleted, nil
		if err := r.Store.FinishRun(ctx, r.won); err != nil {
			return err
		}
	}
	return r.Store.FinishRun(ctx, run)
}

// A reaper that loses the finish race to the run itself leaves the run's outcome, message and stream alone.
func TestReapLosesFinishRace(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	if _, _, err := f.store.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: time.Now(), UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	claim, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th", RunID: "run_1", AssistantMessageID: "msg_1", Now: time.Now().Add(-time.Minute), StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	done := agent.Message{ID: "msg_1", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"all done"}`)},
		Metadata: json.RawMessage(`{"status":"streaming"}`)}
	if err := f.store.PutMessage(ctx, "th", 1, done, time.Now()); err != nil {
		t.Fatal(err)
	}
	rs := &racingFinish{Store: f.store}
	eng := engine.New(engine.Deps{Store: rs, Model: f.llm}, engine.Config{StaleAfter: time.Second})
	if err := eng.ReapRun(ctx, "th", "run_1", claim.Run.Epoch); err != nil {
		t.Fatal(err)
	}
	if run, _ := f.store.GetRun(ctx, "th", "run_1"); run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v, want the run's own completed outcome", run)
	}
	if rec, _ := f.store.GetMessage(ctx, "th", "msg_1"); rec.Message.Meta().Status != agent.MessageStreaming {
		t.Fatalf("the reaper rewrote the message of a run it did not reap: %s", rec.Message.Metadata)
	}
	if segs, _ := f.store.ListSegments(ctx, "run_1", 0, time.Now()); len(segs) != 0 {
		t.Fatalf("the reaper wrote a final segment for a run it did not reap: %d", len(segs))
	}
}
