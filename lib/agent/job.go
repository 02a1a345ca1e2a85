package agent

import (
	"encoding/json"
	"time"
)

// JobStatus: running → done | error. A job becomes done/error only after its result was delivered.
type JobStatus string

const (
	JobRunning JobStatus = "running"
	JobDone    JobStatus = "done"
	JobError   JobStatus = "error"
)

// Job is an async sub-agent task. ID is derived from thread id + tool call id so a retried dispatch converges.
type Job struct {
	ID             string          `json:"id"`
	ThreadID       string          `json:"threadId"`
	Kind           string          `json:"kind"`
	ToolCallID     string          `json:"toolCallId"`
	Input          json.RawMessage `json:"input,omitempty"`
	Status         JobStatus       `json:"status"`
	Activity       string          `json:"activity,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	SteerDelivered bool            `json:"steerDelivered"`
	Execution      string          `json:"execution,omitempty"`
	CreatedAt      time.Time       `json:"createdAt"`
	UpdatedAt      time.Time       `json:"updatedAt"`
}
