package agent

import "time"

// Trigger says why a run started.
type Trigger string

const (
	TriggerUser         Trigger = "user"
	TriggerContinuation Trigger = "continuation" // tool outputs or approval answers on the newest assistant message
	TriggerSteer        Trigger = "steer"        // a sub-agent result delivered into an idle thread
	TriggerQueued       Trigger = "queued"       // a user message queued (multitask enqueue) answered once the thread freed
	TriggerRegenerate   Trigger = "regenerate"
	TriggerEdit         Trigger = "edit" // an earlier user message replaced; everything after it dropped
	// TriggerUnknown is the reaper's record of a run whose own run item was never written when it reaped the
	// run's claim (DynamoDB: ClaimRun's second write late or lost): why that run started is not known.
	TriggerUnknown Trigger = "unknown"
)

// RunStatus: running → completed | interrupted | canceled | failed.
type RunStatus string

const (
	RunRunning     RunStatus = "running"
	RunCompleted   RunStatus = "completed"
	RunInterrupted RunStatus = "interrupted" // waiting for approvals or client tool outputs
	RunCanceled    RunStatus = "canceled"
	RunFailed      RunStatus = "failed"
)

// Terminal reports whether s ends the run.
func (s RunStatus) Terminal() bool { return s != RunRunning && s != "" }

// MessageStatus is the status the run's assistant message records when the run ends with s ("" for running).
func (s RunStatus) MessageStatus() MessageStatus {
	switch s {
	case RunCompleted:
		return MessageCompleted
	case RunInterrupted:
		return MessageInterrupted
	case RunCanceled:
		return MessageCanceled
	case RunFailed:
		return MessageFailed
	}
	return ""
}

// RunStatus is the run outcome an assistant message's status records ("" for streaming or none).
func (s MessageStatus) RunStatus() RunStatus {
	switch s {
	case MessageCompleted:
		return RunCompleted
	case MessageInterrupted:
		return RunInterrupted
	case MessageCanceled:
		return RunCanceled
	case MessageFailed:
		return RunFailed
	}
	return ""
}

// RunError is the persisted outcome of a failed run.
type RunError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Run is one execution of the loop on a thread.
type Run struct {
	ID                 string    `json:"id"`
	ThreadID           string    `json:"threadId"`
	Trigger            Trigger   `json:"trigger"`
	Status             RunStatus `json:"status"`
	Error              *RunError `json:"error,omitempty"`
	Usage              Usage     `json:"usage"`
	Steps              int       `json:"steps"`
	Model              string    `json:"model,omitempty"`
	AssistantMessageID string    `json:"assistantMessageId"`
	// UserMessageID is the user message the run was claimed to write (ClaimRequest.UserMessageID), so that the
	// reaper can fence it (fence B). Stores whose message writes check the claim themselves (SQLite, fence F) need
	// not keep it: their GetRun may return it empty.
	UserMessageID string `json:"-"`
	// Takes are the ids of the queued messages the run noted (NoteTakes) before it stored them, so that the reaper
	// can fence them too (fence B). Like UserMessageID, a store whose writes check the claim may leave it empty.
	Takes []string `json:"-"`
	Epoch int64    `json:"epoch"`
	// FirstSeq and Reserved are the message positions the claim reserved for this run ([FirstSeq,
	// FirstSeq+Reserved)); the run's new messages take them, the assistant message the last one.
	FirstSeq   int64     `json:"-"`
	Reserved   int       `json:"-"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
	// Store is what the run cost the store (requests, capacity units), as recorded by FinishRun; nil for a run
	// that was reaped or recorded before it was measured. The FinishRun write itself is not in it.
	Store *StoreUsage `json:"store,omitempty"`
	// LateUsage is what the run spent after it lost its claim (reaped or fenced mid-step), recorded once by
	// RecordLateUsage and already included in Usage.
	LateUsage *Usage `json:"lateUsage,omitempty"`
	// Released is the usage the release of the run's claim added to the thread (FinishRun's first write, or a
	// ReleaseClaim naming the run): the store keeps it while the run is recorded as running, so that the reaper
	// can record it when the run's draft is no longer the run's (another run continued its reply after a crash
	// between DynamoDB's two FinishRun writes), and a store whose FinishRun is two writes returns it after the
	// outcome too while a reaper's claim names the run (a reaper that died after an orphan's outcome: the usage
	// is on the thread already). nil when none is kept (zero usage; SQLite once the run is finished: its
	// FinishRun is one transaction and never leaves an orphan).
	Released *Usage `json:"-"`
	// Signal is the run's completion signal (signal.go): given to FinishRun or RecordOutcome, it is stored
	// pending in the outcome's own write; read back, it says where the signal is. nil: the run has none.
	Signal *RunSignal `json:"-"`
}

// ClaimRequest asks the store to make RunID the active run of ThreadID.
type ClaimRequest struct {
	ThreadID string
	// Owner must own the thread: the claim's condition checks it, and another owner's thread is reported exactly
	// like a missing one (KindNotFound), so a turn needs no read before its claim.
	Owner              string
	RunID              string
	Trigger            Trigger
	AssistantMessageID string
	// UserMessageID, when the run writes a user message (a submitted or edited one), is its id: the run item
	// keeps it (Run.UserMessageID) so that the reaper can fence it before the run's write of it lands.
	UserMessageID string
	Now           time.Time
	// StaleAfter: an existing claim whose heartbeat is older than this is taken over. Zero or negative: never
	// (the caller reaps a stale claim first, so that the reaper's conditional release is the only reap decision).
	StaleAfter time.Duration
	// Reserve is how many message positions the claim reserves for the run (at least 1).
	Reserve int
}

// ClaimResult is the won claim. Previous is set when a stale claim was taken over; the caller must reap that run.
// Run.FirstSeq and Run.Reserved are the reserved message positions.
type ClaimResult struct {
	Run      Run
	Previous *Claim
	// Thread is the thread as the claim left it (settings, usage, the new claim and epoch).
	Thread Thread
}

// Fence is the run's fencing token for its writes.
func (r Run) Fence() Fence { return Fence{RunID: r.ID, Epoch: r.Epoch} }

// AssistantSeq is the position reserved for the run's assistant message (the last reserved one).
func (r Run) AssistantSeq() int64 { return r.FirstSeq + int64(max(r.Reserved, 1)) - 1 }
