package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/web"
)

const secret = "lambda-form-test-secret-0123456789abcdef"

// setup builds the API handler as main does, from env alone. Nothing here reaches DynamoDB (the requests end
// at auth or /healthz); functions/deploytest runs the built bootstrap against DynamoDB Local.
func setup(t *testing.T, env map[string]string) (http.Handler, error) {
	t.Helper()
	return newHandler(context.Background(), func(k string) string { return env[k] }, aws.Config{Region: "us-east-1"},
		slog.New(slog.DiscardHandler))
}

// The API function needs no model: it starts with only its table and the application secret, so its role
// never needs the OpenAI key.
func TestNeedsNoModel(t *testing.T) {
	t.Parallel()
	h, err := setup(t, map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": secret})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := deploytest.LoadEvent("threads-list.json", map[string]string{"TOKEN": "not-a-jwt"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		path       string
		wantStatus int
		wantCode   string
	}{
		{name: "threads with a bad token", path: "/threads", wantStatus: http.StatusUnauthorized, wantCode: auth.CodeInvalidToken},
		{name: "healthz", path: "/healthz", wantStatus: http.StatusOK},
		{name: "chat is not served here", path: "/chat", wantStatus: http.StatusNotFound, wantCode: "route_not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := *ev.Request
			req.RawPath, req.RequestContext.HTTP.Path = tt.path, tt.path
			resp, err := lambdaurl.Wrap(h)(context.Background(), &req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			var body struct{ Error struct{ Code string } }
			if resp.StatusCode != tt.wantStatus || json.Unmarshal(b, &body) != nil || body.Error.Code != tt.wantCode {
				t.Fatalf("got %d %s, want %d with code %q", resp.StatusCode, b, tt.wantStatus, tt.wantCode)
			}
		})
	}
}

func TestNewHandlerRejectsBadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
	}{
		{name: "no table", env: map[string]string{"AGENT_SECRET": secret}},
		{name: "no secret", env: map[string]string{"TABLE_NAME": "t"}},
		{name: "weak secret", env: map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": "short"}},
		{name: "bad bound", env: map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": secret, "AGENT_STALE_AFTER": "-1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := setup(t, tt.env); err == nil {
				t.Fatal("newHandler succeeded, want an error")
			}
		})
	}
}

// The API function serves the web app at its root, with a configuration naming the chat function's URL (the
// template's AGENT_CHAT_URL) and no dev token route: a deployment never mints tokens over HTTP.
func TestServesTheWebApp(t *testing.T) {
	t.Parallel()
	if !web.Built() {
		t.Fatal("the web app is not built into this binary: run `make web` (make test does) before go test")
	}
	h, err := setup(t, map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": secret, "AGENT_CHAT_URL": "https://chat.example.lambda-url.us-east-1.on.aws/"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := deploytest.LoadEvent("threads-list.json", map[string]string{"TOKEN": "not-a-jwt"})
	if err != nil {
		t.Fatal(err)
	}
	get := func(method, path string) (int, string, string) {
		req := *ev.Request
		req.RequestContext.HTTP.Method = method
		req.RawPath, req.RequestContext.HTTP.Path = path, path
		resp, err := lambdaurl.Wrap(h)(context.Background(), &req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Headers["Content-Type"], string(b)
	}
	if status, ctype, body := get("GET", "/"); status != 200 || !strings.HasPrefix(ctype, "text/html") || !strings.Contains(body, `<div id="root">`) {
		t.Fatalf("GET /: %d %s %.200s", status, ctype, body)
	}
	var cfg web.Config
	if status, _, body := get("GET", "/config.json"); status != 200 || json.Unmarshal([]byte(body), &cfg) != nil ||
		cfg.ChatURL != "https://chat.example.lambda-url.us-east-1.on.aws" || cfg.DevTokenURL != "" || cfg.APIURL != "" {
		t.Fatalf("GET /config.json: %d %s", status, body)
	}
	if status, _, _ := get("POST", "/dev/token"); status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
		t.Fatalf("POST /dev/token: %d, want no such route", status)
	}
}
