package agent

import (
	"context"
	"encoding/json"
	"strings"
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
	InterruptAnswered InterruptStatus = "answered" // a client tool's output was posted
	InterruptExpired  InterruptStatus = "expired"  // nobody answered within the expiry age
	InterruptCanceled InterruptStatus = "canceled" // the run that asked died, or a new message was sent instead
)

// DefaultInterruptTTL is how long a pending interrupt waits for its answer (DESIGN "Human in the loop").
const DefaultInterruptTTL = 24 * time.Hour

// DefaultResolvedInterruptKeep is how long a resolved interrupt stays in its thread after its resolution (a retried
// answer is recognised within it), after which the store removes it, so a thread's interrupt reads grow with its
// recent questions, not with all it ever asked (REVIEW S7).
const DefaultResolvedInterruptKeep = 24 * time.Hour

// Interrupt is a pending human decision. ID is the approval id the client sees (for a client tool, the client
// answers by tool call id and the ID stays internal); it is derived from the thread, the run and the tool call,
// so a retried insert converges and a deterministic model repeating a call id in a later run gets a new one.
// Created insert-if-absent; resolved by compare-and-set from pending.
type Interrupt struct {
	ID         string          `json:"id"`
	ThreadID   string          `json:"threadId"`
	RunID      string          `json:"runId"`
	Epoch      int64           `json:"epoch"`     // the asking run's epoch
	MessageID  string          `json:"messageId"` // the assistant message holding the tool call
	Kind       InterruptKind   `json:"kind"`
	ToolCallID string          `json:"toolCallId"`
	ToolName   string          `json:"toolName"`
	Input      json.RawMessage `json:"input"`
	// Signature is the AI SDK v7 approval signature over (ID, ToolCallID, ToolName, Input).
	Signature string          `json:"signature"`
	Status    InterruptStatus `json:"status"`
	// Response is the resolution's payload: {"approved":bool,"reason":string} for approvals, the tool part's
	// {"output":...} or {"errorText":...} for client tools; empty while pending.
	Response   json.RawMessage `json:"response,omitempty"`
	CreatedAt  time.Time       `json:"createdAt"`
	ExpiresAt  time.Time       `json:"expiresAt"`
	ResolvedAt time.Time       `json:"resolvedAt,omitzero"`
}

// Pending reports whether in still waits for an answer at now (a pending interrupt past ExpiresAt is expired,
// whether or not that has been written yet).
func (in Interrupt) Pending(now time.Time) bool {
	return in.Status == InterruptPending && now.Before(in.ExpiresAt)
}

// InterruptStore keeps interrupts, one item each, keyed by (ThreadID, MessageID, ID): an interrupt is found by the
// message that asks it, so what a turn, a view or the reaper reads grows with that message's questions, not with
// all the thread ever asked (REVIEW S7). An ID is unique within its thread (callers derive it from the thread, the
// run and the call) and holds no '#'. DeleteThread removes a thread's interrupts with everything else under it.
type InterruptStore interface {
	// CreateInterrupt inserts in (Status must be pending) if no interrupt with (in.ThreadID, in.ID) exists (the
	// same ID asked by another message is the caller's error, which the stores need not detect). It
	// returns the stored interrupt and whether this call created it; an existing one is returned unchanged (a
	// retried insert whose first attempt applied converges). Unknown or tombstoned thread: KindNotFound.
	CreateInterrupt(ctx context.Context, in Interrupt) (Interrupt, bool, error)
	// GetInterrupt: unknown id (or one asked by another message) is KindNotFound/CodeInterruptNotFound.
	GetInterrupt(ctx context.Context, threadID, messageID, id string) (Interrupt, error)
	// ListMessageInterrupts returns the interrupts asked by message messageID of the thread, oldest first (ties by
	// id), every status. It reads that message's interrupts only: its cost does not grow with the interrupts of
	// the thread's other messages. Unknown thread or message: none.
	ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]Interrupt, error)
	// ListInterrupts returns the thread's interrupts, oldest first (ties by id), every status: the whole history,
	// for checks and tests (no turn, view or reaper reads it; they read one message's). A resolved interrupt is
	// kept at least DefaultResolvedInterruptKeep after its ResolvedAt and removed after that: SQLite by the
	// thread's next resolve, DynamoDB by the table's TTL (within days of it).
	ListInterrupts(ctx context.Context, threadID string) ([]Interrupt, error)
	// ResolveInterrupt moves the interrupt from pending to req.Status (any status but pending) with req.Response
	// and ResolvedAt = req.Now, by compare-and-set on status = pending. It returns the interrupt as stored after
	// the call. When the stored status is no longer pending it changes nothing and returns the stored interrupt
	// together with KindConflict/CodeAlreadyResolved (so a caller can tell an identical repeat, or its own
	// retried write whose answer was lost, from a conflicting answer). Unknown id (or one asked by another
	// message): KindNotFound.
	ResolveInterrupt(ctx context.Context, req ResolveRequest) (Interrupt, error)
	// ListExpiredInterrupts returns up to limit (<= 0: DefaultListLimit) pending interrupts whose ExpiresAt is
	// before before, across all threads, in no promised order: the reaper's work list. It reads an index of
	// pending interrupts, never a scan; the index only nominates (callers resolve by compare-and-set).
	ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) ([]Interrupt, error)
}

