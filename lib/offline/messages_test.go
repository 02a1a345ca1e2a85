package offline

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func postMessages(t *testing.T, srv http.Handler, headers map[string]string, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

var anthropicHeaders = map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}

// TestMessagesRefusals: invalid requests get Anthropic's status, error type and message.
func TestMessagesRefusals(t *testing.T) {
	t.Parallel()
	sig := thinkingSignature("hmm")
	toolUse := `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"x","input":{}}]}`
	result := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"ok"}]}`
	cases := []struct {
		name    string
		headers map[string]string
		body    string
		status  int
		typ     string
		message string
	}{
		{"no key", map[string]string{"anthropic-version": "2023-06-01"}, `{}`, 401, "authentication_error", "x-api-key header is required"},
		{"no version", map[string]string{"x-api-key": "k"}, `{}`, 400, "invalid_request_error", "anthropic-version: header is required"},
		{"no max_tokens", nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "max_tokens: Field required"},
		{"no messages", nil, `{"model":"m","max_tokens":5,"messages":[]}`, 400, "invalid_request_error", "messages: List should have at least 1 item"},
		{"assistant first", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":"hi"},{"role":"user","content":"x"}]}`,
			400, "invalid_request_error", `messages: first message must use the "user" role`},
		{"two users", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`,
			400, "invalid_request_error", `roles must alternate between "user" and "assistant", but found multiple "user" roles in a row`},
		{"empty text", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":""}]}]}`,
			400, "invalid_request_error", "text content blocks must be non-empty"},
		{"unanswered tool_use", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},` + toolUse + `,{"role":"user","content":"b"}]}`,
			400, "invalid_request_error", "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"},
		{"orphan tool_result", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},` + result + `]}`,
			400, "invalid_request_error", "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1"},
		{"thinking without signature", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
			400, "invalid_request_error", "messages.1.content.0.thinking.signature: Field required"},
		{"forged signature", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"forged"},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
			400, "invalid_request_error", "messages.1.content.0: Invalid `signature` in `thinking` block"},
		{"thinking on, tool round without it", nil, `{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"a"},` + toolUse + `,` + result + `]}`,
			400, "invalid_request_error", "messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but found `tool_use`"},
		{"bad tool", nil, `{"model":"m","max_tokens":5,"tools":[{"name":"a b","input_schema":{"type":"object"}}],"messages":[{"role":"user","content":"a"}]}`,
			400, "invalid_request_error", "tools.0.custom.name: String should match pattern"},
		{"prompt too long", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("word ", 100) + `"}]}`,
			400, "invalid_request_error", "prompt is too long: 125 tokens > 10 maximum"},
		{"injected overload", nil, `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"/error 529"}]}`,
			529, "overloaded_error", "injected error 529"},
	}
	srv := New(WithContextTokens(10))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := tc.headers
			if h == nil {
				h = anthropicHeaders
			}
			status, body := postMessages(t, srv, h, tc.body)
			var e msgErrorBody
			if err := json.Unmarshal([]byte(body), &e); err != nil || status != tc.status || e.Type != "error" ||
				e.Error.Type != tc.typ || !strings.Contains(e.Error.Message, tc.message) {
				t.Errorf("got %d %s, want %d %s %q", status, body, tc.status, tc.typ, tc.message)
			}
		})
	}
	// The same transcripts with the signature the server issued, and with thinking first, pass.
	for _, body := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"` + sig + `"},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
		`{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"redacted_thinking","data":"x"},{"type":"tool_use","id":"toolu_1","name":"x","input":{}}]},` + result + `]}`,
	} {
		if status, got := postMessages(t, srv, anthropicHeaders, body); status != 200 {
			t.Errorf("valid request refused: %d %s", status, got)
		}
	}
}

// TestMessagesStream: the SSE events come in Anthropic's order, with the requested model and a thinking block
// whose signature the server accepts back.
func TestMessagesStream(t *testing.T) {
	t.Parallel()
	srv := New()
	status, body := postMessages(t, srv, anthropicHeaders,
		`{"model":"claude-x","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"/think /tool add {\"a\":1}"}]}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var events []string
	for _, m := range regexp.MustCompile(`(?m)^event: (\S+)$`).FindAllStringSubmatch(body, -1) {
		if len(events) == 0 || events[len(events)-1] != m[1] {
			events = append(events, m[1])
		}
	}
	want := "message_start ping content_block_start content_block_delta content_block_stop content_block_start content_block_delta content_block_stop message_delta message_stop"
	if got := strings.Join(events, " "); got != want {
		t.Errorf("events = %s\nwant     %s", got, want)
	}
	for _, s := range []string{`"model":"claude-x"`, `"signature":"` + thinkingSignature("Thinking about: /tool add {\"a\":1}") + `"`,
		`"id":"toolu_`, `"stop_reason":"tool_use"`, `"cache_read_input_tokens":0`} {
		if !strings.Contains(body, s) {
			t.Errorf("stream lacks %s:\n%s", s, body)
		}
	}
}

