package anthropic

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
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
)

// fixture is the real adapter talking HTTP to the offline model's /v1/messages, with the requests recorded.
type fixture struct {
	srv *offline.Server
	url string

	mu      sync.Mutex
	bodies  []map[string]any
	headers []http.Header
}

func setup(t *testing.T, opts ...offline.Option) *fixture {
	t.Helper()
	f := &fixture{srv: offline.New(append([]offline.Option{offline.WithWordDelay(time.Millisecond)}, opts...)...)}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.headers = append(f.headers, r.Header.Clone())
		f.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		f.srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	f.url = ts.URL + "/"
	return f
}

func (f *fixture) model(change func(*Config)) *Model {
	cfg := Config{BaseURL: f.url, APIKey: "test-key", Model: "claude-test", BackoffBase: time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)}
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

func user(text string) agent.ModelMessage { return agent.ModelMessage{Role: "user", Text: text} }

func run(ctx context.Context, m *Model, msgs ...agent.ModelMessage) (agent.ModelResult, []agent.ModelEvent, error) {
	var events []agent.ModelEvent
	res, err := m.Stream(ctx, agent.ModelRequest{Messages: msgs}, func(ev agent.ModelEvent) error {
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

func callsOf(events []agent.ModelEvent) []agent.ToolCall {
	var out []agent.ToolCall
	for _, ev := range events {
		if ev.Type == agent.EventToolCall {
			out = append(out, agent.ToolCall{ID: ev.ToolCallID, Name: ev.ToolName, Arguments: ev.Arguments})
		}
	}
	return out
}

func requireError(t *testing.T, err error, kind agent.Kind, code, contains string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *agent.Error", err, err)
	}
	if ae.Kind != kind || ae.Code != code || !strings.Contains(ae.Message, contains) {
		t.Fatalf("error = %v/%s %q, want %v/%s containing %q (cause %v)", ae.Kind, ae.Code, ae.Message, kind, code, contains, ae.Err)
	}
}

func TestText(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), user("hello there"))
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: hello there" {
		t.Errorf("text = %q", got)
	}
	if res.FinishReason != agent.FinishStop || res.Model != "claude-test" {
		t.Errorf("result = %+v", res)
	}
	h := f.headers[0]
	if h.Get("X-Api-Key") != "test-key" || h.Get("Authorization") != "" || h.Get("Anthropic-Version") != APIVersion {
		t.Errorf("headers: x-api-key %q, authorization %q, anthropic-version %q", h.Get("X-Api-Key"), h.Get("Authorization"), h.Get("Anthropic-Version"))
	}
	body := f.lastBody(t)
	if body["stream"] != true || body["max_tokens"] != float64(DefaultMaxOutputTokens) {
		t.Errorf("body = %v", body)
	}
}

// TestBaseURLWithV1: a base URL written as OpenAI's are (ending in /v1) reaches the same endpoint.
func TestBaseURLWithV1(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, base := range []string{f.url + "v1/", f.url + "v1", strings.TrimSuffix(f.url, "/")} {
		if _, _, err := run(context.Background(), f.model(func(c *Config) { c.BaseURL = base }), user("hi")); err != nil {
			t.Errorf("%s: %v", base, err)
		}
	}
}

