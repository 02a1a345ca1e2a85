package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/emf"
	"github.com/agentloop/agentloop/lib/offline"
)

// lockedBuffer is a log or metrics sink the server's goroutines write.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines parses the JSON lines whose key has the given value ("" key: every line).
func (b *lockedBuffer) lines(t *testing.T, key, value string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("line is not JSON: %v: %s", err, line)
		}
		if v, ok := rec[key]; key == "" || ok && v == value {
			out = append(out, rec)
		}
	}
	return out
}

// REVIEW S9: every refused request (4xx and 5xx) writes one log line with its route, status, code and owner,
// never its query string (a pre-signed URL's signature) or token, and counts in the Refusals metric by code.
// A request that succeeds writes no such line.
func TestRefusalsAreLoggedAndCounted(t *testing.T) {
	t.Parallel()
	var logs, metrics lockedBuffer
	model := httptest.NewServer(offline.New(offline.WithWordDelay(time.Millisecond)))
	t.Cleanup(model.Close)
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: model.URL + "/v1/",
		Config: config.Config{Secret: string(secret)}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		Metrics: emf.New(&metrics, "test", nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	srv := httptest.NewServer(stack.Handler)
	t.Cleanup(srv.Close)
	f := &fixture{url: srv.URL, store: stack.Store}
	alice := token(t, "alice")

	if resp := f.do(t, "GET", "/threads", alice, nil); readAll(t, resp) == nil || resp.StatusCode != 200 {
		t.Fatalf("GET /threads: %d", resp.StatusCode)
	}
	refused := []struct {
		method, path, tok string
		body              any
		status            int
		route, code       string
		owner             string
	}{
		{"POST", "/chat", "", chatBody("th", "u1", "hi"), 401, "POST /chat", "missing_token", ""},
		{"GET", "/threads/nope?X-Amz-Signature=SECRETSIG", alice, nil, 404, "GET /threads/{id}", "thread_not_found", "alice"},
		{"POST", "/chat", alice, "{not json", 400, "POST /chat", "invalid_json", "alice"},
	}
	for _, r := range refused {
		resp := f.do(t, r.method, r.path, r.tok, r.body)
		if readAll(t, resp); resp.StatusCode != r.status {
			t.Fatalf("%s %s: %d, want %d", r.method, r.path, resp.StatusCode, r.status)
		}
	}
	lines := logs.lines(t, "msg", "http.refused")
	if len(lines) != len(refused) {
		t.Fatalf("%d http.refused lines, want %d: %v", len(lines), len(refused), lines)
	}
	for i, r := range refused {
		l := lines[i]
		if l["route"] != r.route || l["status"] != float64(r.status) || l["code"] != r.code || l["owner"] != r.owner {
			t.Errorf("line %d = %v, want route %q, status %d, code %s, owner %q", i, l, r.route, r.status, r.code, r.owner)
		}
	}
	logs.mu.Lock()
	all := logs.buf.String()
	logs.mu.Unlock()
	if strings.Contains(all, "SECRETSIG") || strings.Contains(all, alice) {
		t.Errorf("the log carries a signature or a token: %s", all)
	}
	var codes []string
	for _, doc := range metrics.lines(t, "", "") {
		if doc["Refusals"] == 1.0 {
			codes = append(codes, doc["Code"].(string))
		}
	}
	if want := []string{"missing_token", "thread_not_found", "invalid_json"}; !slices.Equal(codes, want) {
		t.Fatalf("Refusals by code %v, want %v", codes, want)
	}
}
