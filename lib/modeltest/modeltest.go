// Package modeltest is the adapter matrix of issue 20, and what the adapters' tests share: the same cases run
// over every agent.Model adapter against the offline model (lib/offline), which speaks each provider's protocol
// and refuses every transcript that provider would. It imports no adapter, so an adapter's own (internal) tests
// can use its helpers: Serve (the offline model over HTTP, each request recorded), Collect, Deltas, Calls and
// RequireError.
//
// RunStream runs the Stream cases, which call an adapter's Stream directly: text, usage, parallel tool calls,
// reasoning, an HTTP error before the first event (retried, then failed), a failure after text began (not
// retried), an abort (the caller cancels mid-stream: KindCanceled, nothing emitted after), and an invalid
// transcript (a tool call without its result) refused by the offline model as the provider refuses it. Package
// matrix beside it adds the engine's turns over the adapter on the local stack, and runs both by one call:
//
//	func TestMatrix(t *testing.T) { matrix.Run(t, modeltest.Adapter{New: ...}) }
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
	// Check, when set, runs after the engine's reasoning turns (package matrix) with the bodies of their three
	// model requests (the tool round's two steps, then the next turn's one).
	Check func(t *testing.T, bodies [][]byte)
}

// Offline is the offline model served over HTTP, with each request's path, body and Authorization header
// recorded.
type Offline struct {
	*offline.Server
	// URL is the server's root ("http://127.0.0.1:PORT").
	URL string

	mu       sync.Mutex
	requests []recorded
}

type recorded struct {
	path, auth string
	body       []byte
}

// Serve serves the offline model (1 ms /slow words unless opts say otherwise) until the test ends.
func Serve(t testing.TB, opts ...offline.Option) *Offline {
	t.Helper()
	o := &Offline{Server: offline.New(append([]offline.Option{offline.WithWordDelay(time.Millisecond)}, opts...)...)}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		o.mu.Lock()
		o.requests = append(o.requests, recorded{path: r.URL.EscapedPath(), auth: r.Header.Get("Authorization"), body: b})
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

// EchoSpec is the tool the cases offer.
var EchoSpec = agent.ToolSpec{Name: "echo", Description: "Echoes its input.",
	Parameters: json.RawMessage(`{"type":"object","properties":{"v":{"type":"integer"}}}`)}

func user(text string) agent.ModelMessage { return agent.ModelMessage{Role: "user", Text: text} }

// UserRequest is a request of one user message.
func UserRequest(text string) agent.ModelRequest {
	return agent.ModelRequest{Messages: []agent.ModelMessage{user(text)}}
}

// Collect streams req on m and collects its events.
func Collect(ctx context.Context, m agent.Model, req agent.ModelRequest) (agent.ModelResult, []agent.ModelEvent, error) {
	var events []agent.ModelEvent
	res, err := m.Stream(ctx, req, func(ev agent.ModelEvent) error {
		events = append(events, ev)
		return nil
	})
	return res, events, err
}

// stream runs req on m and collects its events; cancelAfter, when positive, cancels the call after that many
// events (an event after it fails the call).
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

// Deltas is the deltas of the events of type typ, joined.
func Deltas(events []agent.ModelEvent, typ agent.ModelEventType) string {
	var b strings.Builder
	for _, ev := range events {
		if ev.Type == typ {
			b.WriteString(ev.Delta)
		}
	}
	return b.String()
}

// Calls is the complete calls (EventToolCall) in the order they were emitted.
func Calls(events []agent.ModelEvent) []agent.ToolCall {
	var out []agent.ToolCall
	for _, ev := range events {
		if ev.Type == agent.EventToolCall {
			out = append(out, agent.ToolCall{ID: ev.ToolCallID, Name: ev.ToolName, Arguments: ev.Arguments})
		}
	}
	return out
}

// RequireError fails t unless err is an *agent.Error of kind and code whose text contains contains.
func RequireError(t testing.TB, err error, kind agent.Kind, code string, contains string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *agent.Error", err, err)
	}
	if agent.KindOf(err) != kind || agent.CodeOf(err) != code || !strings.Contains(err.Error(), contains) {
		t.Fatalf("error %q: kind %v code %q, want %v %q containing %q", err, agent.KindOf(err), agent.CodeOf(err), kind, code, contains)
	}
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
		if got := Deltas(events, agent.EventTextDelta); got != "You said: hello there" {
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
		req := agent.ModelRequest{Tools: []agent.ToolSpec{EchoSpec}, Messages: []agent.ModelMessage{user(`/tool echo {"v":1} /tool echo {"v":2}`)}}
		res, events, err := stream(a.New(o.URL), req, 0)
		if err != nil {
			t.Fatal(err)
		}
		cs := Calls(events)
		var got []string
		for _, c := range cs {
			got = append(got, c.Name+strings.ReplaceAll(c.Arguments, " ", ""))
		}
		if res.FinishReason != agent.FinishToolCalls || strings.Join(got, "\n") != "echo{\"v\":1}\necho{\"v\":2}" {
			t.Errorf("finish %s, calls %q", res.FinishReason, got)
		}
		if len(cs) != 2 || cs[0].ID == "" || cs[0].ID == cs[1].ID {
			t.Errorf("calls %+v: want two, with ids of their own", cs)
		}
	})
	t.Run("reasoning", func(t *testing.T) {
		t.Parallel()
		o := Serve(t)
		_, events, err := stream(a.New(o.URL), agent.ModelRequest{Messages: []agent.ModelMessage{user("/think the answer")}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r, text := Deltas(events, agent.EventReasoningDelta), Deltas(events, agent.EventTextDelta); r == "" || text != "You said: the answer" {
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
		if err == nil || agent.KindOf(err) != agent.KindUnavailable || Deltas(events, agent.EventTextDelta) == "" {
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
		req := agent.ModelRequest{Tools: []agent.ToolSpec{EchoSpec}, Messages: []agent.ModelMessage{
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

// LastBody is the JSON body of the last request, decoded (t fails when none was sent).
func (o *Offline) LastBody(t testing.TB) map[string]any {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.requests) == 0 {
		t.Fatal("no request was sent")
	}
	var body map[string]any
	_ = json.Unmarshal(o.requests[len(o.requests)-1].body, &body)
	return body
}

// Paths is the (escaped) path of each request, in the order they came.
func (o *Offline) Paths() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, len(o.requests))
	for i, r := range o.requests {
		out[i] = r.path
	}
	return out
}

// Auths is the Authorization header of each request, in the order they came.
func (o *Offline) Auths() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, len(o.requests))
	for i, r := range o.requests {
		out[i] = r.auth
	}
	return out
}
