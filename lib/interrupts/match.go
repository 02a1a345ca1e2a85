package interrupts

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Answer is one interrupt the request answers, as decided by Match.
type Answer struct {
	Interrupt agent.Interrupt // as stored
	Status    agent.InterruptStatus
	Response  json.RawMessage
	// Repeat: the interrupt is already resolved with this very answer (a repeated request, or our own retried
	// write whose reply was lost); nothing is to be written for it.
	Repeat bool
	// Reason is the client's denial or approval reason (approvals only).
	Reason string
	// Output and ErrorText are a client tool's result.
	Output    json.RawMessage
	ErrorText string
}

// Failed reports whether a client tool's answer is an error rather than an output.
func (a Answer) Failed() bool { return a.ErrorText != "" && len(a.Output) == 0 }

// Approved reports whether the answer lets the tool run.
func (a Answer) Approved() bool { return a.Status == agent.InterruptApproved }

// approvalResponse is the stored Response of an approval.
type approvalResponse struct {
	Approved bool   `json:"approved"`
	Reason   string `json:"reason,omitempty"`
}

// clientResponse is the stored Response of a client tool.
type clientResponse struct {
	Output    json.RawMessage `json:"output,omitempty"`
	ErrorText string          `json:"errorText,omitempty"`
}

// Match matches the answers in a request's copy of an assistant message (its parts, as the client sent them)
// to the interrupts the server stored for that message, following the idempotency ladder:
//
//   - an answer to an interrupt already resolved the same way is a repeat (no-op);
//   - an answer that differs from the resolution is 409 already_resolved (expired: 409 expired);
//   - an answer that names no interrupt of the message, or whose tool call, tool name or input differs from what
//     was signed, is 400 (unknown_approval, approval_mismatch); a stored request whose signature does not verify
//     is refused the same way;
//   - a pending interrupt the request does not answer is 400 missing_decision: a missing decision never runs a
//     tool.
//
// Only the decision (approved or not, the client tool's output) is taken from the client; everything else comes
// from the stored interrupt. ins are the message's interrupts; now decides expiry.
func Match(s *Signer, ins []agent.Interrupt, request []agent.Part, now time.Time) ([]Answer, error) {
	byCall := map[string]agent.Part{}
	for _, p := range request {
		if agent.IsToolPart(p.Type) && p.ToolCallID != "" {
			byCall[p.ToolCallID] = p
		}
	}
	known := map[string]bool{} // tool call ids the stored interrupts name
	var answers []Answer
	for _, in := range ins {
		known[in.ToolCallID] = true
		p, ok := byCall[in.ToolCallID]
		a, answered, err := decide(in, p, ok)
		if err != nil {
			return nil, err
		}
		if !answered {
			if in.Pending(now) {
				return nil, agent.E(agent.KindInvalid, agent.CodeMissingDecision,
					"tool call %q waits for %s; the request does not give one", in.ToolCallID, what(in.Kind))
			}
			continue // resolved earlier; the request need not repeat it
		}
		if err := check(s, in, p); err != nil {
			return nil, err
		}
		switch {
		case in.Status == agent.InterruptPending && !in.Pending(now), in.Status == agent.InterruptExpired:
			return nil, agent.E(agent.KindConflict, agent.CodeExpired, "the request for tool call %q expired before it was answered", in.ToolCallID)
		case in.Status == agent.InterruptPending:
		case in.Status == a.Status && sameResponse(in, a):
			a.Repeat = true
		default:
			return nil, agent.E(agent.KindConflict, agent.CodeAlreadyResolved, "tool call %q was already answered (%s)", in.ToolCallID, in.Status)
		}
		answers = append(answers, a)
	}
	for _, p := range request {
		if p.Approval != nil && p.State == agent.StateApprovalResponded && !known[p.ToolCallID] {
			return nil, agent.E(agent.KindInvalid, agent.CodeUnknownApproval, "approval %q matches no request of this message", p.Approval.ID)
		}
	}
	return answers, nil
}

