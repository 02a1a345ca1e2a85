package engine_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// deadEmptyRun leaves thread id (owner alice) with user message userID stored and its run dead before writing
// anything, reaped: the reaper's failed reply stands after the message. It returns the reply's id.
func (f *fixture) deadEmptyRun(t *testing.T, id, userID, text string) string {
	t.Helper()
	ctx := context.Background()
	st := f.stack.SQLite
	old := time.Now().Add(-pastStale) // stale on the fixture's real clock at once
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

// noInterrupts fails every CreateInterrupt, as a store that keeps refusing does after the SDK's retries.
type noInterrupts struct{ agent.Store }

func (noInterrupts) CreateInterrupt(context.Context, agent.Interrupt) (agent.Interrupt, bool, error) {
	return agent.Interrupt{}, false, agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "injected fault in CreateInterrupt")
}

// Issue 16 "Left" 5 (item 11 for the engine's own failures): a reply the engine itself ends failed (a model
// error before or after its first word, the step cap, a request for approval it could not store) shows its error
// in the reply, as the reaper's does: one part agent.RunErrorPart {id: run id, data: the run's stable code and
// safe message} at the end of the stored reply, and the error in its metadata. The stream tells the client the
// same: the AI SDK's own client (every supported version) builds exactly the stored parts and metadata error from
// what the engine streamed, and the segments hold what the client got.
func TestEngineFailedReplyHasAVisiblePart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, text string
		code       string
		opts       []option
	}{
		{"model error before the first word", "/error 401", agent.CodeModelError, nil},
		{"model error mid-stream", "/error 500 after 3", agent.CodeModelInterrupted, nil},
		{"step cap", "/loop list_notes {}", agent.CodeStepLimit, []option{withConfig(func(c *config.Config) { c.MaxSteps = 2 })}},
		{"approval request not saved", `/tool delete_note {"id":"note_1"}`, agent.CodePersistFailed,
			[]option{withStore(func(s agent.Store) agent.Store { return noInterrupts{s} })}},
	}
	var streams [][]byte
	var replies []agent.Message
	for _, c := range cases {
		f := setup(t, c.opts...)
		run, client := f.run(t, submit("th", "u1", c.text))
		if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != c.code {
			t.Fatalf("%s: run = %s %+v, want failed %s", c.name, run.Status, run.Error, c.code)
		}
		stored, err := f.stack.SQLite.GetRun(context.Background(), "th", run.ID)
		if err != nil || stored.Error == nil || *stored.Error != *run.Error {
			t.Fatalf("%s: stored run error = %+v (%v), want %+v", c.name, stored.Error, err, run.Error)
		}
		msgs := f.messages(t, "th")
		if len(msgs) != 2 || msgs[1].ID != run.AssistantMessageID {
			t.Fatalf("%s: %d messages stored, want the user message and the failed reply", c.name, len(msgs))
		}
		reply := msgs[1]
		var errParts []json.RawMessage
		for _, raw := range reply.Parts {
			if p, _ := agent.DecodePart(raw); p.Type == agent.RunErrorPart {
				errParts = append(errParts, raw)
			}
		}
		want := agent.ErrorPart(run.ID, *run.Error)
		if len(errParts) != 1 || !sameJSON(t, reply.Parts[len(reply.Parts)-1], want) {
			t.Fatalf("%s: stored reply parts = %s, want it to end with the one %s", c.name, reply.Parts, want)
		}
		if md := reply.Meta(); md.Status != agent.MessageFailed || md.Error == nil || *md.Error != *run.Error {
			t.Fatalf("%s: stored reply metadata = %s, want failed with the run's error %+v", c.name, reply.Metadata, run.Error)
		}
		if replay := f.segments(t, run.ID); string(replay) != string(client) {
			t.Fatalf("%s: the segments differ from the client's stream:\n%s\n---\n%s", c.name, replay, client)
		}
		streams, replies = append(streams, client), append(replies, reply)
	}
	parsed := aisdktest.CheckStreams(t, streams...)
	for i, c := range cases {
		for _, got := range aisdktest.OfFile(parsed, i) {
			if len(got.Errors) != 1 || got.Errors[0] != replies[i].Meta().Error.Message {
				t.Errorf("%s, ai@%s: in-band errors %q, want the safe message once", c.name, got.SDKVersion, got.Errors)
			}
			// The whole parts where the stream said everything; a tool call the run never got to is stored as
			// "not executed" (finish), which the stream does not say: there, the error part.
			built, stored := got.Message.Parts, replies[i].Parts
			if c.name == "approval request not saved" && len(built) == len(stored) {
				built, stored = built[len(built)-1:], stored[len(stored)-1:]
			}
			if !sameParts(t, built, stored) {
				t.Errorf("%s, ai@%s (%s) builds parts %s, the store holds %s", c.name, got.SDK, got.SDKVersion, got.Message.Parts, replies[i].Parts)
			}
			if md := got.Message.Meta(); md.Error == nil || *md.Error != *replies[i].Meta().Error {
				t.Errorf("%s, ai@%s: metadata %s, want the stored error %+v", c.name, got.SDK, got.Message.Metadata, replies[i].Meta().Error)
			}
		}
	}
}

func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

func sameParts(t *testing.T, a, b []json.RawMessage) bool {
	t.Helper()
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameJSON(t, a[i], b[i]) {
			return false
		}
	}
	return true
}
