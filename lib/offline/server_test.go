package offline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

type fixedClock struct{}

func (fixedClock) Now() time.Time { return time.Unix(1700000000, 0).UTC() }

// setup serves a Server with a 1 ms /slow word delay on an httptest server and returns it with the base URL
// ("http://127.0.0.1:PORT/v1").
func setup(t *testing.T, opts ...Option) (*Server, *httptest.Server, string) {
	t.Helper()
	s := New(append([]Option{WithWordDelay(time.Millisecond), WithClock(fixedClock{})}, opts...)...)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts, ts.URL + "/v1"
}

type object = map[string]any

func deref(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

func user(text string) object      { return object{"role": "user", "content": text} }
func system(text string) object    { return object{"role": "system", "content": text} }
func assistant(text string) object { return object{"role": "assistant", "content": text} }
func toolResult(id, out string) object {
	return object{"role": "tool", "tool_call_id": id, "content": out}
}
func assistantCalls(calls ...wireToolCall) object {
	return object{"role": "assistant", "content": nil, "tool_calls": calls}
}

func request(stream bool, msgs ...object) object {
	body := object{"model": "test-model", "messages": msgs, "stream": stream}
	if stream {
		body["stream_options"] = object{"include_usage": true}
	}
	return body
}

func post(t *testing.T, ctx context.Context, url string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/chat/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// complete makes a non-streaming request and decodes a 200 answer.
func complete(t *testing.T, url string, body object) completion {
	t.Helper()
	res := post(t, context.Background(), url, body)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	var c completion
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// streamed is a parsed SSE answer.
type streamed struct {
	chunks    []chunk
	text      string
	reasoning string
	pieces    int // content deltas with text
	calls     []wireToolCall
	argFrags  int
	finish    string
	usage     *wireUsage
	errEvent  *errorBody
	done      bool
	readErr   error
}

func stream(t *testing.T, url string, body object) streamed {
	t.Helper()
	res := post(t, context.Background(), url, body)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	return parseSSE(t, res.Body)
}

func parseSSE(t *testing.T, r io.Reader) streamed {
	t.Helper()
	var out streamed
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		if out.done || out.errEvent != nil {
			t.Fatalf("data after the end of the stream: %q", line)
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		if strings.HasPrefix(data, `{"error"`) {
			out.errEvent = &errorBody{}
			if err := json.Unmarshal([]byte(data), out.errEvent); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var c chunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if c.Object != "chat.completion.chunk" || c.Model != "test-model" || c.Created != 1700000000 {
			t.Fatalf("chunk header %+v", c)
		}
		out.chunks = append(out.chunks, c)
		if c.Usage != nil {
			if len(c.Choices) != 0 || c.Choices == nil {
				t.Fatalf("usage chunk must have an empty choices array: %s", data)
			}
			out.usage = c.Usage
		}
		for _, ch := range c.Choices {
			d := ch.Delta
			if d.Content != nil && *d.Content != "" {
				out.text += *d.Content
				out.pieces++
			}
			out.reasoning += d.ReasoningContent
			for _, tc := range d.ToolCalls {
				if tc.Index == len(out.calls) {
					out.calls = append(out.calls, wireToolCall{ID: tc.ID, Type: tc.Type})
				}
				out.calls[tc.Index].Function.Name += tc.Function.Name
				out.calls[tc.Index].Function.Arguments += tc.Function.Arguments
				if tc.Function.Arguments != "" {
					out.argFrags++
				}
			}
			if ch.FinishReason != nil {
				out.finish = *ch.FinishReason
			}
		}
	}
	out.readErr = sc.Err()
	return out
}

func TestPlainReply(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	const text = "hello   big\nworld"
	want := "You said: " + text
	wantUsage := wireUsage{PromptTokens: 4, CompletionTokens: 5, TotalTokens: 9}

	t.Run("stream", func(t *testing.T) {
		t.Parallel()
		got := stream(t, url, request(true, user(text)))
		if got.text != want || got.finish != "stop" || !got.done {
			t.Fatalf("got %q finish %q done %v", got.text, got.finish, got.done)
		}
		// Word by word: one piece per word, whitespace kept with the word that follows it.
		if got.pieces != 5 {
			t.Fatalf("pieces = %d, want 5", got.pieces)
		}
		if got.usage == nil || *got.usage != wantUsage {
			t.Fatalf("usage %+v, want %+v", got.usage, wantUsage)
		}
	})
	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		got := complete(t, url, request(false, user(text)))
		if got.Object != "chat.completion" || got.Model != "test-model" || len(got.Choices) != 1 {
			t.Fatalf("completion %+v", got)
		}
		ch := got.Choices[0]
		if ch.Message.Content == nil || *ch.Message.Content != want || ch.FinishReason != "stop" {
			t.Fatalf("choice %+v", ch)
		}
		if got.Usage != wantUsage {
			t.Fatalf("usage %+v, want %+v", got.Usage, wantUsage)
		}
	})
}

func TestUsage(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)

	t.Run("omitted from a stream unless asked for", func(t *testing.T) {
		t.Parallel()
		body := request(true, user("hi"))
		delete(body, "stream_options")
		if got := stream(t, url, body); got.usage != nil || !got.done {
			t.Fatalf("usage %+v done %v", got.usage, got.done)
		}
	})
	t.Run("cached tokens count every message but the last", func(t *testing.T) {
		t.Parallel()
		// system 1+3, user 1+1, assistant 1+2, user 1+2 → prompt 12, cached 9.
		got := complete(t, url, request(false, system("be very brief"), user("hi"), assistant("hello there"), user("how are")))
		want := wireUsage{PromptTokens: 12, CompletionTokens: 4, TotalTokens: 16, PromptTokensDetails: promptDetails{CachedTokens: 9}}
		if got.Usage != want {
			t.Fatalf("usage %+v, want %+v", got.Usage, want)
		}
	})
}

func TestToolRoundTrip(t *testing.T) {
	t.Parallel()
	s, _, url := setup(t)
	ask := user(`/tool add_note {"text": "buy milk", "tags": ["home"]}`)

	first := stream(t, url, request(true, ask))
	if first.finish != "tool_calls" || len(first.calls) != 1 || first.text != "" {
		t.Fatalf("first reply %+v", first)
	}
	call := first.calls[0]
	if call.Function.Name != "add_note" || call.Function.Arguments != `{"text":"buy milk","tags":["home"]}` ||
		!strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
		t.Fatalf("call %+v", call)
	}
	if first.argFrags < 2 {
		t.Fatalf("arguments came in %d fragments, want several", first.argFrags)
	}
	if first.usage == nil || first.usage.CompletionTokens == 0 {
		t.Fatalf("usage %+v", first.usage)
	}

	second := stream(t, url, request(true, ask, assistantCalls(call), toolResult(call.ID, `{"id":"n1"}`)))
	if second.text != `Tool add_note returned: {"id":"n1"}` || second.finish != "stop" {
		t.Fatalf("second reply %q finish %q", second.text, second.finish)
	}

	// The non-streaming form carries the same call.
	c := complete(t, url, request(false, ask))
	msg := c.Choices[0].Message
	if c.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0] != call || msg.Content != nil {
		t.Fatalf("non-streaming tool call %+v", c.Choices[0])
	}
	if s.Requests() != 3 {
		t.Fatalf("requests = %d, want 3", s.Requests())
	}
}

