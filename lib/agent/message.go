package agent

import (
	"encoding/json"
	"time"
)

// Role of a UIMessage.
type Role string

const (
	RoleSystem    Role = "system"
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
)

// Message is an AI SDK UIMessage. Parts stay raw JSON so part types the engine does not act on (data-*, file,
// source-*) round-trip byte for byte; use DecodePart for the ones it does.
type Message struct {
	ID       string            `json:"id"`
	Role     Role              `json:"role"`
	Parts    []json.RawMessage `json:"parts"`
	Metadata json.RawMessage   `json:"metadata,omitempty"`
}

// MessageRecord is a stored message with its position in the thread.
type MessageRecord struct {
	ThreadID  string
	Seq       int64 // position in the thread; assigned by the writer (the claim holder), kept on upsert
	Message   Message
	CreatedAt time.Time
	UpdatedAt time.Time
}

// MessageStatus is kept in assistant message metadata.
type MessageStatus string

const (
	MessageStreaming   MessageStatus = "streaming"
	MessageCompleted   MessageStatus = "completed"
	MessageInterrupted MessageStatus = "interrupted"
	MessageCanceled    MessageStatus = "canceled"
	MessageFailed      MessageStatus = "failed"
)

// MessageMetadata is what the server writes into an assistant message's metadata (and into finish.messageMetadata).
type MessageMetadata struct {
	Status MessageStatus `json:"status,omitempty"`
	RunID  string        `json:"runId,omitempty"`
	Model  string        `json:"model,omitempty"`
	Usage  *Usage        `json:"usage,omitempty"`
	// Replaces names the reply a regenerate replaced. The old reply is hidden right after this one is stored;
	// until then (or when a crash came between), Visible leaves it out.
	Replaces string `json:"replaces,omitempty"`
	// Error is a failed reply's stable code and safe message (the engine's, or the reaper's for a run that
	// died): a reader shows it even when the reply says nothing else (Shown).
	Error *RunError `json:"error,omitempty"`
	// ContextScale is what the provider counted over the transcript's chars/4 estimate for the reply's latest
	// request (stored only, never streamed): the next run prunes with it from its first request, so that it
	// cuts the transcript where this run's last request was cut and the provider's prompt cache holds (lib/transcript
	// Config.Scale). Absent: 1.
	ContextScale float64 `json:"contextScale,omitempty"`
	// HandedOver, on a reply stored by a run as it handed over (stored only, never streamed), is the hand-over's
	// continuation: while the thread's claim still names the run at HandedOver.Epoch, the continuation has not
	// taken it up, and a reaper that finds that claim stale continues the run from it instead of reaping it
	// (lib/reaper). The continuation's own writes of the reply carry none (or a later epoch's).
	HandedOver *Continuation `json:"handedOver,omitempty"`
}

// RunErrorPart is the type of the part that shows a failed reply's error in the reply itself, for apps that
// render a message's parts (useChat): {"type": "data-run-error", "id": <run id>, "data": {code, message}} (the
// run's RunError: a stable code and a message safe to show). A data part, so the AI SDK keeps it on the message as
// it is, and the transcript never sends it to a model. The reaper gives it to the reply of a run that died before
// its first word, which would otherwise have no part at all (issue 16 item 11); the engine ends every failed reply
// it stores with it, and streams it as a data chunk of the same type, id and data.
const RunErrorPart = "data-run-error"

// ErrorPart is the RunErrorPart of run runID's error e.
func ErrorPart(runID string, e RunError) json.RawMessage {
	b, err := json.Marshal(struct {
		Type string   `json:"type"`
		ID   string   `json:"id"`
		Data RunError `json:"data"`
	}{RunErrorPart, runID, e})
	if err != nil {
		panic("agent: encode error part: " + err.Error())
	}
	return b
}

// saysNothing reports whether m is a failed reply with nothing in it for a model: no part, or only its error
// (RunErrorPart).
func saysNothing(m Message) bool {
	if m.Role != RoleAssistant || m.Meta().Status != MessageFailed {
		return false
	}
	for _, raw := range m.Parts {
		var p struct{ Type string }
		if json.Unmarshal(raw, &p) != nil || p.Type != RunErrorPart {
			return false
		}
	}
	return true
}

// Visible leaves out, keeping the order, every message that a later completed (or interrupted: it stands, asking
// for an answer) message replaces (a regenerate whose old reply was not yet hidden), and failed replies that say
// nothing (a run that died before its first word: the reaper stores such a reply, with only its error, to fence
// the dead run's writes and to show the error).
func Visible(msgs []Message) []Message {
	replaced := map[string]bool{}
	for _, m := range msgs {
		if md := m.Meta(); md.Replaces != "" && (md.Status == MessageCompleted || md.Status == MessageInterrupted) {
			replaced[md.Replaces] = true
		}
	}
	out := make([]Message, 0, len(msgs))
	for _, m := range msgs {
		if !replaced[m.ID] && !saysNothing(m) {
			out = append(out, m)
		}
	}
	return out
}

