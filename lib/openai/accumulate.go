package openai

import (
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
)

// accumulator turns the chunks of one streamed completion into agent events. Data flows one way (DESIGN "Models
// and tools"): text and reasoning deltas are forwarded and forgotten, since the engine alone assembles message
// parts. The only thing assembled here is each tool call's arguments, because the port promises one complete
// EventToolCall per call. Only choice 0 is read: the adapter never asks for more than one.
type accumulator struct {
	modelcall.Emitter // each event held back until the next is at hand (More), or Release
	ids               agent.IDs

	model   string
	calls   []*toolCall
	byIndex map[int64]*toolCall // provider tool call index → the newest call at that index
	finish  string
	usage   agent.Usage
}

type toolCall struct {
	id      string
	name    string
	args    strings.Builder // fragments appended as they arrive: linear, whatever the number of fragments
	started bool            // the start event went out
}

// add folds one chunk in, emitting its deltas; an error from emit is returned as is.
func (a *accumulator) add(c chunk) error {
	if c.Model != "" {
		a.model = c.Model
	}
	if u := c.Usage; u != nil {
		a.usage = agent.Usage{
			InputTokens:       int64(u.PromptTokens),
			OutputTokens:      int64(u.CompletionTokens),
			TotalTokens:       int64(u.TotalTokens),
			CachedInputTokens: int64(u.PromptTokensDetails.CachedTokens),
			ReasoningTokens:   int64(u.CompletionTokensDetails.ReasoningTokens),
		}
		if a.usage.TotalTokens == 0 {
			a.usage.TotalTokens = int64(u.PromptTokens + u.CompletionTokens)
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

func (a *accumulator) delta(d chunkDelta) error {
	for _, raw := range [...]json.RawMessage{d.ReasoningContent, d.Reasoning} {
		if len(raw) == 0 || string(raw) == "null" {
			continue // s below escapes to the heap: only for a chunk that has reasoning
		}
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			if err := a.Send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: s}); err != nil {
				return err
			}
		}
	}
	for _, s := range [...]string{d.Content, d.Refusal} {
		if s == "" {
			continue
		}
		if err := a.Send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: s}); err != nil {
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

// toolDelta folds one tool call fragment in. Calls are told apart by index, as OpenAI streams them; a fragment
// that names a different id at an index already in use starts a new call, because some compatible servers
// (older Ollama and Gemini's compatibility layer) send every parallel call at index 0.
func (a *accumulator) toolDelta(tc chunkToolCall) error {
	if a.byIndex == nil {
		a.byIndex = map[int64]*toolCall{}
	}
	idx := int64(tc.Index)
	call := a.byIndex[idx]
	if call == nil || (tc.ID != "" && call.id != "" && tc.ID != call.id) {
		call = &toolCall{}
		a.byIndex[idx] = call
		a.calls = append(a.calls, call)
	}
	if call.id == "" {
		call.id = tc.ID
	}
	if !call.started {
		call.name += tc.Function.Name // names come whole in practice; only fragments before the start are joined
	}
	call.args.WriteString(tc.Function.Arguments)
	if call.started {
		if tc.Function.Arguments == "" {
			return nil
		}
		return a.Send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: call.id, Delta: tc.Function.Arguments})
	}
	if call.name == "" {
		return nil // arguments before the name: keep them until the name arrives
	}
	if call.id == "" {
		call.id = a.ids.New("call")
	}
	call.started = true
	if err := a.Send(agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: call.id, ToolName: call.name}); err != nil {
		return err
	}
	if call.args.Len() == 0 {
		return nil
	}
	return a.Send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: call.id, Delta: call.args.String()})
}

// finishCalls emits one EventToolCall per announced call, in the order the model made them. It runs once the
// stream has ended with a finish reason: only then are the arguments known to be whole.
func (a *accumulator) finishCalls() error {
	for _, c := range a.calls {
		if !c.started {
			continue // a call that never got a name cannot be run; it was never announced either
		}
		args := c.args.String()
		if strings.TrimSpace(args) == "" {
			args = "{}" // providers send no fragments for a call without arguments; "" is not JSON
		}
		if err := a.Send(agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: c.id, ToolName: c.name, Arguments: args}); err != nil {
			return err
		}
	}
	return nil
}

// result is how the completion ended.
func (a *accumulator) result() agent.ModelResult {
	return agent.ModelResult{FinishReason: finishReason(a.finish), Usage: a.usage, Model: a.model}
}

// partial is how a failed completion ended: what usage and model it reported before it failed.
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
