package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
)

// recordingLauncher records the continuations launched; fail makes every launch fail.
type recordingLauncher struct {
	mu   sync.Mutex
	got  []agent.Continuation
	fail bool
}

func (l *recordingLauncher) Launch(_ context.Context, c agent.Continuation) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable, "no launch")
	}
	l.got = append(l.got, c)
	return nil
}

func (l *recordingLauncher) launched() []agent.Continuation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]agent.Continuation(nil), l.got...)
}

// Issue 21 item 1: a run that handed over and whose continuation never took the claim (its launcher's process
// died, the launch was lost) is continued by the sweep through the reaper's launcher, not reaped: once per stale
// window, from the epoch after the hand-over's, the reply and its segments as they were. The late original
// continuation (and any duplicate) then does nothing. Past the run's whole-run time, past MaxRelaunches without
// progress, or when the launch fails, it is reaped as any dead run. On both stores.
func TestSweepContinuesHandedOverRuns(t *testing.T) {
	t.Parallel()
	onBothStores(t, sweepContinuesHandedOverRuns)
}

func sweepContinuesHandedOverRuns(t *testing.T, st agent.Store) {
	ctx := context.Background()
	const runTimeout = 10 * time.Minute
	// handedOver stores a run that handed over at its first epoch after 2 steps and 3 segments, its continuation
	// never started, and returns it with the continuation it handed over to.
	handedOver := func(t *testing.T, clock *stepClock, th string) (agent.Run, agent.Continuation) {
		t.Helper()
		run := claimsOn(t, st, clock, th)("run_"+th, agent.TriggerUser)
		c := agent.Continuation{ThreadID: th, RunID: run.ID, Epoch: run.Epoch, Segment: 3, Steps: 2, HandOvers: 1}
		md, _ := json.Marshal(agent.MessageMetadata{Status: agent.MessageStreaming, RunID: run.ID, HandedOver: &c})
		m := agent.Message{ID: "msg_a", Role: agent.RoleAssistant, Metadata: md,
			Parts: []json.RawMessage{json.RawMessage(`{"type":"step-start"}`), json.RawMessage(`{"type":"text","text":"So far.","state":"done"}`)}}
		if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: th, Seq: run.AssistantSeq(), Fence: run.Fence(), Now: clock.Now(), Message: m}); err != nil {
			t.Fatal(err)
		}
		for n := range 3 {
			if err := st.AppendSegment(ctx, agent.Segment{ThreadID: th, RunID: run.ID, Seq: int64(n), ExpiresAt: clock.Now().Add(time.Hour),
				Data: []byte(`data: {"type":"text-delta","id":"t0","delta":"x"}` + "\n\n")}); err != nil {
				t.Fatal(err)
			}
		}
		return run, c
	}
	status := func(t *testing.T, th, runID string) (agent.RunStatus, *agent.Claim) {
		t.Helper()
		run, err := st.GetRun(ctx, th, runID)
		if err != nil {
			t.Fatal(err)
		}
		thread, err := st.GetThread(ctx, th)
		if err != nil {
			t.Fatal(err)
		}
		return run.Status, thread.ActiveRun
	}
	newReaper := func(clock *stepClock, l agent.RunLauncher) *reaper.Reaper {
		return reaper.New(reaper.Deps{Store: st, Clock: clock, Launcher: l}, reaper.Config{StaleAfter: staleAfter, RunTimeout: runTimeout})
	}

	t.Run("continued once, not reaped", func(t *testing.T) {
		clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
		run, c := handedOver(t, clock, "th-cont")
		l := &recordingLauncher{}
		r, other := newReaper(clock, l), newReaper(clock, l)
		clock.add(2 * staleAfter)
		if st, err := r.Tick(ctx); err != nil || st.Continued != 1 || st.Reaped != 0 {
			t.Fatalf("tick = %+v, %v; want one continued, none reaped", st, err)
		}
		want := c
		want.Epoch, want.Relaunches = c.Epoch+1, 1
		if got := l.launched(); len(got) != 1 || got[0] != want {
			t.Fatalf("launched %+v, want %+v", got, want)
		}
		s, claim := status(t, "th-cont", run.ID)
		if s != agent.RunRunning || claim == nil || claim.RunID != run.ID || claim.Epoch != c.Epoch+1 {
			t.Fatalf("run %s, claim %+v; want running, the run's claim at epoch %d", s, claim, c.Epoch+1)
		}
		// Another replica's sweep in the same stale window finds the claim fresh: nothing more is launched.
		if st, err := other.Tick(ctx); err != nil || st.Continued != 0 || st.Reaped != 0 {
			t.Fatalf("second tick = %+v, %v; want nothing", st, err)
		}
		// The original continuation, delivered late, does nothing: its hand-over is refused.
		if _, err := st.HandOver(ctx, agent.HandOverRequest{ThreadID: "th-cont", Fence: agent.Fence{RunID: run.ID, Epoch: c.Epoch}, Now: clock.Now()}); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("the late original continuation's hand-over: %v, want run_fenced", err)
		}
		// The relaunched one takes the claim from the epoch it was given; a duplicate of it then does nothing.
		res, err := st.HandOver(ctx, agent.HandOverRequest{ThreadID: "th-cont", Fence: agent.Fence{RunID: run.ID, Epoch: want.Epoch}, Now: clock.Now()})
		if err != nil || res.Run.Epoch != want.Epoch+1 {
			t.Fatalf("the relaunched continuation's hand-over: %+v, %v", res.Run, err)
		}
		if _, err := st.HandOver(ctx, agent.HandOverRequest{ThreadID: "th-cont", Fence: agent.Fence{RunID: run.ID, Epoch: want.Epoch}, Now: clock.Now()}); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("a duplicate relaunch's hand-over: %v, want run_fenced", err)
		}
		rec, err := st.GetMessage(ctx, "th-cont", "msg_a")
		if err != nil || len(rec.Message.Parts) != 2 {
			t.Fatalf("the reply: %+v, %v; want it as the hand-over stored it", rec.Message, err)
		}
	})

	for _, tt := range []struct {
		name  string
		setup func(clock *stepClock, l *recordingLauncher)
		ticks int // sweeps, each a stale window after the last
	}{
		{"the run time spent", func(clock *stepClock, _ *recordingLauncher) { clock.add(runTimeout) }, 1},
		{"the launch fails", func(_ *stepClock, l *recordingLauncher) { l.fail = true }, 1},
		{"relaunched without progress", func(*stepClock, *recordingLauncher) {}, reaper.DefaultMaxRelaunches + 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
			th := fmt.Sprintf("th-reaped-%d", len(tt.name))
			run, _ := handedOver(t, clock, th)
			l := &recordingLauncher{}
			tt.setup(clock, l)
			r := newReaper(clock, l)
			for range tt.ticks {
				clock.add(2 * staleAfter)
				if _, err := r.Tick(ctx); err != nil {
					t.Fatal(err)
				}
			}
			s, claim := status(t, th, run.ID)
			if s != agent.RunFailed || claim != nil {
				t.Fatalf("run %s, claim %+v; want failed (stale), no claim", s, claim)
			}
			if got := len(l.launched()); got != tt.ticks-1 {
				t.Fatalf("%d continuations launched, want %d", got, tt.ticks-1)
			}
			rec, err := st.GetMessage(ctx, th, "msg_a")
			if err != nil || rec.Message.Meta().Status != agent.MessageFailed {
				t.Fatalf("the reply: %+v, %v; want it failed", rec.Message.Meta(), err)
			}
		})
	}

	t.Run("a lazy reap continues it too", func(t *testing.T) {
		clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
		run, c := handedOver(t, clock, "th-lazy")
		l := &recordingLauncher{}
		clock.add(2 * staleAfter)
		if reaped, err := newReaper(clock, l).Reap(ctx, "th-lazy", agent.Claim{RunID: run.ID, Epoch: c.Epoch}); reaped || err != nil {
			t.Fatalf("Reap = %v, %v; want not reaped", reaped, err)
		}
		if s, claim := status(t, "th-lazy", run.ID); s != agent.RunRunning || claim == nil || claim.Epoch != c.Epoch+1 || len(l.launched()) != 1 {
			t.Fatalf("run %s, claim %+v, %d launched; want running at epoch %d, one launched", s, claim, len(l.launched()), c.Epoch+1)
		}
	})

	t.Run("a held reaper leaves it until its run time is spent", func(t *testing.T) {
		clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
		run, c := handedOver(t, clock, "th-held")
		r := newReaper(clock, nil)
		r.Hold()
		clock.add(2 * staleAfter)
		if st, err := r.Tick(ctx); err != nil || st.Reaped != 0 || st.Continued != 0 {
			t.Fatalf("tick = %+v, %v; want the run left alone", st, err)
		}
		if s, claim := status(t, "th-held", run.ID); s != agent.RunRunning || claim == nil || claim.Epoch != c.Epoch {
			t.Fatalf("run %s, claim %+v; want left as it was", s, claim)
		}
		clock.add(runTimeout)
		if _, err := r.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		if s, claim := status(t, "th-held", run.ID); s != agent.RunFailed || claim != nil {
			t.Fatalf("past the run time: run %s, claim %+v; want it reaped", s, claim)
		}
	})

	t.Run("a run that died in a step is reaped", func(t *testing.T) {
		clock := &stepClock{now: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
		run := claimsOn(t, st, clock, "th-died")("run_died", agent.TriggerUser)
		l := &recordingLauncher{}
		clock.add(2 * staleAfter)
		if st, err := newReaper(clock, l).Tick(ctx); err != nil || st.Reaped != 1 || st.Continued != 0 {
			t.Fatalf("tick = %+v, %v; want one reaped", st, err)
		}
		if s, _ := status(t, "th-died", run.ID); s != agent.RunFailed || len(l.launched()) != 0 {
			t.Fatalf("run %s, %d launched; want failed, none", s, len(l.launched()))
		}
	})
}
