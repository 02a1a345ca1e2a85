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