func TestToolCommandForms(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	usageText := "Usage: /tool NAME {json}"
	tests := []struct {
		name  string
		text  string
		calls []wireFunction // nil: a usage answer
	}{
		{"no arguments", "/tool ping", []wireFunction{{"ping", "{}"}}},
		{"no space before json", `/tool ping{"a":1}`, []wireFunction{{"ping", `{"a":1}`}}},
		{"pretty json", "/tool ping {\n  \"a\": [1, 2]\n}", []wireFunction{{"ping", `{"a":[1,2]}`}}},
		{"parallel", "/tool a {\"x\":1}\n/tool b", []wireFunction{{"a", `{"x":1}`}, {"b", "{}"}}},
		{"invalid json", `/tool ping {"a":`, nil},
		{"not an object", `/tool ping [1]`, nil},
		{"trailing words", `/tool ping {} please`, nil},
		{"no name", "/tool", nil},
		{"name is json", `/tool {"a":1}`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := stream(t, url, request(true, user(tt.text)))
			if tt.calls == nil {
				if !strings.HasPrefix(got.text, usageText) || len(got.calls) != 0 || got.finish != "stop" {
					t.Fatalf("want a usage answer, got %+v", got)
				}
				return
			}
			if len(got.calls) != len(tt.calls) || got.finish != "tool_calls" {
				t.Fatalf("calls %+v finish %q", got.calls, got.finish)
			}
			for i, c := range got.calls {
				if c.Function != tt.calls[i] {
					t.Fatalf("call %d = %+v, want %+v", i, c.Function, tt.calls[i])
				}
			}
			if got.calls[0].ID == got.calls[len(got.calls)-1].ID && len(got.calls) > 1 {
				t.Fatalf("parallel calls share id %q", got.calls[0].ID)
			}
		})
	}
}

