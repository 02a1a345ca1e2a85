package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// toolset is the tools one turn offers: the engine's Go tools and what its sources listed when the turn began.
type toolset struct {
	byName map[string]agent.Tool
	specs  []agent.ToolSpec
	// catalog, when the engine has a router (Deps.Router), chooses which of specs each step offers.
	catalog agent.ToolCatalog
	// extra is what the sources' specs (and the note on unavailable ones) add to every request's fixed cost
	// (transcript.Fixed), in tokens.
	extra int
	// unavailable names the sources that failed to list their tools when the turn began.
	unavailable []string
}

// system is the turn's system prompt: base, and, when a source failed, a line that tells the model which tools
// it lacks this turn, so a reply that needs them says so instead of pretending they do not exist. Only the
// source's name: its error stays in the log (a client or model never sees internal text).
func (ts *toolset) system(base string) string {
	if len(ts.unavailable) == 0 {
		return base
	}
	note := unavailableNote(ts.unavailable)
	if base == "" {
		return note
	}
	return base + "\n\n" + note
}

func unavailableNote(sources []string) string {
	return "The tools of " + strings.Join(sources, ", ") + " are unavailable for this reply: their server could not be reached. " +
		"If the user asks for something that needs them, say that those tools are unavailable right now."
}

func newToolset(tools []agent.Tool, router agent.ToolRouter) *toolset {
	ts := &toolset{byName: make(map[string]agent.Tool, len(tools))}
	for _, t := range tools {
		ts.byName[t.Name] = t
		ts.specs = append(ts.specs, t.Spec())
	}
	if router != nil {
		ts.catalog = router.Catalog(tools)
	}
	return ts
}

// turnTools is the toolset of a turn that begins now: the Go tools, and each source's tools (agent.ToolSource).
// A source that fails, or offers a tool whose name is taken, loses those tools for the turn, and the log says so;
// the turn goes on (a failed source also told to the model: toolset.system).
func (e *Engine) turnTools(ctx context.Context, s *stepper) *toolset {
	if len(e.sources) == 0 {
		return e.static
	}
	ts := &toolset{byName: make(map[string]agent.Tool, len(e.static.byName)), specs: append([]agent.ToolSpec(nil), e.static.specs...)}
	for name, t := range e.static.byName {
		ts.byName[name] = t
	}
	var added []agent.ToolSpec
	var list []agent.Tool // the catalog in specs' order, for the router
	if e.router != nil {
		list = make([]agent.Tool, 0, len(ts.specs))
		for _, spec := range ts.specs {
			list = append(list, ts.byName[spec.Name])
		}
	}
	for _, src := range e.sources {
		tools, err := src.Tools(ctx)
		if err != nil {
			s.log.WarnContext(s.logCtx, "agent.tool_source", "source", src.Name(), "outcome", "unavailable", "err", err.Error())
			ts.unavailable = append(ts.unavailable, src.Name())
			continue
		}
		for _, t := range tools {
			if _, taken := ts.byName[t.Name]; taken {
				s.log.WarnContext(s.logCtx, "agent.tool_source", "source", src.Name(), "outcome", "name_taken", "tool", t.Name)
				continue
			}
			ts.byName[t.Name] = t
			added = append(added, t.Spec())
			if e.router != nil {
				list = append(list, t)
			}
		}
	}
	ts.specs = append(ts.specs, added...)
	note := ""
	if len(ts.unavailable) > 0 {
		note = unavailableNote(ts.unavailable)
	}
	ts.extra = transcript.Fixed(note, added)
	if e.router != nil {
		ts.catalog = e.router.Catalog(list)
	}
	return ts
}

// offer is what one step offers the model: every tool of the turn, or what the router chose for the step
// (Deps.Router), which the log says (agent.tools_offered: the step, the catalog's size and the names offered).
// The transcript's fixed cost (toolset.extra) still counts the whole catalog: an estimate that errs high.
func (s *stepper) offer(ctx context.Context, step int) []agent.ToolSpec {
	if s.tools.catalog == nil {
		return s.tools.specs
	}
	if s.query == nil {
		s.query = routeQuery(s.turn.plan.history)
	}
	q := *s.query
	for _, p := range s.parts { // this run's own calls so far
		if name := p.ToolNameOf(); name != "" && !slices.Contains(q.Used, name) {
			q.Used = append(slices.Clip(q.Used), name)
		}
	}
	specs, routed := s.tools.catalog.Offer(ctx, q)
	if routed {
		names := make([]string, len(specs))
		for i, spec := range specs {
			names[i] = spec.Name
		}
		s.log.InfoContext(s.logCtx, "agent.tools_offered", "step", step, "catalog", len(s.tools.specs), "offered", names)
	}
	return specs
}

// routedExtra is what the sources' tools add to the turn's requests' fixed cost: all of them (toolset.extra),
// or, with a router, those its first step offers; a later step differs only by the tools the run calls, a few
// specs the estimate leaves out. Counting every tool of a catalog of hundreds would leave its history no room.
func (s *stepper) routedExtra(ctx context.Context) int {
	if s.tools.catalog == nil || s.tools.extra == 0 {
		return s.tools.extra
	}
	if s.query == nil {
		s.query = routeQuery(s.turn.plan.history)
	}
	offered, routed := s.tools.catalog.Offer(ctx, *s.query)
	if !routed {
		return s.tools.extra
	}
	var added []agent.ToolSpec
	for _, spec := range offered {
		if _, static := s.turn.e.static.byName[spec.Name]; !static {
			added = append(added, spec)
		}
	}
	return transcript.Fixed("", added)
}

// routeQuery is what a router reads of a turn's history: the newest user text, and the tools called in it.
func routeQuery(history []agent.Message) *agent.ToolQuery {
	q := &agent.ToolQuery{}
	for i := len(history) - 1; i >= 0; i-- {
		if history[i].Role == agent.RoleUser {
			q.Text = history[i].Text()
			break
		}
	}
	for _, m := range history {
		if m.Role != agent.RoleAssistant {
			continue
		}
		for _, raw := range m.Parts {
			if !bytes.Contains(raw, []byte(`"tool-`)) && !bytes.Contains(raw, []byte(`"dynamic-tool"`)) {
				continue // most parts are no tool call: skip their decoding
			}
			if p, err := agent.DecodePart(raw); err == nil {
				if name := p.ToolNameOf(); name != "" && !slices.Contains(q.Used, name) {
					q.Used = append(q.Used, name)
				}
			}
		}
	}
	return q
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
