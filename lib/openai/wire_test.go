package openai

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The adapter reads the wire itself (wire.go): what compatible servers send beside OpenAI's own shapes is read
// as openai-go read it, and an error answer that is not OpenAI's shape is still an HTTP error with its status.
func TestWireShapes(t *testing.T) {
	t.Parallel()
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`
	tests := []struct {
		name      string
		chunks    []string
		text      string
		reasoning string
		usage     agent.Usage
	}{
		{
			name: "counts written as floats, nulls, usage details",
			chunks: []string{
				head + `{"role":"assistant","content":"hi","refusal":null,"tool_calls":null}}]}`,
				head + `{"content":null},"finish_reason":"stop"}]}`,
				`{"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":10.0,"completion_tokens":2,"total_tokens":null,` +
					`"prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":null}}`,
			},
			text:  "hi",
			usage: agent.Usage{InputTokens: 10, OutputTokens: 2, TotalTokens: 12, CachedInputTokens: 4},
		},
		{
			name: "reasoning as text in either field, an object in it ignored",
			chunks: []string{
				head + `{"reasoning_content":"a "}}]}`,
				head + `{"reasoning":"b"}}]}`,
				head + `{"reasoning":{"summary":"not text"},"content":"done"}}]}`,
				head + `{},"finish_reason":"stop"}]}`,
			},
			text:      "done",
			reasoning: "a b",
		},
		{
			name: "comments, event names and multi-line data",
			chunks: []string{
				head + `{"content":"x"}}]}` + "\n\n: keep-alive\nevent: message\ndata: " + head + `{"content":"y"},` + "\ndata: " + `"finish_reason":"stop"}]}`,
			},
			text: "xy",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := New(Config{BaseURL: sseServer(t, tt.chunks...), Model: "m", Logger: slog.New(slog.DiscardHandler)})
			res, events, err := run(context.Background(), m, userReq("hi"))
			if err != nil || res.FinishReason != agent.FinishStop {
				t.Fatalf("result %+v err %v", res, err)
			}
			if got := textOf(events, agent.EventTextDelta); got != tt.text {
				t.Errorf("text %q, want %q", got, tt.text)
			}
			if got := textOf(events, agent.EventReasoningDelta); got != tt.reasoning {
				t.Errorf("reasoning %q, want %q", got, tt.reasoning)
			}
			if tt.usage != (agent.Usage{}) && res.Usage != tt.usage {
				t.Errorf("usage %+v, want %+v", res.Usage, tt.usage)
			}
		})
	}
}

func TestWireErrorAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		status   int
		body     string
		kind     agent.Kind
		code     string
		attempts int64
		said     string
	}{
		{name: "a proxy's HTML page", status: http.StatusBadGateway, body: "<html>bad gateway</html>",
			kind: agent.KindUnavailable, code: agent.CodeModelError, attempts: 3, said: "<html>bad gateway</html>"},
		{name: "a numeric error code", status: http.StatusTooManyRequests, body: `{"error":{"message":"slow down","code":429}}`,
			kind: agent.KindUnavailable, code: agent.CodeModelError, attempts: 3, said: "slow down"},
		{name: "OpenAI's image refusal", status: http.StatusBadRequest,
			body: `{"error":{"message":"Error while downloading https://x/y.png?sig=secret.","type":"invalid_request_error","param":null,"code":"invalid_image_url"}}`,
			kind: agent.KindInvalid, code: agent.CodeFileUnavailable, attempts: 1, said: "https://x/y.png?…"},
		{name: "an empty body", status: http.StatusUnauthorized, kind: agent.KindUnavailable, code: agent.CodeModelError, attempts: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int64
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n.Add(1)
				if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer k" {
					t.Errorf("request %s with %q", r.URL.Path, r.Header.Get("Authorization"))
				}
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			t.Cleanup(ts.Close)
			// No trailing slash: the base URL is a path prefix either way.
			m := New(Config{BaseURL: ts.URL + "/v1", APIKey: "k", Model: "m", BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
			_, _, err := run(context.Background(), m, userReq("hi"))
			requireError(t, err, tt.kind, tt.code, "")
			if n.Load() != tt.attempts {
				t.Errorf("%d attempts, want %d", n.Load(), tt.attempts)
			}
			if !strings.Contains(err.Error(), tt.said) || strings.Contains(err.Error(), "sig=secret") {
				t.Errorf("error %q: want the provider's %q, no URL query", err, tt.said)
			}
			if ae := err.(*agent.Error); strings.Contains(ae.Message, "bad gateway") || strings.Contains(ae.Message, "slow down") {
				t.Errorf("user message %q quotes the provider", ae.Message)
			}
		})
	}
}

// Words that arrive together are emitted with More (the engine then writes them to the client at once), and
// the last event before the adapter waits for the provider, or returns, never has it: a consumer that waits
// for More to clear never holds a word while the model is slow.
func TestMoreOnlyWhileTheNextEventIsAtHand(t *testing.T) {
	t.Parallel()
	const head = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":`
	word := func(w string) string { return head + `{"content":"` + w + `"}}]}` }
	finish := head + `{},"finish_reason":"stop"}]}`

	t.Run("together", func(t *testing.T) {
		t.Parallel()
		m := New(Config{BaseURL: sseServer(t, word("a "), word("b "), word("c "), finish), Model: "m", Logger: slog.New(slog.DiscardHandler)})
		_, events, err := run(context.Background(), m, userReq("hi"))
		if err != nil || len(events) != 3 {
			t.Fatalf("events %+v err %v", events, err)
		}
		if !events[0].More || !events[1].More || events[2].More {
			t.Fatalf("More = %t %t %t, want true true false", events[0].More, events[1].More, events[2].More)
		}
	})

	t.Run("one at a time", func(t *testing.T) {
		t.Parallel()
		got := make(chan string, 3)
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, wd := range []string{"a ", "b ", "c "} {
				io.WriteString(w, "data: "+word(wd)+"\n\n")
				w.(http.Flusher).Flush()
				select { // the next word only once the consumer has this one: a held word would never come
				case g := <-got:
					if g != wd {
						t.Errorf("consumer got %q, want %q", g, wd)
					}
				case <-time.After(10 * time.Second):
					t.Errorf("the consumer never got %q: the adapter held it while it waited for the next chunk", wd)
					return
				}
			}
			io.WriteString(w, "data: "+finish+"\n\ndata: [DONE]\n\n")
		}))
		t.Cleanup(ts.Close)
		m := New(Config{BaseURL: ts.URL + "/v1/", Model: "m", Logger: slog.New(slog.DiscardHandler)})
		_, err := m.Stream(context.Background(), userReq("hi"), func(ev agent.ModelEvent) error {
			if ev.More {
				t.Errorf("event %+v has More while the next chunk is not sent", ev)
			}
			got <- ev.Delta
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// The default client keeps a connection per concurrent reply for the next turn, where http.DefaultClient keeps
// two (the rest dial, and against a provider shake hands over TLS, anew on every reply under load).
func TestDefaultClientKeepsConnections(t *testing.T) {
	t.Parallel()
	m := New(Config{Model: "m"})
	tr, ok := m.cfg.HTTPClient.Transport.(*http.Transport)
	if !ok || tr.MaxIdleConnsPerHost < DefaultMaxIdleConnsPerHost || tr.MaxIdleConns < DefaultMaxIdleConnsPerHost || tr.Proxy == nil || tr.WriteBufferSize != modelWriteBuffer || tr.ReadBufferSize != modelReadBuffer {
		t.Fatalf("default transport %+v", m.cfg.HTTPClient.Transport)
	}
	if m.cfg.HTTPClient == http.DefaultClient || tr == http.DefaultTransport {
		t.Fatal("the default client is the process's shared one")
	}
}
