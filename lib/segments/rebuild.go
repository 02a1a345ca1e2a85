package segments

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Rebuild reassembles the assistant message parts a stream carried (text, reasoning, step starts, tool calls
// and their results), so that a reply whose message write never happened can be recovered from its segments.
// Frames it cannot parse end the rebuild there (a crashed writer may leave nothing worse than a missing tail,
// since segments hold whole frames). base holds the parts the stream continues (a continuation run goes on
// with the message an earlier run stored; its chunks name those parts' tool calls); nil for a new message.
func Rebuild(base []agent.Part, data []byte) []agent.Part {
	parts := slices.Clone(base)
	chunks, _, err := uistream.ParseFrames(data)
	if err != nil && len(chunks) == 0 {
		return parts
	}
	open := map[string]*strings.Builder{} // text and reasoning ids being streamed
	index := map[string]int{}             // part index of a text/reasoning id or a tool call id
	for i, p := range parts {
		if p.ToolCallID != "" {
			index[p.ToolCallID] = i
		}
	}
	for _, raw := range chunks {
		var c struct {
			Type           string          `json:"type"`
			ID             string          `json:"id"`
			Delta          string          `json:"delta"`
			ToolCallID     string          `json:"toolCallId"`
			ToolName       string          `json:"toolName"`
			Input          json.RawMessage `json:"input"`
			Output         json.RawMessage `json:"output"`
			ErrorText      string          `json:"errorText"`
			InputTextDelta string          `json:"inputTextDelta"`
			ApprovalID     string          `json:"approvalId"`
			Signature      string          `json:"signature"`
		}
		if json.Unmarshal(raw, &c) != nil {
			break
		}
		switch c.Type {
		case "start-step":
			parts = append(parts, agent.Part{Type: "step-start"})
		case "text-start", "reasoning-start":
			typ := strings.TrimSuffix(c.Type, "-start")
			open[c.ID] = &strings.Builder{}
			index[c.ID] = len(parts)
			parts = append(parts, agent.Part{Type: typ, State: "streaming"})
		case "text-delta", "reasoning-delta":
			if b := open[c.ID]; b != nil {
				b.WriteString(c.Delta)
				parts[index[c.ID]].Text = b.String()
			}
		case "text-end", "reasoning-end":
			if _, ok := open[c.ID]; ok {
				parts[index[c.ID]].State = "done"
				delete(open, c.ID)
			}
		case "tool-input-available":
			index[c.ToolCallID] = len(parts)
			parts = append(parts, agent.Part{Type: "tool-" + c.ToolName, ToolCallID: c.ToolCallID,
				State: agent.StateInputAvailable, Input: c.Input})
		case "tool-output-available":
			if i, ok := index[c.ToolCallID]; ok {
				parts[i].State, parts[i].Output = agent.StateOutputAvailable, c.Output
			}
		case "tool-output-error":
			if i, ok := index[c.ToolCallID]; ok {
				parts[i].State, parts[i].ErrorText = agent.StateOutputError, c.ErrorText
			}
		case "tool-approval-request":
			if i, ok := index[c.ToolCallID]; ok {
				parts[i].State, parts[i].Approval = agent.StateApprovalRequested, &agent.PartApproval{ID: c.ApprovalID, Signature: c.Signature}
			}
		case "tool-output-denied":
			if i, ok := index[c.ToolCallID]; ok {
				no := false
				parts[i].State = agent.StateOutputDenied
				if parts[i].Approval != nil {
					parts[i].Approval.Approved = &no
				}
			}
		}
	}
	return parts
}