func TestSystemAndModel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	res, err := m.Stream(context.Background(), agent.ModelRequest{Model: "claude-other", System: "Be brief.", MaxOutputTokens: 2,
		Messages: []agent.ModelMessage{user("one two three four")}}, func(agent.ModelEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if res.Model != "claude-other" || res.FinishReason != agent.FinishLength {
		t.Errorf("result = %+v, want the requested model and length", res)
	}
	body := f.lastBody(t)
	sys, _ := json.Marshal(body["system"])
	if string(sys) != `[{"cache_control":{"type":"ephemeral"},"text":"Be brief.","type":"text"}]` {
		t.Errorf("system = %s", sys)
	}
	last, _ := json.Marshal(body["messages"])
	if string(last) != `[{"content":[{"cache_control":{"type":"ephemeral"},"text":"one two three four","type":"text"}],"role":"user"}]` {
		t.Errorf("messages = %s", last)
	}
	// NoPromptCache: no breakpoints.
	if _, err := f.model(func(c *Config) { c.NoPromptCache = true }).Stream(context.Background(), agent.ModelRequest{System: "s",
		Messages: []agent.ModelMessage{user("x")}}, func(agent.ModelEvent) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(f.lastBody(t)); strings.Contains(string(b), "cache_control") {
		t.Errorf("NoPromptCache body = %s", b)
	}
}

// TestUsage: the offline model counts the newest message as input, the one before as a cache write and the
// rest as cache reads.
func TestUsage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	msgs := []agent.ModelMessage{user("a b"), {Role: "assistant", Text: "c d e"}, user("f")}
	res, _, err := run(context.Background(), f.model(nil), msgs...)
	if err != nil {
		t.Fatal(err)
	}
	// a b: 3 tokens (read), c d e: 4 (write), f: 2 (input); "You said: f": 3 output.
	want := agent.Usage{InputTokens: 9, CachedInputTokens: 3, CacheWriteTokens: 4, OutputTokens: 3, TotalTokens: 12}
	if res.Usage != want {
		t.Errorf("usage = %+v, want %+v", res.Usage, want)
	}
}

func TestTools(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	ctx := context.Background()
	tools := []agent.ToolSpec{{Name: "add_note", Description: "Adds a note.",
		Parameters:    json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
		InputExamples: []json.RawMessage{json.RawMessage(`{"text":"milk"}`)}}}
	first := []agent.ModelMessage{user(`/tool add_note {"text":"buy milk"} /tool add_note {"text":"eggs"}`)}
	var events []agent.ModelEvent
	res, err := m.Stream(ctx, agent.ModelRequest{Messages: first, Tools: tools}, func(ev agent.ModelEvent) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != agent.FinishToolCalls {
		t.Fatalf("finish = %s", res.FinishReason)
	}
	calls := callsOf(events)
	if len(calls) != 2 || calls[0].Arguments != `{"text":"buy milk"}` || calls[1].Arguments != `{"text":"eggs"}` ||
		!strings.HasPrefix(calls[0].ID, "toolu_") || calls[0].ID == calls[1].ID {
		t.Fatalf("calls = %+v", calls)
	}
	// Every tool event carries its call id; the argument deltas add up to the arguments.
	deltas := map[string]string{}
	starts := 0
	for _, ev := range events {
		switch ev.Type {
		case agent.EventToolCallStart:
			starts++
		case agent.EventToolCallDelta:
			deltas[ev.ToolCallID] += ev.Delta
		}
	}
	if starts != 2 || deltas[calls[0].ID] != calls[0].Arguments || deltas[calls[1].ID] != calls[1].Arguments {
		t.Errorf("starts %d, deltas %v", starts, deltas)
	}
	tool, _ := json.Marshal(f.lastBody(t)["tools"])
	if !strings.Contains(string(tool), `"input_examples":[{"text":"milk"}]`) || !strings.Contains(string(tool), `"input_schema":{"properties":{"text":{"type":"string"}},"type":"object"}`) {
		t.Errorf("tools = %s", tool)
	}

	// The results go back as one user message of two tool_result blocks.
	second := append(first, agent.ModelMessage{Role: "assistant", ToolCalls: calls},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "saved 1"},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[1].ID, Text: "saved 2"})
	res, events, err = run(ctx, m, second...)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Tool add_note returned: saved 1\nTool add_note returned: saved 2" {
		t.Errorf("text = %q", got)
	}
	msgs := f.lastBody(t)["messages"].([]any)
	if len(msgs) != 3 || len(msgs[2].(map[string]any)["content"].([]any)) != 2 {
		t.Errorf("messages = %v, want the two results in one user message", msgs)
	}
}

