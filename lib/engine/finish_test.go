package engine_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// finishFails fails every FinishRun once armed, with err.
type finishFails struct {
	agent.Store
	armed atomic.Bool
	err   error
}

func (s *finishFails) FinishRun(ctx context.Context, run agent.Run) error {
	if s.armed.Load() {
		return s.err
	}
	return s.Store.FinishRun(ctx, run)
}

// A continuation with nothing to do (its answer was applied already) whose FinishRun failed is not reported
// completed, and its stream's end is not the stored reply's metadata (naming the earlier run): the client learns
// the run failed, as a failed finish says elsewhere (refused: run_fenced, as abandon; failing for good:
// persist_failed, as unsaved), no final segment is written, and the reaper, which records the run failed once its
// claim is stale, writes the end readers read (sim seed 308896427637612918: the reader's finish named the earlier
// run while the store ended up saying this one failed). Same rule as a delivery pass with nothing to do
// (Turn.release, sim seed 7959872465901649856).
func TestNothingToDoWhoseFinishFailedIsNotCompleted(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		err  error
		code string
	}{
		"refused": {fmt.Errorf("injected: %w", agent.ErrRunFenced), agent.CodeRunFenced},
		"failing": {agent.E(agent.KindInternal, agent.CodeInternal, "injected: FinishRun fails for good"), agent.CodePersistFailed},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			executed := 0
			fs := &finishFails{err: c.err}
			clock := newManualClock() // stands still while the runs run, then moves past staleAfter for the reaper
			f := setup(t, withTools(recordingTool(&executed)), withClock(clock),
				withStore(func(s agent.Store) agent.Store { fs.Store = s; return fs }))
			if run, _ := f.turn(t, "th", "u1", `/tool guarded {"ran":false}`); run.Status != agent.RunInterrupted {
				t.Fatalf("ask: %s", run.Status)
			}
			answer := approveAll(t, f, "th")
			if run, _ := f.run(t, answer); run.Status != agent.RunCompleted || executed != 1 {
				t.Fatalf("continuation: %s %+v, the tool ran %d times", run.Status, run.Error, executed)
			}
			fs.armed.Store(true)
			run, raw := f.run(t, answer) // the same answer again: nothing to do
			chunks := parseSSE(t, raw)
			fin := chunks[len(chunks)-1]
			md, _ := fin["messageMetadata"].(map[string]any)
			if run.Status == agent.RunCompleted || run.Error == nil || run.Error.Code != c.code || executed != 1 {
				t.Fatalf("run %s %+v, want failed %s (the tool ran %d times)", run.Status, run.Error, c.code, executed)
			}
			if fin["type"] != "finish" || md["runId"] != run.ID || md["status"] != string(agent.MessageFailed) || count(chunks, "error") != 1 {
				t.Fatalf("the client's stream ends %v: %v", types(chunks), fin)
			}
			if data := f.segments(t, run.ID); strings.Contains(string(data), `"type":"finish"`) {
				t.Fatalf("the run wrote an end the reaper did not record: %q", data)
			}
			clock.add(pastStale)
			fs.armed.Store(false)
			if st, err := f.stack.Reaper.Tick(context.Background()); err != nil || st.Reaped != 1 {
				t.Fatalf("reaper tick: %+v %v", st, err)
			}
			stored, err := f.store.GetRun(context.Background(), "th", run.ID)
			if err != nil || stored.Status != agent.RunFailed {
				t.Fatalf("stored run %+v %v", stored, err)
			}
			data := string(f.segments(t, run.ID))
			if !strings.Contains(data, `"type":"finish"`) || !strings.Contains(data, `"runId":"`+run.ID+`"`) ||
				!strings.Contains(data, `"status":"failed"`) {
				t.Fatalf("the stream's end is not the reaper's: %q", data)
			}
			f.idle(t, "th")
		})
	}
}

// finishThen runs after every FinishRun that succeeded, once armed.
type finishThen struct {
	agent.Store
	armed atomic.Bool
	after func()
}

func (s *finishThen) FinishRun(ctx context.Context, run agent.Run) error {
	err := s.Store.FinishRun(ctx, run)
	if err == nil && s.armed.Load() {
		s.after()
	}
	return err
}

// A continuation with nothing to do whose outcome is stored writes its final segment whatever the claim's horizon
// says, as every run whose FinishRun succeeded does (REVIEW D7; finish, Turn.release): its readers must learn the
// end, not wait for the synthesized one. Here the clock passes the horizon while FinishRun is under way.
func TestNothingToDoRecordedEndsItsStream(t *testing.T) {
	t.Parallel()
	executed := 0
	clock := newManualClock()
	fs := &finishThen{after: func() { clock.add(pastHorizon) }}
	f := setup(t, withTools(recordingTool(&executed)), withClock(clock),
		withStore(func(s agent.Store) agent.Store { fs.Store = s; return fs }))
	if run, _ := f.turn(t, "th", "u1", `/tool guarded {"ran":false}`); run.Status != agent.RunInterrupted {
		t.Fatalf("ask: %s", run.Status)
	}
	answer := approveAll(t, f, "th")
	first, _ := f.run(t, answer)
	if first.Status != agent.RunCompleted {
		t.Fatalf("continuation: %s %+v", first.Status, first.Error)
	}
	fs.armed.Store(true)
	run, raw := f.run(t, answer) // nothing to do
	if run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	if data := f.segments(t, run.ID); !strings.HasSuffix(string(data), "data: [DONE]\n\n") || !strings.Contains(string(data), `"type":"finish"`) {
		t.Fatalf("no final segment for a recorded run (the client got %q): %q", tail(string(raw)), data)
	}
	f.idle(t, "th")
}
