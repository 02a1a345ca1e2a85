package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httptools"
	"github.com/agentloop/agentloop/lib/mcptools"
	"github.com/agentloop/agentloop/lib/toolschema"
	"github.com/agentloop/agentloop/lib/toolsfile"
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

// echoSchema is the schema of the echo tool of every kind (inputKinds).
const echoSchema = `{"type":"object","properties":{"text":{"type":"string"},"count":{"type":"integer","minimum":1}},"required":["text"],"additionalProperties":false}`

// inputKind is the echo tool as one kind of tool: its name, the engine's Go tools and sources that offer it, and
// the inputs it ran with (as the Go function, the MCP server or the HTTP backend received them, compact JSON).
type inputKind struct {
	name    string
	tools   []agent.Tool
	sources []agent.ToolSource
	ran     func() []string
}

// inputKinds builds the echo tool as a Go tool, as an MCP server's (the Go SDK's own server in-process over
// Streamable HTTP, stateless and session-based) and as an HTTP tool against a local backend.
var inputKinds = []struct {
	name  string
	build func(t *testing.T) inputKind
}{
	{"go", func(t *testing.T) inputKind {
		c := &countingTool{}
		return inputKind{name: "echo", tools: []agent.Tool{c.tool("echo")}, ran: func() []string { return compactAll(t, c.ran()) }}
	}},
	{"mcp stateless", func(t *testing.T) inputKind { return mcpEcho(t, true) }},
	{"mcp sessions", func(t *testing.T) inputKind { return mcpEcho(t, false) }},
	{"http", httpEcho},
}

func mcpEcho(t *testing.T, stateless bool) inputKind {
	t.Helper()
	var mu sync.Mutex
	var ran []string
	srv := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "echo", Description: "Echo.", InputSchema: json.RawMessage(echoSchema)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			ran = append(ran, string(req.Params.Arguments))
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: stateless}))
	t.Cleanup(hs.Close)
	src := mcptools.New(toolsFile(t, "mcpServers:\n  - name: docs\n    url: "+hs.URL+"\n"), toolsfile.Secrets{}, mcptools.Options{})[0]
	t.Cleanup(src.Close)
	return inputKind{name: "docs__echo", sources: []agent.ToolSource{src}, ran: func() []string {
		mu.Lock()
		defer mu.Unlock()
		return compactAll(t, ran)
	}}
}

func httpEcho(t *testing.T) inputKind {
	t.Helper()
	var mu sync.Mutex
	var ran []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		ran = append(ran, string(body))
		mu.Unlock()
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(hs.Close)
	f := toolsFile(t, "httpTools:\n  - name: echo\n    description: Echo.\n    method: POST\n    url: "+hs.URL+"/echo\n    inputSchema: "+echoSchema+"\n")
	return inputKind{name: "echo", sources: []agent.ToolSource{httptools.New(f, toolsfile.Secrets{}, httptools.Options{Client: hs.Client()})},
		ran: func() []string {
			mu.Lock()
			defer mu.Unlock()
			return compactAll(t, ran)
		}}
}

func toolsFile(t *testing.T, body string) *toolsfile.File {
	t.Helper()
	f, err := toolsfile.Parse("tools.yaml", []byte(body), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// compactAll is each JSON text with its object keys sorted and no spaces (what a tool ran with, whatever its
// transport did to the bytes).
func compactAll(t *testing.T, inputs []string) []string {
	t.Helper()
	out := make([]string, len(inputs))
	for i, in := range inputs {
		var v any
		if err := json.Unmarshal([]byte(in), &v); err != nil {
			t.Fatalf("input %q is not JSON: %v", in, err)
		}
		b, _ := json.Marshal(v)
		out[i] = string(b)
	}
	return out
}

// Issue 19 item 4: every call's input is checked before the tool runs, for Go, MCP (stateless and session-based
// servers) and HTTP tools alike. Malformed JSON is repaired once and the tool runs with the repaired input; input
// the schema refuses never runs (the Go function, the MCP server, the HTTP backend receive nothing), the model
// reads the violation (the field and the rule, nothing internal) and its second try runs; the run completes.
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
			ran: []string{`{"count":2,"text":"a"}`}},
		{name: "invalid input refused, the second try runs",
			steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{"text":7,"count":0}`}}, {{ID: "c2", Name: "echo", Arguments: `{"text":"7","count":1}`}}},
			ran:   []string{`{"count":1,"text":"7"}`},
			refused: map[string]string{"c1": `invalid_tool_input: input does not match the tool's schema: at "/count": minimum: got 0, want 1 (minimum); ` +
				`at "/text": got number, want string (type)`}},
		{name: "repaired but still invalid is refused", steps: [][]agent.ToolCall{{{ID: "c1", Name: "echo", Arguments: `{"count": 3,}`}}},
			refused: map[string]string{"c1": `invalid_tool_input: input was not valid JSON; repaired, it does not match the tool's schema: at "": missing property 'text' (required)`}},
	}
	for _, kind := range inputKinds {
		for _, tc := range cases {
			t.Run(kind.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				testToolInputChecked(t, kind.build(t), tc.steps, tc.ran, tc.refused)
			})
		}
	}
}

func testToolInputChecked(t *testing.T, echo inputKind, steps [][]agent.ToolCall, ran []string, refused map[string]string) {
	t.Helper()
	named := make([][]agent.ToolCall, len(steps))
	for i, step := range steps { // the calls name the tool as this kind offers it
		for _, c := range step {
			c.Name = echo.name
			named[i] = append(named[i], c)
		}
	}
	f := setup(t)
	inputs, err := toolschema.New(echo.tools...)
	if err != nil {
		t.Fatal(err)
	}
	model := &scriptedModel{steps: named}
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: echo.tools, Sources: echo.sources, Inputs: inputs,
		Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
	tr, err := eng.Begin(context.Background(), submit("th", "u1", "go"))
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	if got := echo.ran(); strings.Join(got, "|") != strings.Join(ran, "|") {
		t.Errorf("the tool ran with %q, want %q", got, ran)
	}
	reqs := model.requests()
	if len(reqs) != len(named)+1 {
		t.Fatalf("%d model requests, want %d", len(reqs), len(named)+1)
	}
	for id, want := range refused {
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
		if want, ok := refused[part.ToolCallID]; ok && (part.State != agent.StateOutputError || part.ErrorText != want) {
			t.Errorf("stored %s: %s %q", part.ToolCallID, part.State, part.ErrorText)
		}
		if !json.Valid(part.Input) {
			t.Errorf("stored input of %s is not JSON: %s", part.ToolCallID, part.Input)
		}
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
	// The model is told which tools it lacks (so the reply can say so), by name only: never the source's error.
	for i, req := range model.requests() {
		if !strings.Contains(req.System, "The tools of down are unavailable") || strings.Contains(req.System, "connection refused") {
			t.Errorf("request %d's system prompt %q: want the note on the source that is down, without its error", i, req.System)
		}
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