// TestReasoningReplay: a thinking block's signature comes back in ReasoningData, is replayed before the
// tool_use blocks of its assistant turn, and the offline model (as Anthropic) refuses the tool round without it
// or with a signature it did not issue.
func TestReasoningReplay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.ThinkingBudget = 1024 })
	ctx := context.Background()
	first := []agent.ModelMessage{user(`/think /tool lookup {"q":"x"}`)}
	res, events, err := run(ctx, m, first...)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventReasoningDelta); got != `Thinking about: /tool lookup {"q":"x"}` {
		t.Errorf("reasoning = %q", got)
	}
	var blocks []map[string]string
	if err := json.Unmarshal(res.ReasoningData, &blocks); err != nil || len(blocks) != 1 || blocks[0]["type"] != "thinking" ||
		blocks[0]["signature"] == "" || blocks[0]["thinking"] != textOf(events, agent.EventReasoningDelta) {
		t.Fatalf("reasoning data = %s (%v)", res.ReasoningData, err)
	}
	if res.Usage.ReasoningTokens != 5 { // Thinking about: /tool lookup {"q":"x"}
		t.Errorf("reasoning tokens = %d, want 5", res.Usage.ReasoningTokens)
	}
	body := f.lastBody(t)
	if th, _ := json.Marshal(body["thinking"]); string(th) != `{"budget_tokens":1024,"type":"enabled"}` {
		t.Errorf("thinking = %s", th)
	}
	calls := callsOf(events)
	step2 := func(data json.RawMessage) []agent.ModelMessage {
		return append(append([]agent.ModelMessage{}, first...),
			agent.ModelMessage{Role: "assistant", Reasoning: "ignored", ReasoningData: data, ToolCalls: calls},
			agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "found"})
	}
	res2, events, err := run(ctx, m, step2(res.ReasoningData)...)
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "Tool lookup returned: found" || res2.FinishReason != agent.FinishStop {
		t.Errorf("text = %q, finish %s", got, res2.FinishReason)
	}
	asst := f.lastBody(t)["messages"].([]any)[1].(map[string]any)["content"].([]any)
	if asst[0].(map[string]any)["type"] != "thinking" || asst[1].(map[string]any)["type"] != "tool_use" {
		t.Errorf("assistant content = %v, want thinking then tool_use", asst)
	}

	// A forged signature is refused as Anthropic refuses it.
	tampered := json.RawMessage(strings.Replace(string(res.ReasoningData), blocks[0]["signature"], "forged", 1))
	_, _, err = run(ctx, m, step2(tampered)...)
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "HTTP 400")
	if !strings.Contains(errors.Unwrap(err).Error(), "Invalid `signature`") {
		t.Errorf("cause %v", errors.Unwrap(err))
	}
	// A tool round with no thinking of this adapter's to replay (another model's calls, or another adapter's
	// state, which is ignored) goes without thinking: with it, the offline model refuses it as Anthropic does.
	for _, data := range []json.RawMessage{nil, json.RawMessage(`[{"type":"reasoning","encrypted_content":"x"}]`)} {
		if _, events, err := run(ctx, m, step2(data)...); err != nil || textOf(events, agent.EventTextDelta) != "Tool lookup returned: found" {
			t.Errorf("%s: %v %v", data, err, events)
		}
		if th := f.lastBody(t)["thinking"]; th != nil {
			t.Errorf("%s: thinking %v sent", data, th)
		}
	}
}

// fileServer serves /ok.jpg; every other path is 404 (an expired pre-signed URL).
func fileServer(t *testing.T) *httptest.Server {
	t.Helper()
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ok.jpg" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("\xff\xd8\xff\xe0 jpeg"))
	}))
	t.Cleanup(ts.Close)
	return ts
}

