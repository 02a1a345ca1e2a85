package modelset_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelset"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/secretref"
)

// endpoint is an offline model over HTTP that records what each request asked for.
type endpoint struct {
	url  string
	mu   sync.Mutex
	seen []seen
}

type seen struct {
	Model     string `json:"model"`
	MaxTokens int    `json:"max_completion_tokens"`
	Auth      string `json:"-"`
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{}
	model := offline.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/chat/completions") {
			var s seen
			_ = json.Unmarshal(body, &s)
			s.Auth = r.Header.Get("Authorization")
			e.mu.Lock()
			e.seen = append(e.seen, s)
			e.mu.Unlock()
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL + "/v1/"
	return e
}

func (e *endpoint) requests() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.seen...)
}

// openaiChat is the wiring's constructor for openai-chat entries.
func openaiChat(e modelsfile.Model, key string) (agent.Model, error) {
	return openai.New(openai.Config{BaseURL: e.BaseURL, APIKey: key, Model: e.Model, MaxRetries: -1}), nil
}

// TestRouting: two entries on two offline endpoints; each request reaches its entry's endpoint with the entry's
// provider model id and key, capped by its maxOutputTokens, and the result reports the model the provider named.
func TestRouting(t *testing.T) {
	t.Parallel()
	a, b := newEndpoint(t), newEndpoint(t)
	file := "models:\n" +
		"  - {name: fast, provider: openai-chat, model: small-model-1, baseURL: '" + a.url + "', apiKey: '${env:FAST_KEY}'}\n" +
		"  - {name: deep, provider: openai-chat, model: big-model-2, baseURL: '" + b.url + "', maxOutputTokens: 100}\n"
	f, err := modelsfile.Parse("models.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	keys := secretref.Values{{Scheme: secretref.Env, Name: "FAST_KEY"}: "sk-fast"}
	set, err := modelset.New(f, keys, modelset.Constructors{modelsfile.OpenAIChat: openaiChat})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		entry     string
		maxTokens int
		at        *endpoint
		want      seen
	}{
		{entry: "fast", maxTokens: 500, at: a, want: seen{Model: "small-model-1", MaxTokens: 500, Auth: "Bearer sk-fast"}},
		{entry: "deep", maxTokens: 500, at: b, want: seen{Model: "big-model-2", MaxTokens: 100}},
		{entry: "deep", maxTokens: 50, at: b, want: seen{Model: "big-model-2", MaxTokens: 50}},
		{entry: "deep", at: b, want: seen{Model: "big-model-2", MaxTokens: 100}},
	}
	for _, c := range cases {
		before := len(c.at.requests())
		var text strings.Builder
		res, err := set.Stream(context.Background(), agent.ModelRequest{Model: c.entry, MaxOutputTokens: c.maxTokens,
			Messages: []agent.ModelMessage{{Role: "user", Text: "hello there"}}}, func(ev agent.ModelEvent) error {
			text.WriteString(ev.Delta)
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", c.entry, err)
		}
		if res.Model != c.want.Model {
			t.Errorf("%s: result model = %q, want %q (as the provider reported it)", c.entry, res.Model, c.want.Model)
		}
		if text.String() != "You said: hello there" {
			t.Errorf("%s: text = %q", c.entry, text.String())
		}
		got := c.at.requests()
		if len(got) != before+1 {
			t.Fatalf("%s: the endpoint got %d requests, want %d", c.entry, len(got), before+1)
		}
		if got[before] != c.want {
			t.Errorf("%s: request = %+v, want %+v", c.entry, got[before], c.want)
		}
	}
	if n, m := len(a.requests()), len(b.requests()); n != 1 || m != 3 {
		t.Errorf("requests: fast endpoint %d, deep endpoint %d; want 1 and 3", n, m)
	}

	_, err = set.Stream(context.Background(), agent.ModelRequest{Model: "gpt-4o", Messages: []agent.ModelMessage{{Role: "user", Text: "hi"}}},
		func(agent.ModelEvent) error { return nil })
	if agent.CodeOf(err) != agent.CodeUnknownModel || !strings.Contains(err.Error(), `model "gpt-4o" is no entry of the models file models.yaml (its entries: fast, deep)`) {
		t.Errorf("unknown entry: err = %v (code %q), want %s", err, agent.CodeOf(err), agent.CodeUnknownModel)
	}
	if n, m := len(a.requests()), len(b.requests()); n != 1 || m != 3 {
		t.Errorf("an unknown entry sent a request: %d, %d", n, m)
	}
}

// TestNotBuilt: an entry whose provider has no constructor fails New, naming the provider and where it is.
func TestNotBuilt(t *testing.T) {
	t.Parallel()
	f, err := modelsfile.Parse("models.yaml", []byte("models:\n  - {name: a, provider: openai-chat, model: m}\n  - name: claude\n    provider: anthropic\n    model: claude-sonnet-4\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = modelset.New(f, nil, modelset.Constructors{modelsfile.OpenAIChat: openaiChat})
	if want := "models.yaml:3: models[1].provider: anthropic is not built yet in this agentloop (built: openai-chat)"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
}
