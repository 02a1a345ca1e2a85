package openairesponses

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modeltest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// fixture is the real adapter talking HTTP to the offline model's /v1/responses, with the requests it sent
// recorded (modeltest.Serve).
type fixture struct {
	*modeltest.Offline
	url string
}

func setup(t *testing.T, opts ...offline.Option) *fixture {
	t.Helper()
	o := modeltest.Serve(t, opts...)
	return &fixture{Offline: o, url: o.URL + "/v1/"}
}

func (f *fixture) model(change func(*Config)) *Model {
	cfg := Config{BaseURL: f.url, Model: "test-model", BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	if change != nil {
		change(&cfg)
	}
	return New(cfg)
}

// The helpers every adapter's tests share (lib/modeltest).
var (
	run          = modeltest.Collect
	userReq      = modeltest.UserRequest
	textOf       = modeltest.Deltas
	callsOf      = modeltest.Calls
	requireError = modeltest.RequireError
)

func TestPlainReply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), agent.ModelRequest{System: "Be brief.", Model: "gpt-5-mini",
		Messages: []agent.ModelMessage{{Role: "user", Text: "hello there"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: hello there" {
		t.Fatalf("text %q", got)
	}
	if res.FinishReason != agent.FinishStop || res.Model != "gpt-5-mini" || res.ReasoningData != nil {
		t.Fatalf("result %+v", res)
	}
	// Words that arrived together are flagged More but the last of each read.
	if last := events[len(events)-1]; last.More {
		t.Fatalf("last event has More: %+v", last)
	}
	body := f.LastBody(t)
	for k, want := range map[string]any{"store": false, "stream": true, "instructions": "Be brief.", "model": "gpt-5-mini",
		"max_output_tokens": float64(DefaultMaxOutputTokens)} {
		if !reflect.DeepEqual(body[k], want) {
			t.Errorf("%s = %v, want %v", k, body[k], want)
		}
	}
	if !reflect.DeepEqual(body["include"], []any{"reasoning.encrypted_content"}) ||
		!reflect.DeepEqual(body["reasoning"], map[string]any{"summary": "auto"}) {
		t.Fatalf("include %v reasoning %v", body["include"], body["reasoning"])
	}
	if _, ok := body["prompt_cache_key"]; ok {
		t.Fatal("prompt_cache_key sent without one configured")
	}

	// ReasoningNone leaves the reasoning settings out; PromptCacheKey is sent.
	if _, _, err := run(context.Background(), f.model(func(c *Config) { c.ReasoningSummary = ReasoningNone; c.PromptCacheKey = "thread-1" }), userReq("hi")); err != nil {
		t.Fatal(err)
	}
	body = f.LastBody(t)
	if _, ok := body["reasoning"]; ok || body["include"] != nil || body["prompt_cache_key"] != "thread-1" {
		t.Fatalf("body %v", body)
	}
	// The request's own CacheKey (the engine's thread id) wins over the configured one.
	req := userReq("hi")
	req.CacheKey = "thread-2"
	if _, _, err := run(context.Background(), f.model(func(c *Config) { c.PromptCacheKey = "thread-1" }), req); err != nil {
		t.Fatal(err)
	}
	if body = f.LastBody(t); body["prompt_cache_key"] != "thread-2" {
		t.Fatalf("prompt_cache_key %v, want the request's", body["prompt_cache_key"])
	}
}

func TestToolCallRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	tools := []agent.ToolSpec{{Name: "get_weather", Description: "Weather for a city.",
		Parameters:    json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`),
		InputExamples: []json.RawMessage{json.RawMessage(`{ "city": "Paris" }`)}}}
	req := agent.ModelRequest{Tools: tools, Messages: []agent.ModelMessage{{Role: "user", Text: `/tool get_weather {"city":"Paris"}`}}}
	res, events, err := run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	calls := callsOf(events)
	if res.FinishReason != agent.FinishToolCalls || len(calls) != 1 || calls[0].Name != "get_weather" || calls[0].Arguments != `{"city":"Paris"}` {
		t.Fatalf("result %+v calls %+v", res, calls)
	}
	// Start, then argument fragments carrying the call id, then the call.
	if events[0].Type != agent.EventToolCallStart || events[0].ToolCallID != calls[0].ID {
		t.Fatalf("first event %+v", events[0])
	}
	var frags strings.Builder
	for _, ev := range events {
		if ev.Type == agent.EventToolCallDelta {
			if ev.ToolCallID != calls[0].ID {
				t.Fatalf("delta without the call id: %+v", ev)
			}
			frags.WriteString(ev.Delta)
		}
	}
	if frags.String() != calls[0].Arguments {
		t.Fatalf("fragments %q", frags.String())
	}
	tool := f.LastBody(t)["tools"].([]any)[0].(map[string]any)
	if tool["strict"] != false || tool["type"] != "function" || tool["description"] != "Weather for a city.\n\nInput examples:\n{\"city\":\"Paris\"}" {
		t.Fatalf("tool %v", tool)
	}

	req.Messages = append(req.Messages,
		agent.ModelMessage{Role: "assistant", ToolCalls: calls},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "sunny"})
	res, events, err = run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Tool get_weather returned: sunny" || res.FinishReason != agent.FinishStop {
		t.Fatalf("text %q result %+v", got, res)
	}
	input := f.LastBody(t)["input"].([]any)
	if got := input[1].(map[string]any); got["type"] != "function_call" || got["call_id"] != calls[0].ID {
		t.Fatalf("function_call item %v", got)
	}
	if got := input[2].(map[string]any); got["type"] != "function_call_output" || got["output"] != "sunny" {
		t.Fatalf("function_call_output item %v", got)
	}
}

func TestParallelToolCalls(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), userReq(`/tool a {"x":1} /tool b {"y":"2"} /tool a`))
	if err != nil {
		t.Fatal(err)
	}
	calls := callsOf(events)
	if res.FinishReason != agent.FinishToolCalls || len(calls) != 3 {
		t.Fatalf("result %+v calls %+v", res, calls)
	}
	want := []struct{ name, args string }{{"a", `{"x":1}`}, {"b", `{"y":"2"}`}, {"a", "{}"}}
	ids := map[string]bool{}
	for i, c := range calls {
		if c.Name != want[i].name || c.Arguments != want[i].args {
			t.Fatalf("call %d %+v", i, c)
		}
		ids[c.ID] = true
	}
	if len(ids) != 3 {
		t.Fatalf("ids not distinct: %+v", calls)
	}
	// All three answered in one round: the model reads every result.
	msgs := []agent.ModelMessage{{Role: "user", Text: `/tool a {"x":1} /tool b {"y":"2"} /tool a`}, {Role: "assistant", ToolCalls: calls}}
	for i, c := range calls {
		msgs = append(msgs, agent.ModelMessage{Role: "tool", ToolCallID: c.ID, Text: string(rune('1' + i))})
	}
	_, events, err = run(context.Background(), f.model(nil), agent.ModelRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Tool a returned: 1\nTool b returned: 2\nTool a returned: 3" {
		t.Fatalf("text %q", got)
	}
}

// TestReasoningReplayed: a /think step streams its summary and returns its encrypted reasoning items; the next
// step sends them back before the step's calls, and the offline model (as OpenAI) verifies them.
func TestReasoningReplayed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	msgs := []agent.ModelMessage{{Role: "user", Text: "/think /tool lookup {\"q\":\"go\"}"}}
	res, events, err := run(context.Background(), m, agent.ModelRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventReasoningDelta); got != `Thinking about: /tool lookup {"q":"go"}` {
		t.Fatalf("reasoning %q", got)
	}
	var items []map[string]any
	if err := json.Unmarshal(res.ReasoningData, &items); err != nil || len(items) != 1 {
		t.Fatalf("reasoning data %s: %v", res.ReasoningData, err)
	}
	if items[0]["type"] != "reasoning" || items[0]["encrypted_content"] == "" || items[0]["encrypted_content"] == nil {
		t.Fatalf("reasoning item %v", items[0])
	}
	if res.Usage.ReasoningTokens == 0 {
		t.Fatalf("usage %+v", res.Usage)
	}
	calls := callsOf(events)
	step := agent.ModelMessage{Role: "assistant", ToolCalls: calls, Reasoning: textOf(events, agent.EventReasoningDelta), ReasoningData: res.ReasoningData}
	msgs = append(msgs, step, agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "found"})
	_, events, err = run(context.Background(), m, agent.ModelRequest{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Tool lookup returned: found" {
		t.Fatalf("text %q", got)
	}
	input := f.LastBody(t)["input"].([]any)
	if got := input[1].(map[string]any); got["type"] != "reasoning" || got["encrypted_content"] != items[0]["encrypted_content"] {
		t.Fatalf("replayed item %v", got)
	}
	if got := input[2].(map[string]any); got["type"] != "function_call" {
		t.Fatalf("item after the reasoning %v", got)
	}

	// Another adapter's data (Anthropic thinking blocks) is not replayed here.
	other := msgs[1]
	other.ReasoningData = json.RawMessage(`[{"type":"thinking","thinking":"x","signature":"s"}]`)
	if _, _, err := run(context.Background(), m, agent.ModelRequest{Messages: []agent.ModelMessage{msgs[0], other, msgs[2]}}); err != nil {
		t.Fatal(err)
	}
	if got := f.LastBody(t)["input"].([]any)[1].(map[string]any); got["type"] != "function_call" {
		t.Fatalf("foreign reasoning data sent: %v", got)
	}

	// Tampered reasoning is refused by the provider: the offline model checks what it issued.
	items[0]["encrypted_content"] = "offline1.eA.0000"
	tampered, _ := json.Marshal(items)
	bad := msgs[1]
	bad.ReasoningData = tampered
	_, _, err = run(context.Background(), m, agent.ModelRequest{Messages: []agent.ModelMessage{msgs[0], bad, msgs[2]}})
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "could not be verified")
}

func TestUsage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// The offline estimate, the same as for Chat Completions: instructions "Be brief." (3), user "a b" (3),
	// assistant "c" (2), user "/think hi" (3): 11 input tokens, 8 of them cached (all but the last). Reply:
	// reasoning "Thinking about: hi" (3) and "You said: hi" (3).
	res, _, err := run(context.Background(), f.model(nil), agent.ModelRequest{System: "Be brief.", Messages: []agent.ModelMessage{
		{Role: "user", Text: "a b"}, {Role: "assistant", Text: "c"}, {Role: "user", Text: "/think hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := agent.Usage{InputTokens: 11, CachedInputTokens: 8, OutputTokens: 6, ReasoningTokens: 3, TotalTokens: 17}
	if res.Usage != want {
		t.Fatalf("usage %+v, want %+v", res.Usage, want)
	}
}

func TestOutputTokenLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(func(c *Config) { c.MaxOutputTokens = 16 }), userReq("/slow 20"))
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != agent.FinishLength || len(strings.Fields(textOf(events, agent.EventTextDelta))) != 16 {
		t.Fatalf("result %+v", res)
	}
}

func TestRetries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		text       string
		maxRetries int
		requests   int64
		wantErr    string
	}{
		{"retry then success", "/flaky 2 503", 0, 3, ""},
		{"rate limit then success", "/flaky 1 429", 0, 2, ""},
		{"retries exhausted", "/error 503", 0, 3, "HTTP 503"},
		{"retries off", "/flaky 1 500", -1, 1, "HTTP 500"},
		{"client error is not retried", "/error 400", 0, 1, "HTTP 400"},
		{"auth error is not retried", "/error 401", 0, 1, "HTTP 401"},
		{"connection cut before the first event is retried", "/drop 0", 0, 3, "connection to the model provider failed"},
		{"response.failed before the first event is retried", "/error 500 after 0", 0, 3, "failed mid-stream"},
		{"a refused prompt is not retried", "/error 400 after 0", 0, 1, "failed mid-stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			res, events, err := run(context.Background(), f.model(func(c *Config) { c.MaxRetries = tt.maxRetries }), userReq(tt.text))
			if got := f.Requests(); got != tt.requests {
				t.Fatalf("requests = %d, want %d", got, tt.requests)
			}
			if tt.wantErr == "" {
				if err != nil || res.FinishReason != agent.FinishStop || textOf(events, agent.EventTextDelta) != "You said: "+tt.text {
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
	tests := []struct{ name, text, contains string }{
		{"response.failed", "/error 500 after 3", "offline model: injected error 500"}, // the provider's words, in the cause
		{"rate limited mid-stream", "/error 429 after 3", "rate_limit_exceeded"},
		{"connection cut", "/drop 3", "connection to the model provider failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			res, events, err := run(context.Background(), f.model(nil), userReq(tt.text))
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.contains)
			if f.Requests() != 1 {
				t.Fatalf("requests = %d, want 1 (deltas went out: no retry)", f.Requests())
			}
			if textOf(events, agent.EventTextDelta) != "word1 word2 word3" || res.FinishReason != agent.FinishError || res.Model != "test-model" {
				t.Fatalf("events %+v result %+v", events, res)
			}
			if code, msg := agent.Public(err); code != agent.CodeModelError || strings.Contains(msg, "offline") {
				t.Fatalf("public (%q, %q)", code, msg)
			}
		})
	}
}

func TestImageUnavailable(t *testing.T) {
	t.Parallel()
	gone := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(gone.Close)
	f := setup(t)
	_, _, err := run(context.Background(), f.model(nil), agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "look",
		Files: []agent.ModelFile{{MediaType: "image/png", URL: gone.URL + "/cat.png?X-Amz-Signature=secret"}}}}})
	requireError(t, err, agent.KindInvalid, agent.CodeFileUnavailable, "Error while downloading")
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the cause quotes a URL's query: %v", err)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const png = "data:image/png;base64,iVBORw0KGgo="
	const pdf = "data:application/pdf;base64,JVBERi0xLjQK"
	_, events, err := run(context.Background(), f.model(nil), agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/received",
		Files: []agent.ModelFile{{MediaType: "image/png", URL: png}, {MediaType: "application/pdf", URL: pdf, Filename: "r.pdf"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "text\nimage_url image/png 8 bytes\nfile application/pdf r.pdf 9 bytes" {
		t.Fatalf("received %q", got)
	}
	content := f.LastBody(t)["input"].([]any)[0].(map[string]any)["content"].([]any)
	want := []any{
		map[string]any{"type": "input_text", "text": "/received"},
		map[string]any{"type": "input_image", "image_url": png, "detail": "auto"},
		map[string]any{"type": "input_file", "file_data": pdf, "filename": "r.pdf"},
	}
	if !reflect.DeepEqual(content, want) {
		t.Fatalf("content %v", content)
	}
}

// TestCancel: the caller cancels after the first event; nothing more is emitted and the error says canceled.
// With no delay the later words are already in the read buffer when the first is emitted: none may follow the
// cancel. A cause that is an *agent.Error keeps its code (a run timeout).
func TestCancel(t *testing.T) {
	t.Parallel()
	runTimeout := agent.E(agent.KindUnavailable, agent.CodeRunTimeout, "run took too long")
	for _, tt := range []struct {
		name  string
		delay time.Duration
		cause error
		code  string
	}{
		{"plain cancel", 5 * time.Millisecond, nil, agent.CodeRunCanceled},
		{"cancel with the rest buffered", 0, nil, agent.CodeRunCanceled},
		{"cancel with an agent error cause", 5 * time.Millisecond, runTimeout, agent.CodeRunTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, offline.WithWordDelay(tt.delay))
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var events []agent.ModelEvent
			_, err := f.model(nil).Stream(ctx, userReq("/slow 1000"), func(ev agent.ModelEvent) error {
				events = append(events, ev)
				cancel(tt.cause)
				return nil
			})
			requireError(t, err, agent.KindCanceled, tt.code, "model call canceled")
			if f.Requests() != 1 || len(events) != 1 {
				t.Fatalf("requests = %d, events %+v", f.Requests(), events)
			}
		})
	}
}

func TestEmitErrorAborts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stop := errors.New("client gone")
	_, err := f.model(nil).Stream(context.Background(), userReq("/slow 50"), func(agent.ModelEvent) error { return stop })
	if !errors.Is(err, stop) || f.Requests() != 1 {
		t.Fatalf("err %v requests %d", err, f.Requests())
	}
}

func TestFirstTokenTimeout(t *testing.T) {
	t.Parallel()
	// A provider that accepted the request and never answers (until the client goes away).
	stalled := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		<-r.Context().Done()
	}))
	t.Cleanup(stalled.Close)
	m := New(Config{BaseURL: stalled.URL, Model: "m", FirstTokenTimeout: 20 * time.Millisecond, MaxRetries: 1,
		BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	_, _, err := run(context.Background(), m, userReq("hi"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelTimeout, "sent nothing within")
}

func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, offline.WithWordDelay(time.Hour)) // the first word never comes; the request ends with the test
	_, _, err := run(context.Background(), f.model(func(c *Config) { c.IdleTimeout = 20 * time.Millisecond; c.MaxRetries = -1 }), userReq("/slow 3"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelTimeout, "stalled")
}

// TestInvalidTranscript: what OpenAI refuses, the offline endpoint refuses the same way, and the adapter
// reports it as the provider's 400 without retrying.
func TestInvalidTranscript(t *testing.T) {
	t.Parallel()
	call := agent.ToolCall{ID: "call_1", Name: "a", Arguments: "{}"}
	tests := []struct {
		name string
		msgs []agent.ModelMessage
		why  string
	}{
		{"lone tool result", []agent.ModelMessage{{Role: "user", Text: "hi"}, {Role: "tool", ToolCallID: "call_1", Text: "out"}},
			"No tool call found for function call output with call_id call_1."},
		{"unanswered call", []agent.ModelMessage{{Role: "user", Text: "hi"}, {Role: "assistant", ToolCalls: []agent.ToolCall{call}},
			{Role: "user", Text: "again"}}, "No tool output found for function call call_1."},
		{"reasoning never issued", []agent.ModelMessage{{Role: "user", Text: "hi"},
			{Role: "assistant", Text: "ok", ReasoningData: json.RawMessage(`[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAA"}]`)},
			{Role: "user", Text: "again"}}, "The encrypted content for item rs_1 could not be verified."},
		{"no model", nil, "no model configured"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			m := f.model(nil)
			if tt.msgs == nil {
				m = f.model(func(c *Config) { c.Model = "" })
				_, _, err := run(context.Background(), m, userReq("hi"))
				requireError(t, err, agent.KindInternal, agent.CodeModelError, tt.why)
				return
			}
			_, events, err := run(context.Background(), m, agent.ModelRequest{Messages: tt.msgs})
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.why)
			if code, msg := agent.Public(err); code != agent.CodeModelError || msg != "the model provider returned HTTP 400" {
				t.Fatalf("public (%q, %q)", code, msg)
			}
			if f.Requests() != 1 || len(events) != 0 {
				t.Fatalf("requests = %d, events %+v", f.Requests(), events)
			}
		})
	}
}

