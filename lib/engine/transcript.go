package engine

import (
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// buildTranscript turns the stored UI messages (plus the draft assistant message of the run in flight) into the
// provider-neutral transcript. Every tool call gets exactly one result (principle 5): a call without one gets a
// synthesized result. The oldest turns are pruned to stay within budget bytes; the transcript always starts at a
// user message so no tool result is separated from its call.
func buildTranscript(history []agent.MessageRecord, draft *agent.Message, budget int) []agent.ModelMessage {
	var turns [][]agent.ModelMessage // one entry per stored message
	for _, r := range history {
		turns = append(turns, convert(r.Message, false))
	}
	if draft != nil && len(draft.Parts) > 0 {
		turns = append(turns, convert(*draft, true))
	}
	// Prune whole messages from the front, then skip to the first user message.
	size := 0
	sizes := make([]int, len(turns))
	for i, msgs := range turns {
		for _, m := range msgs {
			sizes[i] += len(m.Text)
			for _, c := range m.ToolCalls {
				sizes[i] += len(c.Arguments) + len(c.Name)
			}
		}
		size += sizes[i]
	}
	start := 0
	for size > budget && start < len(turns)-1 {
		size -= sizes[start]
		start++
	}
	var out []agent.ModelMessage
	for _, msgs := range turns[start:] {
		out = append(out, msgs...)
	}
	for len(out) > 1 && out[0].Role != "user" {
		out = out[1:]
	}
	return out
}

// convert maps one UI message. inFlight marks the draft of the running turn, whose calls all have results by
// the time the model sees them.
func convert(m agent.Message, inFlight bool) []agent.ModelMessage {
	switch m.Role {
	case agent.RoleUser:
		var b strings.Builder
		for _, raw := range m.Parts {
			p, err := agent.DecodePart(raw)
			if err != nil {
				continue
			}
			if p.Type == "text" {
				if b.Len() > 0 {
					b.WriteString("\n")
				}
				b.WriteString(p.Text)
			}
		}
		return []agent.ModelMessage{{Role: "user", Text: b.String()}}
	case agent.RoleAssistant:
		var out []agent.ModelMessage
		var cur agent.ModelMessage
		var results []agent.ModelMessage
		flush := func() {
			if cur.Text != "" || len(cur.ToolCalls) > 0 {
				cur.Role = "assistant"
				out = append(out, cur)
				out = append(out, results...)
			}
			cur, results = agent.ModelMessage{}, nil
		}
		for _, raw := range m.Parts {
			p, err := agent.DecodePart(raw)
			if err != nil {
				continue
			}
			switch {
			case p.Type == "step-start":
				flush()
			case p.Type == "text":
				cur.Text += p.Text
			case agent.IsToolPart(p.Type):
				args := "{}"
				if len(p.Input) > 0 {
					args = string(p.Input)
				}
				cur.ToolCalls = append(cur.ToolCalls, agent.ToolCall{ID: p.ToolCallID, Name: p.ToolNameOf(), Arguments: args})
				results = append(results, agent.ModelMessage{Role: "tool", ToolCallID: p.ToolCallID, Text: resultText(p)})
			}
		}
		flush()
		return out
	}
	return nil
}

// resultText is what the model sees as the result of a tool part.
func resultText(p agent.Part) string {
	switch p.State {
	case agent.StateOutputAvailable:
		var s string
		if json.Unmarshal(p.Output, &s) == nil {
			return s
		}
		return string(p.Output)
	case agent.StateOutputError:
		return "Error: " + p.ErrorText
	case agent.StateOutputDenied:
		return "The user denied this tool call."
	default:
		return "No result: the tool call was not completed."
	}
}

// synthesizeMissingResults gives every tool part without a result an output-error, so a finished message never
// holds an orphan call.
func synthesizeMissingResults(parts []json.RawMessage, status string) []json.RawMessage {
	out := make([]json.RawMessage, len(parts))
	for i, raw := range parts {
		out[i] = raw
		p, err := agent.DecodePart(raw)
		if err != nil || !agent.IsToolPart(p.Type) {
			continue
		}
		switch p.State {
		case agent.StateOutputAvailable, agent.StateOutputError, agent.StateOutputDenied:
			continue
		}
		p.State = agent.StateOutputError
		p.ErrorText = "Not executed: the run was " + status + "."
		p.Approval = nil
		out[i] = agent.EncodePart(p)
	}
	return out
}