// TestInvokeRefusals: Bedrock's InvokeModel route refuses as Bedrock does, with its error shape.
func TestInvokeRefusals(t *testing.T) {
	t.Parallel()
	srv := New()
	signed := map[string]string{"Authorization": "AWS4-HMAC-SHA256 Credential=x"}
	msgs := `"max_tokens":5,"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		name, path string
		headers    map[string]string
		body       string
		status     int
		typ, msg   string
	}{
		{"unsigned", "/model/m/invoke", nil, `{}`, 403, "AccessDeniedException", "Missing Authentication Token"},
		{"no version", "/model/m/invoke", signed, `{` + msgs + `}`, 400, "ValidationException", "required key [anthropic_version]"},
		{"model in body", "/model/m/invoke", signed, `{"anthropic_version":"bedrock-2023-05-31","model":"m",` + msgs + `}`, 400, "ValidationException", "extraneous key [model]"},
		{"transcript", "/model/m/invoke", signed, `{"anthropic_version":"bedrock-2023-05-31","max_tokens":5,"messages":[{"role":"assistant","content":"x"}]}`, 400, "ValidationException", "first message must use the"},
		{"unknown operation", "/model/m/converse", signed, `{}`, 404, "ResourceNotFoundException", "unknown operation"},
	}
	for _, tc := range cases {
		req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != tc.status || !strings.HasPrefix(rec.Header().Get("X-Amzn-Errortype"), tc.typ+":") || !strings.Contains(rec.Body.String(), tc.msg) {
			t.Errorf("%s: %d %s %s", tc.name, rec.Code, rec.Header().Get("X-Amzn-Errortype"), rec.Body.String())
		}
	}
	// Valid and not streamed: the message as JSON.
	req := httptest.NewRequest(http.MethodPost, "/model/m/invoke", strings.NewReader(`{"anthropic_version":"bedrock-2023-05-31",`+msgs+`}`))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=x")
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"text":"You said: hi"`) || !strings.Contains(rec.Body.String(), `"model":"m"`) {
		t.Errorf("invoke: %d %s", rec.Code, rec.Body.String())
	}
}

// TestMessagesCacheControl: cache_control breakpoints are checked as Anthropic checks them (the type, the ttl, none
// on a thinking block, at most 4 in a request), and a request without one caches nothing: all of it is input.
func TestMessagesCacheControl(t *testing.T) {
	t.Parallel()
	srv := New()
	cc := `"cache_control":{"type":"ephemeral"}`
	tool := func(name string) string {
		return `{"name":"` + name + `","input_schema":{"type":"object"},` + cc + `}`
	}
	msgs := func(blocks ...string) string {
		return `"messages":[{"role":"user","content":[` + strings.Join(blocks, ",") + `]}]`
	}
	text := func(s string, marked bool) string {
		if marked {
			return `{"type":"text","text":"` + s + `",` + cc + `}`
		}
		return `{"type":"text","text":"` + s + `"}`
	}
	for _, tc := range []struct {
		name, body, message string
	}{
		{"five breakpoints", `{"model":"m","max_tokens":5,"tools":[` + tool("a") + `,` + tool("b") + `],"system":[` + text("s", true) + `],` +
			msgs(text("x", true), text("y", true)) + `}`, "A maximum of 4 blocks with cache_control may be provided. Found 5."},
		{"in a tool result", `{"model":"m","max_tokens":5,"tools":[` + tool("a") + `,` + tool("b") + `,` + tool("c") + `,` + tool("d") + `],"messages":[{"role":"user","content":"a"},` +
			`{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"a","input":{}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[` + text("r", true) + `]}]}]}`,
			"A maximum of 4 blocks with cache_control may be provided. Found 5."},
		{"not ephemeral", `{"model":"m","max_tokens":5,` + msgs(`{"type":"text","text":"x","cache_control":{"type":"forever"}}`) + `}`,
			"messages.0.content.0.text.cache_control.type: Input should be 'ephemeral'"},
		{"bad ttl", `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"2h"}}],` + msgs(text("x", false)) + `}`,
			"system.0.text.cache_control.ttl: Input should be '5m' or '1h'"},
		{"on thinking", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"` +
			thinkingSignature("hmm") + `",` + cc + `},{"type":"text","text":"b"}]},{"role":"user","content":"c"}]}`,
			"messages.1.content.0.thinking.cache_control: Extra inputs are not permitted"},
	} {
		status, body := postMessages(t, srv, anthropicHeaders, tc.body)
		if status != 400 || !strings.Contains(body, tc.message) {
			t.Errorf("%s: %d %s, want 400 %q", tc.name, status, body, tc.message)
		}
	}
	// Four pass; the usage splits the prompt into reads, a write and input only when some breakpoint is set.
	transcript := func(marked bool) string {
		return `"messages":[{"role":"user","content":[` + text("a b", false) + `]},{"role":"assistant","content":[` + text("c d e", false) + `]},` +
			`{"role":"user","content":[` + text("f", marked) + `]}]`
	}
	for _, tc := range []struct {
		body                string
		input, read, create int64
	}{
		{`{"model":"m","max_tokens":50,"tools":[` + tool("a") + `,` + tool("b") + `],"system":[` + text("s", true) + `],` + transcript(true) + `}`, 2, 5, 4}, // the system prompt (1+1) read too
		{`{"model":"m","max_tokens":50,` + transcript(false) + `}`, 9, 0, 0},
	} {
		status, body := postMessages(t, srv, anthropicHeaders, tc.body)
		var msg struct {
			Usage msgUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(body), &msg); status != 200 || err != nil {
			t.Fatalf("%d %s", status, body)
		}
		if u := msg.Usage; u.InputTokens != tc.input || u.CacheReadInputTokens != tc.read || u.CacheCreationInputTokens != tc.create {
			t.Errorf("usage %+v, want input %d, read %d, write %d", u, tc.input, tc.read, tc.create)
		}
	}
}
