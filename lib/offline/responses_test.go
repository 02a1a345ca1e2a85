package offline

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func postResponses(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.Post(url+"/responses", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// sseEvent is one event of a Responses stream: its "event:" name and its data.
type sseEvent struct {
	name string
	data map[string]any
}

func responsesStream(t *testing.T, url string, body object) []sseEvent {
	t.Helper()
	res := postResponses(t, url, body)
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("status %d: %s", res.StatusCode, b)
	}
	var out []sseEvent
	var name string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatal(err)
			}
			if d["type"] != name || d["sequence_number"] != float64(len(out)) {
				t.Fatalf("event %q data %v", name, d)
			}
			out = append(out, sseEvent{name, d})
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
	return out
}

func names(events []sseEvent) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.name
	}
	return out
}

func deltas(events []sseEvent, name string) string {
	var b strings.Builder
	for _, e := range events {
		if e.name == name {
			b.WriteString(e.data["delta"].(string))
		}
	}
	return b.String()
}

func responsesRequestBody(input any) object {
	return object{"model": "test-model", "input": input, "stream": true, "store": false,
		"include": []string{"reasoning.encrypted_content"}}
}

func userItem(text string) object {
	return object{"type": "message", "role": "user", "content": []object{{"type": "input_text", "text": text}}}
}

func TestResponsesText(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	events := responsesStream(t, url, responsesRequestBody("hello world"))
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}
	if got := names(events); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v", got)
	}
	if got := deltas(events, "response.output_text.delta"); got != "You said: hello world" {
		t.Fatalf("text %q", got)
	}
	res := events[len(events)-1].data["response"].(map[string]any)
	usage := map[string]any{"input_tokens": 3.0, "input_tokens_details": map[string]any{"cached_tokens": 0.0}, "output_tokens": 4.0,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0.0}, "total_tokens": 7.0}
	if res["model"] != "test-model" || res["status"] != "completed" || !reflect.DeepEqual(res["usage"], usage) || res["store"] != false {
		t.Fatalf("response %v", res)
	}

	// stream: false answers the same response object.
	body := responsesRequestBody("hello world")
	body["stream"] = false
	r := postResponses(t, url, body)
	defer r.Body.Close()
	var whole map[string]any
	if err := json.NewDecoder(r.Body).Decode(&whole); err != nil || r.StatusCode != 200 {
		t.Fatalf("status %d: %v", r.StatusCode, err)
	}
	if !reflect.DeepEqual(whole, res) {
		t.Fatalf("non-streamed %v\nstreamed %v", whole, res)
	}
}

func TestResponsesThinkAndTools(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	events := responsesStream(t, url, responsesRequestBody([]object{userItem(`/think /tool a {"x":1} /tool b`)}))
	if got := deltas(events, "response.reasoning_summary_text.delta"); got != `Thinking about: /tool a {"x":1} /tool b` {
		t.Fatalf("summary %q", got)
	}
	var items []map[string]any
	for _, e := range events {
		if e.name == "response.output_item.done" {
			items = append(items, e.data["item"].(map[string]any))
		}
	}
	if len(items) != 3 {
		t.Fatalf("items %v", items)
	}
	rs, fa, fb := items[0], items[1], items[2]
	enc, _ := rs["encrypted_content"].(string)
	if rs["type"] != "reasoning" || !strings.HasPrefix(enc, "offline1.") {
		t.Fatalf("reasoning item %v", rs)
	}
	if fa["name"] != "a" || fa["arguments"] != `{"x":1}` || fb["name"] != "b" || fb["arguments"] != "{}" || fa["call_id"] == fb["call_id"] {
		t.Fatalf("calls %v %v", fa, fb)
	}
	// The same request gets the same items, encrypted content included (deterministic).
	again := responsesStream(t, url, responsesRequestBody([]object{userItem(`/think /tool a {"x":1} /tool b`)}))
	if !reflect.DeepEqual(again[len(again)-1].data["response"], events[len(events)-1].data["response"]) {
		t.Fatal("a repeated request answered differently")
	}

	// Replayed as issued, with both outputs: the turn goes on.
	input := []any{userItem(`/think /tool a {"x":1} /tool b`), rs,
		object{"type": "function_call", "call_id": fa["call_id"], "name": "a", "arguments": fa["arguments"]},
		object{"type": "function_call", "call_id": fb["call_id"], "name": "b", "arguments": "{}"},
		object{"type": "function_call_output", "call_id": fa["call_id"], "output": "one"},
		object{"type": "function_call_output", "call_id": fb["call_id"], "output": "two"}}
	events = responsesStream(t, url, responsesRequestBody(input))
	if got := deltas(events, "response.output_text.delta"); got != "Tool a returned: one\nTool b returned: two" {
		t.Fatalf("text %q", got)
	}
	if got := deltas(events, "response.reasoning_summary_text.delta"); got == "" {
		t.Fatal("no reasoning on the second step") // /think wraps every answer of the turn
	}
}

func TestResponsesLength(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	body := responsesRequestBody("/slow 20")
	body["max_output_tokens"] = 16
	events := responsesStream(t, url, body)
	last := events[len(events)-1]
	res := last.data["response"].(map[string]any)
	if last.name != "response.incomplete" || !reflect.DeepEqual(res["incomplete_details"], map[string]any{"reason": "max_output_tokens"}) {
		t.Fatalf("last event %v", last)
	}
}

func TestResponsesFailedMidStream(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t)
	events := responsesStream(t, url, responsesRequestBody("/error 503 after 2"))
	last := events[len(events)-1]
	res := last.data["response"].(map[string]any)
	if last.name != "response.failed" || res["error"].(map[string]any)["code"] != "server_error" ||
		deltas(events, "response.output_text.delta") != "word1 word2" {
		t.Fatalf("events %v", events)
	}
}

