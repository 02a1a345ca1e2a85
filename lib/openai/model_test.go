package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modeltest"
	"github.com/agentloop/agentloop/lib/offline"
)

// fixture is the real adapter talking HTTP to the offline model, with the requests it sent recorded
// (modeltest.Serve).
type fixture struct {
	*modeltest.Offline
	url string
}

// setup serves the offline model (1 ms /slow words unless opts say otherwise) behind a recorder.
func setup(t *testing.T, opts ...offline.Option) *fixture {
	t.Helper()
	o := modeltest.Serve(t, opts...)
	return &fixture{Offline: o, url: o.URL + "/v1/"}
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
	m := f.model(func(c *Config) { c.APIKey = "sk-test" })
	res, events, err := run(context.Background(), m, userReq("hello world"))
	if err != nil {
		t.Fatal(err)
	}
	want := agent.ModelResult{
		FinishReason: agent.FinishStop,
		Model:        "test-model",
		// The offline estimate: prompt 1 message + 2 words, reply 4 words.
		Usage: agent.Usage{InputTokens: 3, OutputTokens: 4, TotalTokens: 7},
	}
	if !reflect.DeepEqual(res, want) {
		t.Fatalf("result %+v, want %+v", res, want)
	}
	// One text delta per word, forwarded as they came; nothing else.
	if len(events) != 4 || textOf(events, agent.EventTextDelta) != "You said: hello world" {
		t.Fatalf("events %+v", events)
	}

	// The request: streamed with usage, bounded output, the key as bearer token, no tools.
	body := f.LastBody(t)
	if body["stream"] != true || body["model"] != "test-model" || body["max_completion_tokens"] != float64(DefaultMaxOutputTokens) {
		t.Fatalf("request body %v", body)
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Fatalf("stream_options %v", body["stream_options"])
	}
	if _, ok := body["tools"]; ok {
		t.Fatalf("tools sent without any: %v", body["tools"])
	}
	if f.Auths()[0] != "Bearer sk-test" {
		t.Fatalf("authorization %q", f.Auths()[0])
	}
	if _, ok := body["prompt_cache_key"]; ok {
		t.Fatal("prompt_cache_key sent without a CacheKey")
	}

	// The request's CacheKey (the engine's thread id) is prompt_cache_key; the offline model, which checks its
	// type as OpenAI does, takes it.
	req := userReq("hello")
	req.CacheKey = "thread-1"
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	if body := f.LastBody(t); body["prompt_cache_key"] != "thread-1" {
		t.Fatalf("prompt_cache_key %v", body["prompt_cache_key"])
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
	if res.FinishReason != agent.FinishToolCalls || textOf(events, agent.EventTextDelta) != "" {
		t.Fatalf("result %+v, events %+v", res, events)
	}
	calls := callsOf(events)
	if len(calls) != 1 {
		t.Fatalf("complete calls %+v", calls)
	}
	call := calls[0]
	if call.Name != "add_note" || call.Arguments != `{"text":"buy milk"}` || !strings.HasPrefix(call.ID, "call_") {
		t.Fatalf("call %+v", call)
	}
	// The shape of the stream: start, argument fragments, then the complete call last. Every event names the
	// call by id, so the engine never maps indexes.
	start, last := events[0], events[len(events)-1]
	if start.Type != agent.EventToolCallStart || start.ToolCallID != call.ID || start.ToolName != "add_note" {
		t.Fatalf("first event %+v", start)
	}
	if last.Type != agent.EventToolCall {
		t.Fatalf("last event %+v, want the complete call", last)
	}
	deltas := 0
	for _, ev := range events[1 : len(events)-1] {
		if ev.Type != agent.EventToolCallDelta || ev.ToolCallID != call.ID {
			t.Fatalf("event %+v", ev)
		}
		deltas++
	}
	if deltas < 2 || textOf(events, agent.EventToolCallDelta) != call.Arguments {
		t.Fatalf("%d argument deltas, %q", deltas, textOf(events, agent.EventToolCallDelta))
	}

	// The tools went out as function tools; a tool without a schema gets an empty object schema.
	sent, _ := f.LastBody(t)["tools"].([]any)
	if len(sent) != 2 {
		t.Fatalf("tools %v", f.LastBody(t)["tools"])
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
		agent.ModelMessage{Role: "assistant", ToolCalls: calls},
		agent.ModelMessage{Role: "tool", ToolCallID: call.ID, Text: `{"id":"n1"}`},
	)
	res, events, err = run(context.Background(), m, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := `Tool add_note returned: {"id":"n1"}`; res.FinishReason != agent.FinishStop ||
		textOf(events, agent.EventTextDelta) != want || len(callsOf(events)) != 0 {
		t.Fatalf("result %+v events %+v", res, events)
	}
	msgs, _ := f.LastBody(t)["messages"].([]any)
	if len(msgs) != 4 || msgs[0].(map[string]any)["role"] != "system" || msgs[3].(map[string]any)["tool_call_id"] != call.ID {
		t.Fatalf("messages %v", msgs)
	}
}

func TestParallelToolCalls(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, events, err := run(context.Background(), f.model(nil), userReq(`/tool a {} /tool b {"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	calls := callsOf(events)
	if len(calls) != 2 || calls[0].Name != "a" || calls[0].Arguments != "{}" || calls[1].Name != "b" ||
		calls[1].Arguments != `{"x":1}` || calls[0].ID == calls[1].ID {
		t.Fatalf("calls %+v", calls)
	}
	// Each fragment belongs to the call its id names.
	args := map[string]string{}
	for _, ev := range events {
		if ev.Type == agent.EventToolCallDelta {
			args[ev.ToolCallID] += ev.Delta
		}
	}
	if args[calls[0].ID] != "{}" || args[calls[1].ID] != `{"x":1}` {
		t.Fatalf("fragments by id %v", args)
	}
}

// sseServer serves one scripted stream: each chunk as an SSE data line, then [DONE].
func sseServer(t *testing.T, chunks ...string) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range chunks {
			io.WriteString(w, "data: "+c+"\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(ts.Close)
	return ts.URL + "/v1/"
}

// TestProviderToolCallShapes covers tool call streams that OpenAI itself does not send but compatible servers do.
func TestProviderToolCallShapes(t *testing.T) {
	t.Parallel()
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`
	chunk := func(delta string) string { return head + delta + `}]}` }
	finish := head + `{},"finish_reason":"tool_calls"}]}`
	tests := []struct {
		name   string
		chunks []string
		want   []agent.ToolCall
	}{
		{
			"every call at index 0, told apart by id",
			[]string{
				chunk(`{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"a","arguments":"{\"x\":"}}]}`),
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}`),
				chunk(`{"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"b","arguments":"{}"}}]}`),
				finish,
			},
			[]agent.ToolCall{{ID: "call_a", Name: "a", Arguments: `{"x":1}`}, {ID: "call_b", Name: "b", Arguments: "{}"}},
		},
		{
			"arguments before the name, no id, no arguments at all",
			[]string{
				chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\""}}]}`),
				chunk(`{"tool_calls":[{"index":0,"function":{"name":"search","arguments":":1}"}}]}`),
				chunk(`{"tool_calls":[{"index":1,"id":"call_2","function":{"name":"ping"}}]}`),
				finish,
			},
			[]agent.ToolCall{{ID: "call_gen1", Name: "search", Arguments: `{"q":1}`}, {ID: "call_2", Name: "ping", Arguments: "{}"}},
		},
		{
			"a call that never gets a name is never announced",
			[]string{chunk(`{"tool_calls":[{"index":0,"id":"call_x","function":{"arguments":"{}"}}]}`), finish},
			nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{BaseURL: sseServer(t, tt.chunks...), Model: "m", IDs: &seqIDs{}, Logger: slog.New(slog.DiscardHandler)})
			res, events, err := run(context.Background(), m, userReq("hi"))
			if err != nil || res.FinishReason != agent.FinishToolCalls {
				t.Fatalf("result %+v err %v", res, err)
			}
			if got := callsOf(events); !slices.Equal(got, tt.want) {
				t.Fatalf("calls %+v, want %+v", got, tt.want)
			}
			// Starts and fragments agree with the complete calls.
			args := map[string]string{}
			for _, ev := range events {
				switch ev.Type {
				case agent.EventToolCallStart:
					args[ev.ToolCallID] = ""
				case agent.EventToolCallDelta:
					args[ev.ToolCallID] += ev.Delta
				}
			}
			if len(args) != len(tt.want) {
				t.Fatalf("started %v, want %d calls", args, len(tt.want))
			}
			for _, c := range tt.want {
				if a, ok := args[c.ID]; !ok || (a != c.Arguments && !(a == "" && c.Arguments == "{}")) {
					t.Fatalf("fragments of %s = %q, want %q", c.ID, a, c.Arguments)
				}
			}
		})
	}
}

// seqIDs hands out call_gen1, call_gen2, ...
type seqIDs struct{ n atomic.Int64 }

func (s *seqIDs) New(prefix string) string { return fmt.Sprintf("%s_gen%d", prefix, s.n.Add(1)) }

func TestToolCallsOnlyAfterFinish(t *testing.T) {
	t.Parallel()
	// A stream cut after a call's arguments: the call is not known to be whole, so no EventToolCall goes out.
	f := setup(t)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","function":{"name":"a","arguments":"{}"}}]}}]}`+"\n\n")
	}))
	t.Cleanup(ts.Close)
	m := f.model(func(c *Config) { c.BaseURL = ts.URL + "/v1/" })
	res, events, err := run(context.Background(), m, userReq("hi"))
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "ended before the model finished")
	if res.FinishReason != agent.FinishError || len(callsOf(events)) != 0 || len(events) != 2 {
		t.Fatalf("result %+v events %+v", res, events)
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

// Reasoning tokens come from completion_tokens_details.reasoning_tokens and are part of the output tokens.
func TestUsageReasoning(t *testing.T) {
	t.Parallel()
	f := setup(t)
	req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/think ponder this"}}}
	res, _, err := run(context.Background(), f.model(nil), req)
	if err != nil {
		t.Fatal(err)
	}
	// Offline estimate: the user message is 1+3 prompt tokens, none cached (it is the only one); the reasoning
	// "Thinking about: ponder this" is 4 words and the reply "You said: ponder this" 4 more.
	want := agent.Usage{InputTokens: 4, OutputTokens: 8, TotalTokens: 12, ReasoningTokens: 4}
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
		{"error before the first event is retried", "/drop 0", 0, 3, "connection to the model provider failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			m := f.model(func(c *Config) { c.MaxRetries = tt.maxRetries })
			res, events, err := run(context.Background(), m, userReq(tt.text))
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
	tests := []struct {
		name, text, contains string
	}{
		{"error event", "/error 500 after 3", "code 500"}, // the provider's words, in the cause for the logs
		{"connection cut", "/drop 3", "connection to the model provider failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			res, events, err := run(context.Background(), f.model(nil), userReq(tt.text))
			requireError(t, err, agent.KindUnavailable, agent.CodeModelError, tt.contains)
			// Deltas were emitted before the failure, so the adapter must not retry.
			if f.Requests() != 1 {
				t.Fatalf("requests = %d, want 1", f.Requests())
			}
			if textOf(events, agent.EventTextDelta) != "word1 word2 word3" {
				t.Fatalf("events %+v", events)
			}
			if res.FinishReason != agent.FinishError || res.Model != "test-model" {
				t.Fatalf("partial result %+v", res)
			}
		})
	}
}

// stallFirst delays the offline model's answer, headers included, by d (or until the client goes away): a
// provider that accepted the request and has not started answering. It counts the requests it receives.
func stallFirst(d time.Duration, n *atomic.Int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		// net/http notices a client that went away only once the body has been read.
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		select {
		case <-time.After(d):
			next.ServeHTTP(w, r)
		case <-r.Context().Done():
		}
	})
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	// limit is both timeouts of a row. The rows that must not time out run at 500 ms against 10 ms gaps (a margin
	// of 50: at 100 ms, gaps stretched by a load average of 23 were taken for stalls, twice); the rows that must
	// time out run at 100 ms against stalls of seconds.
	const limit, wide = 100 * time.Millisecond, 500 * time.Millisecond
	tests := []struct {
		name      string
		limit     time.Duration
		wordDelay time.Duration
		stall     time.Duration // before the answer starts
		text      string
		emitDelay time.Duration // time the consumer takes per event
		wantErr   string        // "" for success; else a part of the timeout message
		requests  int64
	}{
		// 80 words 10 ms apart last 800 ms, longer than both timeouts, but never pause for 500 ms: a long reply
		// that keeps streaming is never cut.
		{name: "slow stream that never stalls", limit: wide, wordDelay: 10 * time.Millisecond, text: "/slow 80", requests: 1},
		// A consumer slower than the idle gap (a client reading slowly) is not a stalled model.
		{name: "slow consumer", limit: wide, wordDelay: time.Millisecond, text: "/slow 3", emitDelay: 2 * wide, requests: 1},
		// No first chunk: nothing was emitted, so the attempt is retried once, then fails.
		// The stalls are long against the 100 ms timeouts but bounded, so that a server handler that misses the
		// client going away (seen under load) cannot hold httptest.Server.Close, and the test, for long.
		{name: "stalled first token", limit: limit, stall: 3 * time.Second, text: "hi", wantErr: "sent nothing within 100ms", requests: 2},
		// The reasoning delta goes out at once, then the first word never comes: a stall mid-stream, after an
		// emit, so there is no retry.
		{name: "stalled mid-stream", limit: limit, wordDelay: 3 * time.Second, text: "/think /slow 2", wantErr: "stalled for 100ms", requests: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var requests atomic.Int64
			ts := httptest.NewServer(stallFirst(tt.stall, &requests, offline.New(offline.WithWordDelay(tt.wordDelay))))
			t.Cleanup(ts.Close)
			m := New(Config{
				BaseURL: ts.URL + "/v1/", Model: "m", FirstTokenTimeout: tt.limit, IdleTimeout: tt.limit, MaxRetries: 1,
				BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler),
			})
			var events []agent.ModelEvent
			res, err := m.Stream(context.Background(), userReq(tt.text), func(ev agent.ModelEvent) error {
				events = append(events, ev)
				time.Sleep(tt.emitDelay)
				return nil
			})
			if n := requests.Load(); n != tt.requests {
				t.Fatalf("requests = %d, want %d", n, tt.requests)
			}
			if tt.wantErr == "" {
				if err != nil || res.FinishReason != agent.FinishStop {
					t.Fatalf("result %+v err %v", res, err)
				}
				return
			}
			requireError(t, err, agent.KindUnavailable, agent.CodeModelTimeout, tt.wantErr)
			if code, msg := agent.Public(err); code != agent.CodeModelTimeout || !strings.Contains(msg, tt.wantErr) {
				t.Fatalf("public %q %q", code, msg)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	runTimeout := agent.E(agent.KindUnavailable, agent.CodeRunTimeout, "run took too long")
	tests := []struct {
		name  string
		cause error
		code  string
		delay time.Duration
	}{
		{"plain cancel", nil, agent.CodeRunCanceled, 5 * time.Millisecond},
		{"cancel with an agent error cause", runTimeout, agent.CodeRunTimeout, 5 * time.Millisecond},
		// No delay: later words are already in the read buffer when the first is emitted (what a loaded machine
		// does to the 5 ms cases); the adapter must not emit them after the cancel.
		{"cancel with the rest buffered", nil, agent.CodeRunCanceled, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, offline.WithWordDelay(tt.delay))
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
			if f.Requests() != 1 || len(events) != 1 {
				t.Fatalf("requests = %d, events %+v", f.Requests(), events)
			}
		})
	}

	// Two words arrive in one read and the provider then goes quiet: the first word's emit cancels, and the
	// second, held back until the next event is at hand (ModelEvent.More), must not be released to the caller
	// before the wait. It was, in a fresh-clone make test (events [word1 word2]).
	t.Run("cancel with one word held back", func(t *testing.T) {
		t.Parallel()
		const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: "+head+`{"content":"word1"}}]}`+"\n\ndata: "+head+`{"content":" word2"}}]}`+"\n\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}))
		t.Cleanup(ts.Close)
		m := New(Config{BaseURL: ts.URL + "/v1/", Model: "m", Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var events []agent.ModelEvent
		_, err := m.Stream(ctx, userReq("hi"), func(ev agent.ModelEvent) error {
			events = append(events, ev)
			cancel()
			return nil
		})
		requireError(t, err, agent.KindCanceled, agent.CodeRunCanceled, "model call canceled")
		if len(events) != 1 || events[0].Delta != "word1" {
			t.Fatalf("events %+v, want only word1", events)
		}
	})

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
		if f.Requests() != 1 {
			t.Fatalf("requests = %d", f.Requests())
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
	if err != stop || calls != 1 || f.Requests() != 1 {
		t.Fatalf("err %v after %d emits and %d requests", err, calls, f.Requests())
	}
}

