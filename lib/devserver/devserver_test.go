package devserver_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
)

// REVIEW S13: the dev server honours AGENT_JWT_ISSUER and AGENT_JWT_AUDIENCE as a deployment does (it ignored
// them), takes the dev tokens it mints itself, and keeps taking plain tokens when neither is set.
func TestDevServerChecksIssuerAndAudience(t *testing.T) {
	t.Parallel()
	status := func(s *devserver.Stack, tok string) int {
		t.Helper()
		req := httptest.NewRequest("GET", "/threads", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		s.Handler.ServeHTTP(rec, req)
		return rec.Code
	}
	start := func(cfg config.Config) *devserver.Stack {
		t.Helper()
		s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Config: cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}

	checked := start(config.Config{JWTIssuer: "https://issuer.example", JWTAudience: "my-app"})
	own, err := checked.Token("alice", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := auth.MintHS256(checked.Secret, "alice", time.Hour, time.Now())
	right, _ := auth.MintHS256(checked.Secret, "alice", time.Hour, time.Now(), auth.WithIssuer("https://issuer.example"), auth.WithAudience("my-app"))
	for name, c := range map[string]struct {
		tok  string
		want int
	}{
		"its own token":            {own, http.StatusOK},
		"a token with iss and aud": {right, http.StatusOK},
		"a token without them":     {plain, http.StatusUnauthorized},
	} {
		if got := status(checked, c.tok); got != c.want {
			t.Errorf("AGENT_JWT_ISSUER/AUDIENCE set, %s: %d, want %d", name, got, c.want)
		}
	}

	open := start(config.Config{})
	own, _ = open.Token("alice", time.Hour)
	plain, _ = auth.MintHS256(open.Secret, "alice", time.Hour, time.Now())
	for name, tok := range map[string]string{"its own token": own, "a plain token": plain} {
		if got := status(open, tok); got != http.StatusOK {
			t.Errorf("nothing set, %s: %d, want 200", name, got)
		}
	}
}
