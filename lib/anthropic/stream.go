package anthropic

import (
	"encoding/json"
	"strings"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/agentloop/agentloop/lib/agent"
)

// accumulator turns stream events into agent events, keeping only what the result needs: each tool_use block's
// input, the thinking blocks (for ReasoningData), usage, the stop reason and the model.
type accumulator struct {
	emit    func(agent.ModelEvent) error
	emitted bool
	model   string
	stopped bool // message_stop arrived
	stop    sdk.StopReason
	usage   struct{ input, cacheRead, cacheWrite, output, thinking int64 }
	blocks  map[int64]*block // open and closed blocks by index
	order   []*block
}

type block struct {
	typ       string
	id, name  string
	input     strings.Builder
	thinking  strings.Builder
	signature string
	data      string // redacted_thinking
}

func newAccumulator(emit func(agent.ModelEvent) error, model string) *accumulator {
	return &accumulator{emit: emit, model: model, blocks: map[int64]*block{}}
}

func (a *accumulator) send(ev agent.ModelEvent) error {
	a.emitted = true
	return a.emit(ev)
}

func (a *accumulator) add(ev sdk.MessageStreamEventUnion) error {
	switch ev.Type {
	case "message_start":
		if ev.Message.Model != "" {
			a.model = string(ev.Message.Model)
		}
		u := ev.Message.Usage
		a.usage.input, a.usage.cacheRead, a.usage.cacheWrite, a.usage.output =
			u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens, u.OutputTokens
	case "content_block_start":
		cb := ev.ContentBlock
		b := &block{typ: cb.Type, id: cb.ID, name: cb.Name, signature: cb.Signature, data: cb.Data}
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
		if ev.Delta.StopReason != "" {
			a.stop = ev.Delta.StopReason
		}
		// message_delta's usage is cumulative; input counts are present only when they changed.
		u := ev.Usage
		if u.JSON.OutputTokens.Valid() {
			a.usage.output = u.OutputTokens
		}
		if u.JSON.OutputTokensDetails.Valid() {
			a.usage.thinking = u.OutputTokensDetails.ThinkingTokens
		}
		if u.JSON.InputTokens.Valid() && u.InputTokens > 0 {
			a.usage.input = u.InputTokens
		}
		if u.JSON.CacheReadInputTokens.Valid() && u.CacheReadInputTokens > 0 {
			a.usage.cacheRead = u.CacheReadInputTokens
		}
		if u.JSON.CacheCreationInputTokens.Valid() && u.CacheCreationInputTokens > 0 {
			a.usage.cacheWrite = u.CacheCreationInputTokens
		}
	case "message_stop":
		a.stopped = true
	}
	return nil
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

func finishReason(r sdk.StopReason) agent.FinishReason {
	switch r {
	case sdk.StopReasonEndTurn, sdk.StopReasonStopSequence, sdk.StopReasonPauseTurn:
		return agent.FinishStop
	case sdk.StopReasonMaxTokens, sdk.StopReasonModelContextWindowExceeded:
		return agent.FinishLength
	case sdk.StopReasonToolUse:
		return agent.FinishToolCalls
	case sdk.StopReasonRefusal:
		return agent.FinishContentFilter
	}
	return agent.FinishOther
}
