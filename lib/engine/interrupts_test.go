package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

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
	without := engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
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

func (l lagging) ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]agent.Interrupt, error) {
	ins, err := l.Store.ListMessageInterrupts(ctx, threadID, messageID)
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

// recordingTool needs approval for every call and reports, through Recorded, an outcome for the calls whose input
// says so (as a tool that ran and recorded its effect under the call's idempotency key).
func recordingTool(executed *int) agent.Tool {
	return agent.Tool{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			*executed++
			return json.RawMessage(`"ran"`), nil
		},
		Recorded: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
			if strings.Contains(string(inv.Input), `"ran":true`) {
				return json.RawMessage(`"recorded effect"`), true, nil
			}
			return nil, false, nil
		}}
}

// REVIEW H5 (knownBugs seed 3721): a message left asking with answers resolved (its continuation died before its
// first draft write) is settled by the next user message with the truth: an approved call asks the tool what it
// recorded (as the reaper's Synthesize does), a denied one is output-denied, never "Not executed".
func TestSettleTellsResolvedAnswers(t *testing.T) {
	t.Parallel()
	executed := 0
	f := setup(t, withTools(recordingTool(&executed)))
	if run, _ := f.turn(t, "th", "u1", `/tool guarded {"ran":true} /tool guarded {"ran":false}`); run.Status != agent.RunInterrupted {
		t.Fatalf("ask: %s", run.Status)
	}
	ins, err := f.store.ListInterrupts(context.Background(), "th")
	if err != nil || len(ins) != 2 {
		t.Fatalf("interrupts %+v, %v", ins, err)
	}
	// The continuation resolved both answers and died before it wrote anything else.
	for _, in := range ins {
		st := agent.InterruptDenied
		if strings.Contains(string(in.Input), `"ran":true`) {
			st = agent.InterruptApproved
		}
		if _, err := f.store.ResolveInterrupt(context.Background(), in.Resolve(st, time.Now())); err != nil {
			t.Fatal(err)
		}
	}
	if run, _ := f.turn(t, "th", "u2", "never mind"); run.Status != agent.RunCompleted {
		t.Fatalf("new message: %s %+v", run.Status, run.Error)
	}
	msgs := f.messages(t, "th")
	for _, p := range transcript.Decode(msgs[1].Parts) {
		if p.Type != "tool-guarded" {
			continue
		}
		approved := strings.Contains(string(p.Input), `"ran":true`)
		switch {
		case approved && (p.State != agent.StateOutputAvailable || string(p.Output) != `"recorded effect"`):
			t.Fatalf("the approved call that ran: %+v", p)
		case !approved && (p.State != agent.StateOutputDenied || p.Approval == nil || p.Approval.Approved == nil || *p.Approval.Approved):
			t.Fatalf("the denied call: %+v", p)
		}
	}
	if executed != 0 {
		t.Fatalf("the tool ran %d times", executed)
	}
}

// failingDraft refuses, for good, every draft write (not finalized) of one message.
type failingDraft struct {
	agent.Store
	id string
}

func (s failingDraft) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Message.ID == s.id && !w.Final {
		return agent.E(agent.KindInternal, agent.CodeInternal, "draft write refused")
	}
	return s.Store.PutMessage(ctx, w)
}

// REVIEW H5: an approved tool never runs when the answers could not be stored on the message first (a crash
// after its effect would find the message still asking, and the transcript would lie about it).
func TestNoExecuteWithoutStoredAnswers(t *testing.T) {
	t.Parallel()
	executed := 0
	f := setup(t, withTools(recordingTool(&executed)))
	if run, _ := f.turn(t, "th", "u1", `/tool guarded {"ran":false}`); run.Status != agent.RunInterrupted {
		t.Fatalf("ask: %s", run.Status)
	}
	answer := approveAll(t, f, "th")
	eng := engine.New(engine.Deps{Store: failingDraft{f.store, answer.Message.ID}, Model: f.stack.Model, Tools: f.stack.Tools,
		Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
	tr, err := eng.Begin(context.Background(), answer)
	if err != nil {
		t.Fatal(err)
	}
	run := tr.Stream(context.Background(), io.Discard)
	if executed != 0 || run.Status != agent.RunFailed {
		t.Fatalf("run %s (%+v), the tool ran %d times", run.Status, run.Error, executed)
	}
	msgs := f.messages(t, "th")
	for _, p := range transcript.Decode(msgs[1].Parts) {
		if p.Type == "tool-guarded" && (p.State != agent.StateOutputError || !strings.Contains(p.ErrorText, "Not executed")) {
			t.Fatalf("part %+v", p)
		}
	}
}