func TestReasoning(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, events, err := run(context.Background(), f.model(nil), userReq("/think why"))
	if err != nil {
		t.Fatal(err)
	}
	if res.FinishReason != agent.FinishStop || textOf(events, agent.EventReasoningDelta) != "Thinking about: why" ||
		textOf(events, agent.EventTextDelta) != "You said: why" {
		t.Fatalf("result %+v events %+v", res, events)
	}
	if events[0].Type != agent.EventReasoningDelta || events[len(events)-1].Type != agent.EventTextDelta {
		t.Fatalf("reasoning must come first: %+v", events)
	}
}

func TestOutputTokenLimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.MaxOutputTokens = 2 })
	res, events, err := run(context.Background(), m, userReq("one two three"))
	if err != nil {
		t.Fatal(err)
	}
	if textOf(events, agent.EventTextDelta) != "You said:" || res.FinishReason != agent.FinishLength {
		t.Fatalf("result %+v events %+v", res, events)
	}
	// A request's own limit wins over the config's.
	req := userReq("one two three")
	req.MaxOutputTokens = 3
	if res, events, err = run(context.Background(), m, req); err != nil || textOf(events, agent.EventTextDelta) != "You said: one" {
		t.Fatalf("result %+v err %v", res, err)
	}
	if got := f.LastBody(t)["max_completion_tokens"]; got != float64(3) {
		t.Fatalf("max_completion_tokens %v", got)
	}
}