// Resolve is the request that resolves in as status at now (no response: set one on the result).
func (in Interrupt) Resolve(status InterruptStatus, now time.Time) ResolveRequest {
	return ResolveRequest{ThreadID: in.ThreadID, MessageID: in.MessageID, ID: in.ID, Status: status, Now: now}
}

// ResolveRequest is one compare-and-set from pending.
type ResolveRequest struct {
	ThreadID  string
	MessageID string // the message that asked it (Interrupt.MessageID): part of its key
	ID        string
	Status    InterruptStatus
	Response  json.RawMessage
	Now       time.Time
}

// Check refuses an interrupt no store keeps (both stores answer the same input with the same code).
func (in Interrupt) Check() error {
	switch {
	case in.ThreadID == "":
		return E(KindInvalid, CodeInvalidThreadID, "interrupt needs a thread id")
	case in.ID == "" || strings.Contains(in.ID, "#"):
		return E(KindInvalid, CodeInvalidMessage, "interrupt needs an id without '#'")
	case in.MessageID == "":
		return E(KindInvalid, CodeInvalidMessage, "interrupt %s needs the id of the message that asks it", in.ID)
	case in.Kind != InterruptApproval && in.Kind != InterruptClientTool:
		return E(KindInvalid, CodeInvalidMessage, "interrupt %s: unknown kind %q", in.ID, in.Kind)
	case in.Status != InterruptPending:
		return E(KindInvalid, CodeInvalidStatus, "interrupt %s is created pending, not %q", in.ID, in.Status)
	case len(in.Response) > 0 || !in.ResolvedAt.IsZero():
		return E(KindInvalid, CodeInvalidStatus, "interrupt %s is created pending, with no resolution", in.ID)
	case len(in.Input) > 0 && !json.Valid(in.Input):
		return E(KindInvalid, CodeInvalidMessage, "interrupt %s: input is not valid JSON", in.ID)
	}
	return nil
}

// Check refuses a resolution no store applies.
func (r ResolveRequest) Check() error {
	switch r.Status {
	case InterruptApproved, InterruptDenied, InterruptAnswered, InterruptExpired, InterruptCanceled:
	default:
		return E(KindInvalid, CodeInvalidStatus, "interrupt %s cannot be resolved as %q", r.ID, r.Status)
	}
	switch {
	case r.ThreadID == "":
		return E(KindInvalid, CodeInvalidThreadID, "resolve needs a thread id")
	case r.ID == "":
		return E(KindInvalid, CodeInvalidMessage, "resolve needs an interrupt id")
	case r.MessageID == "":
		return E(KindInvalid, CodeInvalidMessage, "resolve of %s needs the id of the message that asked it", r.ID)
	case len(r.Response) > 0 && !json.Valid(r.Response):
		return E(KindInvalid, CodeInvalidMessage, "interrupt %s: response is not valid JSON", r.ID)
	}
	return nil
}
