// Package modeltest is the adapter matrix of issue 20: the same cases run over every agent.Model adapter against
// the offline model (lib/offline), which speaks each provider's protocol and refuses every transcript that
// provider would. An adapter's tests get the whole matrix by one call each:
//
//	func TestMatrix(t *testing.T) { modeltest.Run(t, modeltest.Adapter{New: ...}) }
//
// Run has two halves. Stream cases call the adapter's Stream directly: text, usage, parallel tool calls,
// reasoning, an HTTP error before the first event (retried, then failed), a failure after text began (not
// retried), an abort (the caller cancels mid-stream: KindCanceled, nothing emitted after), and an invalid
// transcript (a tool call without its result) refused by the offline model as the provider refuses it. Engine
// turns run lib/engine over the adapter on the local stack (lib/devserver's SQLite, tools and engine
// configuration): a plain turn, a reasoning turn with parallel tool calls and then a turn over that history
// (accepted only if the adapter replays the stored transcript, reasoning included, as its provider requires), and
// a model that fails before and after its reply began (model_error, model_interrupted).
//
// Adapter.Check lets an adapter add the checks that are its own (e.g. how its reasoning was replayed) on the
// request bodies the offline model received.
package modeltest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
)

// Adapter is an adapter under test.
type Adapter struct {
	// New returns the adapter talking to the offline model served at root ("http://127.0.0.1:PORT", no final
	// slash, no /v1), with a short retry backoff and a logger that discards.
	New func(root string) agent.Model
	// Path is the path suffix of the adapter's model requests (e.g. "/chat/completions", "/converse-stream"):
	// the bodies Offline.Bodies returns.
	Path string
	// Check, when set, runs after the engine's reasoning turns with the bodies of their three model requests
	// (the tool round's two steps, then the next turn's one).
	Check func(t *testing.T, bodies [][]byte)
}

// Offline is the offline model served over HTTP, with each request's path and body recorded.
type Offline struct {
	*offline.Server
	// URL is the server's root ("http://127.0.0.1:PORT").
	URL string

	mu       sync.Mutex
	requests []recorded
}

type recorded struct {
	path string
	body []byte
}

// Serve serves the offline model (1 ms /slow words unless opts say otherwise) until the test ends.
func Serve(t testing.TB, opts ...offline.Option) *Offline {
	t.Helper()
	o := &Offline{Server: offline.New(append([]offline.Option{offline.WithWordDelay(time.Millisecond)}, opts...)...)}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		o.mu.Lock()
		o.requests = append(o.requests, recorded{r.URL.Path, b})
		o.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		o.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	o.URL = hs.URL
	return o
}

// Bodies is the bodies of the requests whose path ends with suffix, in the order they came.
func (o *Offline) Bodies(suffix string) [][]byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out [][]byte
	for _, r := range o.requests {
		if strings.HasSuffix(r.path, suffix) {
			out = append(out, r.body)
		}
	}
	return out
}

// Run runs the whole matrix over a: the Stream cases, then the engine turns.
func Run(t *testing.T, a Adapter) {
	t.Run("Stream", func(t *testing.T) { RunStream(t, a) })
	t.Run("Engine", func(t *testing.T) { RunEngine(t, a) })
}

// echoSpec is the tool the Stream cases offer.
var echoSpec = agent.ToolSpec{Name: "echo", Description: "Echoes its input.",
	Parameters: json.RawMessage(`{"type":"object","properties":{"v":{"type":"integer"}}}`)}

func user(text string) agent.ModelMessage { return agent.ModelMessage{Role: "user", Text: text} }

// stream runs req on m and collects its events; cancelAfter, when positive, cancels the call after that many
// events.
func stream(m agent.Model, req agent.ModelRequest, cancelAfter int) (agent.ModelResult, []agent.ModelEvent, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events []agent.ModelEvent
	res, err := m.Stream(ctx, req, func(ev agent.ModelEvent) error {
		if ctx.Err() != nil {
			return errors.New("an event after the caller cancelled")
		}
		events = append(events, ev)
		if len(events) == cancelAfter {
			cancel()
		}
		return nil
	})
	return res, events, err
}

func deltas(events []agent.ModelEvent, typ agent.ModelEventType) string {
	var b strings.Builder
	for _, ev := range events {
		if ev.Type == typ {
			b.WriteString(ev.Delta)
		}
	}
	return b.String()
}

func calls(events []agent.ModelEvent) []string {
	var out []string
	for _, ev := range events {
		if ev.Type == agent.EventToolCall {
			out = append(out, ev.ToolName+" "+ev.Arguments)
		}
	}
	return out
}