// TestResponsesRefused: what OpenAI refuses is answered 400 with its error body.
func TestResponsesRefused(t *testing.T) {
	t.Parallel()
	enc := offlineEncrypted("rs_1", "why")
	reasoning := func(id, text, encrypted string) object {
		it := object{"type": "reasoning", "id": id, "summary": []object{{"type": "summary_text", "text": text}}}
		if encrypted != "" {
			it["encrypted_content"] = encrypted
		}
		return it
	}
	call := object{"type": "function_call", "call_id": "call_1", "name": "a", "arguments": "{}"}
	output := object{"type": "function_call_output", "call_id": "call_1", "output": "x"}
	said := object{"type": "message", "role": "assistant", "content": []object{{"type": "output_text", "text": "ok"}}}
	tests := []struct {
		name    string
		body    any
		message string
		param   string
		code    string
	}{
		{"not json", "nope", msgUnparsable, "", ""},
		{"no model", object{"input": "hi"}, "Missing required parameter: 'model'.", "model", "missing_required_parameter"},
		{"no input", object{"model": "m"}, "Missing required parameter: 'input'.", "input", "missing_required_parameter"},
		{"unknown item type", object{"model": "m", "input": []object{{"type": "web_search_call", "id": "ws_1"}}},
			"Invalid value: 'web_search_call'. Supported values are: 'message', 'function_call', 'function_call_output', and 'reasoning'.", "input[0].type", "invalid_value"},
		{"unknown role", object{"model": "m", "input": []object{{"role": "tool", "content": "x"}}},
			"Invalid value: 'tool'. Supported values are: 'user', 'assistant', 'system', and 'developer'.", "input[0].role", "invalid_value"},
		{"output_text from the user", object{"model": "m", "input": []object{{"role": "user", "content": []object{{"type": "output_text", "text": "x"}}}}},
			"Invalid value: 'output_text'. Supported values are: 'input_text', 'input_image', and 'input_file'.", "input[0].content[0].type", "invalid_value"},
		{"orphan output", object{"model": "m", "input": []any{userItem("hi"), output}},
			"No tool call found for function call output with call_id call_1.", "input", ""},
		{"unanswered call", object{"model": "m", "input": []any{userItem("hi"), call, userItem("again")}},
			"No tool output found for function call call_1.", "input", ""},
		{"reasoning not issued", object{"model": "m", "input": []any{userItem("hi"), reasoning("rs_1", "why", "gAAAA"), said}},
			"The encrypted content for item rs_1 could not be verified.", "", "invalid_encrypted_content"},
		{"reasoning of another item", object{"model": "m", "input": []any{userItem("hi"), reasoning("rs_2", "why", enc), said}},
			"The encrypted content for item rs_2 could not be verified.", "", "invalid_encrypted_content"},
		{"reasoning without encrypted content", object{"model": "m", "input": []any{userItem("hi"), reasoning("rs_1", "why", ""), said}},
			"Item with id 'rs_1' not found. Items are not persisted when `store` is set to false. Try again with `store` set to true, or remove this item from your input.", "input", ""},
		{"reasoning without what followed it", object{"model": "m", "input": []any{userItem("hi"), reasoning("rs_1", "why", enc), userItem("again")}},
			"Item 'rs_1' of type 'reasoning' was provided without its required following item.", "input", ""},
		{"prompt_cache_key not a string", object{"model": "m", "input": "hi", "prompt_cache_key": 5},
			"Invalid type for 'prompt_cache_key': expected a string, but got an integer instead.", "prompt_cache_key", "invalid_type"},
		{"max_output_tokens below 16", object{"model": "m", "input": "hi", "max_output_tokens": 5},
			"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 5 instead.", "max_output_tokens", "integer_below_min_value"},
		{"bad tool name", object{"model": "m", "input": "hi", "tools": []object{{"type": "function", "name": "a b"}}},
			"Invalid 'tools[0].name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.", "tools[0].name", "invalid_value"},
	}
	_, _, url := setup(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var res *http.Response
			if s, ok := tt.body.(string); ok {
				r, err := http.Post(url+"/responses", "application/json", strings.NewReader(s))
				if err != nil {
					t.Fatal(err)
				}
				res = r
			} else {
				res = postResponses(t, url, tt.body)
			}
			defer res.Body.Close()
			var got errorBody
			if err := json.NewDecoder(res.Body).Decode(&got); err != nil || res.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %v", res.StatusCode, err)
			}
			if got.Error.Message != tt.message || deref(got.Error.Param) != cmpNull(tt.param) || deref(got.Error.Code) != cmpNull(tt.code) ||
				got.Error.Type != "invalid_request_error" {
				t.Fatalf("error %+v param %q code %q", got.Error, deref(got.Error.Param), deref(got.Error.Code))
			}
		})
	}

	// Accepted: the reasoning it issued, followed by what followed it; store true as well as false.
	body := object{"model": "m", "input": []any{userItem("hi"), reasoning("rs_1", "why", enc), said, userItem("again")}, "store": true}
	res := postResponses(t, url, body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
}

func TestResponsesContextWindow(t *testing.T) {
	t.Parallel()
	_, _, url := setup(t, WithContextTokens(10))
	res := postResponses(t, url, responsesRequestBody(strings.Repeat("word ", 20)))
	defer res.Body.Close()
	var got errorBody
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || res.StatusCode != http.StatusBadRequest ||
		got.Error.Message != msgInputTooLong || deref(got.Error.Code) != "context_length_exceeded" || deref(got.Error.Param) != "input" {
		t.Fatalf("status %d error %+v (%v)", res.StatusCode, got.Error, err)
	}
}

func cmpNull(s string) string {
	if s == "" {
		return "<null>"
	}
	return s
}
