package offline

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestValidation sends raw requests and checks each rule's answer: OpenAI's status, error shape, message, param
// and code (DESIGN principle 5: an invalid transcript is caught here exactly as the provider would catch it).
func TestValidation(t *testing.T) {
	t.Parallel()
	img := imageServer(t)
	_, ts, _ := setup(t, WithFileClient(img.Client()))
	const (
		u     = `{"role":"user","content":"hi"}`
		calls = `{"role":"assistant","content":null,"tool_calls":[` +
			`{"id":"call_a","type":"function","function":{"name":"a","arguments":"{}"}},` +
			`{"id":"call_b","type":"function","function":{"name":"b","arguments":"{}"}}]}`
		resA = `{"role":"tool","tool_call_id":"call_a","content":"A"}`
		resB = `{"role":"tool","tool_call_id":"call_b","content":"B"}`
	)
	// req wraps messages (a JSON array's inside) and optional extra fields into a body with a model.
	req := func(msgs string, extra ...string) string {
		return `{"model":"m","messages":[` + msgs + `]` + strings.Join(extra, "") + `}`
	}
	orphan := "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
	unanswered := "An assistant message with 'tool_calls' must be followed by tool messages responding to each " +
		"'tool_call_id'. The following tool_call_ids did not have response messages: "
	tests := []struct {
		name, body           string
		message, param, code string // message "" means the request is valid
	}{
		// The body and the model.
		{"unparsable body", `{"model":`, msgUnparsable, "", ""},
		{"model missing", `{"messages":[` + u + `]}`, "you must provide a model parameter", "", ""},
		{"model empty", `{"model":"","messages":[` + u + `]}`, "you must provide a model parameter", "", ""},
		{"model not a string", `{"model":5,"messages":[` + u + `]}`,
			"Invalid type for 'model': expected a string, but got an integer instead.", "model", "invalid_type"},
		{"prompt_cache_key a string", `{"model":"m","prompt_cache_key":"thread-1","messages":[` + u + `]}`, "", "", ""},
		{"prompt_cache_key not a string", `{"model":"m","prompt_cache_key":5,"messages":[` + u + `]}`,
			"Invalid type for 'prompt_cache_key': expected a string, but got an integer instead.", "prompt_cache_key", "invalid_type"},

		// Messages.
		{"messages missing", `{"model":"m"}`, "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"},
		{"messages not an array", `{"model":"m","messages":{}}`,
			"Invalid type for 'messages': expected an array of objects, but got an object instead.", "messages", "invalid_type"},
		{"messages empty", req(""),
			"Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
			"messages", "empty_array"},
		{"message not an object", req(`"hi"`),
			"Invalid type for 'messages[0]': expected an object, but got a string instead.", "messages[0]", "invalid_type"},
		{"role missing", req(`{"content":"hi"}`),
			"Missing required parameter: 'messages[0].role'.", "messages[0].role", "missing_required_parameter"},
		{"unknown role", req(u + `,{"role":"robot","content":"hi"}`),
			"Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'.",
			"messages[1].role", "invalid_value"},
		{"deprecated function role", req(`{"role":"function","name":"f","content":"x"}`),
			"Invalid value: 'function'. Supported values are: 'system', 'assistant', 'user', 'tool', and 'developer'.",
			"messages[0].role", "invalid_value"},

		// Content.
		{"user content missing", req(`{"role":"user"}`),
			"Missing required parameter: 'messages[0].content'.", "messages[0].content", "missing_required_parameter"},
		{"user content null", req(`{"role":"user","content":null}`),
			"Invalid type for 'messages[0].content': expected one of a string or array of objects, but got null instead.",
			"messages[0].content", "invalid_type"},
		{"user content an object", req(`{"role":"user","content":{"text":"hi"}}`),
			"Invalid type for 'messages[0].content': expected one of a string or array of objects, but got an object instead.",
			"messages[0].content", "invalid_type"},
		{"unknown user part type", req(`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","image":{}}]}`),
			"Invalid value: 'image'. Supported values are: 'text', 'image_url', and 'file'.",
			"messages[0].content[1].type", "invalid_value"},
		{"image in a system message", req(`{"role":"system","content":[{"type":"image_url","image_url":{"url":"x"}}]},` + u),
			"Invalid value: 'image_url'. Supported values are: 'text'.", "messages[0].content[0].type", "invalid_value"},
		{"text part without text", req(`{"role":"user","content":[{"type":"text"}]}`),
			"Missing required parameter: 'messages[0].content[0].text'.", "messages[0].content[0].text", "missing_required_parameter"},
		{"text part with a number", req(`{"role":"user","content":[{"type":"text","text":1}]}`),
			"Invalid type for 'messages[0].content[0].text': expected a string, but got an integer instead.",
			"messages[0].content[0].text", "invalid_type"},
		{"user parts: text, image and file", req(`{"role":"user","content":[{"type":"text","text":"look"},` +
			`{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}},` +
			`{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,AA=="}}]}`), "", "", ""},
		{"image by https URL, file by file_id", req(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + img.URL + `/cat.png"}},` +
			`{"type":"file","file":{"file_id":"file-abc"}}]}`), "", "", ""},
		{"image_url without url", req(`{"role":"user","content":[{"type":"image_url","image_url":{}}]}`),
			"Missing required parameter: 'messages[0].content[0].image_url.url'.", "messages[0].content[0].image_url.url", "missing_required_parameter"},
		{"image_url url not a string", req(`{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}`),
			"Invalid type for 'messages[0].content[0].image_url.url': expected a string, but got an integer instead.",
			"messages[0].content[0].image_url.url", "invalid_type"},
		{"image URL without a scheme", req(`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"example.com/a.png"}}]}`),
			"Invalid image URL: 'messages[0].content[1].image_url.url'. Expected a base64-encoded data URL with an image MIME type " +
				"(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got a value without the 'data:' prefix.",
			"messages[0].content[1].image_url.url", "invalid_value"},
		{"image data URL of a PDF", req(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:application/pdf;base64,AA=="}}]}`),
			"Invalid image URL: 'messages[0].content[0].image_url.url'. Expected a base64-encoded data URL with an image MIME type " +
				"(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got unsupported MIME type 'application/pdf'.",
			"messages[0].content[0].image_url.url", "invalid_value"},
		{"image data URL, empty", req(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,"}}]}`),
			"Invalid image URL: 'messages[0].content[0].image_url.url'. Expected a base64-encoded data URL with an image MIME type " +
				"(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got empty base64-encoded bytes.",
			"messages[0].content[0].image_url.url", "invalid_value"},
		{"image data URL, bad base64", req(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,!!"}}]}`),
			"Invalid image URL: 'messages[0].content[0].image_url.url'. Expected a base64-encoded data URL with an image MIME type " +
				"(e.g. 'data:image/png;base64,aW1nIGJ5dGVzIGhlcmU='), but got an invalid base64-encoded value.",
			"messages[0].content[0].image_url.url", "invalid_value"},
		{"file without file_data or file_id", req(`{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf"}}]}`),
			"Missing required parameter: 'messages[0].content[0].file.file_data'.", "messages[0].content[0].file.file_data", "missing_required_parameter"},
		{"file_data not a data URL", req(`{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"https://example.com/a.pdf"}}]}`),
			"Invalid file data: 'messages[0].content[0].file.file_data'. Expected a base64-encoded data URL with an application/pdf MIME type " +
				"(e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got a value without the 'data:' prefix.",
			"messages[0].content[0].file.file_data", "invalid_value"},
		{"file_data of an image", req(`{"role":"user","content":[{"type":"file","file":{"filename":"a.png","file_data":"data:image/png;base64,AA=="}}]}`),
			"Invalid file data: 'messages[0].content[0].file.file_data'. Expected a base64-encoded data URL with an application/pdf MIME type " +
				"(e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got unsupported MIME type 'image/png'.",
			"messages[0].content[0].file.file_data", "invalid_value"},
		{"file_data, bad base64", req(`{"role":"user","content":[{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,AAA"}}]}`),
			"Invalid file data: 'messages[0].content[0].file.file_data'. Expected a base64-encoded data URL with an application/pdf MIME type " +
				"(e.g. 'data:application/pdf;base64,SGVsbG8sIFdvcmxkIQ=='), but got an invalid base64-encoded value.",
			"messages[0].content[0].file.file_data", "invalid_value"},
		{"developer role, assistant parts", req(`{"role":"developer","content":"be brief"},` + u +
			`,{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"refusal","refusal":"no"}]},` + u), "", "", ""},
		{"assistant with neither content nor tool_calls", req(u + `,{"role":"assistant","content":null},` + u),
			"Invalid value for 'content': expected a string, got null.", "messages.[1].content", ""},
		{"assistant with an empty string", req(u + `,{"role":"assistant","content":""},` + u), "", "", ""},

		// Tool calls.
		{"arguments not a string", req(u + `,{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"a","arguments":{}}}]}`),
			"Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, but got an object instead.",
			"messages[1].tool_calls[0].function.arguments", "invalid_type"},
		{"tool call type not function", req(u + `,{"role":"assistant","tool_calls":[{"id":"c","type":"custom","function":{"name":"a","arguments":"{}"}}]}`),
			"Invalid value: 'custom'. Supported values are: 'function'.", "messages[1].tool_calls[0].type", "invalid_value"},
		{"tool call without id", req(u + `,{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"a","arguments":"{}"}}]}`),
			"Missing required parameter: 'messages[1].tool_calls[0].id'.", "messages[1].tool_calls[0].id", "missing_required_parameter"},

		// The transcript rule.
		{"parallel results in any order", req(u + "," + calls + "," + resB + "," + resA), "", "", ""},
		{"a lone tool message (REVIEW H2)", req(resA), orphan, "messages.[0].role", ""},
		{"tool message after a user message", req(u + "," + calls + "," + resA + "," + resB + "," + u + "," + resA),
			orphan, "messages.[5].role", ""},
		{"tool message answering another id", req(u + "," + calls + `,{"role":"tool","tool_call_id":"call_z","content":"Z"}`),
			orphan, "messages.[2].role", ""},
		{"tool message answering an older call", req(u + "," + calls + "," + resA + "," + resB +
			`,{"role":"assistant","content":"done"},` + resA), orphan, "messages.[5].role", ""},
		{"tool message without tool_call_id", req(u + "," + calls + `,{"role":"tool","content":"A"}`),
			"Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.", "messages.[2].tool_call_id", ""},
		{"calls followed by a user message", req(u + "," + calls + "," + u), unanswered + "call_a, call_b", "messages.[1].role", ""},
		{"one of two calls answered", req(u + "," + calls + "," + resB + "," + u), unanswered + "call_a", "messages.[1].role", ""},
		{"calls at the end, unanswered", req(u + "," + calls), unanswered + "call_a, call_b", "messages.[1].role", ""},

		// Tools.
		{"tool type not function", req(u, `,"tools":[{"type":"web_search","function":{"name":"a"}}]`),
			"Invalid value: 'web_search'. Supported values are: 'function'.", "tools[0].type", "invalid_value"},
		{"tool without a function", req(u, `,"tools":[{"type":"function"}]`),
			"Missing required parameter: 'tools[0].function'.", "tools[0].function", "missing_required_parameter"},
		{"tool name with a dot", req(u, `,"tools":[{"type":"function","function":{"name":"ok"}},{"type":"function","function":{"name":"notes.add"}}]`),
			"Invalid 'tools[1].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
			"tools[1].function.name", "invalid_value"},
		{"tool name too long", req(u, `,"tools":[{"type":"function","function":{"name":"`+strings.Repeat("n", 65)+`"}}]`),
			"Invalid 'tools[0].function.name': string too long. Expected a string with maximum length 64, but got a string with length 65 instead.",
			"tools[0].function.name", "string_above_max_length"},
		{"tool parameters not an object", req(u, `,"tools":[{"type":"function","function":{"name":"a","parameters":[]}}]`),
			"Invalid type for 'tools[0].function.parameters': expected an object, but got an array instead.",
			"tools[0].function.parameters", "invalid_type"},
		{"tools empty", req(u, `,"tools":[]`),
			"Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty array instead.", "tools", "empty_array"},
		{"well-formed tools", req(u, `,"tools":[{"type":"function","function":{"name":"add_note","description":"d","parameters":{"type":"object"}}}]`), "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r, err := http.NewRequestWithContext(context.Background(), http.MethodPost, ts.URL+"/v1/chat/completions", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if tt.message == "" {
				if res.StatusCode != http.StatusOK {
					t.Fatalf("a valid request got %d: %s", res.StatusCode, b)
				}
				return
			}
			if res.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", res.StatusCode, b)
			}
			// Exactly OpenAI's shape: four fields, param and code null when they name nothing.
			var raw map[string]map[string]any
			if err := json.Unmarshal(b, &raw); err != nil || len(raw) != 1 || len(raw["error"]) != 4 {
				t.Fatalf("body %s is not {\"error\": {message, type, param, code}}", b)
			}
			e := raw["error"]
			want := map[string]any{"message": tt.message, "type": "invalid_request_error", "param": nullable(tt.param), "code": nullable(tt.code)}
			for k, v := range want {
				if e[k] != v {
					t.Fatalf("%s = %#v, want %#v", k, e[k], v)
				}
			}
		})
	}
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
