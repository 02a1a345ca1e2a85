package offline

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

func postConverse(t *testing.T, srv http.Handler, path string, auth bool, body string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	if auth {
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=x")
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec.Result()
}

// TestConverseRefusals: invalid requests get Bedrock's status, exception name (x-amzn-errortype) and message.
func TestConverseRefusals(t *testing.T) {
	t.Parallel()
	const path = "/model/amazon.nova-pro-v1%3A0/converse-stream"
	use := `{"role":"assistant","content":[{"toolUse":{"toolUseId":"t1","name":"x","input":{}}}]}`
	cases := []struct {
		name      string
		noAuth    bool
		body      string
		status    int
		exception string
		message   string
	}{
		{"no authorization", true, `{}`, 403, "MissingAuthenticationTokenException", "Missing Authentication Token"},
		{"no messages", false, `{"messages":[]}`, 400, "ValidationException", "A conversation must start with a user message."},
		{"assistant first", false, `{"messages":[{"role":"assistant","content":[{"text":"a"}]}]}`, 400, "ValidationException", "A conversation must start with a user message."},
		{"two users", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"user","content":[{"text":"b"}]}]}`,
			400, "ValidationException", "A conversation must alternate between user and assistant roles."},
		{"blank text", false, `{"messages":[{"role":"user","content":[{"text":" "}]}]}`, 400, "ValidationException", "is blank"},
		{"empty content", false, `{"messages":[{"role":"user","content":[]}]}`, 400, "ValidationException", "The content field in the Message object at messages.0 is empty"},
		{"toolUse in a user message", false, `{"messages":[{"role":"user","content":[{"toolUse":{"toolUseId":"t","name":"x","input":{}}}]}]}`,
			400, "ValidationException", "is not one a user message may hold"},
		{"unanswered toolUse", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},` + use + `,{"role":"user","content":[{"text":"b"}]}]}`,
			400, "ValidationException", "Expected toolResult blocks at messages.2.content for the following Ids: t1"},
		{"orphan toolResult", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"assistant","content":[{"text":"b"}]},{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":"r"}]}}]}]}`,
			400, "ValidationException", "The number of toolResult blocks at messages.2.content exceeds the number of toolUse blocks of previous turn."},
		{"wrong toolResult id", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},` + use + `,{"role":"user","content":[{"toolResult":{"toolUseId":"t2","content":[{"text":"r"}]}}]}]}`,
			400, "ValidationException", "The toolUseId t1 of the toolResult blocks at messages.2.content does not match"},
		{"unsigned reasoning", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"assistant","content":[{"reasoningContent":{"reasoningText":{"text":"hmm"}}},{"text":"b"}]},{"role":"user","content":[{"text":"c"}]}]}`,
			400, "ValidationException", "has no signature"},
		{"forged signature", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"assistant","content":[{"reasoningContent":{"reasoningText":{"text":"hmm","signature":"forged"}}},{"text":"b"}]},{"role":"user","content":[{"text":"c"}]}]}`,
			400, "ValidationException", "signature of the reasoningText at messages.1.content.0 is invalid"},
		{"tool without schema", false, `{"messages":[{"role":"user","content":[{"text":"a"}]}],"toolConfig":{"tools":[{"toolSpec":{"name":"x","inputSchema":{}}}]}}`,
			400, "ValidationException", "toolConfig.tools.0.toolSpec.inputSchema.json"},
		{"tool blocks without tools", false, `{"messages":[{"role":"user","content":[{"text":"a"}]},` + use + `,{"role":"user","content":[{"toolResult":{"toolUseId":"t1","content":[{"text":"r"}]}}]}]}`,
			400, "ValidationException", "The toolConfig field must be defined when using toolUse and toolResult content blocks."},
		{"five cache points", false, `{"system":[{"text":"s"},{"cachePoint":{"type":"default"}}],"messages":[{"role":"user","content":[{"text":"a"},{"cachePoint":{"type":"default"}},{"text":"b"},{"cachePoint":{"type":"default"}},{"text":"c"},{"cachePoint":{"type":"default"}},{"text":"d"},{"cachePoint":{"type":"default"}}]}]}`,
			400, "ValidationException", "exceeds the maximum of 4"},
		{"injected throttling", false, `{"messages":[{"role":"user","content":[{"text":"/error 429"}]}]}`, 429, "ThrottlingException", "injected error 429"},
	}
	srv := New()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res := postConverse(t, srv, path, !c.noAuth, c.body)
			b, _ := io.ReadAll(res.Body)
			var body struct{ Message string }
			_ = json.Unmarshal(b, &body)
			if res.StatusCode != c.status || !strings.HasPrefix(res.Header.Get("X-Amzn-Errortype"), c.exception+":") || !strings.Contains(body.Message, c.message) {
				t.Errorf("%d %s %s, want %d %s %q", res.StatusCode, res.Header.Get("X-Amzn-Errortype"), b, c.status, c.exception, c.message)
			}
		})
	}
	// A signed reasoning block, as issued, is taken back.
	sig := thinkingSignature("hmm")
	ok := `{"messages":[{"role":"user","content":[{"text":"a"}]},{"role":"assistant","content":[{"reasoningContent":{"reasoningText":{"text":"hmm","signature":"` + sig + `"}}},{"text":"b"}]},{"role":"user","content":[{"text":"c"}]}]}`
	if res := postConverse(t, srv, path, true, ok); res.StatusCode != 200 {
		t.Errorf("signed reasoning: %d", res.StatusCode)
	}
}

// TestConverseStream: the event stream's messages, their headers and order, for a reply that thinks, says and
// calls two tools.
func TestConverseStream(t *testing.T) {
	t.Parallel()
	res := postConverse(t, New(), "/model/mistral.mistral-large/converse-stream", true,
		`{"messages":[{"role":"user","content":[{"text":"/think /tool a /tool b {\"x\":1}"}]}],"toolConfig":{"tools":[{"toolSpec":{"name":"a","inputSchema":{"json":{"type":"object"}}}}]}}`)
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/vnd.amazon.eventstream" {
		t.Fatalf("%d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	raw, _ := io.ReadAll(res.Body)
	dec := eventstream.NewDecoder()
	r := bytes.NewReader(raw)
	var kinds []string
	var payloads []map[string]any
	for r.Len() > 0 {
		msg, err := dec.Decode(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if mt := msg.Headers.Get(":message-type"); mt == nil || mt.String() != "event" || msg.Headers.Get(":content-type").String() != "application/json" {
			t.Fatalf("headers %v", msg.Headers)
		}
		kinds = append(kinds, msg.Headers.Get(":event-type").String())
		var p map[string]any
		if err := json.Unmarshal(msg.Payload, &p); err != nil || p["p"] == nil {
			t.Fatalf("payload %s", msg.Payload)
		}
		payloads = append(payloads, p)
	}
	got := strings.Join(kinds, " ")
	// Reasoning: 7 words and the signature; tool a's "{}" in 2 fragments, tool b's arguments in 3.
	want := "messageStart " + strings.Repeat("contentBlockDelta ", 8) + "contentBlockStop " +
		"contentBlockStart contentBlockDelta contentBlockDelta contentBlockStop contentBlockStart " + strings.Repeat("contentBlockDelta ", 3) + "contentBlockStop messageStop metadata"
	if got != want {
		t.Errorf("events\n%s\nwant\n%s", got, want)
	}
	stop, _ := json.Marshal(payloads[len(payloads)-2]["stopReason"])
	usage, _ := json.Marshal(payloads[len(payloads)-1]["usage"])
	if string(stop) != `"tool_use"` || !strings.Contains(string(usage), `"cacheReadInputTokens":0`) {
		t.Errorf("stop %s, usage %s", stop, usage)
	}
}