// TestEmptyAssistantStepDropsReasoning: reasoning of a step that said and called nothing is not replayed (the
// provider refuses a reasoning item without the item it preceded).
func TestEmptyAssistantStepDropsReasoning(t *testing.T) {
	t.Parallel()
	items, err := inputItems([]agent.ModelMessage{{Role: "user", Text: "hi"},
		{Role: "assistant", ReasoningData: json.RawMessage(`[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"x"}]`)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(items)
	if strings.Contains(string(b), "rs_1") {
		t.Fatalf("input %s", b)
	}
}

// BenchmarkStream is package openai's BenchmarkStream on this adapter: a 100-word reply from the offline model,
// over HTTP, per op (the offline server's cost included).
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

// Embed asks the same endpoint's embeddings, one vector per text in order (the offline model's deterministic ones).
func TestEmbed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	vecs, err := m.Embed(context.Background(), []string{"delete a file", "weather forecast"})
	if err != nil || len(vecs) != 2 || len(vecs[0]) != offline.EmbeddingDims || reflect.DeepEqual(vecs[0], vecs[1]) {
		t.Fatalf("vectors %d (%v)", len(vecs), err)
	}
	if body := f.LastBody(t); body["model"] != DefaultEmbeddingModel || m.EmbeddingModel() != DefaultEmbeddingModel {
		t.Fatalf("body %v", body)
	}
	var _ agent.Embedder = m
}

// A model that does not reason refuses reasoning settings with OpenAI's 400: the request goes again at once
// without them (not counted as a retry), and later requests to that model leave them out.
func TestModelWithoutReasoning(t *testing.T) {
	t.Parallel()
	srv := offline.New()
	var mu sync.Mutex
	var sent []bool // whether each request carried reasoning settings
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		_, reasons := body["reasoning"]
		mu.Lock()
		sent = append(sent, reasons)
		mu.Unlock()
		if reasons && body["model"] == "gpt-4.1" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"Unsupported parameter: 'reasoning.effort' is not supported with this model.","type":"invalid_request_error","param":"reasoning.effort","code":"unsupported_parameter"}}`)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	m := New(Config{BaseURL: ts.URL, Model: "gpt-4.1", ReasoningEffort: "low", MaxRetries: -1, Logger: slog.New(slog.DiscardHandler)})
	for _, tt := range []struct {
		body string
		want bool
	}{
		{`{"error":{"message":"Encrypted content is not supported with this model.","type":"invalid_request_error","param":null,"code":null}}`, true},
		{`{"error":{"message":"Unsupported value: 'reasoning.summary' does not support 'detailed' with this model.","type":"invalid_request_error","param":"reasoning.summary","code":"unsupported_value"}}`, true},
		{`{"error":{"message":"Unsupported parameter: 'temperature' is not supported with this model.","type":"invalid_request_error","param":"temperature","code":"unsupported_parameter"}}`, false},
	} {
		res := &http.Response{StatusCode: http.StatusBadRequest, Body: io.NopCloser(strings.NewReader(tt.body))}
		if got := refusesReasoning(openaiwire.ReadAPIError(res)); got != tt.want {
			t.Errorf("refusesReasoning(%s) = %v", tt.body, got)
		}
	}
	for range 2 {
		if _, events, err := run(context.Background(), m, userReq("hi")); err != nil || textOf(events, agent.EventTextDelta) != "You said: hi" {
			t.Fatalf("err %v events %+v", err, events)
		}
	}
	// Another model of the same adapter still gets them.
	req := userReq("hi")
	req.Model = "gpt-5"
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, false, true}; !reflect.DeepEqual(sent, want) {
		t.Fatalf("reasoning settings sent %v, want %v", sent, want)
	}
}

// cannedWords is a 200-word Responses stream shaped as OpenAI sends one (obfuscation padding included).
func cannedWords() []byte {
	var b strings.Builder
	seq := 0
	ev := func(typ, rest string) {
		fmt.Fprintf(&b, "event: %s\ndata: {\"type\":%q,%s\"sequence_number\":%d}\n\n", typ, typ, rest, seq)
		seq++
	}
	resp := func(status, usage string) string {
		return `"response":{"id":"resp_bench","object":"response","created_at":1700000000,"status":"` + status +
			`","model":"bench","output":[],"usage":` + usage + `},`
	}
	ev("response.created", resp("in_progress", "null"))
	ev("response.output_item.added", `"output_index":0,"item":{"id":"msg_bench","type":"message","status":"in_progress","content":[],"role":"assistant"},`)
	for i := range 200 {
		ev("response.output_text.delta", fmt.Sprintf(`"item_id":"msg_bench","output_index":0,"content_index":0,"delta":"w%s ","logprobs":[],"obfuscation":"aB3dE",`,
			strconv.FormatInt(int64(1e9+i*5000), 36)))
	}
	ev("response.completed", resp("completed", `{"input_tokens":20,"input_tokens_details":{"cached_tokens":0},"output_tokens":200,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":220}`))
	return []byte(b.String())
}

