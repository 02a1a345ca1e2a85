package agent

import "time"

// Trigger says why a run started.
type Trigger string

const (
	TriggerUser         Trigger = "user"
	TriggerContinuation Trigger = "continuation" // tool outputs or approval answers on the newest assistant message
	TriggerSteer        Trigger = "steer"        // a sub-agent result delivered into an idle thread
	TriggerRegenerate   Trigger = "regenerate"
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
	Epoch              int64     `json:"epoch"`
	CreatedAt          time.Time `json:"createdAt"`
	UpdatedAt          time.Time `json:"updatedAt"`
	FinishedAt         time.Time `json:"finishedAt,omitzero"`
}

// ClaimRequest asks the store to make RunID the active run of ThreadID.
type ClaimRequest struct {
	ThreadID           string
	RunID              string
	Trigger            Trigger
	AssistantMessageID string
	Now                time.Time
	// StaleAfter: an existing claim whose heartbeat is older than this is taken over.
	StaleAfter time.Duration
}

// ClaimResult is the won claim. Previous is set when a stale claim was taken over; the caller must reap that run.
type ClaimResult struct {
	Run      Run
	Previous *Claim
}
