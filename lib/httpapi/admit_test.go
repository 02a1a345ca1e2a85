package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/httpapi"
)

// Deps.Admit (agentloop serve's drain gate, lib/drain) is asked before a chat route reads anything, the token
// included: its refusal is the error contract's, with its status, its Retry-After and the CORS headers a browser
// needs to read them; the other routes never ask it.
func TestAdmitRefusesChatRoutes(t *testing.T) {
	t.Parallel()
	refusal := agent.E(agent.KindUnavailable, agent.CodeDraining, "shutting down")
	refusal.RetryAfter = 5 * time.Second
	asked := 0
	h := httpapi.New(httpapi.Deps{AllowOrigins: []string{"*"}, Admit: func(*http.Request) error { asked++; return refusal }})
	tests := []struct {
		method, path string
		wantStatus   int
		wantAsked    bool
	}{
		{"POST", "/chat", 503, true},
		{"GET", "/chat/t1/stream", 503, true},
		{"GET", "/healthz", 200, false},
	}
	for _, tt := range tests {
		before := asked
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(tt.method, tt.path, strings.NewReader(`{}`))
		req.Header.Set("Origin", "https://app.example")
		h.ServeHTTP(rec, req)
		if rec.Code != tt.wantStatus || (asked > before) != tt.wantAsked {
			t.Fatalf("%s %s: %d (admit asked: %t), want %d (%t): %s", tt.method, tt.path, rec.Code, asked > before, tt.wantStatus, tt.wantAsked, rec.Body)
		}
		if tt.wantStatus != 503 {
			continue
		}
		if !strings.Contains(rec.Body.String(), `"code":"draining"`) || rec.Header().Get("Retry-After") != "5" ||
			rec.Header().Get("Access-Control-Allow-Origin") == "" || !strings.Contains(rec.Header().Get("Access-Control-Expose-Headers"), "retry-after") {
			t.Fatalf("%s %s: headers %v body %s: want code draining, Retry-After 5 and CORS headers", tt.method, tt.path, rec.Header(), rec.Body)
		}
	}
}
