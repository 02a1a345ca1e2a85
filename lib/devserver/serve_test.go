package devserver_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/sfn"
)

// The serve stack's wiring, without a table (an endpoint nothing answers on): jobs go to Step Functions when
// JOBS_STATE_MACHINE_ARN is set and to the in-process runner otherwise; tokens are a deployment's (its own
// token taken, a dev token with the same secret refused, no POST /dev/token); GET /readyz says store_unavailable
// when the table does not answer.
func TestServeWiring(t *testing.T) {
	t.Parallel()
	const secret = "serve-wiring-secret-0123456789abcdef0123"
	const arn = "arn:aws:states:us-east-1:123456789012:stateMachine:agentloop-jobs"
	tests := []struct {
		name     string
		arn      string
		wantMode string
	}{
		{"step functions", arn, "step functions " + arn},
		{"in-process", "", "in-process"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := config.Config{TableName: "t", Secret: secret, DynamoEndpoint: "http://127.0.0.1:1", JobsStateMachineARN: tt.arn}
			s, err := devserver.NewServe(context.Background(), devserver.ServeOptions{Config: cfg,
				Getenv: func(string) string { return "" }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			_, isSFN := s.Jobs.(*sfn.Jobs)
			if s.JobsMode != tt.wantMode || isSFN != (tt.arn != "") || !isSFN && s.Jobs != agent.Jobs(s.Runner) {
				t.Fatalf("jobs %T (%s), want %s", s.Jobs, s.JobsMode, tt.wantMode)
			}
			srv := httptest.NewServer(s.Handler)
			t.Cleanup(srv.Close)
			own, err := s.Token("alice", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			dev, err := auth.MintHS256([]byte(secret), "alice", time.Hour, time.Now(), cfg.DevTokenClaims()...)
			if err != nil {
				t.Fatal(err)
			}
			get := func(method, path, tok string) (int, string) {
				req, _ := http.NewRequest(method, srv.URL+path, nil)
				if tok != "" {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				var b strings.Builder
				_, _ = io.Copy(&b, res.Body)
				return res.StatusCode, b.String()
			}
			if status, body := get("GET", "/threads", dev); status != 401 {
				t.Fatalf("a dev token: %d %s, want 401", status, body)
			}
			if status, body := get("GET", "/threads", own); status == 401 {
				t.Fatalf("serve's own token: %d %s", status, body)
			}
			if status, _ := get("POST", "/dev/token", ""); status != 404 {
				t.Fatalf("POST /dev/token: %d, want 404", status)
			}
			if status, body := get("GET", "/readyz", ""); status != 503 || !strings.Contains(body, `"code":"store_unavailable"`) {
				t.Fatalf("/readyz without a table: %d %s, want 503 store_unavailable", status, body)
			}
		})
	}
}

// A models file's Bedrock entry without a baseURL calls Bedrock in serve, with the process's AWS configuration
// (an ECS task's role), as it does in the functions: only `agentloop dev` sends a keyless entry to the offline
// model. An entry with neither baseURL nor apiKey of another provider still talks to the offline model.
func TestServeBedrockEntriesCallBedrock(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, entries string
		wantOffline   bool
	}{
		{"bedrock only", "  - name: nova\n    provider: bedrock-converse\n    model: amazon.nova-pro-v1:0\n    region: us-east-1\n", false},
		{"anthropic on bedrock", "  - name: claude\n    provider: anthropic-bedrock\n    model: anthropic.claude-sonnet-4-5-20250929-v1:0\n    region: eu-central-1\n", false},
		{"a keyless openai entry beside it", "  - name: nova\n    provider: bedrock-converse\n    model: amazon.nova-pro-v1:0\n    region: us-east-1\n" +
			"  - name: local\n    provider: openai-chat\n    model: offline\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := modelsfile.Parse("models.yaml", []byte("models:\n"+tt.entries))
			if err != nil {
				t.Fatal(err)
			}
			cfg := config.Config{TableName: "t", Secret: "serve-wiring-secret-0123456789abcdef0123", DynamoEndpoint: "http://127.0.0.1:1",
				Models: f, Model: f.Models[0].Name, SubagentModel: f.Models[0].Name, TitleModel: f.Models[0].Name}
			s, err := devserver.NewServe(context.Background(), devserver.ServeOptions{Config: cfg, Getenv: func(string) string { return "" }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if s.Offline != tt.wantOffline {
				t.Fatalf("offline model started: %t, want %t (model URL %q)", s.Offline, tt.wantOffline, s.ModelURL)
			}
		})
	}
}