// Shown is what a reader sees: Visible, except that a failed reply that says nothing but carries an error (a run
// that died before its first word) is shown, so the user message it answers does not stand unanswered with no
// error (issue 16 item 11), until a later reply answers that message (a re-post or a regenerate). The engine
// reads Visible: to it such a reply is no answer, so re-posting the message runs again.
func Shown(msgs []Message) []Message {
	out := make([]Message, 0, len(msgs))
	visible := Visible(msgs)
	next := 0
	for i, m := range msgs {
		if next < len(visible) && visible[next].ID == m.ID {
			out = append(out, m)
			next++
			continue
		}
		if !saysNothing(m) || m.Meta().Error == nil {
			continue
		}
		if i+1 < len(msgs) && msgs[i+1].Role == RoleAssistant {
			continue // answered since
		}
		out = append(out, m)
	}
	return out
}

// Part is the decoded form of the part types the engine reads and writes. Fields that a type does not use stay
// empty and are omitted on encode.
type Part struct {
	Type       string          `json:"type"`
	Text       string          `json:"text,omitempty"`
	State      string          `json:"state,omitempty"`
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"` // dynamic-tool only; static tools carry it in Type
	Input      json.RawMessage `json:"input,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	ErrorText  string          `json:"errorText,omitempty"`
	Approval   *PartApproval   `json:"approval,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	ID         string          `json:"id,omitempty"`
	// ProviderMetadata is the AI SDK's providerMetadata of a part. The engine keeps a reasoning part's
	// ModelResult.ReasoningData under ProviderMetadataKey (ReasoningDataOf reads it back); the stream never
	// carries it.
	ProviderMetadata json.RawMessage `json:"providerMetadata,omitempty"`
}

// ProviderMetadataKey is the key of agentloop's own entry in a part's providerMetadata (the AI SDK keys
// providerMetadata by provider name; this one names no provider and is read by the server only).
const ProviderMetadataKey = "agentloop"

// reasoningMetadata is agentloop's entry in a reasoning part's providerMetadata.
type reasoningMetadata struct {
	ReasoningData json.RawMessage `json:"reasoningData,omitempty"`
}

// WithReasoningData returns providerMetadata holding data (a step's ModelResult.ReasoningData).
func WithReasoningData(data json.RawMessage) json.RawMessage {
	b, err := json.Marshal(map[string]reasoningMetadata{ProviderMetadataKey: {ReasoningData: data}})
	if err != nil {
		return nil // data is not JSON: nothing the adapter could replay
	}
	return b
}

// ReasoningDataOf returns the ReasoningData a reasoning part keeps in its providerMetadata, nil when none.
func ReasoningDataOf(p Part) json.RawMessage {
	if len(p.ProviderMetadata) == 0 {
		return nil
	}
	var md map[string]reasoningMetadata
	if json.Unmarshal(p.ProviderMetadata, &md) != nil {
		return nil
	}
	return md[ProviderMetadataKey].ReasoningData
}

// PartApproval is the approval object on a tool part (AI SDK v6 tool approval).
type PartApproval struct {
	ID        string `json:"id"`
	Approved  *bool  `json:"approved,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Signature string `json:"signature,omitempty"`
}

// Tool part states (AI SDK v6).
const (
	StateInputStreaming    = "input-streaming"
	StateInputAvailable    = "input-available"
	StateApprovalRequested = "approval-requested"
	StateApprovalResponded = "approval-responded"
	StateOutputAvailable   = "output-available"
	StateOutputError       = "output-error"
	StateOutputDenied      = "output-denied"
)

// IsToolPart reports whether a part type is a tool invocation (static "tool-<name>" or "dynamic-tool").
func IsToolPart(typ string) bool {
	return typ == "dynamic-tool" || (len(typ) > 5 && typ[:5] == "tool-")
}

// Waiting reports whether p is a tool part without a result yet (its call waits for an execution, an approval
// or a client's output).
func (p Part) Waiting() bool {
	if !IsToolPart(p.Type) {
		return false
	}
	switch p.State {
	case StateOutputAvailable, StateOutputError, StateOutputDenied:
		return false
	}
	return true
}

// ToolNameOf returns the tool name of a tool part.
func (p Part) ToolNameOf() string {
	if p.Type == "dynamic-tool" {
		return p.ToolName
	}
	if IsToolPart(p.Type) {
		return p.Type[5:]
	}
	return ""
}

// DecodePart decodes the fields the engine understands.
func DecodePart(raw json.RawMessage) (Part, error) {
	var p Part
	err := json.Unmarshal(raw, &p)
	return p, err
}

// EncodePart encodes p; it cannot fail for values built from valid JSON.
func EncodePart(p Part) json.RawMessage {
	b, err := json.Marshal(p)
	if err != nil {
		panic("agent: encode part: " + err.Error())
	}
	return b
}

// Text returns the concatenated text parts of m.
func (m Message) Text() string {
	var s string
	for _, raw := range m.Parts {
		p, err := DecodePart(raw)
		if err == nil && p.Type == "text" {
			s += p.Text
		}
	}
	return s
}

// Meta decodes the server-authored metadata; unknown or invalid metadata yields the zero value.
func (m Message) Meta() MessageMetadata {
	var md MessageMetadata
	if len(m.Metadata) > 0 {
		_ = json.Unmarshal(m.Metadata, &md)
	}
	return md
}