func TestParallelToolResults(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	ask := user("/tool a /tool b")
	first := stream(t, url, request(true, ask))
	if len(first.calls) != 2 {
		t.Fatalf("calls %+v", first.calls)
	}
	got := stream(t, url, request(true, ask, assistantCalls(first.calls...),
		toolResult(first.calls[0].ID, "one"), toolResult(first.calls[1].ID, "two")))
	if want := "Tool a returned: one\nTool b returned: two"; got.text != want {
		t.Fatalf("text %q, want %q", got.text, want)
	}
}

func TestToolCallIDs(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	idOf := func(msgs ...object) string {
		t.Helper()
		got := stream(t, url, request(true, msgs...))
		if len(got.calls) != 1 {
			t.Fatalf("calls %+v", got.calls)
		}
		return got.calls[0].ID
	}
	a := idOf(user("/tool ping"))
	// A retried request gets the same id; the same command in a later turn gets a new one, so ids stay unique
	// within a thread.
	if again := idOf(user("/tool ping")); again != a {
		t.Fatalf("retry changed the id: %q then %q", a, again)
	}
	if later := idOf(user("/tool ping"), assistant("ok"), user("/tool ping")); later == a {
		t.Fatalf("a later turn reused id %q", a)
	}
}

func TestLoopAlwaysCallsAgain(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	ask := user(`/loop step {"n":1}`)
	msgs := []object{ask}
	seen := map[string]bool{}
	for range 3 {
		got := stream(t, url, request(true, msgs...))
		if len(got.calls) != 1 || got.finish != "tool_calls" || got.calls[0].Function.Name != "step" {
			t.Fatalf("reply %+v", got)
		}
		id := got.calls[0].ID
		if seen[id] {
			t.Fatalf("id %q repeated", id)
		}
		seen[id] = true
		msgs = append(msgs, assistantCalls(got.calls[0]), toolResult(id, "done"))
	}
}

func TestSlow(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	got := stream(t, url, request(true, user("/slow 4")))
	if got.text != "word1 word2 word3 word4" || got.pieces != 4 || !got.done {
		t.Fatalf("reply %+v", got)
	}
	c := complete(t, url, request(false, user("/slow 2")))
	if *c.Choices[0].Message.Content != "word1 word2" {
		t.Fatalf("completion %+v", c)
	}
	if got := stream(t, url, request(true, user("/slow many"))); !strings.HasPrefix(got.text, "Usage: /slow N") {
		t.Fatalf("reply %q", got.text)
	}
}

