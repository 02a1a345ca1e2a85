package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
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
			// Time passes while the tool ignores the stop: well past half of StaleAfter (2 s here), in steps a
			// heartbeat can follow.
			for range 6 {
				clock.add(400 * time.Millisecond)
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
