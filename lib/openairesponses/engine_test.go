package openairesponses_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openairesponses"
)

// TestEngineTurns runs the engine's turns (the local stack's SQLite, tools and engine configuration) on this
// adapter over the offline /v1/responses, which refuses every transcript OpenAI would: a reasoning turn with
// parallel tool calls, then a plain turn over that history. It is the Responses column of the adapter matrix
// until the engine suites run per adapter (issue 20 item 2).
func TestEngineTurns(t *testing.T) {
	t.Parallel()
	srv := offline.New(offline.WithWordDelay(time.Millisecond))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	echo := agent.Tool{Name: "echo", Description: "Echoes its input.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"v":{"type":"integer"}}}`),
		Execute:     func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) { return inv.Input, nil }}
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: hs.URL + "/v1/",
		Config: config.Config{Heartbeat: 50 * time.Millisecond, StaleAfter: time.Minute, SegmentFlush: 20 * time.Millisecond},
		Tools:  func(agent.ValueStore, agent.Clock) []agent.Tool { return []agent.Tool{echo} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	model := openairesponses.New(openairesponses.Config{BaseURL: hs.URL + "/v1/", Model: "offline", BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	eng := engine.New(engine.Deps{Store: stack.Store, Model: model, Tools: stack.Tools, Reaper: stack.Reaper, Signer: stack.Signer},
		stack.Engine.Config())

	turn := func(id, msg string) (agent.Run, string, string) {
		t.Helper()
		p, _ := json.Marshal(map[string]string{"type": "text", "text": msg})
		tr, err := eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "t1", Kind: engine.TurnSubmit,
			Message: &agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{p}}})
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		var buf bytes.Buffer
		run := tr.Stream(context.Background(), &buf)
		var text, reasoning strings.Builder
		for _, frame := range strings.Split(buf.String(), "\n\n") {
			var c map[string]any
			if json.Unmarshal([]byte(strings.TrimPrefix(frame, "data: ")), &c) != nil {
				continue
			}
			switch c["type"] {
			case "text-delta":
				text.WriteString(c["delta"].(string))
			case "reasoning-delta":
				reasoning.WriteString(c["delta"].(string))
			}
		}
		return run, text.String(), reasoning.String()
	}

	run, text, reasoning := turn("m1", `/think /tool echo {"v":1} /tool echo {"v":2}`)
	if run.Status != agent.RunCompleted || text != "Tool echo returned: {\"v\":1}\nTool echo returned: {\"v\":2}" ||
		!strings.HasPrefix(reasoning, "Thinking about: /tool echo") {
		t.Fatalf("run %+v text %q reasoning %q", run, text, reasoning)
	}
	run, text, _ = turn("m2", "and now?")
	if run.Status != agent.RunCompleted || text != "You said: and now?" {
		t.Fatalf("run %+v text %q", run, text)
	}
	if n := srv.Requests(); n != 3 {
		t.Fatalf("%d model requests, want 3 (two steps, then one)", n)
	}
}
