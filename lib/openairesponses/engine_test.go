package openairesponses_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
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
// parallel tool calls, then a plain turn over that history, each step's encrypted reasoning replayed by the
// engine (ModelMessage.ReasoningData) and verified by the offline model. It is the Responses column of the adapter matrix
// until the engine suites run per adapter (issue 20 item 2).
func TestEngineTurns(t *testing.T) {
	t.Parallel()
	srv := offline.New(offline.WithWordDelay(time.Millisecond))
	var mu sync.Mutex
	var inputs [][]map[string]any // each /responses request's input items
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body struct {
			Input []map[string]any `json:"input"`
		}
		if strings.HasSuffix(r.URL.Path, "/responses") && json.Unmarshal(b, &body) == nil {
			mu.Lock()
			inputs = append(inputs, body.Input)
			mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		srv.ServeHTTP(w, r)
	}))
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
	// The engine keeps each step's encrypted reasoning (ModelResult.ReasoningData) and the adapter replays it
	// before the step's calls and text; the offline model verified every item it was sent.
	reasoningItems := func(items []map[string]any) (n int) {
		for _, it := range items {
			if it["type"] == "reasoning" {
				if enc, _ := it["encrypted_content"].(string); !strings.HasPrefix(enc, "offline1.") {
					t.Fatalf("reasoning item without the encrypted content issued: %v", it)
				}
				n++
			}
		}
		return n
	}
	if got := []int{reasoningItems(inputs[0]), reasoningItems(inputs[1]), reasoningItems(inputs[2])}; !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Fatalf("reasoning items per request %v, want [0 1 2]", got)
	}
}
