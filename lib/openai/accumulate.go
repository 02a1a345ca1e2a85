package openai

import (
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	oai "github.com/openai/openai-go/v3"
)

// accumulator emits the deltas of one streamed completion and assembles its result. Only choice 0 is read: the
// adapter never asks for more than one.
type accumulator struct {
	emit    func(agent.ModelEvent) error
	ids     agent.IDs
	emitted bool // at least one event went out: the attempt can no longer be retried

	model     string
	text      strings.Builder
	reasoning strings.Builder
	calls     []*toolCall
	byIndex   map[int64]int // provider tool call index → position in calls
	finish    string
	usage     agent.Usage
}

type toolCall struct {
	id, name string
	args     strings.Builder
	started  bool // the start event went out
}

// reasoningFields are the delta fields in which OpenAI-compatible providers stream reasoning text.
var reasoningFields = [...]string{"reasoning_content", "reasoning"}

func (a *accumulator) send(ev agent.ModelEvent) error {
	a.emitted = true
	return a.emit(ev)
}

// add folds one chunk in, emitting its deltas; an error from emit is returned as is.
func (a *accumulator) add(c oai.ChatCompletionChunk) error {
	if c.Model != "" {
		a.model = c.Model
	}
	if c.JSON.Usage.Valid() {
		u := c.Usage
		a.usage = agent.Usage{
			InputTokens:       u.PromptTokens,
			OutputTokens:      u.CompletionTokens,
			TotalTokens:       u.TotalTokens,
			CachedInputTokens: u.PromptTokensDetails.CachedTokens,
		}
		if a.usage.TotalTokens == 0 {
			a.usage.TotalTokens = u.PromptTokens + u.CompletionTokens
		}
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		if err := a.delta(ch.Delta); err != nil {
			return err
		}
		if ch.FinishReason != "" {
			a.finish = ch.FinishReason
		}
	}
	return nil
}

func (a *accumulator) delta(d oai.ChatCompletionChunkChoiceDelta) error {
	for _, name := range reasoningFields {
		f, ok := d.JSON.ExtraFields[name]
		if !ok {
			continue
		}
		var s string
		if raw := f.Raw(); raw != "" && raw != "null" && json.Unmarshal([]byte(raw), &s) == nil && s != "" {
			a.reasoning.WriteString(s)
			if err := a.send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: s}); err != nil {
				return err
			}
		}
	}
	for _, s := range [...]string{d.Content, d.Refusal} {
		if s == "" {
			continue
		}
		a.text.WriteString(s)
		if err := a.send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: s}); err != nil {
			return err
		}
	}
	for _, tc := range d.ToolCalls {
		if err := a.toolDelta(tc); err != nil {
			return err
		}
	}
	return nil
}

func (a *accumulator) toolDelta(tc oai.ChatCompletionChunkChoiceDeltaToolCall) error {
	if a.byIndex == nil {
		a.byIndex = map[int64]int{}
	}
	pos, ok := a.byIndex[tc.Index]
	if !ok {
		pos = len(a.calls)
		a.byIndex[tc.Index] = pos
		a.calls = append(a.calls, &toolCall{})
	}
	call := a.calls[pos]
	if call.id == "" {
		call.id = tc.ID
	}
	if !call.started {
		call.name += tc.Function.Name
	}
	call.args.WriteString(tc.Function.Arguments)
	if call.started {
		if tc.Function.Arguments == "" {
			return nil
		}
		return a.send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolIndex: pos, ToolCallID: call.id, Delta: tc.Function.Arguments})
	}
	if call.name == "" {
		return nil // arguments before the name: keep them until the name arrives
	}
	if call.id == "" {
		call.id = a.ids.New("call")
	}
	call.started = true
	if err := a.send(agent.ModelEvent{Type: agent.EventToolCallStart, ToolIndex: pos, ToolCallID: call.id, ToolName: call.name}); err != nil {
		return err
	}
	if call.args.Len() == 0 {
		return nil
	}
	return a.send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolIndex: pos, ToolCallID: call.id, Delta: call.args.String()})
}

// result assembles the finished completion.
func (a *accumulator) result() agent.ModelResult {
	res := agent.ModelResult{
		Text:         a.text.String(),
		Reasoning:    a.reasoning.String(),
		FinishReason: finishReason(a.finish),
		Usage:        a.usage,
		Model:        a.model,
	}
	for _, c := range a.calls {
		if !c.started {
			continue // a call that never got a name cannot be run; it was never announced either
		}
		args := c.args.String()
		if strings.TrimSpace(args) == "" {
			args = "{}"
		}
		res.ToolCalls = append(res.ToolCalls, agent.ToolCall{ID: c.id, Name: c.name, Arguments: args})
	}
	return res
}

// partial is what was assembled before the stream failed.
func (a *accumulator) partial() agent.ModelResult {
	res := a.result()
	res.FinishReason = agent.FinishError
	return res
}

func finishReason(s string) agent.FinishReason {
	switch s {
	case "stop":
		return agent.FinishStop
	case "length":
		return agent.FinishLength
	case "tool_calls", "function_call":
		return agent.FinishToolCalls
	case "content_filter":
		return agent.FinishContentFilter
	default:
		return agent.FinishOther
	}
}
