package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// deadEmptyRun leaves thread id (owner alice) with user message userID stored and its run dead before writing
// anything, reaped: the reaper's failed reply stands after the message. It returns the reply's id.
func (f *fixture) deadEmptyRun(t *testing.T, id, userID, text string) string {
	t.Helper()
	ctx := context.Background()
	st := f.stack.SQLite
	old := time.Now().Add(-time.Minute)
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: old, UpdatedAt: old}); err != nil {
		t.Fatal(err)
	}
	res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "alice", RunID: "run_dead", Trigger: agent.TriggerUser,
		AssistantMessageID: "msg_dead", UserMessageID: userID, Now: old, Reserve: 2})
	if err != nil {
		t.Fatal(err)
	}
	run := res.Run
	if err := st.PutMessage(ctx, agent.MessageWrite{ThreadID: id, Seq: run.FirstSeq, Message: *userMsg(userID, text), Fence: run.Fence(),
		Final: true, Now: old}); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.stack.Reaper.Reap(ctx, id, agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: old}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}
	shown := agent.Shown(f.messages(t, id))
	if len(shown) != 2 || shown[1].ID != run.AssistantMessageID || shown[1].Meta().Status != agent.MessageFailed {
		t.Fatalf("after the reap readers see %d messages, want the user message and its failed reply", len(shown))
	}
	return run.AssistantMessageID
}

// Issue 16 item 11: the failed reply the reaper stores for a run that died before its first word is shown, and
// the user can still get an answer: re-posting the message runs it again, and so does a regenerate, whether it
// names no message (useChat's regenerate()) or that failed reply (regenerate({messageId}) from the reply's own
// button: the engine does not count such a reply as an answer, and it must not refuse it as "not the newest").
// Either way the new reply answers the message and readers no longer show the failed one.
func TestFailedEmptyReplyCanBeAnsweredAgain(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"repost", "regenerate", "regenerate the failed reply"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			failed := f.deadEmptyRun(t, "th", "u1", "hello there")
			req := submit("th", "u1", "hello there")
			switch how {
			case "regenerate":
				req = engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate}
			case "regenerate the failed reply":
				req = engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate, MessageID: failed}
			}
			tr, err := f.eng.Begin(context.Background(), req)
			if err != nil {
				t.Fatalf("%s after the failed reply: %v", how, err)
			}
			run := tr.Stream(context.Background(), discard{})
			if run.Status != agent.RunCompleted {
				t.Fatalf("the new run = %s %+v, want completed", run.Status, run.Error)
			}
			shown := agent.Shown(f.messages(t, "th"))
			if len(shown) != 2 || shown[0].ID != "u1" || shown[1].ID != run.AssistantMessageID {
				ids := []string{}
				for _, m := range shown {
					ids = append(ids, m.ID)
				}
				t.Fatalf("readers see %v, want [u1 %s]", ids, run.AssistantMessageID)
			}
			if got := shown[1].Text(); got == "" {
				raw, _ := json.Marshal(shown[1])
				t.Fatalf("the new reply says nothing: %s", raw)
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
