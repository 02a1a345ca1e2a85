package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/toolschema"
)

// reasoningModel reasons on every request and returns provider state for it (ReasoningData, as lib/anthropic
// returns thinking signatures): the first request of a turn calls the tool, the next one answers. Its second
// step's reasoning is all redacted (no reasoning delta, data only). It keeps every request.
type reasoningModel struct {
	mu   sync.Mutex
	reqs []agent.ModelRequest
}

func reasoningDataFor(n int) json.RawMessage {
	return json.RawMessage(`[{"type":"thinking","thinking":"plan","signature":"sig-` + string(rune('a'+n)) + `"}]`)
}

func (m *reasoningModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	m.mu.Lock()
	n := len(m.reqs)
	m.reqs = append(m.reqs, req)
	m.mu.Unlock()
	toolStep := req.Messages[len(req.Messages)-1].Role == "user"
	evs := []agent.ModelEvent{{Type: agent.EventReasoningDelta, Delta: "plan"}}
	res := agent.ModelResult{FinishReason: agent.FinishStop, ReasoningData: reasoningDataFor(n)}
	if toolStep {
		id := "call" + string(rune('a'+n))
		evs = append(evs, agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: id, ToolName: "note"},
			agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: id, ToolName: "note", Arguments: `{"text":"x"}`})
		res.FinishReason = agent.FinishToolCalls
	} else {
		evs = []agent.ModelEvent{{Type: agent.EventTextDelta, Delta: "done"}} // redacted reasoning: data only
	}
	for _, ev := range evs {
		if err := emit(ev); err != nil {
			return agent.ModelResult{}, err
		}
	}
	return res, nil
}

// TestReasoningDataReplayed: a step's ModelResult.ReasoningData is stored with its reasoning part (in
// providerMetadata, never streamed to the client) and given back in ModelMessage.ReasoningData for that step's
// assistant message: to the second step of the same turn, and to the next turn from the stored transcript.
func TestReasoningDataReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	note := &countingTool{}
	tools := []agent.Tool{note.tool("note")}
	inputs, err := toolschema.New(tools...)
	if err != nil {
		t.Fatal(err)
	}
	model := &reasoningModel{}
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: tools, Inputs: inputs,
		Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
	var streamed bytes.Buffer
	for i, text := range []string{"one", "two"} {
		tr, err := eng.Begin(context.Background(), submit("th", "u"+string(rune('1'+i)), text))
		if err != nil {
			t.Fatal(err)
		}
		if run := tr.Stream(context.Background(), &streamed); run.Status != agent.RunCompleted {
			t.Fatalf("run %s %+v", run.Status, run.Error)
		}
	}
	reqs := model.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d requests, want 4", len(reqs))
	}
	// assistantData lists the ReasoningData of each assistant message of a request, "-" for none.
	assistantData := func(req agent.ModelRequest) string {
		var out []string
		for _, m := range req.Messages {
			if m.Role == "assistant" {
				d := "-"
				if m.ReasoningData != nil {
					var blocks []map[string]string
					_ = json.Unmarshal(m.ReasoningData, &blocks)
					d = blocks[0]["signature"]
				}
				out = append(out, d)
			}
		}
		return strings.Join(out, " ")
	}
	want := []string{"", "sig-a", "sig-a sig-b", "sig-a sig-b sig-c"}
	for i, req := range reqs {
		if got := assistantData(req); got != want[i] {
			t.Errorf("request %d: assistant reasoning data %q, want %q", i, got, want[i])
		}
	}
	if strings.Contains(streamed.String(), "sig-") || strings.Contains(streamed.String(), "providerMetadata") {
		t.Errorf("the client stream carries the reasoning data:\n%s", streamed.String())
	}
	// Stored: each step's reasoning part, the redacted one with no text.
	msgs := f.messages(t, "th")
	var stored []string
	for _, p := range msgs[1].Parts {
		var part agent.Part
		if json.Unmarshal(p, &part) == nil && part.Type == "reasoning" {
			stored = append(stored, part.Text+":"+string(agent.ReasoningDataOf(part)))
		}
	}
	if len(stored) != 2 || stored[0] != "plan:"+string(reasoningDataFor(0)) || stored[1] != ":"+string(reasoningDataFor(1)) {
		t.Errorf("stored reasoning parts = %q", stored)
	}
}

func (m *reasoningModel) requests() []agent.ModelRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]agent.ModelRequest(nil), m.reqs...)
}
