package interrupts_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/interrupts"
)

func setup(t *testing.T) (*interrupts.Signer, time.Time) {
	t.Helper()
	s, err := interrupts.NewSigner([]byte("application secret for tests"))
	if err != nil {
		t.Fatal(err)
	}
	return s, time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
}

func TestCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{`{"b":1,"a":[true,null,"x"]}`, `{"a":[true,null,"x"],"b":1}`},
		{` { "a" : { "d" : 1 , "c" : 2 } } `, `{"a":{"c":2,"d":1}}`},
		{`"<&>\u2028"`, "\"<&>\u2028\""},
		{`"tab\there\u0001"`, `"tab\there\u0001"`},
		{`[1e21, 1.5, -0, 1e-7, 100, 12345678901234567890, 0.000001]`, `[1e+21,1.5,0,1e-7,100,12345678901234567000,0.000001]`},
		// Keys sort by UTF-16 code units, as JavaScript sorts them.
		{`{"é":1,"z":2,"😀":3,"":4,"￿":5}`, `{"":4,"z":2,"é":1,"😀":3,"￿":5}`},
		{``, `null`},
	}
	for _, tt := range tests {
		got, err := interrupts.Canonical(json.RawMessage(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("Canonical(%s) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{`{`, `{} {}`, `1e400`} {
		if _, err := interrupts.Canonical(json.RawMessage(bad)); err == nil {
			t.Errorf("Canonical(%s) accepted", bad)
		}
	}
}

// The signature depends on every signed field and on nothing else (key order and spacing of the input do not
// count); a signer over another secret cannot verify it.
func TestSignVerify(t *testing.T) {
	t.Parallel()
	s, _ := setup(t)
	in := agent.Interrupt{ID: "apr_1", ToolCallID: "call_1", ToolName: "delete_note", Input: json.RawMessage(`{"id":"n1","force":true}`)}
	sig, err := s.Sign(in.ID, in.ToolCallID, in.ToolName, in.Input)
	if err != nil || strings.ContainsAny(sig, "+/=") || len(sig) != 43 {
		t.Fatalf("signature %q (%v): want 43 base64url characters", sig, err)
	}
	in.Signature = sig
	if !s.Verify(in) {
		t.Fatal("own signature does not verify")
	}
	reordered := in
	reordered.Input = json.RawMessage(`{ "force": true, "id": "n1" }`)
	if !s.Verify(reordered) {
		t.Fatal("key order changed the signature")
	}
	for name, mut := range map[string]func(*agent.Interrupt){
		"id":    func(x *agent.Interrupt) { x.ID = "apr_2" },
		"call":  func(x *agent.Interrupt) { x.ToolCallID = "call_2" },
		"name":  func(x *agent.Interrupt) { x.ToolName = "add_note" },
		"input": func(x *agent.Interrupt) { x.Input = json.RawMessage(`{"id":"n2","force":true}`) },
		"sig":   func(x *agent.Interrupt) { x.Signature = flip(sig[:1]) + sig[1:] },
	} {
		x := in
		mut(&x)
		if s.Verify(x) {
			t.Errorf("changed %s still verifies", name)
		}
	}
	other, _ := interrupts.NewSigner([]byte("another secret"))
	if other.Verify(in) {
		t.Fatal("another key verifies")
	}
	if _, err := interrupts.NewSigner(nil); err == nil {
		t.Fatal("an empty secret was accepted")
	}
}

func flip(c string) string {
	if c == "A" {
		return "B"
	}
	return "A"
}

func TestIDIsDerived(t *testing.T) {
	t.Parallel()
	a := interrupts.ID("th", "run_1", "call_1")
	if a != interrupts.ID("th", "run_1", "call_1") || a == interrupts.ID("th", "run_2", "call_1") || a == interrupts.ID("th2", "run_1", "call_1") {
		t.Fatal("ids must be a function of thread, run and call")
	}
	if !strings.HasPrefix(a, "apr_") || len(a) > 40 {
		t.Fatalf("id %q", a)
	}
}

// part is the client's copy of a tool part.
func part(typ, state, callID string, input string, approval *agent.PartApproval) agent.Part {
	return agent.Part{Type: typ, State: state, ToolCallID: callID, Input: json.RawMessage(input), Approval: approval}
}

func yes(id string) *agent.PartApproval { v := true; return &agent.PartApproval{ID: id, Approved: &v} }
func no(id string) *agent.PartApproval  { v := false; return &agent.PartApproval{ID: id, Approved: &v} }

// The idempotency ladder, rung by rung.
func TestMatchLadder(t *testing.T) {
	t.Parallel()
	s, now := setup(t)
	signed := func(in agent.Interrupt) agent.Interrupt {
		in.Signature, _ = s.Sign(in.ID, in.ToolCallID, in.ToolName, in.Input)
		in.CreatedAt, in.ExpiresAt = now.Add(-time.Hour), now.Add(time.Hour)
		if in.Status == "" {
			in.Status = agent.InterruptPending
		}
		return in
	}
	approval := signed(agent.Interrupt{ID: "apr_1", Kind: agent.InterruptApproval, ToolCallID: "c1", ToolName: "delete_note", Input: json.RawMessage(`{"id":"n1"}`)})
	approved := approval
	approved.Status, approved.Response = agent.InterruptApproved, json.RawMessage(`{"approved":true}`)
	expired := approval
	expired.ExpiresAt = now.Add(-time.Second)
	client := signed(agent.Interrupt{ID: "apr_2", Kind: agent.InterruptClientTool, ToolCallID: "c2", ToolName: "ask_user_question", Input: json.RawMessage(`{"question":"?"}`)})
	answered := client
	answered.Status, answered.Response = agent.InterruptAnswered, json.RawMessage(`{"output":{"answer":"blue"}}`)
	forged := approval
	forged.Input = json.RawMessage(`{"id":"n2"}`) // the stored request changed after it was signed

	ok := "tool-delete_note"
	tests := []struct {
		name   string
		ins    []agent.Interrupt
		req    []agent.Part
		code   string
		status agent.InterruptStatus
		repeat bool
	}{
		{"approve", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, yes("apr_1"))}, "", agent.InterruptApproved, false},
		{"deny", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, no("apr_1"))}, "", agent.InterruptDenied, false},
		{"input key order does not matter", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", ` {"id": "n1"} `, yes("apr_1"))}, "", agent.InterruptApproved, false},
		{"repeat", []agent.Interrupt{approved}, []agent.Part{part(ok, "output-available", "c1", `{"id":"n1"}`, yes("apr_1"))}, "", agent.InterruptApproved, true},
		{"conflict", []agent.Interrupt{approved}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, no("apr_1"))}, agent.CodeAlreadyResolved, "", false},
		{"unknown approval id", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, yes("apr_x"))}, agent.CodeUnknownApproval, "", false},
		{"unknown tool call", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, yes("apr_1")), part(ok, "approval-responded", "c9", `{}`, yes("apr_9"))}, agent.CodeUnknownApproval, "", false},
		{"tampered input", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n2"}`, yes("apr_1"))}, agent.CodeApprovalMismatch, "", false},
		{"tampered tool name", []agent.Interrupt{approval}, []agent.Part{part("tool-add_note", "approval-responded", "c1", `{"id":"n1"}`, yes("apr_1"))}, agent.CodeApprovalMismatch, "", false},
		{"stored request altered", []agent.Interrupt{forged}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n2"}`, yes("apr_1"))}, agent.CodeApprovalMismatch, "", false},
		{"missing decision", []agent.Interrupt{approval}, []agent.Part{part(ok, "approval-requested", "c1", `{"id":"n1"}`, &agent.PartApproval{ID: "apr_1"})}, agent.CodeMissingDecision, "", false},
		{"missing part", []agent.Interrupt{approval}, nil, agent.CodeMissingDecision, "", false},
		{"expired", []agent.Interrupt{expired}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, yes("apr_1"))}, agent.CodeExpired, "", false},
		{"client output", []agent.Interrupt{client}, []agent.Part{part("tool-ask_user_question", "output-available", "c2", `{"question":"?"}`, nil)}, "", agent.InterruptAnswered, false},
		{"client output repeated", []agent.Interrupt{answered}, []agent.Part{{Type: "tool-ask_user_question", State: "output-available", ToolCallID: "c2", Input: json.RawMessage(`{"question":"?"}`), Output: json.RawMessage(`{ "answer": "blue" }`)}}, "", agent.InterruptAnswered, true},
		{"client output changed", []agent.Interrupt{answered}, []agent.Part{{Type: "tool-ask_user_question", State: "output-available", ToolCallID: "c2", Input: json.RawMessage(`{"question":"?"}`), Output: json.RawMessage(`{"answer":"red"}`)}}, agent.CodeAlreadyResolved, "", false},
		{"client output missing", []agent.Interrupt{client}, []agent.Part{part("tool-ask_user_question", "input-available", "c2", `{"question":"?"}`, nil)}, agent.CodeMissingDecision, "", false},
		{"one of two missing", []agent.Interrupt{approval, client}, []agent.Part{part(ok, "approval-responded", "c1", `{"id":"n1"}`, yes("apr_1"))}, agent.CodeMissingDecision, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answers, err := interrupts.Match(s, tt.ins, tt.req, now)
			if tt.code != "" {
				if !errors.Is(err, &agent.Error{Code: tt.code}) {
					t.Fatalf("err = %v, want %s", err, tt.code)
				}
				return
			}
			if err != nil || len(answers) != 1 {
				t.Fatalf("answers %+v, err %v", answers, err)
			}
			if a := answers[0]; a.Status != tt.status || a.Repeat != tt.repeat {
				t.Fatalf("answer %+v, want %s repeat=%v", a, tt.status, tt.repeat)
			}
		})
	}
}

// Canonical never panics on valid JSON, and its output is a fixed point (valid JSON whose canonical form is
// itself).
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{`{"b":[1,{"d":null,"c":"\ud800"}],"a":true}`, `"\u2028\"\\"`, `[1e21,-0,0.1]`, `{"a":1,"a":2}`, ` 7 `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if !json.Valid([]byte(in)) {
			return
		}
		c, err := interrupts.Canonical(json.RawMessage(in))
		if err != nil {
			return // a number JavaScript cannot hold
		}
		if !json.Valid(c) {
			t.Fatalf("Canonical(%q) = %q is not JSON", in, c)
		}
		again, err := interrupts.Canonical(c)
		if err != nil || string(again) != string(c) {
			t.Fatalf("Canonical is not a fixed point: %q -> %q -> %q (%v)", in, c, again, err)
		}
	})
}