func TestSlowHonoursCancellation(t *testing.T) {
	t.Parallel()
	// With an hour per word, the handler can only end in time by noticing that the client went away:
	// httptest.Server.Close waits for every handler, so this test hangs if cancellation is ignored.
	_, ts, url := setup(t, WithWordDelay(time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	res := post(t, ctx, url, request(true, user("/slow 5")))
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	cancel()
	res.Body.Close()
	ts.Close()
}

func TestError(t *testing.T) {
	t.Parallel()
	s, _, url := setup(t)
	tests := []struct {
		text     string
		stream   bool
		status   int
		typ      string
		contains string
	}{
		{"/error 503", true, 503, "server_error", "503"},
		{"/error 503", false, 503, "server_error", "503"},
		{"/error 429", true, 429, "rate_limit_error", "429"},
		{"/error 400", false, 400, "invalid_request_error", "400"},
		{"/error 500 after 2", false, 500, "server_error", "after 2 words"},
	}
	for _, tt := range tests {
		res := post(t, context.Background(), url, request(tt.stream, user(tt.text)))
		var body errorBody
		err := json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", tt.text, err)
		}
		if res.StatusCode != tt.status || body.Error.Type != tt.typ || deref(body.Error.Code) != strconv.Itoa(tt.status) ||
			!strings.Contains(body.Error.Message, tt.contains) {
			t.Fatalf("%s (stream %v): status %d body %+v", tt.text, tt.stream, res.StatusCode, body)
		}
	}
	// Every request of the turn fails, not only the first.
	res := post(t, context.Background(), url, request(true, user("/error 502"), assistant("x"), user("/error 502")))
	res.Body.Close()
	if res.StatusCode != 502 {
		t.Fatalf("status %d", res.StatusCode)
	}
	for _, bad := range []string{"/error", "/error 200", "/error 600", "/error x", "/error 500 after", "/error 500 before 2"} {
		if got := stream(t, url, request(true, user(bad))); !strings.HasPrefix(got.text, "Usage: /error") {
			t.Fatalf("%q: reply %q", bad, got.text)
		}
	}
	if s.Requests() < 6 {
		t.Fatalf("requests = %d", s.Requests())
	}
}

func TestErrorMidStream(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	got := stream(t, url, request(true, user("/error 500 after 3")))
	if got.text != "word1 word2 word3" {
		t.Fatalf("text %q", got.text)
	}
	if got.errEvent == nil || deref(got.errEvent.Error.Code) != "500" || got.errEvent.Error.Type != "server_error" {
		t.Fatalf("error event %+v", got.errEvent)
	}
	if got.done || got.finish != "" || got.usage != nil {
		t.Fatalf("stream went on after the error: %+v", got)
	}
}

func TestDrop(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	got := stream(t, url, request(true, user("/drop 2")))
	if got.text != "word1 word2" || got.readErr == nil || got.done || got.errEvent != nil {
		t.Fatalf("reply %+v", got)
	}
	b, err := json.Marshal(request(false, user("/drop 2")))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := http.Post(url+"/chat/completions", "application/json", bytes.NewReader(b)); err == nil {
		res.Body.Close()
		t.Fatalf("non-streaming /drop answered %d", res.StatusCode)
	}
}

func TestFlaky(t *testing.T) {
	t.Parallel()
	s, _, url := setup(t)
	statuses := func(msgs ...object) []int {
		var out []int
		for range 3 {
			res := post(t, context.Background(), url, request(true, msgs...))
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			out = append(out, res.StatusCode)
		}
		return out
	}
	if got := statuses(user("/flaky 2 429")); got[0] != 429 || got[1] != 429 || got[2] != 200 {
		t.Fatalf("statuses %v", got)
	}
	// The count is per turn: a new turn with the same text fails again.
	if got := statuses(user("/flaky 2 429"), assistant("ok"), user("/flaky 2 429")); got[0] != 429 || got[2] != 200 {
		t.Fatalf("statuses of the second turn %v", got)
	}
	if got := statuses(user("/flaky 1 503 hi")); got[0] != 503 || got[1] != 200 {
		t.Fatalf("statuses %v", got)
	}
	if got := stream(t, url, request(true, user("/flaky 1 503 hi"))); got.text != "You said: hi" {
		t.Fatalf("the rest was answered %q", got.text)
	}
	before := s.Requests()

	// The rest of the message is answered once the failures are used up, including the tool-result request.
	ask := user("/flaky 1 503 /tool ping")
	res := post(t, context.Background(), url, request(true, ask))
	res.Body.Close()
	if res.StatusCode != 503 {
		t.Fatalf("status %d", res.StatusCode)
	}
	call := stream(t, url, request(true, ask))
	if len(call.calls) != 1 || call.calls[0].Function.Name != "ping" {
		t.Fatalf("reply %+v", call)
	}
	final := stream(t, url, request(true, ask, assistantCalls(call.calls[0]), toolResult(call.calls[0].ID, "pong")))
	if final.text != "Tool ping returned: pong" {
		t.Fatalf("text %q", final.text)
	}
	if got := s.Requests() - before; got != 3 {
		t.Fatalf("requests = %d, want 3", got)
	}
	if got := stream(t, url, request(true, user("/flaky x 503"))); !strings.HasPrefix(got.text, "Usage: /flaky") {
		t.Fatalf("reply %q", got.text)
	}
}

func TestThink(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	got := stream(t, url, request(true, user("/think why not")))
	if got.reasoning != "Thinking about: why not" || got.text != "You said: why not" {
		t.Fatalf("reply %+v", got)
	}
	c := complete(t, url, request(false, user("/think /tool ping")))
	msg := c.Choices[0].Message
	if msg.ReasoningContent != "Thinking about: /tool ping" || len(msg.ToolCalls) != 1 {
		t.Fatalf("message %+v", msg)
	}
	// Reasoning words are output tokens: 4 reasoning + 1 for the call + 1 for "ping {}".
	if c.Usage.CompletionTokens != 4+1+2 {
		t.Fatalf("usage %+v", c.Usage)
	}
}

func TestMaxTokens(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	body := request(true, user("one two three"))
	body["max_completion_tokens"] = 3
	got := stream(t, url, body)
	if got.text != "You said: one" || got.finish != "length" || got.usage.CompletionTokens != 3 {
		t.Fatalf("reply %+v", got)
	}
	body = request(false, user("one two three"))
	body["max_tokens"] = 2
	c := complete(t, url, body)
	if *c.Choices[0].Message.Content != "You said:" || c.Choices[0].FinishReason != "length" {
		t.Fatalf("completion %+v", c)
	}
}

func TestMessageForms(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	parts := object{"role": "user", "content": []object{{"type": "text", "text": "hello "}, {"type": "text", "text": "parts"}}}
	if got := stream(t, url, request(true, parts)); got.text != "You said: hello parts" {
		t.Fatalf("text %q", got.text)
	}
	if got := stream(t, url, request(true, system("no user here"))); got.text != "There is no user message to answer." {
		t.Fatalf("text %q", got.text)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	_, ts, _ := setup(t)
	tests := []struct {
		name, method, path, body string
		status                   int
	}{
		{"invalid json", "POST", "/v1/chat/completions", "{", 400},
		{"invalid messages", "POST", "/v1/chat/completions", `{"messages":{}}`, 400},
		{"no messages", "POST", "/v1/chat/completions", `{"model":"m"}`, 400},
		{"wrong method", "GET", "/v1/chat/completions", "", 405},
		{"unknown route", "GET", "/v1/completions", "", 404},
		{"embeddings by GET", "GET", "/v1/embeddings", "", 405},
		{"models by POST", "POST", "/v1/models", "", 405},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := http.NewRequest(tt.method, ts.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var body errorBody
			if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.status || body.Error.Message == "" {
				t.Fatalf("status %d body %+v", res.StatusCode, body)
			}
		})
	}
}

func TestModels(t *testing.T) {
	t.Parallel()
	_, ts, _ := setup(t)
	for _, path := range []string{"/v1/models", "/models"} {
		res, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var list modelList
		err = json.NewDecoder(res.Body).Decode(&list)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != DefaultModel {
			t.Fatalf("%s: status %d list %+v err %v", path, res.StatusCode, list, err)
		}
	}
}

func TestStart(t *testing.T) {
	t.Parallel()
	base, stop, err := Start("127.0.0.1:0", WithClock(fixedClock{}))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !regexp.MustCompile(`^http://127\.0\.0\.1:\d+/v1/$`).MatchString(base) {
		t.Fatalf("base URL %q", base)
	}
	got := stream(t, strings.TrimSuffix(base, "/"), request(true, user("hi")))
	if got.text != "You said: hi" {
		t.Fatalf("text %q", got.text)
	}
	stop()
	stop() // a second stop is harmless
	if res, err := http.Get(base + "models"); err == nil {
		res.Body.Close()
		t.Fatal("server still answers after stop")
	}
	if _, _, err := Start("256.0.0.1:0"); err == nil {
		t.Fatal("Start on an invalid address succeeded")
	}
}

func TestReplyDelayStillStreams(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t, WithReplyDelay(time.Millisecond))
	got := stream(t, url, request(true, user("a b")))
	if got.text != "You said: a b" || got.pieces != 4 {
		t.Fatalf("reply %+v", got)
	}
}

