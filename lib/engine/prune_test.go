package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// recordingModel passes every request on to the stack's real model (the openai adapter over the offline
// endpoint) and keeps a copy, so a test can read what the model was sent.
type recordingModel struct {
	agent.Model
	mu   sync.Mutex
	reqs []agent.ModelRequest
}

func (m *recordingModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	m.mu.Lock()
	m.reqs = append(m.reqs, req)
	m.mu.Unlock()
	return m.Model.Stream(ctx, req, emit)
}

func (m *recordingModel) last() agent.ModelRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reqs[len(m.reqs)-1]
}

// recorded builds an engine like the fixture's, whose model requests are recorded and whose log lines go to
// log (JSON, as in Lambda); mut adjusts its config.
func recorded(t *testing.T, f *fixture, log io.Writer, mut func(*engine.Config)) (*engine.Engine, *recordingModel) {
	t.Helper()
	rec := &recordingModel{Model: f.stack.Model}
	cfg := f.eng.Config()
	if mut != nil {
		mut(&cfg)
	}
	return engine.New(engine.Deps{Store: f.store, Model: rec, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer,
		Logger: slog.New(slog.NewJSONHandler(log, nil)), Clock: f.clock}, cfg), rec
}

func runTurn(t *testing.T, eng *engine.Engine, thread, msgID, text string) agent.Run {
	t.Helper()
	tr, err := eng.Begin(context.Background(), submit(thread, msgID, text))
	if err != nil {
		t.Fatalf("begin %s: %v", msgID, err)
	}
	run := tr.Stream(context.Background(), io.Discard)
	if run.Status != agent.RunCompleted {
		t.Fatalf("run %s: %s %+v", msgID, run.Status, run.Error)
	}
	return run
}

func toolResults(req agent.ModelRequest, name string) []string {
	names := map[string]string{}
	var out []string
	for _, m := range req.Messages {
		for _, c := range m.ToolCalls {
			names[c.ID] = c.Name
		}
		if m.Role == "tool" && names[m.ToolCallID] == name {
			out = append(out, m.Text)
		}
	}
	return out
}

// list_notes declares its output a snapshot: the engine tells the transcript, and a later request shows the
// model only the newest list (tier 0 runs before every step, whatever the budget).
func TestSnapshotToolSupersedes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	eng, rec := recorded(t, f, io.Discard, nil)
	runTurn(t, eng, "th-snap", "u1", "/tool list_notes {}")
	runTurn(t, eng, "th-snap", "u2", `/tool add_note {"text":"milk"}`)
	runTurn(t, eng, "th-snap", "u3", "/tool list_notes {}")
	lists := toolResults(rec.last(), "list_notes")
	if len(lists) != 2 || !strings.HasPrefix(lists[0], "[superseded") || !strings.Contains(lists[1], "milk") {
		t.Fatalf("list_notes results sent: %q", lists)
	}
}

// A big tool result two turns back becomes a stub once the thread is over the budget (and not before: the
// turn after the call sees it whole); the system prompt and the tool specs count against the budget.
func TestPruneBeforeStep(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("word ", 2000) // 10 KB, about 2,500 tokens
	dump := agent.Tool{Name: "dump", Description: "returns a big document", Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			return json.Marshal(big)
		}}
	f := setup(t, withTools(dump))
	var fixed int
	var log syncBuffer
	eng, rec := recorded(t, f, &log, func(c *engine.Config) {
		c.System = strings.Repeat("Be brief. ", 400) // 4 KB, about 1,000 tokens
		c.Transcript.FixedTokens = 0                 // the engine counts them again for this system prompt
		fixed = 1000
		// The offline model's reply quotes the result, so the old turn is the system prompt (1,000), the
		// result (2,500) and the reply (2,500): over 4,500 with the result, under it without.
		c.Transcript.BudgetTokens = 4500
	})
	if got := eng.Config().Transcript.FixedTokens; got < fixed {
		t.Fatalf("fixed tokens %d, want at least the system prompt's %d", got, fixed)
	}
	runTurn(t, eng, "th-prune", "u1", "/tool dump {}")
	if got := toolResults(rec.last(), "dump"); len(got) != 1 || got[0] != big {
		t.Fatalf("the step after the call must see the whole result: %.60q", got)
	}
	runTurn(t, eng, "th-prune", "u2", "hello")
	runTurn(t, eng, "th-prune", "u3", "again")
	if got := toolResults(rec.last(), "dump"); len(got) != 1 || !strings.HasPrefix(got[0], "[pruned") {
		t.Fatalf("the old result was not stubbed: %.60q", got)
	}
	// The operator can tell from the logs alone: the second and third turns stubbed the pair and fit (the big
	// reply's call was an older step of the last assistant message: REVIEW S1 had it sent over the budget).
	lines := log.records(t, "agent.prune")
	if len(lines) != 2 || lines[0]["over"] != false || lines[0]["pairs_stubbed"] != 1.0 ||
		lines[1]["over"] != false || lines[1]["pairs_stubbed"] != 1.0 || lines[1]["budget_tokens"] != 4500.0 {
		t.Fatalf("agent.prune lines: %v", lines)
	}
	// The stored message keeps the whole output: pruning changes only what the model sees.
	msgs := f.messages(t, "th-prune")
	if raw, _ := json.Marshal(msgs[1].Parts); !strings.Contains(string(raw), strings.Repeat("word ", 100)) {
		t.Fatalf("stored reply changed: %.200s", msgs[1].Parts)
	}
}
