package openairesponses

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// accumulator turns the events of one streamed response into agent events. Text and reasoning deltas are
// forwarded and forgotten (the engine alone assembles message parts). What is assembled here: each function
// call's arguments (the port promises one complete EventToolCall per call), and the reasoning items with their
// encrypted content (ModelResult.ReasoningData), kept as the provider sent them.
type accumulator struct {
	modelcall.Emitter // each event held back until the next is at hand (More), or Release

	model     string
	calls     []*call
	byItem    map[string]*call // output item id → call
	reasoning []json.RawMessage
	summaries int // reasoning summary parts begun: a later one is set apart by a blank line
	ended     *response
	failed    *streamFailure
}

type call struct {
	itemID string
	callID string
	name   string
	args   strings.Builder
	final  string // the whole arguments as the .done events gave them; authoritative over the fragments
	done   bool
}

// add folds one event in, emitting its deltas; an error from emit is returned as is. An event type the adapter
// does not know is ignored (the API adds types; the ones that carry what the port needs are listed here).
func (a *accumulator) add(ev *event) error {
	switch ev.Type {
	case "response.created", "response.in_progress":
		if ev.Response != nil && ev.Response.Model != "" {
			a.model = ev.Response.Model
		}
	case "response.output_text.delta", "response.refusal.delta":
		if ev.Delta != "" {
			return a.Send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: ev.Delta})
		}
	case "response.reasoning_summary_part.added":
		a.summaries++
		if a.summaries > 1 {
			return a.Send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: "\n\n"})
		}
	case "response.reasoning_summary_text.delta", "response.reasoning_text.delta":
		if ev.Delta != "" {
			return a.Send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: ev.Delta})
		}
	case "response.output_item.added":
		return a.itemAdded(ev.Item)
	case "response.function_call_arguments.delta":
		c := a.byItem[ev.ItemID]
		if c == nil || ev.Delta == "" {
			return nil
		}
		c.args.WriteString(ev.Delta)
		return a.Send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: c.callID, Delta: ev.Delta})
	case "response.function_call_arguments.done":
		if c := a.byItem[ev.ItemID]; c != nil {
			c.final, c.done = ev.Arguments, true
		}
	case "response.output_item.done":
		return a.itemDone(ev.Item)
	case "response.completed", "response.incomplete":
		if ev.Response != nil {
			a.ended = ev.Response
			if ev.Response.Model != "" {
				a.model = ev.Response.Model
			}
		} else {
			a.ended = &response{Status: strings.TrimPrefix(ev.Type, "response.")}
		}
	case "response.failed":
		f := &streamFailure{Event: ev.Type}
		if r := ev.Response; r != nil && r.Error != nil {
			f.Code, f.Message = r.Error.Code, r.Error.Message
		}
		a.failed = f
	case "error":
		a.failed = &streamFailure{Event: ev.Type, Code: openaiwire.CodeString(ev.Code), Message: ev.Message}
	}
	return nil
}

func (a *accumulator) itemAdded(raw json.RawMessage) error {
	var it outputItem
	if json.Unmarshal(raw, &it) != nil || it.Type != "function_call" {
		return nil
	}
	return a.announce(it)
}

// announce starts a function call: EventToolCallStart, and a delta for arguments the item already carries.
func (a *accumulator) announce(it outputItem) error {
	if it.CallID == "" || it.Name == "" || a.byItem[it.ID] != nil {
		return nil // a call without an id or a name cannot be run or answered: never announced
	}
	c := &call{itemID: it.ID, callID: it.CallID, name: it.Name}
	if a.byItem == nil {
		a.byItem = map[string]*call{}
	}
	a.byItem[it.ID] = c
	a.calls = append(a.calls, c)
	if err := a.Send(agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: c.callID, ToolName: c.name}); err != nil {
		return err
	}
	if it.Arguments == "" {
		return nil
	}
	c.args.WriteString(it.Arguments)
	return a.Send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: c.callID, Delta: it.Arguments})
}

func (a *accumulator) itemDone(raw json.RawMessage) error {
	var it outputItem
	if json.Unmarshal(raw, &it) != nil {
		return nil
	}
	switch it.Type {
	case "reasoning":
		// Kept only with its encrypted content: with store false, an item without it names nothing the
		// provider can find, and is refused when sent back.
		if it.EncryptedContent != "" {
			var buf bytes.Buffer
			if json.Compact(&buf, raw) == nil {
				a.reasoning = append(a.reasoning, buf.Bytes())
			}
		}
	case "function_call":
		c := a.byItem[it.ID]
		if c == nil {
			if err := a.announce(it); err != nil {
				return err
			}
			if c = a.byItem[it.ID]; c == nil {
				return nil
			}
		}
		c.final, c.done = it.Arguments, true
	}
	return nil
}

// finishCalls emits one EventToolCall per announced call, in the order the model made them, once the response
// has completed: only then are the arguments known to be whole.
func (a *accumulator) finishCalls() error {
	for _, c := range a.calls {
		args := c.args.String()
		if c.done {
			args = c.final
		}
		if strings.TrimSpace(args) == "" {
			args = "{}"
		}
		if err := a.Send(agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: c.callID, ToolName: c.name, Arguments: args}); err != nil {
			return err
		}
	}
	return nil
}

// reasoningData is the JSON array of the response's reasoning items, as received; nil when there are none.
func (a *accumulator) reasoningData() json.RawMessage {
	if len(a.reasoning) == 0 {
		return nil
	}
	b := []byte{'['}
	for i, r := range a.reasoning {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, r...)
	}
	return append(b, ']')
}

// result is how the response ended.
func (a *accumulator) result() agent.ModelResult {
	res := agent.ModelResult{Model: a.model, ReasoningData: a.reasoningData(), FinishReason: agent.FinishOther}
	r := a.ended
	if r == nil {
		return res
	}
	if u := r.Usage; u != nil {
		res.Usage = agent.Usage{
			InputTokens:       u.InputTokens,
			OutputTokens:      u.OutputTokens,
			TotalTokens:       u.TotalTokens,
			CachedInputTokens: u.InputTokensDetails.CachedTokens,
			ReasoningTokens:   u.OutputTokensDetails.ReasoningTokens,
		}
		if res.Usage.TotalTokens == 0 {
			res.Usage.TotalTokens = u.InputTokens + u.OutputTokens
		}
	}
	res.FinishReason = finishReason(r, len(a.calls) > 0)
	return res
}

// partial is how a failed response ended: what model it named before it failed.
func (a *accumulator) partial() agent.ModelResult {
	res := a.result()
	res.FinishReason = agent.FinishError
	return res
}

// finishReason maps a response's end to the AI SDK's names: an incomplete response by its reason (the output
// bound: length; the content filter), a completed one by whether it called tools.
func finishReason(r *response, calls bool) agent.FinishReason {
	switch r.Status {
	case "completed":
		if calls {
			return agent.FinishToolCalls
		}
		return agent.FinishStop
	case "incomplete":
		if r.IncompleteDetails != nil {
			switch r.IncompleteDetails.Reason {
			case "max_output_tokens":
				return agent.FinishLength
			case "content_filter":
				return agent.FinishContentFilter
			}
		}
	}
	return agent.FinishOther
}
