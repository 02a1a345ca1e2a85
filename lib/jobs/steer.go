package jobs

import (
	"encoding/json"

	"github.com/agentloop/agentloop/lib/agent"
)

// SteerMeta is the steer message's metadata.subagentResult: the UI renders such a message as a sub-agent result
// card, never as something the user said.
type SteerMeta struct {
	JobID      string `json:"jobId"`
	Kind       string `json:"kind"`
	ToolCallID string `json:"toolCallId"`
	Status     string `json:"status"` // "done" or "error"
}

// Artifact is the data-subagent-artifact part's data: what the UI renders (the model reads the text part only).
type Artifact struct {
	Kind   string          `json:"kind"`
	JobID  string          `json:"jobId"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Steer builds the steer message that delivers a finished job into its thread: user role (UIMessage roles are
// fixed), id steer_<jobId> (so a re-delivery converges on the same message), a text part for the model and a
// data-subagent-artifact part for the UI. A failure gets a failure text.
func (r Registry) Steer(j agent.Job) agent.Message {
	status, text := "done", ""
	switch k, ok := r[j.Kind]; {
	case j.Failed():
		status = "error"
		text = "The " + j.Kind + " job failed: " + j.Error + "\n\nContinue with what you can establish and tell the user what could not be done."
	case ok && k.SteerText != nil:
		text = k.SteerText(j.Result)
	default:
		text = "The " + j.Kind + " job finished. Its result: " + string(j.Result)
	}
	md := map[string]any{"subagentResult": SteerMeta{JobID: j.ID, Kind: j.Kind, ToolCallID: j.ToolCallID, Status: status}}
	if j.Usage != (agent.Usage{}) {
		// The sub-agent's usage (agent.MessageMetadata.Usage): the turn that delivers the steer counts it.
		md["usage"] = j.Usage
	}
	meta, _ := json.Marshal(md)
	textPart := agent.EncodePart(agent.Part{Type: "text", Text: text})
	art := Artifact{Kind: j.Kind, JobID: j.ID, Error: j.Error}
	if !j.Failed() {
		art.Result = j.Result
	}
	data, _ := json.Marshal(map[string]any{"type": "data-subagent-artifact", "id": j.ID, "data": art})
	return agent.Message{ID: agent.SteerMessageID(j.ID), Role: agent.RoleUser, Parts: []json.RawMessage{textPart, data}, Metadata: meta}
}
