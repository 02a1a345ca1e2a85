package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
)

// fixture is the real adapter talking HTTP to the offline model, with the requests it sent recorded.
type fixture struct {
	srv *offline.Server
	url string

	mu       sync.Mutex
	bodies   []map[string]any
	authList []string
}

// setup serves the offline model (1 ms /slow words unless opts say otherwise) behind a recorder.
func setup(t *testing.T, opts ...offline.Option) *fixture {
	t.Helper()
	f := &fixture{srv: offline.New(append([]offline.Option{offline.WithWordDelay(time.Millisecond)}, opts...)...)}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.authList = append(f.authList, r.Header.Get("Authorization"))
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		f.srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	f.url = ts.URL + "/v1/"
	return f
}

// model returns an adapter for the fixture with millisecond backoff; change adjusts the config.
func (f *fixture) model(change func(*Config)) *Model {
	cfg := Config{
		BaseURL:     f.url,
		Model:       "test-model",
		BackoffBase: time.Millisecond,
		Logger:      slog.New(slog.DiscardHandler),
	}
	if change != nil {
		change(&cfg)
	}
	return New(cfg)
}

func (f *fixture) lastBody(t *testing.T) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		t.Fatal("no request was sent")
	}
	return f.bodies[len(f.bodies)-1]
}

func userReq(text string) agent.ModelRequest {
	return agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: text}}}
}

// run streams req and collects the events.
func run(ctx context.Context, m *Model, req agent.ModelRequest) (agent.ModelResult, []agent.ModelEvent, error) {
	var events []agent.ModelEvent
	res, err := m.Stream(ctx, req, func(ev agent.ModelEvent) error {
		events = append(events, ev)
		return nil
	})
	return res, events, err
}

func textOf(events []agent.ModelEvent, typ agent.ModelEventType) string {
	var b strings.Builder
	for _, ev := range events {
		if ev.Type == typ {
			b.WriteString(ev.Delta)
		}
	}
	return b.String()
}

func requireError(t *testing.T, err error, kind agent.Kind, code string, contains string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *agent.Error", err, err)
	}
	if agent.KindOf(err) != kind || agent.CodeOf(err) != code || !strings.Contains(err.Error(), contains) {
		t.Fatalf("error %q: kind %v code %q, want %v %q containing %q", err, agent.KindOf(err), agent.CodeOf(err), kind, code, contains)
	}
}

func TestPlainReply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.APIKey = "sk-test" })
	res, events, err := run(context.Background(), m, userReq("hello world"))
	if err != nil {
		t.Fatal(err)
	}
	want := agent.ModelResult{
		Text:         "You said: hello world",
		FinishReason: agent.FinishStop,
		Model:        "test-model",
		// The offline estimate: prompt 1 message + 2 words, reply 4 words.
		Usage: agent.Usage{InputTokens: 3, OutputTokens: 4, TotalTokens: 7},
	}
	if res.Text != want.Text || res.FinishReason != want.FinishReason || res.Model != want.Model ||
		res.Usage != want.Usage || len(res.ToolCalls) != 0 || res.Reasoning != "" {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	if len(events) != 4 || textOf(events, agent.EventTextDelta) != want.Text {
		t.Fatalf("events %+v", events)
	}

	// The request: streamed with usage, bounded output, the key as bearer token, no tools.
	body := f.lastBody(t)
	if body["stream"] != true || body["model"] != "test-model" || body["max_completion_tokens"] != float64(DefaultMaxOutputTokens) {
		t.Fatalf("request body %v", body)
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Fatalf("stream_options %v", body["stream_options"])
	}
	if _, ok := body["tools"]; ok {
		t.Fatalf("tools sent without any: %v", body["tools"])
	}
	if f.authList[0] != "Bearer sk-test" {
		t.Fatalf("authorization %q", f.authList[0])
	}
}

func TestToolCallRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	tools := []agent.ToolSpec{{
		Name:        "add_note",
		Description: "Add a note",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
	}, {Name: "list_notes"}}
	ask := agent.ModelMessage{Role: "user", Text: `/tool add_note {"text": "buy milk"}`}
	req := agent.ModelRequest{System: "You take notes.", Messages: []agent.ModelMessage{ask}, Tools: tools}

	res, events, err := run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != agent.FinishToolCalls || len(res.ToolCalls) != 1 || res.Text != "" {
		t.Fatalf("result %+v", res)
	}
	call := res.ToolCalls[0]
	if call.Name != "add_note" || call.Arguments != `{"text":"buy milk"}` || !strings.HasPrefix(call.ID, "call_") {
		t.Fatalf("call %+v", call)
	}
	start := events[0]
	if start.Type != agent.EventToolCallStart || start.ToolCallID != call.ID || start.ToolName != "add_note" || start.ToolIndex != 0 {
		t.Fatalf("first event %+v", start)
	}
	deltas := 0
	for _, ev := range events[1:] {
		if ev.Type != agent.EventToolCallDelta || ev.ToolIndex != 0 || ev.ToolCallID != call.ID {
			t.Fatalf("event %+v", ev)
		}
		deltas++
	}
	if deltas < 2 || textOf(events, agent.EventToolCallDelta) != call.Arguments {
		t.Fatalf("%d argument deltas, %q", deltas, textOf(events, agent.EventToolCallDelta))
	}

	// The tools went out as function tools; a tool without a schema gets an empty object schema.
	sent, _ := f.lastBody(t)["tools"].([]any)
	if len(sent) != 2 {
		t.Fatalf("tools %v", f.lastBody(t)["tools"])
	}
	fn := sent[0].(map[string]any)["function"].(map[string]any)
	if sent[0].(map[string]any)["type"] != "function" || fn["name"] != "add_note" || fn["description"] != "Add a note" ||
		fn["parameters"].(map[string]any)["required"].([]any)[0] != "text" {
		t.Fatalf("tool %v", sent[0])
	}
	if p := sent[1].(map[string]any)["function"].(map[string]any)["parameters"].(map[string]any); p["type"] != "object" {
		t.Fatalf("default parameters %v", p)
	}

	// Second request: the transcript carries the assistant's call and its result. The offline model names the
	// tool by matching the result's call id against the assistant message, so the answer proves both went out.
	req.Messages = append(req.Messages,
		agent.ModelMessage{Role: "assistant", ToolCalls: res.ToolCalls},
		agent.ModelMessage{Role: "tool", ToolCallID: call.ID, Text: `{"id":"n1"}`},
	)
	res, events, err = run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := `Tool add_note returned: {"id":"n1"}`; res.Text != want || res.FinishReason != agent.FinishStop ||
		textOf(events, agent.EventTextDelta) != want {
		t.Fatalf("result %+v", res)
	}
	msgs, _ := f.lastBody(t)["messages"].([]any)
	if len(msgs) != 4 || msgs[0].(map[string]any)["role"] != "system" || msgs[3].(map[string]any)["tool_call_id"] != call.ID {
		t.Fatalf("messages %v", msgs)
	}
}

