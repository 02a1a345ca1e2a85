package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// setupTools is setup with extra test tools.
func setupTools(t *testing.T, cfg engine.Config, extra ...agent.Tool) (*engine.Engine, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	hs := httptest.NewServer(offline.New(offline.WithWordDelay(20 * time.Millisecond)))
	t.Cleanup(hs.Close)
	model := openai.New(openai.Config{BaseURL: hs.URL + "/v1/", Model: "offline", BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	cfg.Model = "offline"
	return engine.New(engine.Deps{Store: st, Model: model, Tools: extra}, cfg), st
}

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Server tools of one step run concurrently: each call waits until both are in flight.
func TestServerToolsRunConcurrently(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 2)
	rendezvous := agent.Tool{Name: "meet", Description: "waits for a second caller", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			arrived <- struct{}{}
			deadline := time.After(5 * time.Second)
			for len(arrived) < 2 {
				select {
				case <-deadline:
					return nil, errors.New("the other call never started: tools ran one after the other")
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(time.Millisecond):
				}
			}
			return json.RawMessage(`"met"`), nil
		}}
	eng, st := setupTools(t, engine.Config{ToolTimeout: 10 * time.Second}, rendezvous)
	tr, err := eng.Begin(context.Background(), engine.Request{Owner: "a", ThreadID: "th", Trigger: engine.WireSubmit,
		Message: userMsg("u1", "/tool meet {}\n/tool meet {}")})
	if err != nil {
		t.Fatal(err)
	}
	run := tr.Stream(context.Background(), &bytes.Buffer{})
	if run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v", run)
	}
	rec, _ := st.GetMessage(context.Background(), "th", run.AssistantMessageID)
	outputs := 0
	for _, raw := range rec.Message.Parts {
		if p, _ := agent.DecodePart(raw); p.Type == "tool-meet" && p.State == agent.StateOutputAvailable {
			outputs++
		}
	}
	if outputs != 2 {
		t.Fatalf("want 2 outputs, got %d: %s", outputs, rec.Message.Parts)
	}
}

// A tool that outlives its timeout gets an error result the model sees; the run goes on.
func TestToolTimeout(t *testing.T) {
	t.Parallel()
	stuck := agent.Tool{Name: "stuck", Description: "never returns", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}}
	eng, _ := setupTools(t, engine.Config{ToolTimeout: 50 * time.Millisecond}, stuck)
	tr, err := eng.Begin(context.Background(), engine.Request{Owner: "a", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "/tool stuck {}")})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	chunks := parseSSE(t, buf.Bytes())
	if run.Status != agent.RunCompleted || count(chunks, "tool-output-error") != 1 || !strings.Contains(buf.String(), "timed out") {
		t.Fatalf("run %s, stream %s", run.Status, buf.String())
	}
}

// The whole-run wall clock ends a long reply as failed/run_timeout, with the partial text kept.
func TestRunWallClock(t *testing.T) {
	t.Parallel()
	eng, st := setupTools(t, engine.Config{RunTimeout: 300 * time.Millisecond})
	tr, err := eng.Begin(context.Background(), engine.Request{Owner: "a", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "/slow 200")})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeRunTimeout {
		t.Fatalf("run = %+v", run)
	}
	rec, err := st.GetMessage(context.Background(), "th", run.AssistantMessageID)
	if err != nil || rec.Message.Meta().Status != agent.MessageFailed || !strings.Contains(rec.Message.Text(), "word1") {
		t.Fatalf("message = %+v %v", rec, err)
	}
	th, _ := st.GetThread(context.Background(), "th")
	if th.ActiveRun != nil {
		t.Fatal("claim not released")
	}
}

// A client that goes away does not stop the run: it finishes and persists.
func TestClientDisconnectDoesNotStopRun(t *testing.T) {
	t.Parallel()
	eng, st := setupTools(t, engine.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := eng.Begin(ctx, engine.Request{Owner: "a", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "/slow 5")})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	run := tr.Stream(ctx, failingWriter{})
	rec, err := st.GetMessage(context.Background(), "th", run.AssistantMessageID)
	if run.Status != agent.RunCompleted || err != nil || !strings.Contains(rec.Message.Text(), "word5") {
		t.Fatalf("run %s, message %+v %v", run.Status, rec, err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("client gone") }
