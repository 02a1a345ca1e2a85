package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/toolschema"
)

// scriptedModel answers each request with the next of its steps: tool calls (name and raw arguments), or, past
// the last step, a text that ends the turn. It keeps every request.
type scriptedModel struct {
	mu    sync.Mutex
	steps [][]agent.ToolCall
	reqs  []agent.ModelRequest
}

func (m *scriptedModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	m.mu.Lock()
	n := len(m.reqs)
	m.reqs = append(m.reqs, req)
	m.mu.Unlock()
	usage := agent.Usage{InputTokens: 1, OutputTokens: 1, TotalTokens: 2}
	if n >= len(m.steps) {
		if err := emit(agent.ModelEvent{Type: agent.EventTextDelta, Delta: "done"}); err != nil {
			return agent.ModelResult{}, err
		}
		return agent.ModelResult{FinishReason: agent.FinishStop, Usage: usage}, nil
	}
	for _, c := range m.steps[n] {
		for _, ev := range []agent.ModelEvent{{Type: agent.EventToolCallStart, ToolCallID: c.ID, ToolName: c.Name},
			{Type: agent.EventToolCall, ToolCallID: c.ID, ToolName: c.Name, Arguments: c.Arguments}} {
			if err := emit(ev); err != nil {
				return agent.ModelResult{}, err
			}
		}
	}
	return agent.ModelResult{FinishReason: agent.FinishToolCalls, Usage: usage}, nil
}

func (m *scriptedModel) requests() []agent.ModelRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]agent.ModelRequest(nil), m.reqs...)
}

// toolResultText is the text the model read for the tool call id in req.
func toolResultText(req agent.ModelRequest, callID string) string {
	for _, m := range req.Messages {
		if m.Role == "tool" && m.ToolCallID == callID {
			return m.Text
		}
	}
	return ""
}

// countingTool is a server tool that keeps the inputs it ran with.
type countingTool struct {
	mu     sync.Mutex
	inputs []string
}

func (c *countingTool) tool(name string) agent.Tool {
	return agent.Tool{Name: name, Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"},"count":{"type":"integer","minimum":1}},"required":["text"],"additionalProperties":false}`),
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			c.mu.Lock()
			c.inputs = append(c.inputs, string(inv.Input))
			c.mu.Unlock()
			return json.RawMessage(`{"ok":true}`), nil
		}}
}

func (c *countingTool) ran() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.inputs...)
}

// Issue 19 item 4: every call's input is checked before the tool runs. Malformed JSON is repaired once and the
// tool runs with the repaired input; input the schema refuses never runs, the model reads the violation (the
// field and the rule, nothing internal) and its second try runs; the run completes.
func TestToolInputsCheckedBeforeExecute(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		steps [][]agent.ToolCall
		ran   []string
		// refused maps a call id to the error text the model reads (after "Error: ") and the transcript stores.
		refused map[string]string
	}{
		{name: "valid", steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{"text":"a"}`}}}, ran: []string{`{"text":"a"}`}},
		{name: "malformed JSON repaired once", steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{'text': 'a', count: 2,}`}}},
			ran: []string{`{"text": "a", "count": 2}`}},
		{name: "invalid input refused, the second try runs",
			steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{"text":7,"count":0}`}}, {{ID: "c2", Name: "echo", Arguments: `{"text":"7","count":1}`}}},
			ran:   []string{`{"text":"7","count":1}`},
			refused: map[string]string{"c1": `invalid_tool_input: input does not match the tool's schema: at "/count": minimum: got 0, want 1 (minimum); ` +
				`at "/text": got number, want string (type)`}},
		{name: "repaired but still invalid is refused", steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{"count": 3,}`}}},
			refused: map[string]string{"c1": `invalid_tool_input: input was not valid JSON; repaired, it does not match the tool's schema: at "": missing property 'text' (required)`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			echo := &countingTool{}
			tools := []agent.Tool{echo.tool("echo")}
			inputs, err := toolschema.New(tools...)
			if err != nil {
				t.Fatal(err)
			}
			model := &scriptedModel{steps: tc.steps}
			eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: tools, Inputs: inputs, Reaper: f.stack.Reaper,
				Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
			tr, err := eng.Begin(context.Background(), submit("th", "u1", "go"))
			if err != nil {
				t.Fatal(err)
			}
			if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
				t.Fatalf("run %s %+v", run.Status, run.Error)
			}
			if got := echo.ran(); strings.Join(got, "|") != strings.Join(tc.ran, "|") {
				t.Errorf("the tool ran with %q, want %q", got, tc.ran)
			}
			reqs := model.requests()
			if len(reqs) != len(tc.steps)+1 {
				t.Fatalf("%d model requests, want %d", len(reqs), len(tc.steps)+1)
			}
			for id, want := range tc.refused {
				if got := toolResultText(reqs[len(reqs)-1], id); got != "Error: "+want {
					t.Errorf("the model read for %s:\n%s\nwant\n%s", id, got, want)
				}
			}
			// The stored transcript holds the input that was acted on (repaired), and the refusal.
			msgs := f.messages(t, "th")
			last := msgs[len(msgs)-1]
			for _, p := range last.Parts {
				var part agent.Part
				if err := json.Unmarshal(p, &part); err != nil || part.ToolCallID == "" {
					continue
				}
				if want, ok := tc.refused[part.ToolCallID]; ok && (part.State != agent.StateOutputError || part.ErrorText != want) {
					t.Errorf("stored %s: %s %q", part.ToolCallID, part.State, part.ErrorText)
				}
				if !json.Valid(part.Input) {
					t.Errorf("stored input of %s is not JSON: %s", part.ToolCallID, part.Input)
				}
			}
		})
	}
}

