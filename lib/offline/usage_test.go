package offline

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
)

// TestInputTokensAlike: the same transcript reports the same input tokens on every route, the system prompt
// included wherever the protocol sends it (Chat Completions' system message, Responses' instructions, Messages'
// and Converse's system field). The engine scales its chars/4 estimate by the provider's count
// (transcript.History.Reported): a route that left the system prompt out made the engine prune later over
// Anthropic and Bedrock than over OpenAI (TestPruneBeforeStep under make test-matrix).
func TestInputTokensAlike(t *testing.T) {
	t.Parallel()
	s, _, url := setup(t)
	// system 1+3, user 1+1, assistant 1+2, user 1+2.
	const want = 12
	inputs := map[string]func(t *testing.T) int64{
		"chat completions": func(t *testing.T) int64 {
			u := complete(t, url, request(false, system("be very brief"), user("hi"), assistant("hello there"), user("how are"))).Usage
			return u.PromptTokens
		},
		"responses": func(t *testing.T) int64 {
			body := responsesRequestBody([]object{userItem("hi"),
				{"type": "message", "role": "assistant", "content": []object{{"type": "output_text", "text": "hello there"}}}, userItem("how are")})
			body["instructions"], body["stream"] = "be very brief", false
			res := postResponses(t, url, body)
			defer res.Body.Close()
			var r struct {
				Usage responsesUsage `json:"usage"`
			}
			if err := json.NewDecoder(res.Body).Decode(&r); err != nil || res.StatusCode != 200 {
				t.Fatalf("status %d: %v", res.StatusCode, err)
			}
			return r.Usage.InputTokens
		},
		"messages": func(t *testing.T) int64 {
			status, body := postMessages(t, s, anthropicHeaders, `{"model":"m","max_tokens":50,"system":[{"type":"text","text":"be very brief","cache_control":{"type":"ephemeral"}}],`+
				`"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello there"},{"role":"user","content":"how are"}]}`)
			var r struct {
				Usage msgUsage `json:"usage"`
			}
			if err := json.Unmarshal([]byte(body), &r); err != nil || status != 200 {
				t.Fatalf("%d %s", status, body)
			}
			return r.Usage.InputTokens + r.Usage.CacheReadInputTokens + r.Usage.CacheCreationInputTokens
		},
		"converse": func(t *testing.T) int64 {
			res := postConverse(t, s, "/model/amazon.nova-pro-v1%3A0/converse-stream", true, `{"system":[{"text":"be very brief"}],"messages":[`+
				`{"role":"user","content":[{"text":"hi"}]},{"role":"assistant","content":[{"text":"hello there"}]},{"role":"user","content":[{"text":"how are"}]}]}`)
			return converseInput(t, res)
		},
	}
	for name, input := range inputs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := input(t); got != want {
				t.Errorf("input tokens %d, want %d", got, want)
			}
		})
	}
}

// converseInput is the whole prompt a ConverseStream answer's metadata event reports (input, cache reads and
// writes).
func converseInput(t *testing.T, res *http.Response) int64 {
	t.Helper()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("%d %s", res.StatusCode, raw)
	}
	dec, r := eventstream.NewDecoder(), bytes.NewReader(raw)
	for r.Len() > 0 {
		msg, err := dec.Decode(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Headers.Get(":event-type").String() != "metadata" {
			continue
		}
		var m struct {
			Usage struct{ InputTokens, CacheReadInputTokens, CacheWriteInputTokens int64 } `json:"usage"`
		}
		if err := json.Unmarshal(msg.Payload, &m); err != nil {
			t.Fatal(err)
		}
		return m.Usage.InputTokens + m.Usage.CacheReadInputTokens + m.Usage.CacheWriteInputTokens
	}
	t.Fatalf("no metadata event in %q", raw)
	return 0
}
