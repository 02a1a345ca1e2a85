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
)

// Multitask is what a request does when the thread already has an active run.
type Multitask int

const (
	MultitaskReject    Multitask = iota // 409 run_active (the default)
	MultitaskInterrupt                  // cancel the active run, then run
)

// Request is one turn request, authenticated and decoded.
type Request struct {
	Owner    string
	ThreadID string
	Kind     TurnKind
	// Message is the request's newest message; the rest of the client's history is never read.
	Message *agent.Message
	// ReplaceID (regenerate, optional) names the assistant message to replace; it must be the newest one.
	ReplaceID string
	Multitask Multitask
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
	case TurnRegenerate:
	default:
		return agent.E(agent.KindInvalid, agent.CodeInvalidTrigger, "unknown turn kind")
	}
	m := req.Message
	if m == nil {
		return nil
	}
	if m.ID == "" || len(m.ID) > maxIDBytes || strings.ContainsAny(m.ID, "#/") || strings.ContainsFunc(m.ID, unicode.IsControl) {
		return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "message id must be 1-200 characters without '#', '/' or control characters")
	}
	size := len(m.Metadata)
	for _, p := range m.Parts {
		size += len(p)
	}
	if size > e.cfg.MaxMessageBytes {
		return agent.E(agent.KindTooLarge, agent.CodeMessageTooLarge, "message is %d bytes, the limit is %d", size, e.cfg.MaxMessageBytes)
	}
	for i, raw := range m.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil || p.Type == "" {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "part %d must be an object with a type", i)
		}
	}
	if req.Kind != TurnSubmit {
		return nil
	}
	switch m.Role {
	case agent.RoleUser:
		if len(m.Parts) == 0 {
			return agent.E(agent.KindInvalid, agent.CodeInvalidMessage, "a user message needs at least one part")
		}
	case agent.RoleAssistant:
		return agent.E(agent.KindInvalid, agent.CodeUserRequired, "the newest message must be a user message (tool outputs and approval answers are not accepted yet)")
	default:
		return agent.E(agent.KindInvalid, agent.CodeUserRequired, "the newest message must have role user, got %q", m.Role)
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
