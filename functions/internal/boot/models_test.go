package boot

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/offline"
)

// Issue 20 item 1: in Lambda the models file's keys are read at cold start: an ${ssm:…} key must be the model key
// parameter the roles may read (OPENAI_API_KEY_PARAM), refused at its line before SSM is asked otherwise; the key
// read reaches the entry's provider, which gets the entry's model id.
func TestModelsFileKeys(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var auth []string
	model := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	file := func(key string) *modelsfile.File {
		f, err := modelsfile.Parse("models.yaml", []byte("models:\n  - name: main\n    provider: openai-chat\n    model: house-1\n    baseURL: "+srv.URL+"/v1/\n    apiKey: "+key+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	base := func(f *modelsfile.File) Base {
		return Base{Config: config.Config{Models: f, Model: "main", OpenAIAPIKeyParam: "/agentloop/openai-api-key"},
			Log: slog.New(slog.DiscardHandler), getenv: func(string) string { return "" }}
	}

	params := &fakeParams{values: map[string]string{"/agentloop/openai-api-key": "sk-from-ssm", "/other/key": "sk-other"}}
	_, err := base(file("${ssm:/other/key}")).model(context.Background(), params)
	if want := "models.yaml:6: models[0].apiKey: ${ssm:/other/key} is not a parameter the functions may read (they may read /agentloop/openai-api-key)"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err = %v, want %s…", err, want)
	}
	if len(params.asked) != 0 {
		t.Fatalf("SSM was asked %v before the scope was checked", params.asked)
	}

	// A key under AGENT_MODEL_KEYS_PATH (the template's ModelKeysPath) may be read: an Anthropic key and an
	// OpenAI key can both come from SSM.
	under := base(file("${ssm:/other/key}"))
	under.Config.ModelKeysPath = "/other/"
	if _, err := under.model(context.Background(), params); err != nil {
		t.Fatalf("a key under AGENT_MODEL_KEYS_PATH: %v", err)
	}
	params.asked = nil

	bare, err := modelsfile.Parse("models.yaml", []byte("models:\n  - {name: main, provider: openai-chat, model: gpt-4o}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := base(bare).model(context.Background(), params); err == nil || !strings.Contains(err.Error(), "models.yaml:2: models[0] (main) has neither baseURL nor apiKey") {
		t.Errorf("an entry with neither baseURL nor apiKey: err = %v", err)
	}

	m, err := base(file("${ssm:/agentloop/openai-api-key}")).model(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if len(params.asked) != 1 {
		t.Errorf("SSM requests: %v, want one", params.asked)
	}
	res, err := m.Stream(context.Background(), agent.ModelRequest{Model: "main", Messages: []agent.ModelMessage{{Role: "user", Text: "hi"}}},
		func(agent.ModelEvent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if res.Model != "house-1" || len(auth) != 1 || auth[0] != "Bearer sk-from-ssm" {
		t.Errorf("model %q, authorization %v; want house-1 and the key from SSM", res.Model, auth)
	}
}