// decide reads the client's decision for in from its part p (ok: the request has a part for the call).
func decide(in agent.Interrupt, p agent.Part, ok bool) (Answer, bool, error) {
	a := Answer{Interrupt: in}
	if !ok {
		return a, false, nil
	}
	switch in.Kind {
	case agent.InterruptApproval:
		if p.Approval == nil || p.Approval.Approved == nil {
			return a, false, nil
		}
		if p.Approval.ID != in.ID {
			return a, false, agent.E(agent.KindInvalid, agent.CodeUnknownApproval, "approval %q matches no request of this message", p.Approval.ID)
		}
		a.Reason = p.Approval.Reason
		a.Status = agent.InterruptDenied
		if *p.Approval.Approved {
			a.Status = agent.InterruptApproved
		}
		a.Response = mustJSON(approvalResponse{Approved: *p.Approval.Approved, Reason: a.Reason})
	case agent.InterruptClientTool:
		switch p.State {
		case agent.StateOutputAvailable:
			a.Output = p.Output
			if len(a.Output) == 0 {
				a.Output = json.RawMessage("null")
			}
			if !json.Valid(a.Output) {
				return a, false, agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "the output of tool call %q is not JSON", in.ToolCallID)
			}
		case agent.StateOutputError:
			a.ErrorText = p.ErrorText
		default:
			return a, false, nil
		}
		a.Status = agent.InterruptAnswered
		a.Response = mustJSON(clientResponse{Output: a.Output, ErrorText: a.ErrorText})
	}
	return a, true, nil
}

// check compares the client's copy of the call with the stored, signed request.
func check(s *Signer, in agent.Interrupt, p agent.Part) error {
	if name := p.ToolNameOf(); name != in.ToolName {
		return agent.E(agent.KindInvalid, agent.CodeApprovalMismatch, "tool call %q names tool %q, the request was for %q", in.ToolCallID, name, in.ToolName)
	}
	if len(p.Input) > 0 || in.Kind == agent.InterruptApproval {
		got, err1 := Canonical(p.Input)
		want, err2 := Canonical(in.Input)
		if err1 != nil || err2 != nil || !bytes.Equal(got, want) {
			return agent.E(agent.KindInvalid, agent.CodeApprovalMismatch, "the input of tool call %q differs from the one that was signed", in.ToolCallID)
		}
	}
	if !s.Verify(in) {
		return agent.E(agent.KindInvalid, agent.CodeApprovalMismatch, "the stored request for tool call %q does not verify", in.ToolCallID)
	}
	return nil
}

// sameResponse reports whether a resolves in as it already is: the same decision for an approval (a different
// reason does not make a new decision), the same output for a client tool.
func sameResponse(in agent.Interrupt, a Answer) bool {
	switch in.Kind {
	case agent.InterruptApproval:
		var r approvalResponse
		return json.Unmarshal(in.Response, &r) == nil && r.Approved == (a.Status == agent.InterruptApproved)
	default:
		got, err1 := Canonical(in.Response)
		want, err2 := Canonical(a.Response)
		return err1 == nil && err2 == nil && bytes.Equal(got, want)
	}
}

// Resolution decodes a stored resolution back into an answer (for a message rewritten from the store alone).
func Resolution(in agent.Interrupt) Answer {
	a := Answer{Interrupt: in, Status: in.Status, Response: in.Response, Repeat: true}
	switch in.Kind {
	case agent.InterruptApproval:
		var r approvalResponse
		_ = json.Unmarshal(in.Response, &r)
		a.Reason = r.Reason
	default:
		var r clientResponse
		_ = json.Unmarshal(in.Response, &r)
		a.Output, a.ErrorText = r.Output, r.ErrorText
	}
	return a
}

func what(k agent.InterruptKind) string {
	if k == agent.InterruptClientTool {
		return "the client's output"
	}
	return "an approval decision"
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("interrupts: " + err.Error())
	}
	return b
}
