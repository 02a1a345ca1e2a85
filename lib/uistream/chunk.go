package uistream

import (
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// CodeInvalidChunk is the code of the error returned for a chunk that cannot be encoded: a required id is
// empty, a raw JSON value is malformed, a data chunk type lacks its "data-" prefix. It is always a bug in the
// caller, so the error kind is KindInternal.
const CodeInvalidChunk = agent.CodeInvalidChunk

// Chunk is one UI message stream chunk. The set is closed: only the types of this package implement it, and
// each emits only fields that both the ai@6 and the ai@7 client schemas declare.
type Chunk interface {
	// ChunkType is the chunk's wire "type", e.g. "text-delta" or "data-subagent-artifact".
	ChunkType() string
	// appendFields appends the chunk's fields after "type", each as `,"name":value`.
	appendFields(b []byte) ([]byte, error)
}

// Start opens a reply. MessageID is the assistant message id; a replayed or continued reply repeats it so the
// client updates the message it already shows instead of adding a second one.
type Start struct {
	MessageID string          // optional in the protocol, always set by agentloop
	Metadata  json.RawMessage // messageMetadata, omitted when empty
}

// StartStep opens one model step; the client adds a "step-start" part.
type StartStep struct{}

// FinishStep closes a step.
type FinishStep struct{}

// TextStart opens a text part identified by ID.
type TextStart struct{ ID string }

// TextDelta appends Delta to the open text part ID.
type TextDelta struct{ ID, Delta string }

// TextEnd closes the text part ID.
type TextEnd struct{ ID string }

// ReasoningStart opens a reasoning part identified by ID.
type ReasoningStart struct{ ID string }

// ReasoningDelta appends Delta to the open reasoning part ID.
type ReasoningDelta struct{ ID, Delta string }

// ReasoningEnd closes the reasoning part ID.
type ReasoningEnd struct{ ID string }

// ToolInputStart announces a tool call whose arguments will stream as ToolInputDelta chunks; the client adds a
// "tool-<ToolName>" part in state input-streaming.
type ToolInputStart struct{ ToolCallID, ToolName string }

// ToolInputDelta is a fragment of the tool call's arguments JSON.
type ToolInputDelta struct{ ToolCallID, InputTextDelta string }

// ToolInputAvailable carries the complete, parsed tool input (state input-available). An empty Input is sent
// as null.
type ToolInputAvailable struct {
	ToolCallID string
	ToolName   string
	Input      json.RawMessage
}

// ToolInputError reports tool arguments that could not be parsed or validated (state output-error). Input is
// the raw input as the model produced it, as a JSON value (e.g. a JSON string of the unparsable text).
type ToolInputError struct {
	ToolCallID string
	ToolName   string
	Input      json.RawMessage
	ErrorText  string
}

// ToolOutputAvailable carries the tool's result (state output-available). An empty Output is sent as null.
type ToolOutputAvailable struct {
	ToolCallID string
	Output     json.RawMessage
	// Preliminary marks an output the tool will replace (a partial result while it works): the client shows it
	// until the next output of the same call; the engine never stores it nor gives it to the model.
	Preliminary bool
}

// ToolOutputError reports a failed tool execution (state output-error).
type ToolOutputError struct{ ToolCallID, ErrorText string }

// ToolApprovalRequest asks the user to approve the tool call (state approval-requested). The client answers
// with an approval-responded part carrying ApprovalID. It has no signature field (REVIEW H1): ai@6 before
// 6.0.202 parses this chunk as a strict object and refuses any other field, and the server never reads the
// client's copy of a signature anyway; the signature stays on the stored part (GET /threads/{id}).
type ToolApprovalRequest struct{ ApprovalID, ToolCallID string }

// ToolOutputDenied marks a tool call whose approval was denied (state output-denied).
type ToolOutputDenied struct{ ToolCallID string }

// Data is a custom data part. Type must be "data-<name>". A later chunk with the same Type and ID replaces the
// data of the part already shown; a Transient chunk is delivered to the client's onData but not added to the
// message.
type Data struct {
	Type      string
	ID        string // optional
	Data      json.RawMessage
	Transient bool
}

// Error reports a failure in-band (after the first byte an HTTP status can no longer be sent). The client
// surfaces ErrorText through its onError; a Finish chunk still follows.
type Error struct{ ErrorText string }

// Finish closes the reply. FinishReason is empty or one of the reasons both SDK majors accept (stop, length,
// content-filter, tool-calls, error, other); Metadata is merged into the message's metadata.
type Finish struct {
	FinishReason agent.FinishReason
	Metadata     json.RawMessage
}

// MessageMetadata merges Metadata into the message's metadata mid-stream.
type MessageMetadata struct{ Metadata json.RawMessage }

func (Start) ChunkType() string               { return "start" }
func (StartStep) ChunkType() string           { return "start-step" }
func (FinishStep) ChunkType() string          { return "finish-step" }
func (TextStart) ChunkType() string           { return "text-start" }
func (TextDelta) ChunkType() string           { return "text-delta" }
func (TextEnd) ChunkType() string             { return "text-end" }
func (ReasoningStart) ChunkType() string      { return "reasoning-start" }
func (ReasoningDelta) ChunkType() string      { return "reasoning-delta" }
func (ReasoningEnd) ChunkType() string        { return "reasoning-end" }
func (ToolInputStart) ChunkType() string      { return "tool-input-start" }
func (ToolInputDelta) ChunkType() string      { return "tool-input-delta" }
func (ToolInputAvailable) ChunkType() string  { return "tool-input-available" }
func (ToolInputError) ChunkType() string      { return "tool-input-error" }
func (ToolOutputAvailable) ChunkType() string { return "tool-output-available" }
func (ToolOutputError) ChunkType() string     { return "tool-output-error" }
func (ToolApprovalRequest) ChunkType() string { return "tool-approval-request" }
func (ToolOutputDenied) ChunkType() string    { return "tool-output-denied" }
func (c Data) ChunkType() string              { return c.Type }
func (Error) ChunkType() string               { return "error" }
func (Finish) ChunkType() string              { return "finish" }
func (MessageMetadata) ChunkType() string     { return "message-metadata" }

func (c Start) appendFields(b []byte) ([]byte, error) {
	if c.MessageID != "" {
		b = appendStringField(b, "messageId", c.MessageID)
	}
	return appendOptionalRawField(b, c, "messageMetadata", c.Metadata)
}

func (StartStep) appendFields(b []byte) ([]byte, error)  { return b, nil }
func (FinishStep) appendFields(b []byte) ([]byte, error) { return b, nil }

func (c TextStart) appendFields(b []byte) ([]byte, error) {
	return appendID(b, c.ChunkType(), "id", c.ID)
}
func (c TextEnd) appendFields(b []byte) ([]byte, error) {
	return appendID(b, c.ChunkType(), "id", c.ID)
}
func (c TextDelta) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "id", c.ID)
	return appendStringField(b, "delta", c.Delta), err
}

