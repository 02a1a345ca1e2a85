package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/mcptools"
	"github.com/agentloop/agentloop/lib/mcptools/mcptest"
	"github.com/agentloop/agentloop/lib/toolsfile"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// mcpServer is the Go SDK's own MCP server in-process over Streamable HTTP (stateless or session-based), with the
// given tools; it counts the calls each thread made (by the idempotency key in _meta, <thread>/<message>/<call>).
type mcpServer struct {
	mu    sync.Mutex
	calls map[string]int // by thread
}

func (m *mcpServer) called(thread string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[thread]
}

// start serves tools, each answering "done" unless its handler answers, and returns the source of a tools file
// naming the server docs.
func (m *mcpServer) start(t *testing.T, stateless bool, tools map[*mcp.Tool]mcp.ToolHandler) agent.ToolSource {
	t.Helper()
	m.calls = map[string]int{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "1"}, nil)
	for tool, h := range tools {
		tool.InputSchema = json.RawMessage(`{"type":"object"}`)
		srv.AddTool(tool, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			key, _ := req.Params.Meta[mcptools.MetaIdempotencyKey].(string)
			thread, _, _ := strings.Cut(key, "/")
			m.mu.Lock()
			m.calls[thread]++
			m.mu.Unlock()
			if h != nil {
				return h(ctx, req)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
	}
	hs := httptest.NewServer(mcptest.Handler(srv, stateless))
	t.Cleanup(hs.Close)
	f, err := toolsfile.Parse("tools.yaml", []byte("mcpServers:\n  - name: docs\n    url: "+hs.URL+"\n"), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src := mcptools.New(f, toolsfile.Secrets{}, mcptools.Options{})[0]
	t.Cleanup(src.Close)
	return src
}

// Issue 19 item 2: an MCP tool's annotations decide its approval in a turn (approval: annotations, the default):
// destructiveHint asks whatever the thread says, readOnlyHint never asks (not even with reviewTools on), and
// anything else (no annotations, destructiveHint false) asks only when the thread's reviewTools is on. A call
// that asks ends the run interrupted with a tool-approval-request and never reaches the server.
func TestMCPAnnotationsDecideApproval(t *testing.T) {
	t.Parallel()
	no := false
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		f := setup(t)
		var m mcpServer
		src := m.start(t, stateless, map[*mcp.Tool]mcp.ToolHandler{
			{Name: "look", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}:     nil,
			{Name: "wipe", Annotations: &mcp.ToolAnnotations{DestructiveHint: yes()}}: nil,
			{Name: "touch"}: nil,
			{Name: "keep", Annotations: &mcp.ToolAnnotations{DestructiveHint: &no}}:                       nil,
			{Name: "both", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: yes()}}: nil,
		})
		for _, tc := range []struct {
			tool   string
			review bool
			asks   bool
		}{
			{"look", false, false}, {"look", true, false},
			{"both", true, false}, // readOnlyHint wins: a tool that changes nothing destroys nothing
			{"wipe", false, true}, {"wipe", true, true},
			{"touch", false, false}, {"touch", true, true},
			{"keep", false, false}, {"keep", true, true},
		} {
			thread := tc.tool + map[bool]string{true: "-review", false: "-plain"}[tc.review]
			now := time.Now().UTC()
			if _, _, err := f.store.CreateThread(context.Background(), agent.Thread{ID: thread, Owner: "alice",
				Settings: agent.ThreadSettings{ReviewTools: tc.review}, CreatedAt: now, UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
			model := &scriptedModel{steps: [][]agent.ToolCall{{{ID: "c1", Name: "docs__" + tc.tool, Arguments: `{}`}}}}
			eng := engine.New(engine.Deps{Store: f.store, Model: model, Sources: []agent.ToolSource{src}, Reaper: f.stack.Reaper,
				Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
			tr, err := eng.Begin(context.Background(), submit(thread, "u1", "go"))
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			run := tr.Stream(context.Background(), &buf)
			asked := count(parseSSE(t, buf.Bytes()), "tool-approval-request") == 1
			want := map[bool]agent.RunStatus{true: agent.RunInterrupted, false: agent.RunCompleted}[tc.asks]
			if asked != tc.asks || run.Status != want || m.called(thread) != map[bool]int{true: 0, false: 1}[tc.asks] {
				t.Errorf("%s with reviewTools %v: asked %v, run %s, the server ran it %d times; want asked %v, run %s",
					tc.tool, tc.review, asked, run.Status, m.called(thread), tc.asks, want)
			}
		}
	})
}

func yes() *bool { b := true; return &b }

// Issue 19 items 2 and 6: an MCP server's notifications/progress for a call stream to the client as transient
// data-tool-progress parts {toolCallId, stage "<progress>/<total>", message}, before the tool's output and in the
// order sent; resumed readers get them too (the run's segments); the model and the stored transcript never see
// them; and the stream parses under every ai version the README supports (ai@6.0.0, the newest ai@6 and ai@7) to
// a message whose tool part holds only the output.
func TestMCPProgressStreams(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		f := setup(t)
		w := &progressWriter{seen: make(chan struct{})}
		var m mcpServer
		src := m.start(t, stateless, map[*mcp.Tool]mcp.ToolHandler{{Name: "work"}: func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			token := req.Params.GetProgressToken()
			if token == nil {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no progress token"}}}, nil
			}
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Total: 2, Message: "reading"})
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 2, Total: 2, Message: "writing"})
			// The SDK hands notifications to the client asynchronously: the tool answers once the client's stream
			// carries both (one racing the result may come after it, and is dropped).
			select {
			case <-w.seen:
			case <-ctx.Done():
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "worked"}}}, nil
		}})
		model := &scriptedModel{steps: [][]agent.ToolCall{{{ID: "c1", Name: "docs__work", Arguments: `{}`}}}}
		eng := engine.New(engine.Deps{Store: f.store, Model: model, Sources: []agent.ToolSource{src}, Reaper: f.stack.Reaper,
			Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
		tr, err := eng.Begin(context.Background(), submit("th", "u1", "go"))
		if err != nil {
			t.Fatal(err)
		}
		run := tr.Stream(context.Background(), w)
		if run.Status != agent.RunCompleted {
			t.Fatalf("run %s %+v", run.Status, run.Error)
		}
		raw := w.bytes()
		var got []string
		output := false
		for _, c := range parseSSE(t, raw) {
			switch c["type"] {
			case "data-tool-progress":
				d, _ := c["data"].(map[string]any)
				if c["transient"] != true || c["id"] != "c1" || d["toolCallId"] != "c1" || output {
					t.Errorf("progress chunk %v: want transient, of c1, before the output", c)
				}
				got = append(got, d["stage"].(string)+" "+d["message"].(string))
			case "tool-output-available":
				output = c["output"] == "worked"
			}
		}
		if strings.Join(got, "|") != "1/2 reading|2/2 writing" || !output {
			t.Errorf("progress %q, output %v: want 1/2 reading, 2/2 writing, then the output worked", got, output)
		}
		if replay := f.segments(t, run.ID); !bytes.Equal(replay, raw) {
			t.Errorf("a resumed reader's replay differs from the stream:\n%s\n---\n%s", replay, raw)
		}
		if read := toolResultText(model.requests()[1], "c1"); read != "worked" {
			t.Errorf("the model read %q, want the output alone", read)
		}
		for _, msg := range f.messages(t, "th") {
			for _, p := range msg.Parts {
				if bytes.Contains(p, []byte("tool-progress")) || bytes.Contains(p, []byte("reading")) {
					t.Errorf("message %s holds the progress: %s", msg.ID, p)
				}
			}
		}
		for _, p := range aisdktest.CheckStreams(t, raw) {
			parts, err := p.Parts()
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(strings.Join(p.ChunkTypes, ","), "data-tool-progress"); n != 2 {
				t.Errorf("ai@%s read %d data-tool-progress chunks, want 2", p.SDKVersion, n)
			}
			if partTypes(parts) != "step-start,tool-docs__work,step-start,text" || parts[1].State != agent.StateOutputAvailable ||
				string(parts[1].Output) != `"worked"` {
				t.Errorf("ai@%s built %s, want the tool part with its output alone (no progress part), then the answer", p.SDKVersion, p.Message.Parts)
			}
		}
	})
}

func partTypes(parts []agent.Part) string {
	types := make([]string, len(parts))
	for i, p := range parts {
		types[i] = p.Type
	}
	return strings.Join(types, ",")
}

// progressWriter is the client's end of a stream: it keeps the bytes and closes seen once two data-tool-progress
// chunks went by.
type progressWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	once sync.Once
	seen chan struct{}
}

func (w *progressWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if bytes.Count(w.buf.Bytes(), []byte(`"type":"data-tool-progress"`)) >= 2 {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

func (w *progressWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.buf.Bytes()...)
}
