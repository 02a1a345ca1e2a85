package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/emf"
	"github.com/agentloop/agentloop/lib/engine"
)

// requestKey names the request id a test puts in the context, as Lambda's runtime does (lambdacontext).
type requestKey struct{}

// contextHandler adds the context's request id to every record, as boot's lambdacontext handler adds the
// Lambda request id: only lines logged with the request's context (InfoContext) carry it.
type contextHandler struct{ slog.Handler }

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	if id, ok := ctx.Value(requestKey{}).(string); ok {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(attrs)}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name)}
}

// REVIEW S9: a run refused after its claim (here a duplicate message: the stored run is failed/duplicate_message)
// writes its agent.run line and its metric like every other run; agent.run names the owner. S23: the agent.*
// lines are logged with the request's context, so the Lambda request id joins them to the invocation.
func TestRefusedRunsAreReported(t *testing.T) {
	t.Parallel()
	var logs, metrics syncBuffer
	f := setup(t, func(o *devserver.Options) {
		o.Logger = slog.New(contextHandler{slog.NewJSONHandler(&logs, nil)})
	}, withMetrics(emf.New(&metrics, "test", nil)))
	ctx := context.WithValue(context.Background(), requestKey{}, "req-1")
	tr, err := f.eng.Begin(ctx, submit("th", "u1", `/tool add_note {"text":"milk"}`))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if run := tr.Stream(ctx, &buf); run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v", run)
	}
	ctx2 := context.WithValue(context.Background(), requestKey{}, "req-2")
	if _, err := f.eng.Begin(ctx2, submit("th", "u1", `/tool add_note {"text":"milk"}`)); agent.CodeOf(err) != agent.CodeDuplicateMessage {
		t.Fatalf("err = %v, want duplicate_message", err)
	}
	runs, err := f.store.ListRuns(context.Background(), "th")
	if err != nil {
		t.Fatal(err)
	}
	lines := logs.records(t, "agent.run")
	if len(runs) != 2 || len(lines) != len(runs) {
		t.Fatalf("runs stored: %d, agent.run lines: %d (%v): want one line per run", len(runs), len(lines), lines)
	}
	refused := lines[1]
	if refused["status"] != string(agent.RunFailed) || refused["error_code"] != agent.CodeDuplicateMessage ||
		refused["run_id"] != runs[1].ID || refused["request_id"] != "req-2" {
		t.Fatalf("the refused run's line %v", refused)
	}
	for _, l := range lines {
		if l["owner"] != "alice" {
			t.Fatalf("agent.run without its owner: %v", l)
		}
	}
	for _, msg := range []string{"agent.run", "agent.step", "agent.tool"} {
		for _, l := range logs.records(t, msg) {
			if l["request_id"] == nil {
				t.Fatalf("%s logged without the request's context: %v", msg, l)
			}
		}
	}
	metrics.mu.Lock()
	defer metrics.mu.Unlock()
	var outcomes []string
	for _, line := range bytes.Split(bytes.TrimSpace(metrics.buf.Bytes()), []byte("\n")) {
		var doc map[string]any
		if err := json.Unmarshal(line, &doc); err != nil {
			t.Fatal(err)
		}
		if doc["Runs"] == 1.0 {
			outcomes = append(outcomes, doc["Outcome"].(string))
		}
	}
	if len(outcomes) != 2 || outcomes[1] != string(agent.RunFailed) {
		t.Fatalf("run metrics by outcome %v, want completed and failed", outcomes)
	}
	_ = engine.TurnSubmit
}
