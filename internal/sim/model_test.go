package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/tools"
)

// The sim talks to the engine through an in-process scripted model rather than the offline OpenAI-compatible
// endpoint: the HTTP model streams on its own goroutines and its own timers, so where a stop, a crash or a
// reaper pass lands relative to a streaming reply would be up to the Go scheduler, not the seed. Here every
// model event is a handoff to the sim's scheduler, which decides what happens before the next one. The HTTP
// model and the openai adapter are covered by every other engine test.
type simModel struct{}

// stepScript is one model step: some text deltas, then tool calls.
type stepScript struct {
	deltas []string
	calls  []callScript
}

type callScript struct {
	tool string
	args string
}

// executes reports whether the engine runs the call on the server (client tools and tools that need approval
// end the run interrupted instead).
func (c callScript) executes() bool {
	switch c.tool {
	case "sim_effect", "add_note", "list_notes":
		return true
	}
	return false
}

func callID(proc, step, i int) string { return fmt.Sprintf("call_%d_%d_%d", proc, step, i) }

// newScript draws a model reply: up to four steps, the last without tool calls (or with a client tool or a tool
// that needs approval, which interrupts the run).
func newScript(r *rand.Rand, maxSteps int) []stepScript {
	n := 1 + r.IntN(3)
	if r.IntN(8) == 0 {
		n = maxSteps + 1 // runs into the step limit
	}
	var s []stepScript
	for i := 0; i < n; i++ {
		st := stepScript{}
		for range r.IntN(4) {
			st.deltas = append(st.deltas, fmt.Sprintf("w%d ", r.IntN(100)))
		}
		last := i == n-1
		if !last {
			for range 1 + r.IntN(2) {
				switch r.IntN(6) {
				case 0, 1, 2:
					st.calls = append(st.calls, callScript{"sim_effect", `{}`})
				case 3:
					st.calls = append(st.calls, callScript{"add_note", fmt.Sprintf(`{"text":"note %d"}`, r.IntN(1000))})
				case 4:
					st.calls = append(st.calls, callScript{"list_notes", `{}`})
				case 5:
					st.calls = append(st.calls, callScript{"sim_effect", `{}`})
				}
			}
		} else if r.IntN(6) == 0 {
			if r.IntN(2) == 0 {
				st.calls = append(st.calls, callScript{"ask_user_question", `{"question":"which?"}`})
			} else {
				st.calls = append(st.calls, callScript{"delete_note", `{"id":"note_nope"}`})
			}
		}
		if len(st.deltas) == 0 && len(st.calls) == 0 {
			st.deltas = []string{"ok"}
		}
		s = append(s, st)
	}
	return s
}

func (simModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	p := procOf(ctx)
	if p == nil {
		return agent.ModelResult{}, errors.New("sim: model called outside a process")
	}
	if err := validTranscript(req.Messages); err != nil {
		p.w.violate("valid-transcript", "%s: model request: %v", p.name, err)
	}
	var sc stepScript
	p.w.mu.Lock()
	idx := p.step
	p.w.mu.Unlock()
	if idx < len(p.script) {
		sc = p.script[idx]
	} else {
		sc = stepScript{deltas: []string{"done"}}
	}
	step := p.modelCalled(ctx, sc)
	var events []agent.ModelEvent
	for _, d := range sc.deltas {
		events = append(events, agent.ModelEvent{Type: agent.EventTextDelta, Delta: d})
	}
	for i, c := range sc.calls {
		id := callID(p.id, step, i)
		events = append(events,
			agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: id, ToolName: c.tool},
			agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: id, Delta: c.args},
			agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: id, ToolName: c.tool, Arguments: c.args})
	}
	endsLoop := step >= p.w.ecfg.MaxSteps-1
	interrupts := false
	executes := false
	for _, c := range sc.calls {
		if c.executes() {
			executes = true
		} else {
			interrupts = true
		}
	}
	if !executes || interrupts {
		endsLoop = true
	}
	usage := agent.Usage{InputTokens: int64(100 + step), OutputTokens: int64(len(events)), TotalTokens: int64(100 + step + len(events))}
	for i, ev := range events {
		// A handoff every other event keeps schedules short while leaving room between any two.
		if i%2 == 0 {
			if !p.parkModel(false) {
				return agent.ModelResult{}, errDead
			}
			if err := ctx.Err(); err != nil {
				return agent.ModelResult{}, err
			}
		}
		if err := emit(ev); err != nil {
			return agent.ModelResult{}, err
		}
	}
	// The step's last handoff: after it the engine waits for the user-message write (before it runs tools,
	// writes a draft or finishes), so the scheduler lets that write through first, as for the end of the loop.
	_ = endsLoop
	if !p.parkModel(true) {
		return agent.ModelResult{}, errDead
	}
	// Half the time a reply that was complete when the run was stopped is returned anyway (its last bytes were
	// already in flight), so the engine meets tool calls it must not start: "not executed".
	if err := ctx.Err(); err != nil && (p.id+step)%2 == 0 {
		return agent.ModelResult{}, err
	}
	reason := agent.FinishStop
	if len(sc.calls) > 0 {
		reason = agent.FinishToolCalls
	}
	return agent.ModelResult{FinishReason: reason, Usage: usage, Model: "sim-model"}, nil
}