func TestSplitWords(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"one", []string{"one"}},
		{"You said: hi", []string{"You", " said:", " hi"}},
		{"  lead\n\ntrail ", []string{"  lead", "\n\ntrail", " "}},
		{"héllo wörld", []string{"héllo", " wörld"}},
	}
	for _, tt := range tests {
		got := splitWords(tt.in)
		if strings.Join(got, "|") != strings.Join(tt.want, "|") || len(got) != len(tt.want) {
			t.Fatalf("splitWords(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFragments(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"{}", `{"text":"buy milk"}`, `{"t":"ééééééé"}`, ""} {
		got := fragments(s, 3)
		if strings.Join(got, "") != s || len(got) > 3+len(s)/3 {
			t.Fatalf("fragments(%q) = %q", s, got)
		}
		for _, f := range got {
			if !isRuneStart(f[0]) {
				t.Fatalf("fragment %q starts inside a rune", f)
			}
		}
	}
}

// /received reports each content part of the newest user message; only that message counts, and a string
// content is one text part.
func TestReceived(t *testing.T) {
	t.Parallel()
	img := imageServer(t)
	_, _, url := setup(t, WithFileClient(img.Client()))
	png := "data:image/png;base64," + base64.StdEncoding.EncodeToString(make([]byte, 68))
	pdf := "data:application/pdf;base64," + base64.StdEncoding.EncodeToString(make([]byte, 1234))
	tests := []struct {
		name string
		msgs []object
		want string
	}{
		{"string content", []object{user("/received")}, "text"},
		{"parts", []object{{"role": "user", "content": []object{
			{"type": "text", "text": "/received"},
			{"type": "image_url", "image_url": object{"url": png}},
			{"type": "image_url", "image_url": object{"url": img.URL + "/cat.png"}},
			{"type": "file", "file": object{"filename": "report.pdf", "file_data": pdf}},
			{"type": "file", "file": object{"file_data": pdf[:len(pdf)-4]}},
			{"type": "file", "file": object{"file_id": "file-abc"}},
		}}}, "text\nimage_url image/png 68 bytes\nimage_url " + img.URL + "/cat.png\nfile application/pdf report.pdf 1234 bytes\n" +
			"file application/pdf - 1233 bytes\nfile file-abc"},
		{"only the newest user message", []object{
			{"role": "user", "content": []object{{"type": "text", "text": "old"}, {"type": "image_url", "image_url": object{"url": png}}}},
			assistant("ok"), user("/received"),
		}, "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := stream(t, url, request(true, tt.msgs...)); got.text != tt.want {
				t.Fatalf("reply %q, want %q", got.text, tt.want)
			}
		})
	}
}

