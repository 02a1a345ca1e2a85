package threads_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/threads"
)

// fakeStopper records the stops delivered in-process, and what the store said about the run at that moment.
type fakeStopper struct {
	store    agent.ThreadStore
	stops    []string // threadID/runID
	canceled []bool   // whether the stored claim carried the cancel request when the stop was delivered
}

func (s *fakeStopper) StopLocal(threadID, runID string) bool {
	th, err := s.store.GetThread(context.Background(), threadID)
	s.stops = append(s.stops, threadID+"/"+runID)
	s.canceled = append(s.canceled, err == nil && th.ActiveRun != nil && th.ActiveRun.CancelRequested)
	return true
}

// A stop is stored first, then delivered to the run in this process (Deps.Stopper) with the run's id, whether the
// request named the run or not; a stop refused (another run named, no active run, another user's thread) is
// delivered to nobody.
func TestStopDeliveredInProcess(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		owner   string
		runID   string // what the stop names ("": the active run)
		claimed bool   // the thread has an active run
		want    error
		stopped bool
	}{
		{name: "the active run", owner: "alice", claimed: true, stopped: true},
		{name: "the named run", owner: "alice", runID: "run_1", claimed: true, stopped: true},
		{name: "another run named", owner: "alice", runID: "run_other", claimed: true, want: agent.ErrNoActiveRun},
		{name: "no active run", owner: "alice", want: agent.ErrNoActiveRun},
		{name: "another user's thread", owner: "bob", claimed: true, want: agent.ErrThreadNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			if c.claimed {
				f.claim(t, time.Now())
			} else if _, _, err := f.store.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: time.Now(), UpdatedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			stopper := &fakeStopper{store: f.store}
			svc := threads.New(threads.Deps{Store: f.store, Clock: f.clock, Stopper: stopper}, threads.Config{StaleAfter: staleAfter})
			id, err := svc.Stop(ctx, c.owner, "th", c.runID)
			if c.want != nil {
				if !errors.Is(err, c.want) {
					t.Fatalf("stop: %v, want %v", err, c.want)
				}
			} else if err != nil || id != "run_1" {
				t.Fatalf("stop: %q %v", id, err)
			}
			switch {
			case !c.stopped && len(stopper.stops) != 0:
				t.Fatalf("a refused stop was delivered: %v", stopper.stops)
			case c.stopped && (len(stopper.stops) != 1 || stopper.stops[0] != "th/run_1"):
				t.Fatalf("stops delivered: %v, want [th/run_1]", stopper.stops)
			case c.stopped && !stopper.canceled[0]:
				t.Fatal("the stop was delivered before the store held it")
			}
		})
	}
}
