package anthropic

import (
	"encoding/json"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
)

// accumulator turns stream events into agent events, keeping only what the result needs: each tool_use block's
// input, the thinking blocks (for ReasoningData), usage, the stop reason and the model.
type accumulator struct {
	emit    func(agent.ModelEvent) error
	emitted bool
	pending *agent.ModelEvent // the newest event, held until the next one or until the adapter waits (release)
	model   string
	stopped bool // message_stop arrived
	stop    string
	usage   struct{ input, cacheRead, cacheWrite, output, thinking int64 }
	blocks  map[int]*streamBlock // open and closed blocks by index
	order   []*streamBlock
}

// streamBlock is a content block of the reply, as it arrives.
type streamBlock struct {
	typ       string
	id, name  string
	input     strings.Builder
	thinking  strings.Builder
	signature string
	data      string // redacted_thinking
}

func newAccumulator(emit func(agent.ModelEvent) error, model string) *accumulator {
	return &accumulator{emit: emit, model: model, blocks: map[int]*streamBlock{}}
}

// send emits the event held before ev, saying More (ev is at hand), and holds ev.
func (a *accumulator) send(ev agent.ModelEvent) error {
	a.emitted = true
	if p := a.pending; p != nil {
		p.More = true
		if err := a.emit(*p); err != nil {
			a.pending = nil
			return err
		}
		*p = ev
		return nil
	}
	a.pending = &ev
	return nil
}

// release emits the event held, if any, without More: the adapter is about to wait on the provider, or done.
func (a *accumulator) release() error {
	p := a.pending
	if p == nil {
		return nil
	}
	a.pending = nil
	return a.emit(*p)
}

func (a *accumulator) add(ev *event) error {
	switch ev.Type {
	case "message_start":
		if ev.Message == nil {
			return nil
		}
		if ev.Message.Model != "" {
			a.model = ev.Message.Model
		}
		u := ev.Message.Usage
		set(&a.usage.input, u.InputTokens)
		set(&a.usage.cacheRead, u.CacheReadInputTokens)
		set(&a.usage.cacheWrite, u.CacheCreationInputTokens)
		set(&a.usage.output, u.OutputTokens)
	case "content_block_start":
		cb := ev.ContentBlock
		if cb == nil {
			return nil
		}
		b := &streamBlock{typ: cb.Type, id: cb.ID, name: cb.Name, signature: cb.Signature, data: cb.Data}
		b.thinking.WriteString(cb.Thinking)
		a.blocks[ev.Index] = b
		a.order = append(a.order, b)
		switch cb.Type {
		case "tool_use":
			return a.send(agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: cb.ID, ToolName: cb.Name})
		case "text":
			if cb.Text != "" {
				return a.send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: cb.Text})
			}
		case "thinking":
			if cb.Thinking != "" {
				return a.send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: cb.Thinking})
			}
		}
	case "content_block_delta":
		b := a.blocks[ev.Index]
		d := ev.Delta
		if d == nil {
			return nil
		}
		switch d.Type {
		case "text_delta":
			if d.Text != "" {
				return a.send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: d.Text})
			}
		case "thinking_delta":
			if b != nil {
				b.thinking.WriteString(d.Thinking)
			}
			if d.Thinking != "" {
				return a.send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: d.Thinking})
			}
		case "signature_delta":
			if b != nil {
				b.signature += d.Signature
			}
		case "input_json_delta":
			if b == nil || b.typ != "tool_use" {
				return nil
			}
			b.input.WriteString(d.PartialJSON)
			if d.PartialJSON != "" {
				return a.send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: b.id, Delta: d.PartialJSON})
			}
		}
	case "message_delta":
		if ev.Delta != nil && ev.Delta.StopReason != "" {
			a.stop = ev.Delta.StopReason
		}
		// message_delta's usage is cumulative; the input counts are present only when they changed.
		if u := ev.Usage; u != nil {
			set(&a.usage.output, u.OutputTokens)
			if u.OutputTokensDetails != nil {
				a.usage.thinking = u.OutputTokensDetails.ThinkingTokens
			}
			setPositive(&a.usage.input, u.InputTokens)
			setPositive(&a.usage.cacheRead, u.CacheReadInputTokens)
			setPositive(&a.usage.cacheWrite, u.CacheCreationInputTokens)
		}
	case "message_stop":
		a.stopped = true
	case "error":
		e := &streamError{Type: "error"}
		if ev.Error != nil {
			e.Type, e.Message = ev.Error.Type, ev.Error.Message
		}
		return e
	}
	return nil
}

// set stores a count that is present.
func set(dst *int64, v *int64) {
	if v != nil {
		*dst = *v
	}
}

// setPositive stores a count that is present and above zero.
func setPositive(dst *int64, v *int64) {
	if v != nil && *v > 0 {
		*dst = *v
	}
}

// finishCalls emits one EventToolCall per tool_use block, in order.
func (a *accumulator) finishCalls() error {
	for _, b := range a.order {
		if b.typ != "tool_use" {
			continue
		}
		args := strings.TrimSpace(b.input.String())
		if args == "" {
			args = "{}"
		}
		if err := a.send(agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: b.id, ToolName: b.name, Arguments: args}); err != nil {
			return err
		}
	}
	return nil
}

// reasoningData is the message's thinking and redacted_thinking blocks as Anthropic sent them, for replay; nil
// when it sent none.
func (a *accumulator) reasoningData() json.RawMessage {
	var out []map[string]string
	for _, b := range a.order {
		switch b.typ {
		case "thinking":
			out = append(out, map[string]string{"type": "thinking", "thinking": b.thinking.String(), "signature": b.signature})
		case "redacted_thinking":
			out = append(out, map[string]string{"type": "redacted_thinking", "data": b.data})
		}
	}
	if len(out) == 0 {
		return nil
	}
	raw, _ := json.Marshal(out)
	return raw
}

func (a *accumulator) usageOf() agent.Usage {
	u := a.usage
	in := u.input + u.cacheRead + u.cacheWrite
	return agent.Usage{InputTokens: in, OutputTokens: u.output, TotalTokens: in + u.output,
		CachedInputTokens: u.cacheRead, CacheWriteTokens: u.cacheWrite, ReasoningTokens: u.thinking}
}

// partial is the result of a failed attempt: what is known of model and usage.
func (a *accumulator) partial() agent.ModelResult {
	return agent.ModelResult{FinishReason: agent.FinishError, Usage: a.usageOf(), Model: a.model}
}

func (a *accumulator) result() agent.ModelResult {
	return agent.ModelResult{FinishReason: finishReason(a.stop), Usage: a.usageOf(), Model: a.model, ReasoningData: a.reasoningData()}
}

func finishReason(r string) agent.FinishReason {
	switch r {
	case "end_turn", "stop_sequence", "pause_turn":
		return agent.FinishStop
	case "max_tokens", "model_context_window_exceeded":
		return agent.FinishLength
	case "tool_use":
		return agent.FinishToolCalls
	case "refusal":
		return agent.FinishContentFilter
	}
	return agent.FinishOther
}
