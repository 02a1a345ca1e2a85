package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
)

// Fence B's queue takes (REVIEW §3 B, issue 16 item 2): a run notes the queued messages it takes on its run item
// (NoteTakes) before it stores them; the reaper fences those ids at its epoch, then adopts what landed. A dead run
// that took a steer is reaped, then:
//   - late: its write of the steer lands after the reap. It must be refused, the steer still queued and shown
//     nowhere, and the next turn stores it once;
//   - landed: the write had landed before the reap. The reaper adopts it: the entry is marked taken, the steer
//     shows once, and the dead run's late take is harmless.
//
// On both stores.
func TestReapFencesQueueTakes(t *testing.T) {
	t.Parallel()
	onBothStores(t, func(t *testing.T, st agent.Store) {
		for _, landed := range []bool{false, true} {
			reapTakes(t, st, landed)
		}
	})
}

func reapTakes(t *testing.T, st agent.Store, landed bool) {
	t.Helper()
	ctx := context.Background()
	th := "late"
	if landed {
		th = "landed"
	}
	old := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	r := reaper.New(reaper.Deps{Store: st, Clock: &stepClock{now: old.Add(time.Hour)}}, reaper.Config{StaleAfter: staleAfter})
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: th, Owner: "alice", CreatedAt: old, UpdatedAt: old}); err != nil {
		t.Fatal(err)
	}
	steer := agent.Message{ID: "steer_job1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"job done"}`)}}
	if _, _, err := st.Enqueue(ctx, agent.QueuedMessage{ThreadID: th, Kind: agent.QueueSteer, JobID: "job1", Message: steer,
		Status: agent.QueueQueued, CreatedAt: old}, 0); err != nil {
		t.Fatal(err)
	}
	res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: th, Owner: "alice", RunID: "run_dead", AssistantMessageID: "msg_run_dead",
		Trigger: agent.TriggerSteer, Now: old, Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	dead := res.Run
	if err := st.NoteTakes(ctx, dead, []string{steer.ID}); err != nil {
		t.Fatalf("NoteTakes: %v", err)
	}
	write := func(run agent.Run) error {
		return st.PutMessage(ctx, agent.MessageWrite{ThreadID: th, Seq: run.FirstSeq, Message: steer, Fence: run.Fence(), Final: true, Now: old})
	}
	if landed {
		if err := write(dead); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := r.Reap(ctx, th, agent.Claim{RunID: dead.ID, Epoch: dead.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	// The dead run's late writes.
	if err := st.NoteTakes(ctx, dead, []string{"steer_other"}); !errors.Is(err, agent.ErrRunFenced) {
		t.Errorf("%s: a note of the dead run after the reap: %v, want run_fenced", th, err)
	}
	if !landed {
		if err := write(dead); !errors.Is(err, agent.ErrRunFenced) {
			t.Errorf("%s: the dead run's late write of the steer it took: %v, want run_fenced", th, err)
		}
	}
	shown := func() int {
		t.Helper()
		recs, err := st.ListMessages(ctx, th)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, rec := range recs {
			if rec.Message.ID == steer.ID {
				n++
			}
		}
		return n
	}
	queued, err := st.ListQueued(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	if landed {
		if len(queued) != 0 || shown() != 1 {
			t.Fatalf("%s: after the reap %d entries queued, the steer shown %d times; want it adopted: taken, shown once", th, len(queued), shown())
		}
		if err := st.TakeQueued(ctx, th, steer.ID, old); err != nil || shown() != 1 {
			t.Fatalf("%s: the dead run's late take: %v, the steer shown %d times", th, err, shown())
		}
		return
	}
	if len(queued) != 1 || shown() != 0 {
		t.Fatalf("%s: after the reap %d entries queued, the steer shown %d times; want it still queued and shown nowhere", th, len(queued), shown())
	}
	// The next turn stores it, once.
	next, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: th, Owner: "alice", RunID: "run_next", AssistantMessageID: "msg_run_next",
		Trigger: agent.TriggerSteer, Now: old.Add(2 * time.Hour), Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := write(next.Run); err != nil {
		t.Fatalf("%s: the next turn's write of the steer: %v", th, err)
	}
	if n := shown(); n != 1 {
		t.Fatalf("%s: the steer shown %d times after the next turn stored it, want 1", th, n)
	}
}