func (c ReasoningStart) appendFields(b []byte) ([]byte, error) {
	return appendID(b, c.ChunkType(), "id", c.ID)
}
func (c ReasoningEnd) appendFields(b []byte) ([]byte, error) {
	return appendID(b, c.ChunkType(), "id", c.ID)
}
func (c ReasoningDelta) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "id", c.ID)
	return appendStringField(b, "delta", c.Delta), err
}

func (c ToolInputStart) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	if err != nil {
		return b, err
	}
	return appendID(b, c.ChunkType(), "toolName", c.ToolName)
}

func (c ToolInputDelta) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	return appendStringField(b, "inputTextDelta", c.InputTextDelta), err
}

func (c ToolInputAvailable) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	if err != nil {
		return b, err
	}
	if b, err = appendID(b, c.ChunkType(), "toolName", c.ToolName); err != nil {
		return b, err
	}
	return appendRawField(b, c, "input", c.Input)
}

func (c ToolInputError) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	if err != nil {
		return b, err
	}
	if b, err = appendID(b, c.ChunkType(), "toolName", c.ToolName); err != nil {
		return b, err
	}
	if b, err = appendRawField(b, c, "input", c.Input); err != nil {
		return b, err
	}
	return appendStringField(b, "errorText", c.ErrorText), nil
}

