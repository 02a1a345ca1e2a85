package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// beforeEnqueue runs the hook armed, once, before the next Enqueue reaches the store (a process that paused there).
type beforeEnqueue struct {
	agent.Store
	mu   sync.Mutex
	hook func()
}

func (s *beforeEnqueue) arm(hook func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hook = hook
}

func (s *beforeEnqueue) Enqueue(ctx context.Context, q agent.QueuedMessage, max int) (agent.QueuedMessage, bool, error) {
	s.mu.Lock()
	hook := s.hook
	s.hook = nil
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s.Store.Enqueue(ctx, q, max)
}

// Issue 16 item 2, the queue: a job's delivery read the job, then its thread was deleted and created again on the
// id (a new conversation, with its own turn) before the delivery queued the steer. The steer landed in the new
// thread and a delivery turn answered it there. It is refused now: the delivery ends delivered nowhere (not
// retried), and the new thread holds its own turn alone.
func TestDeliveryRacingARecreateGoesNowhere(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			js := &startLog{}
			racer := &beforeEnqueue{}
			f := setup(t, withStore(func(s agent.Store) agent.Store { racer.Store = s; return racer }), store(t), withJobs(js))
			ctx := context.Background()
			const thread = "th-deliver-race"
			f.turn(t, thread, "m1", `/tool research {"question":"What is Go?"}`)
			job := js.started()[0]
			if _, err := f.stack.JobTasks.Subagent(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID}); err != nil {
				t.Fatal(err)
			}
			racer.arm(func() {
				if err := f.stack.Threads.Delete(ctx, "alice", thread); err != nil {
					t.Error(err)
				}
				f.turn(t, thread, "m2", "hello again")
			})
			out, err := f.stack.JobTasks.Deliver(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID})
			if err != nil {
				t.Fatalf("Deliver: %v, want delivered nowhere (a retried delivery would be refused again)", err)
			}
			if out.Status != agent.DeliveredNothing || out.Turns != 0 {
				t.Fatalf("delivery %+v, want %q with no turn", out, agent.DeliveredNothing)
			}
			if q, err := f.store.ListQueued(ctx, thread); err != nil || len(q) != 0 {
				t.Fatalf("queue of the new thread %+v (%v), want empty", q, err)
			}
			msgs, err := f.store.ListMessages(ctx, thread)
			if err != nil || len(msgs) != 2 || msgs[0].Message.ID != "m2" {
				t.Fatalf("new thread holds %+v (%v), want m2 and its reply alone", msgs, err)
			}
			runs, err := f.store.ListRuns(ctx, thread)
			if err != nil || len(runs) != 1 {
				t.Fatalf("runs of the new thread %+v (%v), want its own turn alone", runs, err)
			}
		})
	}
}

// Issue 16 item 2, the queue: a message sent with multitask "enqueue" met a running thread, and before it was
// queued the run ended and the thread was deleted and created again on its id by another user. The message
// landed in that user's queue. It is refused now as not found: the queue is the one of the incarnation whose
// run refused the claim.
func TestEnqueueRacingARecreateIsRefused(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			racer := &beforeEnqueue{}
			f := setup(t, withStore(func(s agent.Store) agent.Store { racer.Store = s; return racer }), store(t))
			ctx := context.Background()
			const thread = "th-enqueue-race"
			f.turn(t, thread, "m1", "hello")
			// A run holds the thread (its heartbeat far ahead, so it stays live however slow the test is).
			later := time.Now().Add(time.Hour)
			held, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: thread, Owner: "alice", RunID: "run-held",
				Trigger: agent.TriggerUser, AssistantMessageID: "msg-held", Now: later, StaleAfter: time.Minute, Reserve: 2})
			if err != nil {
				t.Fatal(err)
			}
			racer.arm(func() {
				if err := f.store.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: thread, Fence: held.Run.Fence(), Now: later}); err != nil {
					t.Error(err)
				}
				if err := f.stack.Threads.Delete(ctx, "alice", thread); err != nil {
					t.Error(err)
				}
				if _, _, err := f.store.CreateThread(ctx, agent.Thread{ID: thread, Owner: "bob", Title: "bob's", CreatedAt: later, UpdatedAt: later}); err != nil {
					t.Error(err)
				}
			})
			req := submit(thread, "m2", "and also this")
			req.Multitask = engine.MultitaskEnqueue
			_, err = f.eng.Begin(ctx, req)
			if !agent.IsKind(err, agent.KindNotFound) {
				t.Fatalf("Begin(enqueue) racing the thread's delete and a new thread on its id: %v, want not found", err)
			}
			if q, err := f.store.ListQueued(ctx, thread); err != nil || len(q) != 0 {
				t.Fatalf("queue of bob's thread %+v (%v), want none of alice's messages", q, err)
			}
		})
	}
}
