package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Server tools of one step run concurrently: each call waits until both are in flight. The 5 s only turns tools
// run one after the other (the defect: the second never starts while the first waits) into a failure; run
// concurrently, both calls are in flight before either waits, however loaded the machine.
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
	f := setup(t, withTools(rendezvous), withConfig(func(c *config.Config) { c.ToolTimeout = 10 * time.Second }))
	run, _ := f.run(t, submit("th", "u1", "/tool meet {}\n/tool meet {}"))
	if run.Status != agent.RunCompleted {
		t.Fatalf("run = %+v", run)
	}
	rec, _ := f.store.GetMessage(context.Background(), "th", run.AssistantMessageID)
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
	f := setup(t, withTools(stuck), withConfig(func(c *config.Config) { c.ToolTimeout = 50 * time.Millisecond }))
	run, raw := f.run(t, submit("th", "u1", "/tool stuck {}"))
	chunks := parseSSE(t, raw)
	if run.Status != agent.RunCompleted || count(chunks, "tool-output-error") != 1 || !strings.Contains(string(raw), "timed out") {
		t.Fatalf("run %s, stream %s", run.Status, raw)
	}
}

// The whole-run wall clock ends a long reply as failed/run_timeout, with the partial text kept.
func TestRunWallClock(t *testing.T) {
	t.Parallel()
	f := setup(t, withConfig(func(c *config.Config) { c.RunTimeout = 300 * time.Millisecond }))
	st := f.store
	run, _ := f.run(t, submit("th", "u1", "/slow 200"))
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
	f := setup(t)
	st := f.store
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := f.eng.Begin(ctx, submit("th", "u1", "/slow 5"))
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

// A tool that ignores its context cannot hold the run past its timeout (REVIEW L14).
func TestToolIgnoringContextTimesOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	deaf := agent.Tool{Name: "deaf", Description: "ignores its context", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			<-release
			return json.RawMessage(`"late"`), nil
		}}
	f := setup(t, withTools(deaf), withConfig(func(c *config.Config) { c.ToolTimeout = 50 * time.Millisecond }))
	done := make(chan agent.Run, 1)
	go func() { run, _ := f.run(t, submit("th", "u1", "/tool deaf {}")); done <- run }()
	select {
	case run := <-done:
		rec, _ := f.store.GetMessage(context.Background(), "th", run.AssistantMessageID)
		if run.Status != agent.RunCompleted || !strings.Contains(string(rec.Message.Parts[1]), "timed out") {
			t.Fatalf("run %s, parts %s", run.Status, rec.Message.Parts)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a tool that ignores its context held the run")
	}
}

// A tool that returned its output keeps it, even when the run is stopped a moment later (REVIEW L15).
func TestToolOutputSurvivesStop(t *testing.T) {
	t.Parallel()
	var f *fixture
	stopper := agent.Tool{Name: "stopper", Description: "stops its own run, then succeeds", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			if _, err := f.store.RequestCancel(ctx, inv.ThreadID, inv.RunID, time.Now()); err != nil {
				return nil, err
			}
			select { // the run sees the stop (and cancels the tool's context) meanwhile; a loaded machine may take a while
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
			}
			return json.RawMessage(`"done"`), nil
		}}
	f = setup(t, withTools(stopper))
	run, _ := f.run(t, submit("th", "u1", "/tool stopper {}"))
	rec, _ := f.store.GetMessage(context.Background(), "th", run.AssistantMessageID)
	var found bool
	for _, raw := range rec.Message.Parts {
		if p, _ := agent.DecodePart(raw); p.Type == "tool-stopper" {
			found = p.State == agent.StateOutputAvailable && string(p.Output) == `"done"`
		}
	}
	if run.Status != agent.RunCanceled || !found {
		t.Fatalf("run %s, parts %s", run.Status, rec.Message.Parts)
	}
}

// Every tool invocation carries the thread + tool call idempotency key.
func TestToolsGetIdempotencyKeys(t *testing.T) {
	t.Parallel()
	keys := make(chan string, 1)
	keyed := agent.Tool{Name: "keyed", Description: "reports its key", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			keys <- inv.IdempotencyKey
			return json.RawMessage(`1`), nil
		}}
	f := setup(t, withTools(keyed))
	run, chunks := f.turn(t, "th", "u1", "/tool keyed {}")
	var callID string
	for _, c := range chunks {
		if c["type"] == "tool-input-available" {
			callID = c["toolCallId"].(string)
		}
	}
	if got := <-keys; run.Status != agent.RunCompleted || got != agent.IdempotencyKey("th", run.AssistantMessageID, callID) {
		t.Fatalf("key %q, want %q", got, agent.IdempotencyKey("th", run.AssistantMessageID, callID))
	}
}