func (c ToolOutputAvailable) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	if err != nil {
		return b, err
	}
	b, err = appendRawField(b, c, "output", c.Output)
	if c.Preliminary {
		b = append(b, `,"preliminary":true`...)
	}
	return b, err
}

func (c ToolOutputError) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
	return appendStringField(b, "errorText", c.ErrorText), err
}

func (c ToolApprovalRequest) appendFields(b []byte) ([]byte, error) {
	b, err := appendID(b, c.ChunkType(), "approvalId", c.ApprovalID)
	if err != nil {
		return b, err
	}
	return appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
}

func (c ToolOutputDenied) appendFields(b []byte) ([]byte, error) {
	return appendID(b, c.ChunkType(), "toolCallId", c.ToolCallID)
}

func (c Data) appendFields(b []byte) ([]byte, error) {
	name, ok := strings.CutPrefix(c.Type, "data-")
	if !ok || name == "" {
		return b, agent.E(agent.KindInternal, CodeInvalidChunk, "data chunk type %q must be data-<name>", c.Type)
	}
	if c.ID != "" {
		b = appendStringField(b, "id", c.ID)
	}
	b, err := appendRawField(b, c, "data", c.Data)
	if c.Transient {
		b = append(b, `,"transient":true`...)
	}
	return b, err
}

func (c Error) appendFields(b []byte) ([]byte, error) {
	return appendStringField(b, "errorText", c.ErrorText), nil
}

func (c Finish) appendFields(b []byte) ([]byte, error) {
	if c.FinishReason != "" {
		if !sharedFinishReason(c.FinishReason) {
			return b, agent.E(agent.KindInternal, CodeInvalidChunk, "finish reason %q is not understood by every client", c.FinishReason)
		}
		b = appendStringField(b, "finishReason", string(c.FinishReason))
	}
	return appendOptionalRawField(b, c, "messageMetadata", c.Metadata)
}

func (c MessageMetadata) appendFields(b []byte) ([]byte, error) {
	if len(c.Metadata) == 0 {
		return b, invalid(c.ChunkType(), "messageMetadata")
	}
	return appendRawField(b, c, "messageMetadata", c.Metadata)
}

// sharedFinishReason reports whether both ai@6 and ai@7 accept r (ai@7 adds "interrupted", ai@6 rejects it).
func sharedFinishReason(r agent.FinishReason) bool {
	switch r {
	case agent.FinishStop, agent.FinishLength, agent.FinishContentFilter, agent.FinishToolCalls,
		agent.FinishError, agent.FinishOther:
		return true
	}
	return false
}

func invalid(typ, field string) error {
	return agent.E(agent.KindInternal, CodeInvalidChunk, "%s chunk: %s is required", typ, field)
}

// appendID appends a required, non-empty string field of a chunk of type typ (a type name, not the chunk: a
// chunk passed as an interface would escape to the heap, once per streamed word).
func appendID(b []byte, typ, name, value string) ([]byte, error) {
	if value == "" {
		return b, invalid(typ, name)
	}
	return appendStringField(b, name, value), nil
}

func appendStringField(b []byte, name, value string) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	return appendString(b, value)
}

// appendRawField appends a required JSON value; empty means null.
func appendRawField(b []byte, c Chunk, name string, raw json.RawMessage) ([]byte, error) {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, '"', ':')
	if len(raw) == 0 {
		return append(b, "null"...), nil
	}
	out, err := appendCompactJSON(b, raw)
	if err != nil {
		return b, agent.Wrap(err, agent.KindInternal, CodeInvalidChunk, c.ChunkType()+" chunk: "+name+" is not valid JSON")
	}
	return out, nil
}

// appendOptionalRawField appends a JSON value unless it is empty.
func appendOptionalRawField(b []byte, c Chunk, name string, raw json.RawMessage) ([]byte, error) {
	if len(raw) == 0 {
		return b, nil
	}
	return appendRawField(b, c, name, raw)
}