func (p *proc) parkModel(endsLoop bool) bool {
	p.w.mu.Lock()
	p.nextEndsLoop = endsLoop
	p.w.mu.Unlock()
	return p.parkMain("model")
}

// validTranscript is the provider's rule (DESIGN principle 5): every assistant tool call is answered by exactly
// one tool message before the next non-tool message, and no tool message answers a call that was not made.
func validTranscript(msgs []agent.ModelMessage) error {
	pending := map[string]bool{}
	for i, m := range msgs {
		switch m.Role {
		case "tool":
			if !pending[m.ToolCallID] {
				return fmt.Errorf("message %d: tool result for %q answers no pending call", i, m.ToolCallID)
			}
			delete(pending, m.ToolCallID)
		default:
			if len(pending) > 0 {
				return fmt.Errorf("message %d (%s): calls without a result: %v", i, m.Role, pending)
			}
			for _, c := range m.ToolCalls {
				if pending[c.ID] {
					return fmt.Errorf("message %d: call %q twice", i, c.ID)
				}
				pending[c.ID] = true
			}
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("calls without a result at the end: %v", pending)
	}
	return nil
}

// simEffectNS is where the scripted server tool records its effect, keyed by the call's idempotency key.
func simEffectNS(owner string) string { return "simfx/" + owner }

// toolset is the demo tools over the process's store, plus a scripted server tool with an exactly-once effect,
// each server tool serialized by the process's turnstile.
func (w *world) toolset(p *proc) []agent.Tool {
	ts := tools.Demo(p.store, w.clock)
	ts = append(ts, agent.Tool{
		Name: "sim_effect", Description: "a side effect, applied once per call", Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			if b, err := p.store.GetValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey); err == nil {
				return b, nil
			} else if !agent.IsKind(err, agent.KindNotFound) {
				return nil, err
			}
			out, _ := json.Marshal(map[string]string{"effect": inv.IdempotencyKey})
			if err := p.store.PutValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey, out); err != nil {
				return nil, err
			}
			return out, nil
		},
		Recorded: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
			b, err := p.store.GetValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey)
			if agent.IsKind(err, agent.KindNotFound) {
				return nil, false, nil
			}
			return b, err == nil, err
		},
	})
	for i := range ts {
		if ts[i].Execute == nil || ts[i].Kind != agent.ToolServer {
			continue
		}
		exec := ts[i].Execute
		ts[i].Execute = func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			next := p.toolTurn(inv.ToolCallID)
			defer next()
			return exec(ctx, inv)
		}
	}
	return ts
}

// procOf finds the process of a call from its context (the sim tags the contexts it passes to Begin, Stream and
// the services; context.WithoutCancel keeps values, so the engine's detached contexts carry it too).
func procOf(ctx context.Context) *proc {
	p, _ := ctx.Value(procKey{}).(*proc)
	return p
}

type procKey struct{}
