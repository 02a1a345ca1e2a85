package bedrockconverse

import (
	"encoding/json"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// accumulator turns stream events into agent events, keeping only what the result needs: each toolUse block's
// input, the reasoning blocks (for ReasoningData), usage and the stop reason.
type accumulator struct {
	emit    func(agent.ModelEvent) error
	emitted bool
	model   string
	stopped bool // messageStop arrived
	stop    types.StopReason
	usage   struct{ input, cacheRead, cacheWrite, output int64 }
	blocks  map[int32]*block
	order   []*block
}

type block struct {
	kind      string // "tool", "reasoning"
	id, name  string
	input     strings.Builder
	text      strings.Builder
	signature string
	redacted  []byte
}

func newAccumulator(emit func(agent.ModelEvent) error, model string) *accumulator {
	return &accumulator{emit: emit, model: model, blocks: map[int32]*block{}}
}

func (a *accumulator) send(ev agent.ModelEvent) error {
	a.emitted = true
	return a.emit(ev)
}

// open returns block index's, created as kind when it is new.
func (a *accumulator) open(index int32, kind string) *block {
	if b := a.blocks[index]; b != nil {
		return b
	}
	b := &block{kind: kind}
	a.blocks[index] = b
	a.order = append(a.order, b)
	return b
}

func (a *accumulator) add(ev types.ConverseStreamOutput) error {
	switch e := ev.(type) {
	case *types.ConverseStreamOutputMemberContentBlockStart:
		if tu, ok := e.Value.Start.(*types.ContentBlockStartMemberToolUse); ok {
			b := a.open(aws.ToInt32(e.Value.ContentBlockIndex), "tool")
			b.id, b.name = aws.ToString(tu.Value.ToolUseId), aws.ToString(tu.Value.Name)
			return a.send(agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: b.id, ToolName: b.name})
		}
	case *types.ConverseStreamOutputMemberContentBlockDelta:
		index := aws.ToInt32(e.Value.ContentBlockIndex)
		switch d := e.Value.Delta.(type) {
		case *types.ContentBlockDeltaMemberText:
			if d.Value != "" {
				return a.send(agent.ModelEvent{Type: agent.EventTextDelta, Delta: d.Value})
			}
		case *types.ContentBlockDeltaMemberReasoningContent:
			b := a.open(index, "reasoning")
			switch r := d.Value.(type) {
			case *types.ReasoningContentBlockDeltaMemberText:
				b.text.WriteString(r.Value)
				if r.Value != "" {
					return a.send(agent.ModelEvent{Type: agent.EventReasoningDelta, Delta: r.Value})
				}
			case *types.ReasoningContentBlockDeltaMemberSignature:
				b.signature += r.Value
			case *types.ReasoningContentBlockDeltaMemberRedactedContent:
				b.redacted = append(b.redacted, r.Value...)
			}
		case *types.ContentBlockDeltaMemberToolUse:
			b := a.blocks[index]
			if b == nil || b.kind != "tool" {
				return nil
			}
			frag := aws.ToString(d.Value.Input)
			b.input.WriteString(frag)
			if frag != "" {
				return a.send(agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: b.id, Delta: frag})
			}
		}
	case *types.ConverseStreamOutputMemberMessageStop:
		a.stop, a.stopped = e.Value.StopReason, true
	case *types.ConverseStreamOutputMemberMetadata:
		if u := e.Value.Usage; u != nil {
			a.usage.input, a.usage.output = int64(aws.ToInt32(u.InputTokens)), int64(aws.ToInt32(u.OutputTokens))
			a.usage.cacheRead, a.usage.cacheWrite = int64(aws.ToInt32(u.CacheReadInputTokens)), int64(aws.ToInt32(u.CacheWriteInputTokens))
		}
	}
	return nil
}

// finishCalls emits one EventToolCall per toolUse block, in order.
func (a *accumulator) finishCalls() error {
	for _, b := range a.order {
		if b.kind != "tool" {
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

// reasoningData is the reply's reasoning blocks as the model sent them, for replay; nil when it sent none.
func (a *accumulator) reasoningData() json.RawMessage {
	var st reasoningState
	for _, b := range a.order {
		if b.kind == "reasoning" {
			st.Converse = append(st.Converse, reasoningBlock{Text: b.text.String(), Signature: b.signature, Redacted: b.redacted})
		}
	}
	if len(st.Converse) == 0 {
		return nil
	}
	raw, _ := json.Marshal(st)
	return raw
}

func (a *accumulator) usageOf() agent.Usage {
	u := a.usage
	in := u.input + u.cacheRead + u.cacheWrite
	return agent.Usage{InputTokens: in, OutputTokens: u.output, TotalTokens: in + u.output,
		CachedInputTokens: u.cacheRead, CacheWriteTokens: u.cacheWrite}
}

// partial is the result of a failed attempt: what is known of model and usage.
func (a *accumulator) partial() agent.ModelResult {
	return agent.ModelResult{FinishReason: agent.FinishError, Usage: a.usageOf(), Model: a.model}
}

func (a *accumulator) result() agent.ModelResult {
	return agent.ModelResult{FinishReason: finishReason(a.stop), Usage: a.usageOf(), Model: a.model, ReasoningData: a.reasoningData()}
}

func finishReason(r types.StopReason) agent.FinishReason {
	switch r {
	case types.StopReasonEndTurn, types.StopReasonStopSequence:
		return agent.FinishStop
	case types.StopReasonToolUse:
		return agent.FinishToolCalls
	case types.StopReasonMaxTokens, types.StopReasonModelContextWindowExceeded:
		return agent.FinishLength
	case types.StopReasonContentFiltered, types.StopReasonGuardrailIntervened:
		return agent.FinishContentFilter
	}
	return agent.FinishOther
}