func TestFiles(t *testing.T) {
	t.Parallel()
	files := fileServer(t)
	f := setup(t, offline.WithFileClient(files.Client()))
	png := "data:image/png;base64,iVBORw0KGgo="
	pdf := "data:application/pdf;base64,JVBERi0xLjQK"
	_, events, err := run(context.Background(), f.model(nil), agent.ModelMessage{Role: "user", Text: "/received",
		Files: []agent.ModelFile{{MediaType: "image/png", URL: png}, {MediaType: "application/pdf", URL: pdf, Filename: "r.pdf"},
			{MediaType: "image/jpeg", URL: files.URL + "/ok.jpg"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := "text\nimage_url image/png 8 bytes\nfile application/pdf r.pdf 9 bytes\nimage_url " + files.URL + "/ok.jpg"
	if got := textOf(events, agent.EventTextDelta); got != want {
		t.Errorf("received = %q, want %q", got, want)
	}
}

// TestStaleFiles: Anthropic downloads files by URL itself. One of an older message that it cannot download (an
// expired pre-signed URL) is sent as a line instead, so the thread goes on; one of the newest message is the
// person's own to fix: file_unavailable, not retried.
func TestStaleFiles(t *testing.T) {
	t.Parallel()
	files := fileServer(t)
	f := setup(t, offline.WithFileClient(files.Client()))
	gone := agent.ModelMessage{Role: "user", Text: "look", Files: []agent.ModelFile{{MediaType: "image/jpeg", URL: files.URL + "/gone.jpg"},
		{MediaType: "application/pdf", URL: files.URL + "/gone.pdf", Filename: "old.pdf"}}}
	_, events, err := run(context.Background(), f.model(nil), gone, agent.ModelMessage{Role: "assistant", Text: "seen"}, user("and now?"))
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: and now?" {
		t.Errorf("text = %q", got)
	}
	first, _ := json.Marshal(f.lastBody(t)["messages"].([]any)[0])
	if !strings.Contains(string(first), "[attachment (image) no longer available]") ||
		!strings.Contains(string(first), "[attachment old.pdf (application/pdf) no longer available]") || f.srv.Requests() != 3 {
		t.Errorf("after %d requests the first message is %s", f.srv.Requests(), first)
	}

	f = setup(t, offline.WithFileClient(files.Client()))
	_, _, err = run(context.Background(), f.model(nil), gone)
	requireError(t, err, agent.KindInvalid, agent.CodeFileUnavailable, "could not read a file")
	if f.srv.Requests() != 1 {
		t.Errorf("requests = %d", f.srv.Requests())
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		text     string
		opts     []offline.Option
		kind     agent.Kind
		code     string
		contains string
		requests int64 // requests the offline model saw (MaxRetries 2: 3 for a retried failure)
		emitted  bool
	}{
		{"refused", "/error 400", nil, agent.KindUnavailable, agent.CodeModelError, "HTTP 400", 1, false},
		{"unauthorized", "/error 401", nil, agent.KindUnavailable, agent.CodeModelError, "HTTP 401", 1, false},
		{"rate limited", "/error 429", nil, agent.KindUnavailable, agent.CodeModelError, "HTTP 429", 3, false},
		{"overloaded", "/error 529", nil, agent.KindUnavailable, agent.CodeModelError, "HTTP 529", 3, false},
		{"server error", "/error 500", nil, agent.KindUnavailable, agent.CodeModelError, "HTTP 500", 3, false},
		{"overloaded mid-stream", "/error 529 after 2", nil, agent.KindUnavailable, agent.CodeModelError, "mid-stream", 1, true},
		{"overloaded before output", "/error 529 after 0", nil, agent.KindUnavailable, agent.CodeModelError, "mid-stream", 3, false},
		{"dropped", "/drop 2", nil, agent.KindUnavailable, agent.CodeModelError, "connection", 1, true},
		{"context too long", "hello", []offline.Option{offline.WithContextTokens(1)}, agent.KindTooLarge, agent.CodeMessageTooLarge, "too long", 1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, tc.opts...)
			_, events, err := run(context.Background(), f.model(nil), user(tc.text))
			requireError(t, err, tc.kind, tc.code, tc.contains)
			if n := f.srv.Requests(); n != tc.requests {
				t.Errorf("requests = %d, want %d", n, tc.requests)
			}
			if (len(events) > 0) != tc.emitted {
				t.Errorf("events = %v", events)
			}
			var ae *agent.Error
			errors.As(err, &ae)
			if strings.Contains(ae.Message, "offline model") || strings.Contains(ae.Message, "127.0.0.1") {
				t.Errorf("message %q names provider text", ae.Message)
			}
		})
	}
}

func TestFlakyRetried(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, events, err := run(context.Background(), f.model(nil), user("/flaky 2 529 fine"))
	if err != nil {
		t.Fatal(err)
	}
	if got := textOf(events, agent.EventTextDelta); got != "You said: fine" || f.srv.Requests() != 3 {
		t.Errorf("text %q after %d requests", got, f.srv.Requests())
	}
}

func TestAbort(t *testing.T) {
	t.Parallel()
	f := setup(t, offline.WithWordDelay(50*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	_, err := f.model(nil).Stream(ctx, agent.ModelRequest{Messages: []agent.ModelMessage{user("/slow 100")}}, func(agent.ModelEvent) error {
		n++
		if n == 2 {
			cancel()
		}
		return nil
	})
	requireError(t, err, agent.KindCanceled, agent.CodeRunCanceled, "canceled")
	if n > 3 {
		t.Errorf("%d events after cancel", n)
	}
}

// TestInvalidTranscripts: what the adapter sends for a transcript the provider refuses is refused by the
// offline model with Anthropic's own messages.
func TestInvalidTranscripts(t *testing.T) {
	t.Parallel()
	call := agent.ToolCall{ID: "toolu_1", Name: "x", Arguments: "{}"}
	cases := map[string]struct {
		msgs []agent.ModelMessage
		said string
	}{
		"unanswered tool_use": {[]agent.ModelMessage{user("a"), {Role: "assistant", ToolCalls: []agent.ToolCall{call}}, user("b")},
			"`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"},
		"orphan tool_result": {[]agent.ModelMessage{user("a"), {Role: "assistant", Text: "ok"}, {Role: "tool", ToolCallID: "toolu_9", Text: "r"}},
			"unexpected `tool_use_id` found in `tool_result` blocks: toolu_9"},
		"assistant first": {[]agent.ModelMessage{{Role: "assistant", Text: "hi"}, user("a")},
			`first message must use the "user" role`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			_, _, err := run(context.Background(), f.model(nil), tc.msgs...)
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "HTTP 400")
			if !strings.Contains(errors.Unwrap(err).Error(), tc.said) {
				t.Errorf("cause %v, want %q", errors.Unwrap(err), tc.said)
			}
		})
	}
}

// TestRecorded replays Anthropic SSE streams written by hand from Anthropic's documented stream format
// (testdata/*.sse; not captured from the live API, which this machine cannot reach): details the offline model
// does not produce (redacted thinking, a text block before tool use, cache usage in message_start, usage updated
// in message_delta, the refusal stop reason, an overloaded error event).
func TestRecorded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		file      string
		text      string
		reasoning string
		finish    agent.FinishReason
		usage     agent.Usage
		calls     int
		data      string
		errCode   string
	}{
		{file: "thinking_tool_use.sse", text: "Let me check the weather.", reasoning: "The user wants the weather in Paris. I should call get_weather.",
			finish: agent.FinishToolCalls, calls: 1,
			usage: agent.Usage{InputTokens: 2572, CachedInputTokens: 2048, CacheWriteTokens: 500, OutputTokens: 89, TotalTokens: 2661, ReasoningTokens: 31},
			data:  `[{"signature":"EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds","thinking":"The user wants the weather in Paris. I should call get_weather.","type":"thinking"},{"data":"EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP","type":"redacted_thinking"}]`},
		{file: "refusal.sse", text: "I can't help with that.", finish: agent.FinishContentFilter,
			usage: agent.Usage{InputTokens: 12, OutputTokens: 7, TotalTokens: 19}},
		{file: "overloaded.sse", errCode: agent.CodeModelError},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			sse, err := os.ReadFile("testdata/" + tc.file)
			if err != nil {
				t.Fatal(err)
			}
			var requests int
			var mu sync.Mutex
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests++
				mu.Unlock()
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = w.Write(sse)
			}))
			t.Cleanup(ts.Close)
			m := New(Config{BaseURL: ts.URL + "/", APIKey: "k", Model: "claude-sonnet-4-5", BackoffBase: time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
			res, events, err := run(context.Background(), m, user("weather in Paris?"))
			if tc.errCode != "" {
				requireError(t, err, agent.KindUnavailable, tc.errCode, "mid-stream")
				if requests != 3 {
					t.Errorf("requests = %d, want 3 (an overloaded_error before any output is retried)", requests)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := textOf(events, agent.EventTextDelta); got != tc.text {
				t.Errorf("text = %q", got)
			}
			if got := textOf(events, agent.EventReasoningDelta); got != tc.reasoning {
				t.Errorf("reasoning = %q", got)
			}
			if res.FinishReason != tc.finish || res.Usage != tc.usage || res.Model != "claude-sonnet-4-5-20250929" {
				t.Errorf("result = %+v", res)
			}
			if calls := callsOf(events); len(calls) != tc.calls || (tc.calls > 0 && (calls[0].Arguments != `{"location": "Paris, France"}` || calls[0].ID != "toolu_01T1x1fJ34qAmk2tNTrN7Up6")) {
				t.Errorf("calls = %+v", calls)
			}
			if string(res.ReasoningData) != tc.data {
				t.Errorf("reasoning data = %s", res.ReasoningData)
			}
		})
	}
}