// TestCompatibility covers the request fields some compatible servers refuse (REVIEW "Provider compatibility").
func TestCompatibility(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		change        func(*Config)
		wantField     string // the field that carries the bound, "" for none
		streamOptions bool
	}{
		{"defaults", nil, "max_completion_tokens", true},
		{"max_tokens", func(c *Config) { c.MaxTokensParam = MaxTokens }, "max_tokens", true},
		{"no bound", func(c *Config) { c.MaxTokensParam = MaxTokensNone }, "", true},
		{"no stream options", func(c *Config) { c.OmitStreamOptions = true }, "max_completion_tokens", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			m := f.model(func(c *Config) {
				c.MaxOutputTokens = 2
				if tt.change != nil {
					tt.change(c)
				}
			})
			res, events, err := run(context.Background(), m, userReq("one two three"))
			if err != nil {
				t.Fatal(err)
			}
			body := f.LastBody(t)
			for _, field := range []string{"max_completion_tokens", "max_tokens"} {
				if _, sent := body[field]; sent != (field == tt.wantField) {
					t.Fatalf("%s sent = %v in %v", field, sent, body)
				}
			}
			if _, sent := body["stream_options"]; sent != tt.streamOptions {
				t.Fatalf("stream_options sent = %v", sent)
			}
			// The offline model honours either field, and reports usage only when asked.
			cut := tt.wantField != ""
			if (res.FinishReason == agent.FinishLength) != cut || (textOf(events, agent.EventTextDelta) == "You said:") != cut {
				t.Fatalf("result %+v, text %q", res, textOf(events, agent.EventTextDelta))
			}
			if (res.Usage.TotalTokens > 0) != tt.streamOptions {
				t.Fatalf("usage %+v", res.Usage)
			}
		})
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
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "connection to the model provider failed")
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
	if f.Requests() != 0 {
		t.Fatalf("requests = %d, want 0", f.Requests())
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
	res, events, err := run(context.Background(), m, userReq("ping"))
	if err != nil || textOf(events, agent.EventTextDelta) != "You said: ping" || res.Model != "offline" {
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
			_, events, err := run(context.Background(), m, userReq(text))
			if got := textOf(events, agent.EventTextDelta); err == nil && got != "You said: "+strings.TrimSpace(text) {
				err = errors.New("wrong text " + got)
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

// TestErrorsAreSafeForUsers: what a client sees (agent.Public) is a catalog code and a fixed sentence; the
// provider's body, the base URL and the key reach only the cause, for the logs (REVIEW L/M11).
func TestErrorsAreSafeForUsers(t *testing.T) {
	t.Parallel()
	const key = "sk-proj-secret-abcd"
	// OpenAI's own 401 body quotes the masked key.
	providerBody := `{"error":{"message":"Incorrect API key provided: sk-proj-****abcd. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`
	refused := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return "http://" + ln.Addr().String() + "/v1/"
	}
	tests := []struct {
		name    string
		baseURL func(t *testing.T) string
		text    string
		code    string
		message string // the whole public message
		logsSay string // a part of the cause chain that the logs need
	}{
		{
			name: "HTTP 401 with the provider's body",
			baseURL: func(t *testing.T) string {
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					io.WriteString(w, providerBody)
				}))
				t.Cleanup(ts.Close)
				return ts.URL + "/v1/"
			},
			text: "hi", code: agent.CodeModelError, message: "the model provider returned HTTP 401",
			logsSay: "Incorrect API key provided",
		},
		{
			name: "error event mid-stream", baseURL: func(t *testing.T) string { return setup(t).url },
			text: "/error 500 after 1", code: agent.CodeModelError, message: "the model provider failed mid-stream",
			logsSay: "injected error 500",
		},
		{
			name: "connection refused", baseURL: refused,
			text: "hi", code: agent.CodeModelError, message: "the connection to the model provider failed",
			logsSay: "connection refused",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			base := tt.baseURL(t)
			m := New(Config{BaseURL: base, APIKey: key, Model: "m", MaxRetries: -1, Logger: slog.New(slog.DiscardHandler)})
			_, _, err := run(context.Background(), m, userReq(tt.text))
			code, msg := agent.Public(err)
			if code != tt.code || msg != tt.message {
				t.Fatalf("public (%q, %q), want (%q, %q)", code, msg, tt.code, tt.message)
			}
			host := strings.TrimPrefix(strings.TrimSuffix(base, "/v1/"), "http://")
			for _, secret := range []string{host, key, "sk-", "Incorrect API key", "injected"} {
				if strings.Contains(msg, secret) {
					t.Fatalf("public message %q contains %q", msg, secret)
				}
			}
			if !strings.Contains(err.Error(), tt.logsSay) {
				t.Fatalf("the cause %q lost %q, which the logs need", err, tt.logsSay)
			}
		})
	}
}

