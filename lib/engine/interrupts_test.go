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
