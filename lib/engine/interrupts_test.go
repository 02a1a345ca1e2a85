package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/transcript"
)

// approveAll is the client's approval of every requested approval on the thread's newest message.
func approveAll(t *testing.T, f *fixture, thread string) engine.Request {
	t.Helper()
	msgs := f.messages(t, thread)
	m := msgs[len(msgs)-1]
	for i, raw := range m.Parts {
		p, _ := agent.DecodePart(raw)
		if p.State == agent.StateApprovalRequested {
			yes := true
			p.State, p.Approval.Approved = agent.StateApprovalResponded, &yes
			m.Parts[i] = agent.EncodePart(p)
		}
	}
	return engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit, Message: &m, MessageID: m.ID}
}

// An approved tool that a new deployment no longer has is not run (and does not crash the run): the call gets
// a result saying so, and the model answers on a valid transcript.
func TestApprovedToolGone(t *testing.T) {
	t.Parallel()
	ran := false
	guarded := agent.Tool{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			ran = true
			return json.RawMessage(`"ok"`), nil
		}}
	f := setup(t, withTools(guarded))
	if run, _ := f.turn(t, "th", "u1", `/tool guarded {}`); run.Status != agent.RunInterrupted {
		t.Fatalf("ask: %s", run.Status)
	}
	without := engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Reaper: f.stack.Reaper, Signer: f.stack.Signer}, f.eng.Config())
	tr, err := without.Begin(context.Background(), approveAll(t, f, "th"))
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted || ran {
		t.Fatalf("run %s (%+v), tool ran: %v", run.Status, run.Error, ran)
	}
	msgs := f.messages(t, "th")
	for _, p := range transcript.Decode(msgs[1].Parts) {
		if p.Type == "tool-guarded" && (p.State != agent.StateOutputError || !strings.Contains(p.ErrorText, "not executed")) {
			t.Fatalf("part %+v", p)
		}
	}
}

// lagging reads every interrupt as pending (a store whose reads lag behind its writes).
type lagging struct{ agent.Store }

func (l lagging) ListInterrupts(ctx context.Context, threadID string) ([]agent.Interrupt, error) {
	ins, err := l.Store.ListInterrupts(ctx, threadID)
	for i := range ins {
		ins[i].Status, ins[i].Response = agent.InterruptPending, nil
	}
	return ins, err
}

// An answer for a message the thread has moved past is refused, even when its interrupt still reads pending:
// nothing is resolved and nothing runs. (It used to be answered with a no-op stream, leaving the client to think
// its answer counted.)
func TestAnswerForAnOlderMessage(t *testing.T) {
	t.Parallel()
	ran := 0
	guarded := agent.Tool{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			ran++
			return json.RawMessage(`"ok"`), nil
		}}
	f := setup(t, withTools(guarded), withStore(func(s agent.Store) agent.Store { return lagging{s} }))
	f.turn(t, "th", "u1", `/tool guarded {}`)
	answer := approveAll(t, f, "th")
	if run, _ := f.turn(t, "th", "u2", "never mind"); run.Status != agent.RunCompleted {
		t.Fatal(run.Status)
	}
	if _, err := f.eng.Begin(context.Background(), answer); agent.CodeOf(err) != agent.CodeAlreadyResolved || ran != 0 {
		t.Fatalf("begin: %v (ran %d), want %s", err, ran, agent.CodeAlreadyResolved)
	}
}
