package boot

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/offline"
)

// Issue 20 item 1: an anthropic entry (its key read at cold start) and an anthropic-bedrock entry (region, no
// key, the function's role) pass the cold start and answer over the offline model: the direct one on
// /v1/messages with the key as x-api-key, the Bedrock one on InvokeModelWithResponseStream for the entry's
// model id, signed with the function's credentials in the entry's region (not the function's own). The
// anthropic-bedrock entry is a Bedrock model as bedrock-converse's is: no key is asked of it, and the template's
// BedrockModelArns grant covers it (bedrock:InvokeModelWithResponseStream is the action InvokeModel streaming
// needs).
func TestModelsFileAnthropic(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths, auth, keys []string
	model := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths, auth, keys = append(paths, r.URL.EscapedPath()), append(auth, r.Header.Get("Authorization")), append(keys, r.Header.Get("X-Api-Key"))
		mu.Unlock()
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	if !modelsfile.Bedrock(modelsfile.AnthropicBedrock) {
		t.Fatal("anthropic-bedrock is not a Bedrock provider")
	}
	f, err := modelsfile.Parse("models.yaml", []byte("models:\n"+
		"  - name: claude\n    provider: anthropic\n    model: claude-sonnet-4-5\n    baseURL: "+srv.URL+"\n    apiKey: ${ssm:/agentloop/openai-api-key}\n"+
		"  - name: bedrock-claude\n    provider: anthropic-bedrock\n    model: anthropic.claude-sonnet-4-5-20250929-v1:0\n"+
		"    region: eu-central-1\n    baseURL: "+srv.URL+"/\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := Base{Config: config.Config{Models: f, Model: "claude", OpenAIAPIKeyParam: "/agentloop/openai-api-key"},
		Log: slog.New(slog.DiscardHandler), getenv: func(string) string { return "" },
		AWS: aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDROLE", "secret", "token")}}
	params := &fakeParams{values: map[string]string{"/agentloop/openai-api-key": "sk-ant-from-ssm"}}
	m, err := b.model(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ entry, model string }{
		{"claude", "claude-sonnet-4-5"},
		{"bedrock-claude", "anthropic.claude-sonnet-4-5-20250929-v1:0"},
	} {
		var text strings.Builder
		res, err := m.Stream(context.Background(), agent.ModelRequest{Model: tc.entry, Messages: []agent.ModelMessage{{Role: "user", Text: "hi"}}},
			func(ev agent.ModelEvent) error { text.WriteString(ev.Delta); return nil })
		if err != nil || res.Model != tc.model || text.String() != "You said: hi" {
			t.Fatalf("%s: result %+v, text %q, err %v", tc.entry, res, text.String(), err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 2 || paths[0] != "/v1/messages" || keys[0] != "sk-ant-from-ssm" || auth[0] != "" {
		t.Errorf("direct: paths %v, x-api-key %v, authorization %v", paths, keys, auth)
	}
	if len(paths) == 2 && (paths[1] != "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream" ||
		!strings.HasPrefix(auth[1], "AWS4-HMAC-SHA256 Credential=AKIDROLE/") || !strings.Contains(auth[1], "/eu-central-1/bedrock/") || keys[1] != "") {
		t.Errorf("bedrock: path %s, auth %s, x-api-key %q", paths[1], auth[1], keys[1])
	}
}
