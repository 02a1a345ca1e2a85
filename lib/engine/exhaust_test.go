package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// REVIEW S1, end to end: a thread whose tool outputs pass the budget still answers its next message. The model is
// the offline endpoint with a context window (it refuses a longer request with OpenAI's 400
// context_length_exceeded) at 25k tokens, the budget is 10k tokens (the engine scales its estimate by the
// offline model's usage, which counts words: by up to half) and each fetch returns 16 KiB (about 4k tokens).
//   - seven parallel fetches in one step: their results alone are over the budget, and the model must see them
//     to go on: the turn ends at once with context_exhausted (before: the request was sent and refused,
//     model_error);
//   - the next message is answered (before: the reply above was never pruned and every later request was
//     refused: the thread was dead);
//   - a run that fetches once per step stubs its own older results and goes on to its step limit (before: it
//     failed with model_error once its draft passed the window).
func TestThreadOverBudgetAnswersNext(t *testing.T) {
	t.Parallel()
	fetch := agent.Tool{Name: "fetch", Description: "returns a big page", Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
			return json.Marshal(strings.Repeat("page ", 16<<10/5))
		}}
	f := setup(t, withTools(fetch))
	window := httptest.NewServer(offline.New(offline.WithWordDelay(time.Millisecond), offline.WithContextTokens(25_000)))
	t.Cleanup(window.Close)
	model := openai.New(openai.Config{BaseURL: window.URL + "/v1/", Model: "offline", MaxRetries: -1, Logger: slog.New(slog.DiscardHandler)})
	cfg := f.eng.Config()
	cfg.Transcript.BudgetTokens = 10_000
	cfg.MaxSteps = 8
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, cfg)

	turn := func(thread, id, text string) agent.Run {
		t.Helper()
		tr, err := eng.Begin(context.Background(), submit(thread, id, text))
		if err != nil {
			t.Fatalf("begin %s: %v", id, err)
		}
		return tr.Stream(context.Background(), io.Discard)
	}
	run := turn("th-full", "u1", strings.TrimSpace(strings.Repeat("/tool fetch {} ", 7)))
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeContextExhausted {
		t.Fatalf("seven big results in one step: %s %+v, want failed context_exhausted", run.Status, run.Error)
	}
	if run = turn("th-full", "u2", "hello"); run.Status != agent.RunCompleted {
		t.Fatalf("the next message: %s %+v, want completed", run.Status, run.Error)
	}
	if run = turn("th-loop", "u1", "/loop fetch {}"); run.Error == nil || run.Error.Code != agent.CodeStepLimit {
		t.Fatalf("a fetch per step: %s %+v, want the step limit", run.Status, run.Error)
	}
}

// REVIEW S6, in the engine: a steer queued on the thread is taken by the next turn and stored after the person's
// message; the person's message (a big text with an image) is the one the turn answers and reaches the model
// whole, although the steer is now the newest user message and the thread is over the budget.
func TestSteerDoesNotUnprotectTheMessage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	eng, rec := recorded(t, f, io.Discard, func(c *engine.Config) { c.Transcript.BudgetTokens = 20_000 })
	runTurn(t, eng, "th-steer", "u1", "hi "+strings.Repeat("h", 30_000))
	steer := userMsg("steer_job1", "Research complete: "+strings.Repeat("r", 20_000))
	if _, _, err := f.store.Enqueue(context.Background(), agent.QueuedMessage{ThreadID: "th-steer", Kind: agent.QueueSteer, JobID: "job1",
		Message: *steer, Status: agent.QueueQueued, CreatedAt: time.Now()}, 10); err != nil {
		t.Fatal(err)
	}
	person := userMsg("u2", "summarize this "+strings.Repeat("d", 40_000))
	img, _ := json.Marshal(map[string]string{"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,iVBORw0KGgo=", "filename": "p.png"})
	person.Parts = append(person.Parts, img)
	tr, err := eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th-steer", Kind: engine.TurnSubmit, Message: person})
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
		t.Fatalf("run: %s %+v", run.Status, run.Error)
	}
	var got *agent.ModelMessage
	var users []string
	for i, m := range rec.reqs[len(rec.reqs)-1].Messages {
		if m.Role == "user" {
			users = append(users, m.Text[:min(len(m.Text), 12)])
		}
		if m.Role == "user" && strings.HasPrefix(m.Text, "summarize this") {
			got = &rec.reqs[len(rec.reqs)-1].Messages[i]
		}
	}
	if got == nil || len(got.Files) != 1 || users[len(users)-1] != "Research com" {
		t.Fatalf("user messages sent %q; the person's was pruned (files %v)", users, got != nil && len(got.Files) == 1)
	}
}
