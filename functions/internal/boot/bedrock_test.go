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

// Issue 20 item 1: a bedrock-converse entry (region, no key) passes the cold start and is built on the
// function's AWS configuration: its requests go to ConverseStream for the entry's model id, signed with the
// function's credentials in the entry's region (not the function's own).
func TestModelsFileBedrockConverse(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths, auth []string
	model := offline.New(offline.WithWordDelay(0))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths, auth = append(paths, r.URL.EscapedPath()), append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f, err := modelsfile.Parse("models.yaml", []byte("models:\n  - name: nova\n    provider: bedrock-converse\n    model: amazon.nova-lite-v1:0\n"+
		"    region: eu-central-1\n    baseURL: "+srv.URL+"/\n"))
	if err != nil {
		t.Fatal(err)
	}
	b := Base{Config: config.Config{Models: f, Model: "nova"}, Log: slog.New(slog.DiscardHandler), getenv: func(string) string { return "" },
		AWS: aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("AKIDROLE", "secret", "token")}}
	m, err := b.model(context.Background(), &fakeParams{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.Stream(context.Background(), agent.ModelRequest{Model: "nova", Messages: []agent.ModelMessage{{Role: "user", Text: "hi"}}},
		func(agent.ModelEvent) error { return nil })
	if err != nil || res.Model != "amazon.nova-lite-v1:0" {
		t.Fatalf("result %+v, err %v", res, err)
	}
	if len(paths) != 1 || paths[0] != "/model/amazon.nova-lite-v1%3A0/converse-stream" ||
		!strings.HasPrefix(auth[0], "AWS4-HMAC-SHA256 Credential=AKIDROLE/") || !strings.Contains(auth[0], "/eu-central-1/bedrock/") {
		t.Errorf("paths %v, auth %v", paths, auth)
	}
}