// TestToolsBytesStable: a tool's input schema goes out byte for byte as given (not re-encoded), and the tools
// and system prompt are the same bytes in every request, so a provider's prompt cache holds across steps.
func TestToolsBytesStable(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	srv := offline.New()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(b))
		srv.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	m := New(Config{BaseURL: ts.URL + "/", APIKey: "k", Model: "claude-test", Logger: slog.New(slog.DiscardHandler)})
	schema := `{"type":"object","required":["z"],"properties":{"z":{"type":"string"},"a":{"type":"integer"}}}`
	req := agent.ModelRequest{System: "sys", Tools: []agent.ToolSpec{{Name: "t", Description: "d", Parameters: json.RawMessage(schema)}},
		Messages: []agent.ModelMessage{user("one")}}
	for i := 0; i < 2; i++ {
		if _, err := m.Stream(context.Background(), req, func(agent.ModelEvent) error { return nil }); err != nil {
			t.Fatal(err)
		}
		req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", Text: "You said: one"}, user("two"))
	}
	tail := func(body string) string { // system and tools follow messages in the body
		i := strings.Index(body, `"system"`)
		if i < 0 {
			t.Fatalf("no system in %s", body)
		}
		return body[i:]
	}
	if !strings.Contains(bodies[0], `"input_schema":`+schema) {
		t.Errorf("schema re-encoded: %s", bodies[0])
	}
	if tail(bodies[0]) != tail(bodies[1]) {
		t.Errorf("system and tools differ between requests:\n%s\n%s", tail(bodies[0]), tail(bodies[1]))
	}
}

