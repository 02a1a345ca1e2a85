// Package matrix runs the adapter matrix of issue 20 (lib/modeltest) over one adapter by one call: the Stream
// cases, then the engine's turns over the adapter on the local stack (lib/devserver's SQLite, tools and engine
// configuration) against the offline model: a plain turn with its usage; a reasoning turn with parallel tool
// calls and then a turn over that history (accepted only if the adapter replays the stored transcript, reasoning
// included, as its provider requires); a model that fails before and after its reply began (model_error,
// model_interrupted). It imports lib/devserver, and so every adapter: an adapter's external test package
// (package x_test) calls it.
package matrix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/modeltest"
)

// Run runs the whole matrix over a: the Stream cases (modeltest.RunStream), then the engine turns.
func Run(t *testing.T, a modeltest.Adapter) {
	t.Run("Stream", func(t *testing.T) { modeltest.RunStream(t, a) })
	t.Run("Engine", func(t *testing.T) { RunEngine(t, a) })
}

// Stack is the engine of the local stack over one adapter, against the offline model.
type Stack struct {
	Offline *modeltest.Offline
	Engine  *engine.Engine
}

// NewStack starts the local stack (devserver, in t.TempDir) with tools, and an engine over the adapter.
func NewStack(t *testing.T, a modeltest.Adapter, tools ...agent.Tool) *Stack {
	t.Helper()
	o := modeltest.Serve(t)
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: o.URL + "/v1/",
		Config: config.Config{Heartbeat: 50 * time.Millisecond, StaleAfter: time.Minute, SegmentFlush: 20 * time.Millisecond},
		Tools:  func(agent.ValueStore, agent.Clock) []agent.Tool { return tools }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	eng := engine.New(engine.Deps{Store: stack.Store, Model: a.New(o.URL), Tools: stack.Tools, Reaper: stack.Reaper, Signer: stack.Signer},
		stack.Engine.Config())
	return &Stack{Offline: o, Engine: eng}
}

// Turn is what one turn produced: the run, and the text and reasoning its client stream carried.
type Turn struct {
	Run             agent.Run
	Text, Reasoning string
	Stream          string // the client stream as sent
}

// Turn submits a user message (id, text) to thread and streams the run to its end.
func (s *Stack) Turn(t *testing.T, thread, id, text string) Turn {
	t.Helper()
	p, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	tr, err := s.Engine.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit,
		Message: &agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{p}}})
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	var buf bytes.Buffer
	out := Turn{Run: tr.Stream(context.Background(), &buf), Stream: buf.String()}
	var txt, reasoning strings.Builder
	for _, frame := range strings.Split(out.Stream, "\n\n") {
		var c map[string]any
		if json.Unmarshal([]byte(strings.TrimPrefix(frame, "data: ")), &c) != nil {
			continue
		}
		switch c["type"] {
		case "text-delta":
			txt.WriteString(c["delta"].(string))
		case "reasoning-delta":
			reasoning.WriteString(c["delta"].(string))
		}
	}
	out.Text, out.Reasoning = txt.String(), reasoning.String()
	return out
}

// Echo is the tool the engine turns offer: it returns its input.
var Echo = agent.Tool{Name: "echo", Description: modeltest.EchoSpec.Description, InputSchema: modeltest.EchoSpec.Parameters,
	Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) { return inv.Input, nil }}

