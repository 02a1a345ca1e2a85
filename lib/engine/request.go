package engine

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// TurnKind says what a request asks the run to do. Wire words (the AI SDK's "submit-message") stay in httpapi.
type TurnKind int

const (
	// TurnSubmit answers the request's newest message, a user message.
	TurnSubmit TurnKind = iota + 1
	// TurnRegenerate replaces the newest assistant message with a new answer.
	TurnRegenerate
	// TurnQueued answers what the thread's queue holds (a delivery pass; no request message): BeginQueued.
	TurnQueued
)

// Multitask is what a request does when the thread already has an active run.
type Multitask int

const (
	MultitaskReject    Multitask = iota // 409 run_active (the default)
	MultitaskInterrupt                  // cancel the active run, then run
	MultitaskEnqueue                    // queue a user message; a delivery pass answers it once the thread frees
)

// Request is one turn request, authenticated and decoded.
type Request struct {
	Owner    string
	ThreadID string
	Kind     TurnKind
	// Message is the request's newest message; the rest of the client's history is never read.
	Message *agent.Message
	// MessageID is the AI SDK request's messageId (optional). Regenerate: the assistant message to replace (it
	// must be the newest one). Submit with a user message: the earlier user message being edited (sendMessage
	// with a messageId), which is replaced and everything after it dropped. Submit with an assistant message
	// (tool outputs, approval answers): that message's id, which the message itself carries too.
	MessageID string
	Multitask Multitask
	// UserToken is the caller's bearer token (the end user's JWT), handed to the tools this request's own turn
	// runs (agent.ToolInvocation.UserToken) and nowhere else: it is held in memory for the turn, never stored,
	// logged or put in a run record. A message this request queues (multitask enqueue) is answered later by a
	// turn without it, as are delivery passes (a job's report, a queued message): no request of the user runs
	// them.
	UserToken string
	// trigger is a delivery pass's trigger (steer, or queued when it answers a queued user message).
	trigger agent.Trigger
}

const maxIDBytes = 200

// ValidThreadID reports whether id can name a thread: 1-200 bytes of UTF-8, no control characters, whitespace,
// '#' or '/', and not "." or ".." (the AI SDK puts it in the resume URL path).
func ValidThreadID(id string) bool {
	if id == "" || len(id) > maxIDBytes || !utf8.ValidString(id) || id == "." || id == ".." {
		return false
	}
	return !strings.ContainsFunc(id, func(r rune) bool {
		return r == '#' || r == '/' || unicode.IsSpace(r) || unicode.IsControl(r)
	})
}

// continues reports whether req answers the newest assistant message (tool outputs, approval answers) rather
// than adding a user message.
func (req Request) continues() bool {
	return req.Kind == TurnSubmit && req.Message != nil && req.Message.Role == agent.RoleAssistant
}

// edits reports whether req names an earlier user message to replace.
func (req Request) edits() bool {
	return req.Kind == TurnSubmit && req.Message != nil && req.Message.Role == agent.RoleUser && req.MessageID != ""
}

// Validate checks a request without touching the store; a refused request writes nothing.
func (e *Engine) Validate(req Request) error {
	if !ValidThreadID(req.ThreadID) {
		return agent.E(agent.KindInvalid, agent.CodeInvalidThreadID,
			"id must be 1-200 characters without whitespace, control characters, '#' or '/', and not '.' or '..'")
	}
	switch req.Kind {
	case TurnSubmit:
		if req.Message == nil {
			return agent.E(agent.KindInvalid, agent.CodeMissingMessage, "messages must hold at least one message")
		}
	case TurnRegenerate, TurnQueued:
	default:
		return agent.E(agent.KindInvalid, agent.CodeInvalidTrigger, "unknown turn kind")
	}
	m := req.Message
	if m == nil {
		return nil
	}
	if req.Kind != TurnSubmit {
		// A regenerate's newest message is the client's copy of history, never read: only its shape is checked.
		if !agent.ValidMessageID(m.ID) {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message id must be 1-200 characters without '#', '/' or control characters")
		}
		return nil
	}
	if err := agent.ValidateIncoming(*m, agent.Limits{MaxBytes: e.cfg.MaxMessageBytes, MaxParts: e.cfg.MaxMessageParts}); err != nil {
		return err
	}
	if m.Role == agent.RoleUser && req.MessageID != "" && req.MessageID != m.ID {
		return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "messageId %q is not the id of the edited message (%q)", req.MessageID, m.ID)
	}
	if m.Role == agent.RoleAssistant {
		// Tool outputs and approval answers on the newest assistant message; matched after the claim.
		if req.MessageID != "" && req.MessageID != m.ID {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "messageId %q is not the id of the message sent (%q)", req.MessageID, m.ID)
		}
		return nil
	}
	// A message the model could never see whole is refused before anything is written (REVIEW H2).
	return transcript.CheckMessage(*m, e.cfg.Transcript)
}

func titleOf(m *agent.Message) string {
	if m == nil {
		return ""
	}
	s := strings.Join(strings.Fields(m.Text()), " ")
	if utf8.RuneCountInString(s) > 80 {
		r := []rune(s)
		s = string(r[:80]) + "…"
	}
	return s
}