// TestInvalidTranscript: a transcript the provider would refuse (here REVIEW H2's lone tool message, and an
// unanswered call) comes back from the offline model as OpenAI's 400, which surfaces as model_error, is not
// retried, and keeps the provider's reason in the cause for the logs.
func TestInvalidTranscript(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msgs []agent.ModelMessage
		why  string
	}{
		{"lone tool message", []agent.ModelMessage{{Role: "tool", ToolCallID: "call_1", Text: "out"}},
			"must be a response to a preceeding message with 'tool_calls'"},
		{"unanswered call", []agent.ModelMessage{
			{Role: "user", Text: "hi"},
			{Role: "assistant", ToolCalls: []agent.ToolCall{{ID: "call_1", Name: "a", Arguments: "{}"}}},
			{Role: "user", Text: "again"},
		}, "did not have response messages: call_1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			_, events, err := run(context.Background(), f.model(nil), agent.ModelRequest{Messages: tt.msgs})
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

// cannedReply is a 200-word reply shaped as the peer benchmark's fake model sends it (one chunk per word, then
// finish and usage).
func cannedReply() []byte {
	const head = `data: {"id":"chatcmpl-peerbench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[{"index":0,"delta":`
	var body strings.Builder
	body.WriteString(head + `{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	for i := range 200 {
		fmt.Fprintf(&body, "%s{\"content\":\"w%s \"},\"finish_reason\":null}]}\n\n", head, strconv.FormatInt(int64(1e9+i*5000), 36))
	}
	body.WriteString(head + `{},"finish_reason":"stop"}]}` + "\n\n")
	body.WriteString(`data: {"id":"chatcmpl-peerbench","object":"chat.completion.chunk","created":1700000000,"model":"bench","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":200,"total_tokens":220}}` + "\n\ndata: [DONE]\n\n")
	return []byte(body.String())
}

// cannedServer answers every request with cannedReply, written at once, and counts the connections opened to it.
func cannedServer(tb testing.TB) (url string, conns *atomic.Int64) {
	canned := cannedReply()
	conns = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(canned)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	return srv.URL + "/v1/", conns
}

func streamCanned(b *testing.B, m *Model) {
	words := 0
	res, err := m.Stream(context.Background(), userReq("hi"), func(ev agent.ModelEvent) error {
		if ev.Type == agent.EventTextDelta {
			words++
		}
		return nil
	})
	if err != nil || res.FinishReason != agent.FinishStop || words != 200 || res.Usage.TotalTokens != 220 {
		b.Errorf("result %+v, %d words, err %v", res, words, err)
	}
}

// BenchmarkStreamWords streams the canned 200-word reply from a server that does nothing else: the adapter's own
// cost per reply (reading, decoding, emitting), without a model's.
func BenchmarkStreamWords(b *testing.B) {
	url, _ := cannedServer(b)
	m := New(Config{BaseURL: url, Model: "bench", Logger: slog.New(slog.DiscardHandler)})
	b.ReportAllocs()
	for b.Loop() {
		streamCanned(b, m)
	}
}

// BenchmarkConcurrentReplies streams 16 canned replies at once per op, with the adapter's default client and
// with http.DefaultClient: dials/op is the connections each op opened (DefaultClient keeps 2 idle per host).
func BenchmarkConcurrentReplies(b *testing.B) {
	for _, tc := range []struct {
		name   string
		client *http.Client
	}{{"default client", nil}, {"http.DefaultClient", http.DefaultClient}} {
		b.Run(tc.name, func(b *testing.B) {
			url, conns := cannedServer(b)
			m := New(Config{BaseURL: url, Model: "bench", HTTPClient: tc.client, Logger: slog.New(slog.DiscardHandler)})
			b.ReportAllocs()
			for b.Loop() {
				var wg sync.WaitGroup
				for range 16 {
					wg.Go(func() { streamCanned(b, m) })
				}
				wg.Wait()
			}
			b.ReportMetric(float64(conns.Load())/float64(b.N), "dials/op")
		})
	}
}

// Issue 19 item 4: Chat Completions has no field for input examples, so they are folded into the description,
// one compact JSON value per line; a tool without examples keeps its description as it is.
func TestInputExamplesFoldedIntoDescription(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(nil)
	tools := []agent.ToolSpec{{Name: "add_note", Description: "Add a note",
		Parameters:    json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
		InputExamples: []json.RawMessage{json.RawMessage(`{ "text": "buy milk" }`), json.RawMessage(`{"text":"call Ann"}`)}},
		{Name: "list_notes", Description: "List notes"}}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "hi"}}, Tools: tools}
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	sent, _ := f.LastBody(t)["tools"].([]any)
	want := []string{"Add a note\n\nInput examples:\n{\"text\":\"buy milk\"}\n{\"text\":\"call Ann\"}", "List notes"}
	for i, w := range want {
		fn := sent[i].(map[string]any)["function"].(map[string]any)
		if fn["description"] != w {
			t.Errorf("tool %d description %q, want %q", i, fn["description"], w)
		}
		if _, ok := fn["inputExamples"]; ok {
			t.Errorf("tool %d sent a field the API does not have", i)
		}
	}
}
