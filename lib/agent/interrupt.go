package agent

import (
	"encoding/json"
	"time"
)

// InterruptKind: a human decision (approval) or a client-executed tool awaiting its output.
type InterruptKind string

const (
	InterruptApproval   InterruptKind = "approval"
	InterruptClientTool InterruptKind = "client_tool"
)

// InterruptStatus: pending → approved | denied | answered | expired | canceled.
type InterruptStatus string

const (
	InterruptPending  InterruptStatus = "pending"
	InterruptApproved InterruptStatus = "approved"
	InterruptDenied   InterruptStatus = "denied"
	InterruptAnswered InterruptStatus = "answered"
	InterruptExpired  InterruptStatus = "expired"
	InterruptCanceled InterruptStatus = "canceled"
)

// Interrupt is a pending human decision. ID is the approval id, or the tool call id for client tools. It is
// created insert-if-absent and resolved by compare-and-set from pending.
type Interrupt struct {
	ID         string          `json:"id"`
	ThreadID   string          `json:"threadId"`
	RunID      string          `json:"runId"`
	MessageID  string          `json:"messageId"`
	Kind       InterruptKind   `json:"kind"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Input      json.RawMessage `json:"input"`
	Signature  string          `json:"signature"`
	Status     InterruptStatus `json:"status"`
	Response   json.RawMessage `json:"response,omitempty"`
	CreatedAt  time.Time       `json:"createdAt"`
	ResolvedAt time.Time       `json:"resolvedAt,omitzero"`
}
