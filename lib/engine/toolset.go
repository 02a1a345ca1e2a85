package engine

import (
	"context"
	"encoding/json"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// toolset is the tools one turn offers: the engine's Go tools and what its sources listed when the turn began.
type toolset struct {
	byName map[string]agent.Tool
	specs  []agent.ToolSpec
	// extra is what the sources' specs add to every request's fixed cost (transcript.Fixed), in tokens.
	extra int
}

func newToolset(tools []agent.Tool) *toolset {
	ts := &toolset{byName: make(map[string]agent.Tool, len(tools))}
	for _, t := range tools {
		ts.byName[t.Name] = t
		ts.specs = append(ts.specs, t.Spec())
	}
	return ts
}

// turnTools is the toolset of a turn that begins now: the Go tools, and each source's tools (agent.ToolSource).
// A source that fails, or offers a tool whose name is taken, loses those tools for the turn, and the log says so;
// the turn goes on.
func (e *Engine) turnTools(ctx context.Context, s *stepper) *toolset {
	if len(e.sources) == 0 {
		return e.static
	}
	ts := &toolset{byName: make(map[string]agent.Tool, len(e.static.byName)), specs: append([]agent.ToolSpec(nil), e.static.specs...)}
	for name, t := range e.static.byName {
		ts.byName[name] = t
	}
	var added []agent.ToolSpec
	for _, src := range e.sources {
		tools, err := src.Tools(ctx)
		if err != nil {
			s.log.WarnContext(s.logCtx, "agent.tool_source", "source", src.Name(), "outcome", "unavailable", "err", err.Error())
			continue
		}
		for _, t := range tools {
			if _, taken := ts.byName[t.Name]; taken {
				s.log.WarnContext(s.logCtx, "agent.tool_source", "source", src.Name(), "outcome", "name_taken", "tool", t.Name)
				continue
			}
			ts.byName[t.Name] = t
			added = append(added, t.Spec())
		}
	}
	ts.specs = append(ts.specs, added...)
	ts.extra = transcript.Fixed("", added)
	return ts
}

// checkInput is the one check every tool call's arguments pass before anything acts on them (Deps.Inputs):
// the input to record and act on, and the refusal the model reads when it is not acceptable. Without a checker
// (or for an unknown tool) only JSON is required. Empty arguments are an empty object.
func (e *Engine) checkInput(tool agent.Tool, known bool, arguments string) (json.RawMessage, error) {
	if e.inputs != nil && known {
		return e.inputs.CheckInput(tool, arguments)
	}
	input := json.RawMessage(arguments)
	if len(input) == 0 {
		return json.RawMessage(`{}`), nil
	}
	if !json.Valid(input) {
		return nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "tool input is not valid JSON")
	}
	return input, nil
}
