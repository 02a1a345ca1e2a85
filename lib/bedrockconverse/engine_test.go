package bedrockconverse_test

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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
)

// TestEngineTurns runs the engine's turns (the local stack's SQLite, tools and engine configuration) on this
// adapter over the offline /model/{modelId}/converse-stream, which refuses every transcript Bedrock would: a
// reasoning turn with parallel tool calls, then a plain turn over that history. The later requests are accepted
// only if the engine stored the first step's reasoning with its signature and gave it back
// (ModelMessage.ReasoningData), and the adapter put it back as a reasoningContent block; the tool results go back
// as one user message. It is the Converse column of the adapter matrix until the engine suites run per adapter
// (issue 20 item 2).
func TestEngineTurns(t *testing.T) {
	t.Parallel()
	srv := offline.New(offline.WithWordDelay(time.Millisecond))
	var mu sync.Mutex
	var requests [][]map[string]any // each converse-stream request's messages
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body struct {
			Messages []map[string]any `json:"messages"`
		}
		if strings.HasSuffix(r.URL.Path, "/converse-stream") && json.Unmarshal(b, &body) == nil {
			mu.Lock()
			requests = append(requests, body.Messages)
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
	model := bedrockconverse.New(bedrockconverse.Config{BaseURL: hs.URL + "/", Model: "amazon.nova-pro-v1:0", Region: "us-east-1",
		AWS:         &aws.Config{Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")},
		BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
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
		if strings.Contains(buf.String(), "signature") {
			t.Errorf("the client stream carries a reasoning signature:\n%s", buf.String())
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
	// Reasoning blocks per request: none, then the tool round's (first in its assistant message), then both steps'
	// (each checked by the offline model against the signature it issued).
	reasoningBlocks := func(msgs []map[string]any) (n int) {
		for _, m := range msgs {
			blocks, _ := m["content"].([]any)
			for i, b := range blocks {
				if _, ok := b.(map[string]any)["reasoningContent"]; ok {
					if i != 0 {
						t.Errorf("reasoningContent block at %d of %v", i, blocks)
					}
					n++
				}
			}
		}
		return n
	}
	if got := []int{reasoningBlocks(requests[0]), reasoningBlocks(requests[1]), reasoningBlocks(requests[2])}; !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Fatalf("reasoning blocks per request %v, want [0 1 2]", got)
	}
	// The tool results went back as one user message of two toolResult blocks after the toolUse turn.
	if r := requests[1]; len(r) != 3 || len(r[2]["content"].([]any)) != 2 {
		t.Errorf("tool round messages = %v", r)
	}
}