func TestParallelToolCalls(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), userReq(`/tool a {} /tool b {"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ToolCalls) != 2 || res.ToolCalls[0].Name != "a" || res.ToolCalls[1].Arguments != `{"x":1}` ||
		res.ToolCalls[0].ID == res.ToolCalls[1].ID {
		t.Fatalf("calls %+v", res.ToolCalls)
	}
	var starts []int
	for _, ev := range events {
		if ev.Type == agent.EventToolCallStart {
			starts = append(starts, ev.ToolIndex)
		}
	}
	if len(starts) != 2 || starts[0] != 0 || starts[1] != 1 {
		t.Fatalf("start events at indexes %v", starts)
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	req := agent.ModelRequest{
		System: "be very brief",
		Messages: []agent.ModelMessage{
			{Role: "user", Text: "hi"},
			{Role: "assistant", Text: "hello there"},
			{Role: "user", Text: "how are"},
		},
	}
	res, _, err := run(context.Background(), f.model(nil), req)
	if err != nil {
		t.Fatal(err)
	}
	// Offline estimate: system 4, user 2, assistant 3, user 3 = 12 prompt tokens, all but the last message (9)
	// cached; the reply "You said: how are" is 4 words.
	want := agent.Usage{InputTokens: 12, OutputTokens: 4, TotalTokens: 16, CachedInputTokens: 9}
	if res.Usage != want {
		t.Fatalf("usage %+v, want %+v", res.Usage, want)
	}
}

func TestRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		text       string
		maxRetries int
		requests   int64
		wantErr    string // "" for success
	}{
		{"retry then success", "/flaky 2 503", 0, 3, ""},
		{"rate limit then success", "/flaky 1 429", 0, 2, ""},
		{"retries exhausted", "/error 503", 0, 3, "HTTP 503"},
		{"more retries", "/flaky 3 502", 3, 4, ""},
		{"retries off", "/flaky 1 500", -1, 1, "HTTP 500"},
		{"client error is not retried", "/error 400", 0, 1, "HTTP 400"},
		{"auth error is not retried", "/error 401", 0, 1, "HTTP 401"},
		{"error before the first event is retried", "/drop 0", 0, 3, "model connection failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			m := f.model(func(c *Config) { c.MaxRetries = tt.maxRetries })
			res, events, err := run(context.Background(), m, userReq(tt.text))
			if got := f.srv.Requests(); got != tt.requests {
				t.Fatalf("requests = %d, want %d", got, tt.requests)
			}
			if tt.wantErr == "" {
				if err != nil || res.Text != "You said: "+tt.text || textOf(events, agent.EventTextDelta) != res.Text {
					t.Fatalf("result %+v err %v", res, err)
				}
				return
			}
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.wantErr)
			if len(events) != 0 {
				t.Fatalf("events %+v", events)
			}
		})
	}
}

func TestErrorMidStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, text, contains string
	}{
		{"error event", "/error 500 after 3", "code 500"},
		{"connection cut", "/drop 3", "model connection failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			res, events, err := run(context.Background(), f.model(nil), userReq(tt.text))
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.contains)
			// Deltas were emitted before the failure, so the adapter must not retry.
			if f.srv.Requests() != 1 {
				t.Fatalf("requests = %d, want 1", f.srv.Requests())
			}
			if textOf(events, agent.EventTextDelta) != "word1 word2 word3" {
				t.Fatalf("events %+v", events)
			}
			if res.Text != "word1 word2 word3" || res.FinishReason != agent.FinishError {
				t.Fatalf("partial result %+v", res)
			}
		})
	}
}

func TestRequestTimeout(t *testing.T) {
	t.Parallel()
	// An hour per word: the first word never comes within the 50 ms attempt timeout.
	f := setup(t, offline.WithWordDelay(time.Hour))
	m := f.model(func(c *Config) {
		c.RequestTimeout = 50 * time.Millisecond
		c.MaxRetries = 1
	})
	_, events, err := run(context.Background(), m, userReq("/slow 2"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelTimeout, "timed out")
	// Nothing was emitted, so the timed-out attempt was retried once.
	if f.srv.Requests() != 2 || len(events) != 0 {
		t.Fatalf("requests = %d, events %+v", f.srv.Requests(), events)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	runTimeout := agent.E(agent.KindUnavailable, agent.CodeRunTimeout, "run took too long")
	tests := []struct {
		name  string
		cause error
		code  string
	}{
		{"plain cancel", nil, agent.CodeRunCanceled},
		{"cancel with an agent error cause", runTimeout, agent.CodeRunTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, offline.WithWordDelay(5*time.Millisecond))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var events []agent.ModelEvent
			// 1000 words at 5 ms would take 5 s; cancelling after the first word ends the call early.
			_, err := f.model(nil).Stream(ctx, userReq("/slow 1000"), func(ev agent.ModelEvent) error {
				events = append(events, ev)
				cancel(tt.cause)
				return nil
			})
			requireError(t, err, agent.KindCanceled, tt.code, "model call canceled")
			if f.srv.Requests() != 1 || len(events) != 1 {
				t.Fatalf("requests = %d, events %+v", f.srv.Requests(), events)
			}
		})
	}

	t.Run("during backoff", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The adapter logs the retry just before it waits an hour: cancelling there tests the wait.
		m := f.model(func(c *Config) {
			c.BackoffBase, c.BackoffMax = time.Hour, time.Hour
			c.Logger = slog.New(cancelOnLog{cancel})
		})
		_, _, err := run(ctx, m, userReq("/error 503"))
		requireError(t, err, agent.KindCanceled, agent.CodeRunCanceled, "canceled")
		if f.srv.Requests() != 1 {
			t.Fatalf("requests = %d", f.srv.Requests())
		}
	})
}

// cancelOnLog is a log handler that cancels a context when anything is logged.
type cancelOnLog struct{ cancel context.CancelFunc }

func (h cancelOnLog) Enabled(context.Context, slog.Level) bool  { return true }
func (h cancelOnLog) Handle(context.Context, slog.Record) error { h.cancel(); return nil }
func (h cancelOnLog) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h cancelOnLog) WithGroup(string) slog.Handler             { return h }

func TestEmitErrorAborts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stop := errors.New("client gone")
	calls := 0
	_, err := f.model(nil).Stream(context.Background(), userReq("hello there world"), func(agent.ModelEvent) error {
		calls++
		return stop
	})
	if err != stop || calls != 1 || f.srv.Requests() != 1 {
		t.Fatalf("err %v after %d emits and %d requests", err, calls, f.srv.Requests())
	}
}

func TestReasoning(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), userReq("/think why"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Reasoning != "Thinking about: why" || res.Text != "You said: why" ||
		textOf(events, agent.EventReasoningDelta) != res.Reasoning {
		t.Fatalf("result %+v", res)
	}
	if events[0].Type != agent.EventReasoningDelta || events[len(events)-1].Type != agent.EventTextDelta {
		t.Fatalf("reasoning must come first: %+v", events)
	}
}

func TestOutputTokenLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.MaxOutputTokens = 2 })
	res, _, err := run(context.Background(), m, userReq("one two three"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != "You said:" || res.FinishReason != agent.FinishLength {
		t.Fatalf("result %+v", res)
	}
	// A request's own limit wins over the config's.
	req := userReq("one two three")
	req.MaxOutputTokens = 3
	if res, _, err = run(context.Background(), m, req); err != nil || res.Text != "You said: one" {
		t.Fatalf("result %+v err %v", res, err)
	}
	if got := f.lastBody(t)["max_completion_tokens"]; got != float64(3) {
		t.Fatalf("max_completion_tokens %v", got)
	}
}

func TestRequestModel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	req := userReq("hi")
	req.Model = "other-model"
	res, _, err := run(context.Background(), f.model(nil), req)
	if err != nil || res.Model != "other-model" {
		t.Fatalf("result %+v err %v", res, err)
	}
}

// countingTransport counts round trips on the way to the real transport.
type countingTransport struct{ n atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

func TestConnectionRefused(t *testing.T) {
	t.Parallel()
	// A port that was free a moment ago: nothing listens there any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	transport := &countingTransport{}
	m := New(Config{
		BaseURL:     "http://" + addr + "/v1/",
		Model:       "m",
		BackoffBase: time.Millisecond,
		HTTPClient:  &http.Client{Transport: transport},
		Logger:      slog.New(slog.DiscardHandler),
	})
	_, _, err = run(context.Background(), m, userReq("hi"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "model connection failed")
	if transport.n.Load() != 1+DefaultMaxRetries {
		t.Fatalf("round trips = %d, want %d", transport.n.Load(), 1+DefaultMaxRetries)
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tests := []struct {
		name   string
		change func(*Config)
		req    agent.ModelRequest
	}{
		{"no model", func(c *Config) { c.Model = "" }, userReq("hi")},
		{"tool schema not an object", nil, agent.ModelRequest{
			Messages: userReq("hi").Messages,
			Tools:    []agent.ToolSpec{{Name: "t", Parameters: json.RawMessage(`[1]`)}},
		}},
		{"unknown role", nil, agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "robot", Text: "hi"}}}},
	}
	for _, tt := range tests {
		_, _, err := run(context.Background(), f.model(tt.change), tt.req)
		if err == nil || agent.KindOf(err) != agent.KindInternal {
			t.Fatalf("%s: error %v, want an internal *agent.Error", tt.name, err)
		}
	}
	if f.srv.Requests() != 0 {
		t.Fatalf("requests = %d, want 0", f.srv.Requests())
	}
}

func TestOfflineStart(t *testing.T) {
	t.Parallel()
	// The loopback helper's base URL works as is with the adapter, as `agentloop dev` wires it.
	base, stop, err := offline.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m := New(Config{BaseURL: base, Model: "offline", Logger: slog.New(slog.DiscardHandler)})
	res, _, err := run(context.Background(), m, userReq("ping"))
	if err != nil || res.Text != "You said: ping" || res.Model != "offline" {
		t.Fatalf("result %+v err %v", res, err)
	}
}

func TestConcurrentStreams(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			text := strings.Repeat("w ", i+1)
			res, _, err := run(context.Background(), m, userReq(text))
			if err == nil && res.Text != "You said: "+strings.TrimSpace(text) {
				err = errors.New("wrong text " + res.Text)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	m := New(Config{BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	tests := []struct {
		attempt      int
		providerWait time.Duration
		lo, hi       time.Duration
	}{
		{0, 0, 50 * time.Millisecond, 100 * time.Millisecond},
		{1, 0, 100 * time.Millisecond, 200 * time.Millisecond},
		{3, 0, 400 * time.Millisecond, 800 * time.Millisecond},
		{4, 0, 500 * time.Millisecond, time.Second}, // capped
		{60, 0, 500 * time.Millisecond, time.Second},
		{0, 3 * time.Second, 3 * time.Second, 3 * time.Second}, // the provider's wait wins
	}
	for _, tt := range tests {
		for range 50 {
			if d := m.backoff(tt.attempt, tt.providerWait); d < tt.lo || d > tt.hi {
				t.Fatalf("backoff(%d, %s) = %s, want within [%s, %s]", tt.attempt, tt.providerWait, d, tt.lo, tt.hi)
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		header, value string
		want          time.Duration
	}{
		{"Retry-After", "2", 2 * time.Second},
		{"Retry-After-Ms", "250", 250 * time.Millisecond},
		{"Retry-After", "3600", maxRetryAfter},
		{"Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT", 0},
		{"Retry-After", "-1", 0},
		{"X-Other", "5", 0},
	}
	for _, tt := range tests {
		res := &http.Response{Header: http.Header{}}
		res.Header.Set(tt.header, tt.value)
		if got := retryAfter(res); got != tt.want {
			t.Fatalf("%s: %s = %s, want %s", tt.header, tt.value, got, tt.want)
		}
	}
	if retryAfter(nil) != 0 {
		t.Fatal("nil response")
	}
}

func TestFinishReason(t *testing.T) {
	t.Parallel()
	tests := map[string]agent.FinishReason{
		"stop":           agent.FinishStop,
		"length":         agent.FinishLength,
		"tool_calls":     agent.FinishToolCalls,
		"function_call":  agent.FinishToolCalls,
		"content_filter": agent.FinishContentFilter,
		"something_new":  agent.FinishOther,
	}
	for in, want := range tests {
		if got := finishReason(in); got != want {
			t.Fatalf("finishReason(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkStream(b *testing.B) {
	srv := httptest.NewServer(offline.New())
	defer srv.Close()
	m := New(Config{BaseURL: srv.URL + "/v1/", Model: "bench", Logger: slog.New(slog.DiscardHandler)})
	req := userReq(strings.TrimSpace(strings.Repeat("lorem ipsum dolor sit amet ", 20)))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		res, err := m.Stream(ctx, req, func(agent.ModelEvent) error { return nil })
		if err != nil || res.FinishReason != agent.FinishStop {
			b.Fatalf("result %+v err %v", res, err)
		}
	}
}