// BenchmarkStreamWords is package openai's BenchmarkStreamWords on this adapter: a canned 200-word reply from a
// server that does nothing else, the adapter's own cost per reply (reading, decoding, emitting).
func BenchmarkStreamWords(b *testing.B) {
	canned := cannedWords()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(canned)
	}))
	defer srv.Close()
	m := New(Config{BaseURL: srv.URL, Model: "bench", Logger: slog.New(slog.DiscardHandler)})
	b.ReportAllocs()
	for b.Loop() {
		words := 0
		res, err := m.Stream(context.Background(), userReq("hi"), func(ev agent.ModelEvent) error {
			if ev.Type == agent.EventTextDelta {
				words++
			}
			return nil
		})
		if err != nil || res.FinishReason != agent.FinishStop || words != 200 || res.Usage.TotalTokens != 220 {
			b.Fatalf("result %+v, %d words, err %v", res, words, err)
		}
	}
}

// TestRequestPrefixStable: a run's next step sends the earlier steps' input items, instructions and tools as the
// same bytes (the provider's prompt cache holds the prefix; issue 20 item 3), reasoning items included.
func TestRequestPrefixStable(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var raws [][]byte
	srv := offline.New()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		raws = append(raws, b)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	m := New(Config{BaseURL: ts.URL, Model: "m", Logger: slog.New(slog.DiscardHandler)})
	tools := []agent.ToolSpec{{Name: "b", Description: "<b> & co", Parameters: json.RawMessage(`{"type":"object", "properties":{}}`)},
		{Name: "a", Parameters: json.RawMessage(`{"type":"object"}`), InputExamples: []json.RawMessage{json.RawMessage(`{ "x" : 1 }`)}}}
	req := agent.ModelRequest{System: "Be brief & kind.", Tools: tools, Messages: []agent.ModelMessage{{Role: "user", Text: "/think /tool a {\"x\":1}"}}}
	res, events, err := run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	calls := callsOf(events)
	req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", ToolCalls: calls, ReasoningData: res.ReasoningData},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "<1>"})
	res, events, err = run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", Text: textOf(events, agent.EventTextDelta), ReasoningData: res.ReasoningData},
		agent.ModelMessage{Role: "user", Text: "next"})
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	type body struct {
		Instructions json.RawMessage   `json:"instructions"`
		Input        []json.RawMessage `json:"input"`
		Tools        json.RawMessage   `json:"tools"`
	}
	var bodies []body
	for _, raw := range raws {
		var b body
		if err := json.Unmarshal(raw, &b); err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	for i := 1; i < len(bodies); i++ {
		prev, cur := bodies[i-1], bodies[i]
		if !bytes.Equal(prev.Instructions, cur.Instructions) || !bytes.Equal(prev.Tools, cur.Tools) {
			t.Fatalf("request %d: instructions or tools changed", i)
		}
		for j, it := range prev.Input {
			if !bytes.Equal(it, cur.Input[j]) {
				t.Fatalf("request %d: input item %d changed:\n%s\n%s", i, j, it, cur.Input[j])
			}
		}
	}
	if !bytes.Contains(raws[0], []byte(`"Be brief & kind."`)) {
		t.Fatalf("HTML characters escaped: %s", raws[0])
	}
}