// staticSource is an agent.ToolSource over a fixed list (or a failure).
type staticSource struct {
	name  string
	tools []agent.Tool
	err   error
}

func (s staticSource) Name() string { return s.name }
func (s staticSource) Tools(context.Context) ([]agent.Tool, error) {
	return s.tools, s.err
}

// Issue 19: tools from sources that are not Go code reach the model and run through the same checks; a source
// that fails leaves only its own tools out, and a tool whose name is taken is not offered twice.
func TestToolSources(t *testing.T) {
	t.Parallel()
	f := setup(t)
	goTool, remote := &countingTool{}, &countingTool{}
	tools := []agent.Tool{goTool.tool("local")}
	inputs, err := toolschema.New(tools...)
	if err != nil {
		t.Fatal(err)
	}
	sources := []agent.ToolSource{
		staticSource{name: "down", err: errors.New("connection refused")},
		staticSource{name: "remote", tools: []agent.Tool{remote.tool("remote__echo"), remote.tool("local")}},
	}
	model := &scriptedModel{steps: [][]agent.ToolCall{{{ID: "c1", Name: "remote__echo", Arguments: `{"text":1}`}},
		{{ID: "c2", Name: "remote__echo", Arguments: `{"text":"1"}`}, {ID: "c3", Name: "local", Arguments: `{"text":"2"}`}}}}
	var logs syncBuffer
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: tools, Sources: sources, Inputs: inputs, Reaper: f.stack.Reaper,
		Signer: f.stack.Signer, Clock: f.clock, Logger: slog.New(slog.NewJSONHandler(&logs, nil))}, f.eng.Config())
	tr, err := eng.Begin(context.Background(), submit("th", "u1", "go"))
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	var offered []string
	for _, s := range model.requests()[0].Tools {
		offered = append(offered, s.Name)
	}
	if strings.Join(offered, ",") != "local,remote__echo" {
		t.Errorf("offered %v", offered)
	}
	if got := remote.ran(); len(got) != 1 || got[0] != `{"text":"1"}` {
		t.Errorf("the source's tool ran with %q", got)
	}
	if got := goTool.ran(); len(got) != 1 {
		t.Errorf("the Go tool ran with %q (a source's tool of the same name must not replace it)", got)
	}
	logs.mu.Lock()
	log := logs.buf.String()
	logs.mu.Unlock()
	for _, want := range []string{`"source":"down","outcome":"unavailable"`, `"source":"remote","outcome":"name_taken","tool":"local"`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %s:\n%s", want, log)
		}
	}
}