// A request over the context window is refused as OpenAI refuses it: 400, invalid_request_error, param
// "messages", code context_length_exceeded; one that fits is answered.
func TestContextLength(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t, WithContextTokens(1000))
	complete(t, url, request(false, user(strings.Repeat("w", 3990))))
	res := post(t, context.Background(), url, request(false, user(strings.Repeat("w", 2000)), assistant("ok"), user(strings.Repeat("w", 2004))))
	defer res.Body.Close()
	var body errorBody
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	e := body.Error
	if res.StatusCode != http.StatusBadRequest || e.Type != "invalid_request_error" || deref(e.Param) != "messages" ||
		deref(e.Code) != "context_length_exceeded" ||
		e.Message != "This model's maximum context length is 1000 tokens. However, your messages resulted in 1002 tokens. Please reduce the length of the messages." {
		t.Fatalf("status %d, error %+v (param %s, code %s)", res.StatusCode, e, deref(e.Param), deref(e.Code))
	}
}

// /tools answers the names of the tools the request offered, one per line, in order (issue 19 item 7: a router's
// subset seen from outside).
func TestToolsOffered(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	tool := func(name string) object {
		return object{"type": "function", "function": object{"name": name, "parameters": object{"type": "object"}}}
	}
	with := request(true, user("/tools"))
	with["tools"] = []object{tool("b_tool"), tool("a_tool"), tool("docs__search")}
	if got := stream(t, url, with); got.text != "b_tool\na_tool\ndocs__search" {
		t.Errorf("reply %q, want the three names in order", got.text)
	}
	if got := stream(t, url, request(true, user("/tools"))); got.text != "No tools were offered." {
		t.Errorf("no tools: reply %q", got.text)
	}
}