// RunStream runs the Stream cases over a.
func RunStream(t *testing.T, a Adapter) {
	t.Run("text and usage", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		res, events, err := stream(a.New(o.URL), agent.ModelRequest{System: "Be brief.", Messages: []agent.ModelMessage{user("hello there")}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := deltas(events, agent.EventTextDelta); got != "You said: hello there" {
			t.Errorf("text %q", got)
		}
		u := res.Usage
		if res.FinishReason != agent.FinishStop || u.InputTokens <= 0 || u.OutputTokens <= 0 || u.TotalTokens != u.InputTokens+u.OutputTokens || res.Model == "" {
			t.Errorf("result %+v", res)
		}
	})
	t.Run("parallel tool calls", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		req := agent.ModelRequest{Tools: []agent.ToolSpec{echoSpec}, Messages: []agent.ModelMessage{user(`/tool echo {"v":1} /tool echo {"v":2}`)}}
		res, events, err := stream(a.New(o.URL), req, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(calls(events), "\n")
		if res.FinishReason != agent.FinishToolCalls || strings.ReplaceAll(got, " ", "") != "echo{\"v\":1}\necho{\"v\":2}" {
			t.Errorf("finish %s, calls %q", res.FinishReason, got)
		}
		var ids []string
		for _, ev := range events {
			if ev.Type == agent.EventToolCall {
				ids = append(ids, ev.ToolCallID)
			}
		}
		if len(ids) != 2 || ids[0] == "" || ids[0] == ids[1] {
			t.Errorf("call ids %q", ids)
		}
	})
	t.Run("reasoning", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		_, events, err := stream(a.New(o.URL), agent.ModelRequest{Messages: []agent.ModelMessage{user("/think the answer")}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r, text := deltas(events, agent.EventReasoningDelta), deltas(events, agent.EventTextDelta); r == "" || text != "You said: the answer" {
			t.Errorf("reasoning %q, text %q", r, text)
		}
	})
	t.Run("error before the first event", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		_, events, err := stream(a.New(o.URL), agent.ModelRequest{Messages: []agent.ModelMessage{user("/error 503")}}, 0)
		if agent.KindOf(err) != agent.KindUnavailable || agent.CodeOf(err) != agent.CodeModelError || len(events) != 0 {
			t.Fatalf("err %v (%s), %d events", err, agent.CodeOf(err), len(events))
		}
		if n := o.Requests(); n < 2 {
			t.Errorf("%d requests: a 503 before any event is retried", n)
		}
	})
	t.Run("error after text began", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		_, events, err := stream(a.New(o.URL), agent.ModelRequest{Messages: []agent.ModelMessage{user("/error 500 after 3")}}, 0)
		if err == nil || agent.KindOf(err) != agent.KindUnavailable || deltas(events, agent.EventTextDelta) == "" {
			t.Fatalf("err %v, events %v", err, events)
		}
		if n := o.Requests(); n != 1 {
			t.Errorf("%d requests: nothing is retried once text was emitted", n)
		}
	})
	t.Run("abort", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		_, events, err := stream(a.New(o.URL), agent.ModelRequest{Messages: []agent.ModelMessage{user("/slow 200")}}, 2)
		if agent.KindOf(err) != agent.KindCanceled || len(events) != 2 {
			t.Fatalf("err %v (kind %v), %d events", err, agent.KindOf(err), len(events))
		}
		if n := o.Requests(); n != 1 {
			t.Errorf("%d requests: an abort is not retried", n)
		}
	})
	t.Run("invalid transcript refused", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		req := agent.ModelRequest{Tools: []agent.ToolSpec{echoSpec}, Messages: []agent.ModelMessage{
			user("call it"),
			{Role: "assistant", ToolCalls: []agent.ToolCall{{ID: "call_1", Name: "echo", Arguments: `{"v":1}`}}},
			user("and now?"), // the call has no result: every provider refuses this
		}}
		_, events, err := stream(a.New(o.URL), req, 0)
		if err == nil || agent.CodeOf(err) != agent.CodeModelError || len(events) != 0 {
			t.Fatalf("err %v (%s), %d events: the offline model accepted a tool call without its result", err, agent.CodeOf(err), len(events))
		}
		if n := o.Requests(); n != 1 {
			t.Errorf("%d requests: a refused request is not retried", n)
		}
	})
}

// Stack is the engine of the local stack over one adapter, against the offline model.
type Stack struct {
	Offline *Offline
	Engine  *engine.Engine
}

// NewStack starts the local stack (devserver, in t.TempDir) with tools, and an engine over the adapter.
func NewStack(t *testing.T, a Adapter, tools ...agent.Tool) *Stack {
	t.Helper()
	o := Serve(t)
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
var Echo = agent.Tool{Name: "echo", Description: echoSpec.Description, InputSchema: echoSpec.Parameters,
	Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) { return inv.Input, nil }}

// RunEngine runs the engine turns over a.
func RunEngine(t *testing.T, a Adapter) {
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
