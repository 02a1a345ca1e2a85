package engine_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

// refuseMessage wraps the store and fails every write of one message id for good while refuse is set; with lose,
// the write is applied first and only its answer is lost.
type refuseMessage struct {
	agent.Store
	id     string
	lose   bool
	refuse atomic.Bool
}

func (s *refuseMessage) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Message.ID == s.id && s.refuse.Load() {
		if s.lose {
			if err := s.Store.PutMessage(ctx, w); err != nil {
				return err
			}
		}
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
	rs := &refuseMessage{id: "q0"}
	f := queuedBehind(t, rs, "q0", "q1")
	rs.refuse.Store(true)
	run, _ := f.turn(t, "th", "q1", "queued q1") // q1 sent again without enqueue: its turn takes q0 before it
	if run.Status != agent.RunFailed {
		t.Fatalf("run %s %+v, want failed (q0 could not be stored)", run.Status, run.Error)
	}
	rs.refuse.Store(false)
	deliverAll(t, f, "th")
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

// deliverAll runs delivery passes until the thread's queue is empty and no run holds the thread. A run's end asks
// the jobs port for a delivery pass (Engine.wake), which the local stack runs in the background: whichever of it
// and this loop claims first delivers, the other meets run_active (then waits for it) or nothing queued.
func deliverAll(t *testing.T, f *fixture, thread string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tr, err := f.eng.BeginQueued(ctx, thread)
		if err == nil {
			tr.Stream(ctx, &bytes.Buffer{})
			continue
		}
		th, gerr := f.store.GetThread(ctx, thread)
		if gerr != nil {
			t.Fatal(gerr)
		}
		if errors.Is(err, engine.ErrNothingQueued) && th.ActiveRun == nil {
			return
		}
		if !errors.Is(err, engine.ErrNothingQueued) && agent.CodeOf(err) != agent.CodeRunActive {
			t.Fatalf("BeginQueued: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue was not delivered: %v, active run %+v", err, th.ActiveRun)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A submit that took a queued user message stored it, then failed to store its own message and ended failed: the
// queued message is in the thread with no reply after it. A later delivery pass answers it (it is the newest
// user message, and nothing answered it), instead of only marking its entry taken (sim seeds 3032699439052972066,
// 1659694912926764706, 7186506105046278021: invariant queued-answered); it is stored once.
func TestQueuedMessageStoredByAFailedTurnIsAnswered(t *testing.T) {
	t.Parallel()
	rs := &refuseMessage{id: "u1"}
	f := queuedBehind(t, rs, "q0")
	rs.refuse.Store(true)
	run, _ := f.turn(t, "th", "u1", "mine") // takes q0 and stores it before its own message, whose write fails
	if run.Status != agent.RunFailed {
		t.Fatalf("run %s %+v, want failed (u1 could not be stored)", run.Status, run.Error)
	}
	rs.refuse.Store(false)
	deliverAll(t, f, "th")
	ms := f.messages(t, "th")
	var ids []string
	seen, answered := 0, false
	for i, m := range ms {
		ids = append(ids, string(m.Role)+":"+m.ID+":"+string(m.Meta().Status))
		if m.ID != "q0" {
			continue
		}
		seen++
		for _, r := range ms[i+1:] {
			if r.Role == agent.RoleUser {
				break
			}
			if r.Role == agent.RoleAssistant && r.Meta().Status == agent.MessageCompleted {
				answered = true
			}
		}
	}
	if seen != 1 || !answered {
		t.Fatalf("messages %v: want q0 stored once and answered by a completed reply", ids)
	}
}

// As above, but the submit's own message was stored and only the write's answer was lost: the thread holds q0
// then u1, neither answered, and the run ended failed (persist_failed). q0's entry is still queued and held, but
// it is not the newest message, so the pass must answer anyway (its reply goes after u1, the newest): sim seed
// 7078298938037414757 (time mode, invariant queued-answered: a delivery pass only marked five held entries
// taken).
func TestQueuedMessageStoredBeforeALostOwnWriteIsAnswered(t *testing.T) {
	t.Parallel()
	rs := &refuseMessage{id: "u1", lose: true}
	f := queuedBehind(t, rs, "q0", "q1")
	rs.refuse.Store(true)
	run, _ := f.turn(t, "th", "u1", "mine") // stores q0, q1, then u1, whose answer is lost
	if run.Status != agent.RunFailed {
		t.Fatalf("run %s %+v, want failed (u1's write answered an error)", run.Status, run.Error)
	}
	rs.refuse.Store(false)
	deliverAll(t, f, "th")
	ms := f.messages(t, "th")
	var ids []string
	for _, m := range ms {
		ids = append(ids, string(m.Role)+":"+m.ID+":"+string(m.Meta().Status))
	}
	for _, q := range []string{"q0", "q1"} {
		seen, answered := 0, false
		for i, m := range ms {
			if m.ID != q {
				continue
			}
			seen++
			answered = slices.ContainsFunc(ms[i+1:], func(r agent.Message) bool {
				return r.Role == agent.RoleAssistant && r.Meta().Status == agent.MessageCompleted
			})
		}
		if seen != 1 || !answered {
			t.Fatalf("messages %v: want %s stored once and answered by a completed reply after it", ids, q)
		}
	}
}

// queuedBehind builds the stack over rs, answers u0 on thread th, and queues ids on th (as user messages, in
// order) while rs still lets every write through.
func queuedBehind(t *testing.T, rs *refuseMessage, ids ...string) *fixture {
	t.Helper()
	f := setup(t, withStore(func(s agent.Store) agent.Store { rs.Store = s; return rs }),
		withConfig(func(c *config.Config) { c.MaxQueued = 10 }))
	f.turn(t, "th", "u0", "hello")
	for _, id := range ids {
		q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Owner: "alice", Status: agent.QueueQueued, CreatedAt: time.Now().UTC(),
			Message: *userMsg(id, "queued "+id)}
		if _, _, err := f.store.Enqueue(context.Background(), q, 0); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
