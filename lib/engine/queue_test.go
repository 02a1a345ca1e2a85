package engine_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

// refuseMessage wraps the store and fails every write of one message id for good while refuse is set.
type refuseMessage struct {
	agent.Store
	id     string
	refuse atomic.Bool
}

func (s *refuseMessage) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Message.ID == s.id && s.refuse.Load() {
		return agent.E(agent.KindInternal, agent.CodeInternal, "injected: write of %s refused", w.Message.ID)
	}
	return s.Store.PutMessage(ctx, w)
}

// A submit that takes queued user messages stores them before its own (they were accepted first). The writes go
// in that order too: a turn whose write of an earlier queued message fails has not stored its own message after
// it, where the earlier one would land later, behind it (sim seed 1329: q1 queued after q0, then sent again
// without enqueue; its turn stored q1, its write of q0 was refused, and a later delivery pass stored q0 after
// q1).
func TestQueuedMessagesStoredInQueueOrderWhenAWriteFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rs := &refuseMessage{id: "q0"}
	f := setup(t, withStore(func(s agent.Store) agent.Store { rs.Store = s; return rs }),
		withConfig(func(c *config.Config) { c.MaxQueued = 10 }))
	f.turn(t, "th", "u0", "hello")
	for _, id := range []string{"q0", "q1"} {
		q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Owner: "alice", Status: agent.QueueQueued, CreatedAt: time.Now().UTC(),
			Message: *userMsg(id, "queued "+id)}
		if _, _, err := f.store.Enqueue(ctx, q, 0); err != nil {
			t.Fatal(err)
		}
	}
	rs.refuse.Store(true)
	run, _ := f.turn(t, "th", "q1", "queued q1") // q1 sent again without enqueue: its turn takes q0 before it
	if run.Status != agent.RunFailed {
		t.Fatalf("run %s %+v, want failed (q0 could not be stored)", run.Status, run.Error)
	}
	rs.refuse.Store(false)
	// The failed run's end asked the jobs port for a delivery pass (Engine.wake), which the local stack runs in
	// the background: whichever of it and this loop claims first delivers, the other meets run_active (then waits
	// for it) or nothing queued. Done when the queue is empty and no run holds the thread.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tr, err := f.eng.BeginQueued(ctx, "th")
		if err == nil {
			tr.Stream(ctx, &bytes.Buffer{})
			continue
		}
		th, gerr := f.store.GetThread(ctx, "th")
		if gerr != nil {
			t.Fatal(gerr)
		}
		if errors.Is(err, engine.ErrNothingQueued) && th.ActiveRun == nil {
			break
		}
		if !errors.Is(err, engine.ErrNothingQueued) && agent.CodeOf(err) != agent.CodeRunActive {
			t.Fatalf("BeginQueued: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue was not delivered: %v, active run %+v", err, th.ActiveRun)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var users []string
	for _, m := range f.messages(t, "th") {
		if m.Role == agent.RoleUser {
			users = append(users, m.ID)
		}
	}
	if len(users) != 3 || users[1] != "q0" || users[2] != "q1" {
		t.Fatalf("user messages %v, want [u0 q0 q1] (queue order)", users)
	}
}