// RunEngine runs the engine turns over a.
func RunEngine(t *testing.T, a modeltest.Adapter) {
	t.Run("text and usage", func(t *testing.T) {
		t.Parallel()
		s := NewStack(t, a, Echo)
		turn := s.Turn(t, "t1", "m1", "hello there")
		if turn.Run.Status != agent.RunCompleted || turn.Text != "You said: hello there" || turn.Run.Usage.InputTokens <= 0 || turn.Run.Usage.OutputTokens <= 0 {
			t.Fatalf("run %+v text %q", turn.Run, turn.Text)
		}
	})
	t.Run("reasoning and parallel tools, then a turn over them", func(t *testing.T) {
		t.Parallel()
		s := NewStack(t, a, Echo)
		turn := s.Turn(t, "t1", "m1", `/think /tool echo {"v":1} /tool echo {"v":2}`)
		if turn.Run.Status != agent.RunCompleted || turn.Text != "Tool echo returned: {\"v\":1}\nTool echo returned: {\"v\":2}" ||
			!strings.HasPrefix(turn.Reasoning, "Thinking about: /tool echo") {
			t.Fatalf("run %+v text %q reasoning %q", turn.Run, turn.Text, turn.Reasoning)
		}
		if strings.Contains(turn.Stream, "signature") || strings.Contains(turn.Stream, "encrypted") {
			t.Errorf("the client stream carries the provider's reasoning state:\n%s", turn.Stream)
		}
		// The offline model refuses a history its provider would (a result missing or misplaced, reasoning not
		// replayed where the provider needs it): this turn is accepted only over a valid transcript.
		turn = s.Turn(t, "t1", "m2", "and now?")
		if turn.Run.Status != agent.RunCompleted || turn.Text != "You said: and now?" {
			t.Fatalf("run %+v text %q", turn.Run, turn.Text)
		}
		bodies := s.Offline.Bodies(a.Path)
		if len(bodies) != 3 {
			t.Fatalf("%d model requests, want 3 (two steps, then one)", len(bodies))
		}
		if a.Check != nil {
			a.Check(t, bodies)
		}
	})
	t.Run("model errors", func(t *testing.T) {
		t.Parallel()
		s := NewStack(t, a, Echo)
		for _, tt := range []struct{ id, text, code string }{
			{"m1", "/error 400", agent.CodeModelError},
			{"m2", "/error 500 after 3", agent.CodeModelInterrupted},
		} {
			turn := s.Turn(t, "t-"+tt.id, tt.id, tt.text)
			if turn.Run.Status != agent.RunFailed || turn.Run.Error == nil || turn.Run.Error.Code != tt.code {
				t.Errorf("%s: run %+v, want failed with %s", tt.text, turn.Run, tt.code)
			}
		}
	})
}

// ProviderEnv is the environment variable that runs a suite of the local stack (lib/engine's, lib/httpapi's)
// over another adapter, for make test-matrix: a models-file provider (openai-responses, anthropic,
// anthropic-bedrock, bedrock-converse). Empty, or openai-chat, leaves the stack's own default (lib/openai).
const ProviderEnv = "AGENT_TEST_PROVIDER"

// providerModels are the model ids the entries of UseProvider ask for: ones whose features the offline model
// offers as the provider does (Bedrock's prompt cache points are for Nova and Claude).
var providerModels = map[string]string{
	modelsfile.OpenAIResponses:  "offline",
	modelsfile.Anthropic:        "claude-sonnet-4-5",
	modelsfile.AnthropicBedrock: "anthropic.claude-sonnet-4-5-v1:0",
	modelsfile.BedrockConverse:  "amazon.nova-pro-v1:0",
}

// UseProvider makes cfg's default model (and the sub-agents' and titles') the one entry of a models file of
// provider that talks to the stack's offline model (an entry with neither baseURL nor apiKey: lib/devserver).
// Empty, or openai-chat, changes nothing.
func UseProvider(t testing.TB, cfg *config.Config, provider string) {
	t.Helper()
	if provider == "" || provider == modelsfile.OpenAIChat {
		return
	}
	model, ok := providerModels[provider]
	if !ok {
		t.Fatalf("%s=%s: no such provider (%v)", ProviderEnv, provider, slices.Sorted(maps.Keys(providerModels)))
	}
	entry := fmt.Sprintf("models:\n  - name: matrix\n    provider: %s\n    model: %q\n", provider, model)
	if provider == modelsfile.BedrockConverse || provider == modelsfile.AnthropicBedrock {
		entry += "    region: us-east-1\n"
	}
	f, err := modelsfile.Parse("matrix.yaml", []byte(entry))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Models, cfg.Model, cfg.SubagentModel, cfg.TitleModel = f, "matrix", "matrix", "matrix"
}

// UseProviderFromEnv is UseProvider with ProviderEnv's provider.
func UseProviderFromEnv(t testing.TB, cfg *config.Config) {
	UseProvider(t, cfg, os.Getenv(ProviderEnv))
}

// Skip skips t when the suite runs over one of providers (ProviderEnv), saying why: a case of what only some
// adapters do, or a known difference under repair.
func Skip(t testing.TB, why string, providers ...string) {
	t.Helper()
	if p := os.Getenv(ProviderEnv); p != "" && slices.Contains(providers, p) {
		t.Skipf("%s=%s: %s", ProviderEnv, p, why)
	}
}