// TestNoEnvironment: Anthropic's SDK variables (ANTHROPIC_*) change nothing; every setting comes from Config.
func TestNoEnvironment(t *testing.T) {
	t.Setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1/")
	t.Setenv("ANTHROPIC_API_KEY", "from-env")
	t.Setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Leak: 1")
	f := setup(t)
	if _, _, err := run(context.Background(), f.model(nil), user("hi")); err != nil {
		t.Fatal(err)
	}
	if h := f.headers[0]; h.Get("X-Leak") != "" || h.Get("X-Api-Key") != "test-key" {
		t.Errorf("headers = %v", h)
	}
}

// TestStalled: a stream that goes quiet after its first events fails with model_timeout; nothing was emitted
// (message_start and an empty text block carry no delta), so it is retried first.
func TestStalled(t *testing.T) {
	t.Parallel()
	f := setup(t, offline.WithWordDelay(10*time.Second)) // a cancelled request stops the offline model at once
	m := f.model(func(c *Config) { c.IdleTimeout = 10 * time.Millisecond; c.FirstTokenTimeout = time.Minute })
	_, events, err := run(context.Background(), m, user("/slow 2"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelTimeout, "stalled")
	if len(events) != 0 || f.srv.Requests() != 3 {
		t.Errorf("events %v after %d requests", events, f.srv.Requests())
	}
}

// TestCacheBreakpoints: the breakpoints sit on the last tool, the system prompt, the newest message of the
// stable prefix (what the previous step ended on) and the last message, four in all (the offline model, as
// Anthropic, refuses more), never on a thinking block; with thinking replayed first, the breakpoint of an
// assistant message is on its last block. Cache reads and writes come back as cached input and cache writes.
func TestCacheBreakpoints(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.ThinkingBudget = 1024 })
	ctx := context.Background()
	tools := []agent.ToolSpec{{Name: "a", Parameters: json.RawMessage(`{"type":"object"}`)}, {Name: "lookup", Parameters: json.RawMessage(`{"type":"object"}`)}}
	first := []agent.ModelMessage{user("hello"), {Role: "assistant", Text: "You said: hello"}, user(`/tool lookup {"q":"x"}`)}
	var events []agent.ModelEvent
	collect := func(ev agent.ModelEvent) error { events = append(events, ev); return nil }
	res, err := m.Stream(ctx, agent.ModelRequest{System: "sys", Tools: tools, Messages: first}, collect)
	if err != nil {
		t.Fatal(err)
	}
	marks := func() []string { // where the breakpoints are: tool names, "system", "message N block M type"
		t.Helper()
		b, _ := json.Marshal(f.lastBody(t))
		var body struct {
			Tools []struct {
				Name         string          `json:"name"`
				CacheControl json.RawMessage `json:"cache_control"`
			} `json:"tools"`
			System   []map[string]any `json:"system"`
			Messages []struct {
				Content []map[string]any `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tl := range body.Tools {
			if tl.CacheControl != nil {
				out = append(out, "tool "+tl.Name)
			}
		}
		for _, s := range body.System {
			if s["cache_control"] != nil {
				out = append(out, "system")
			}
		}
		for i, msg := range body.Messages {
			for j, blk := range msg.Content {
				if blk["cache_control"] != nil {
					out = append(out, fmt.Sprintf("message %d block %d %s", i, j, blk["type"]))
				}
			}
		}
		return out
	}
	if got, want := marks(), []string{"tool lookup", "system", "message 0 block 0 text", "message 2 block 0 text"}; !slices.Equal(got, want) {
		t.Errorf("breakpoints %q, want %q", got, want)
	}
	// The tool round: the prefix ends on the message the first step ended on; the assistant's turn starts with
	// its thinking, and the last message (the tool result) takes the other breakpoint.
	calls := callsOf(events)
	second := append(append([]agent.ModelMessage{}, first...), agent.ModelMessage{Role: "assistant", ReasoningData: res.ReasoningData, ToolCalls: calls},
		agent.ModelMessage{Role: "tool", ToolCallID: calls[0].ID, Text: "found"})
	res, err = m.Stream(ctx, agent.ModelRequest{System: "sys", Tools: tools, Messages: second}, collect)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := marks(), []string{"tool lookup", "system", "message 2 block 0 text", "message 4 block 0 tool_result"}; !slices.Equal(got, want) {
		t.Errorf("tool round breakpoints %q, want %q", got, want)
	}
	if u := res.Usage; u.CachedInputTokens == 0 || u.CacheWriteTokens == 0 || u.InputTokens != u.CachedInputTokens+u.CacheWriteTokens+2 {
		t.Errorf("usage %+v: want cache reads and writes reported, the newest message (2 tokens) as the rest", u)
	}
	// An assistant message whose last block would be thinking (none of text or calls) is not marked there.
	p := &messagesRequest{Messages: []message{{Role: "user", Content: []block{textBlock("a")}},
		{Role: "assistant", Content: replay(res.ReasoningData)}, {Role: "user", Content: []block{textBlock("b")}}}}
	if len(p.Messages[1].Content) == 0 {
		p.Messages[1].Content = []block{{Type: "redacted_thinking", Data: "x"}}
	}
	markCache(p)
	if n := breakpoints(p); n != 2 || p.Messages[1].Content[0].CacheControl != nil {
		t.Errorf("%d breakpoints, thinking marked %v", n, p.Messages[1].Content[0].CacheControl)
	}
}

// TestMore: events that arrive together (a recorded stream written at once) say More while the next one is at
// hand; the last one, after which the adapter returns, does not.
func TestMore(t *testing.T) {
	t.Parallel()
	sse, err := os.ReadFile("testdata/thinking_tool_use.sse")
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(sse)
	}))
	t.Cleanup(ts.Close)
	m := New(Config{BaseURL: ts.URL, APIKey: "k", Model: "claude-sonnet-4-5", Logger: slog.New(slog.DiscardHandler)})
	_, events, err := run(context.Background(), m, user("weather in Paris?"))
	if err != nil {
		t.Fatal(err)
	}
	more := 0
	for _, ev := range events {
		if ev.More {
			more++
		}
	}
	if more == 0 || events[len(events)-1].More || events[len(events)-1].Type != agent.EventToolCall {
		t.Errorf("%d of %d events say More; the last %+v", more, len(events), events[len(events)-1])
	}
}
