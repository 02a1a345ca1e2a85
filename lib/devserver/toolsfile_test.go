package devserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/mcptools"
)

// ticketBackend is the deployer's service behind an HTTP tool: it refuses a request without the service's token
// or an idempotency key, and records what it received.
type ticketBackend struct {
	mu   sync.Mutex
	reqs []http.Header
	uris []string
}

func (b *ticketBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.reqs, b.uris = append(b.reqs, r.Header.Clone()), append(b.uris, r.Method+" "+r.URL.RequestURI()+" "+string(body))
	b.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer svc-secret" || r.Header.Get("Idempotency-Key") == "" {
		http.Error(w, "who are you?", http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ticket":"T-42"}`)
}

func (b *ticketBackend) seen() ([]http.Header, []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]http.Header(nil), b.reqs...), append([]string(nil), b.uris...)
}

// toolsStack is agentloop dev on the data directory data, logging to log, with a tools file whose HTTP tool calls
// backend.
func toolsStack(t *testing.T, backend *httptest.Server, data string, log *slog.Logger) *devserver.Stack {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tools.yaml")
	body := `httpTools:
  - name: create_ticket
    description: Open a ticket.
    inputSchema: {type: object, properties: {team: {type: string}, title: {type: string}}, required: [team, title]}
    method: POST
    url: ` + backend.URL + `/teams/{team}/tickets
    headers: {Authorization: "Bearer ${env:AGENTLOOP_TEST_BACKEND_TOKEN}"}
`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := devserver.New(context.Background(), devserver.Options{Data: data, Config: config.Config{ToolsFile: file}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// postChat posts one user message as tok and returns the whole stream.
func postChat(t *testing.T, s *devserver.Stack, tok, thread, text string) string {
	t.Helper()
	body := fmt.Sprintf(`{"id":%q,"trigger":"submit-message","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":%q}]}]}`, thread, text)
	req := httptest.NewRequest("POST", "/chat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	s.Handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
		t.Fatalf("POST /chat: %d\n%s", rec.Code, rec.Body)
	}
	return rec.Body.String()
}

// Issue 19: the tools file's HTTP tools are offered to the model and executed. The offline model calls
// create_ticket; the backend receives the service's token (from an ${env:…} reference), the call's idempotency key
// (thread/message/call), the URL filled from the input and the rest as the body; the model reads its answer.
func TestToolsFileHTTPToolRuns(t *testing.T) {
	t.Setenv("AGENTLOOP_TEST_BACKEND_TOKEN", "svc-secret")
	b := &ticketBackend{}
	backend := httptest.NewServer(b)
	t.Cleanup(backend.Close)
	var logs syncBuffer
	s := toolsStack(t, backend, t.TempDir(), slog.New(slog.NewJSONHandler(&logs, nil)))
	tok, _ := s.Token("alice", time.Hour)
	stream := postChat(t, s, tok, "th-tools", `/tool create_ticket {"team":"ops","title":"Printer on fire"}`)
	if !strings.Contains(stream, `"type":"tool-output-available"`) || !strings.Contains(stream, `T-42`) {
		t.Fatalf("no output of create_ticket in the stream:\n%s", stream)
	}
	headers, uris := b.seen()
	if len(headers) != 1 {
		t.Fatalf("backend saw %d requests, want 1: %v", len(headers), uris)
	}
	if want := `POST /teams/ops/tickets {"title":"Printer on fire"}`; uris[0] != want {
		t.Errorf("backend saw %q, want %q", uris[0], want)
	}
	if key := headers[0].Get("Idempotency-Key"); !strings.HasPrefix(key, "th-tools/") || strings.Count(key, "/") != 2 {
		t.Errorf("Idempotency-Key %q, want th-tools/<message>/<call>", key)
	}
	// An input the tool's schema refuses never reaches the backend: the model reads the violation.
	stream = postChat(t, s, tok, "th-tools-bad", `/tool create_ticket {"team":"ops"}`)
	if !strings.Contains(stream, `"type":"tool-output-error"`) || !strings.Contains(stream, "invalid_tool_input") {
		t.Errorf("an invalid input was not refused:\n%s", stream)
	}
	if headers, _ := b.seen(); len(headers) != 1 {
		t.Errorf("backend saw %d requests, want 1 (the invalid input never executes)", len(headers))
	}
	if !strings.Contains(logs.String(), `"http_tools":["create_ticket"]`) {
		t.Errorf("no tools.file line naming create_ticket:\n%s", logs.String())
	}
}

// Issue 19: the caller's bearer JWT reaches the HTTP tool's backend as X-User-JWT (the service's token stays in
// Authorization), and nothing the stack keeps holds it: not the SQLite file (transcript, run record, segments,
// tool state) nor the logs.
func TestUserTokenReachesHTTPToolOnly(t *testing.T) {
	t.Setenv("AGENTLOOP_TEST_BACKEND_TOKEN", "svc-secret")
	b := &ticketBackend{}
	backend := httptest.NewServer(b)
	t.Cleanup(backend.Close)
	var logs bytes.Buffer
	data := t.TempDir()
	s := toolsStack(t, backend, data, slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	tok, _ := s.Token("alice", time.Hour)
	stream := postChat(t, s, tok, "th-user", `/tool create_ticket {"team":"ops","title":"Printer on fire"}`)
	if !strings.Contains(stream, `T-42`) {
		t.Fatalf("no output of create_ticket in the stream:\n%s", stream)
	}
	headers, _ := b.seen()
	if len(headers) != 1 || headers[0].Get("X-User-JWT") != tok || headers[0].Get("Authorization") != "Bearer svc-secret" {
		t.Fatalf("backend saw %v, want X-User-JWT the caller's token and Authorization the service's", headers)
	}
	s.Close()
	signature := tok[strings.LastIndex(tok, ".")+1:]
	if strings.Contains(stream, signature) {
		t.Errorf("the stream holds the user's token")
	}
	if bytes.Contains(logs.Bytes(), []byte(signature)) {
		t.Errorf("the logs hold the user's token:\n%s", logs.Bytes())
	}
	entries, _ := os.ReadDir(data)
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(data, e.Name()))
		if err != nil || e.IsDir() {
			continue
		}
		if bytes.Contains(raw, []byte(signature)) {
			t.Errorf("%s holds the user's token", e.Name())
		}
	}
}

// Issue 19: the tools file's MCP servers are offered through agentloop dev. The offline model calls docs__lookup
// on the Go SDK's own server (Streamable HTTP, in-process): the server receives the caller's JWT (forwardUserToken)
// and the call's idempotency key in _meta, and the model reads the answer. A second server is down: the turn goes
// on without its tools and the log says so.
func TestToolsFileMCPServer(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var auths, keys []string
	m := mcp.NewServer(&mcp.Implementation{Name: "docs", Version: "1"}, nil)
	m.AddTool(&mcp.Tool{Name: "lookup", Description: "Look a thing up.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct{ Q string }
			_ = json.Unmarshal(req.Params.Arguments, &in)
			key, _ := req.Params.Meta[mcptools.MetaIdempotencyKey].(string)
			mu.Lock()
			auths, keys = append(auths, req.Extra.Header.Get("Authorization")), append(keys, key)
			mu.Unlock()
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "found " + in.Q}}}, nil
		})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(hs.Close)
	file := filepath.Join(t.TempDir(), "tools.yaml")
	body := "mcpServers:\n  - name: docs\n    url: " + hs.URL + "\n    forwardUserToken: true\n  - name: gone\n    url: http://127.0.0.1:1/mcp\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), Config: config.Config{ToolsFile: file},
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	tok, _ := s.Token("alice", time.Hour)
	stream := postChat(t, s, tok, "th-mcp", `/tool docs__lookup {"q":"printer"}`)
	if !strings.Contains(stream, `"type":"tool-output-available"`) || !strings.Contains(stream, "found printer") {
		t.Fatalf("no output of docs__lookup in the stream:\n%s", stream)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) != 1 || auths[0] != "Bearer "+tok || !strings.HasPrefix(keys[0], "th-mcp/") {
		t.Errorf("the MCP server saw Authorization %q and key %q, want the caller's JWT and th-mcp/<message>/<call>", auths, keys)
	}
	if l := logs.String(); !strings.Contains(l, `"source":"mcp:gone"`) || !strings.Contains(l, `"outcome":"unavailable"`) {
		t.Errorf("no log line for the server that is down:\n%s", l)
	}
	mu.Unlock()
	// What the model is offered (the offline model's /tools): the Go tools, then the file's; not the server
	// that is down.
	offered := postChat(t, s, tok, "th-mcp-tools", "/tools")
	if !strings.Contains(offered, `"delta":"add_note"`) || !strings.Contains(offered, "docs__lookup") || strings.Contains(offered, "gone__") {
		t.Errorf("/tools: want the Go tools and docs__lookup, nothing of gone:\n%s", offered)
	}
	// An input the tool's schema refuses never reaches the server: the model reads the violation.
	stream = postChat(t, s, tok, "th-mcp-bad", `/tool docs__lookup {"q":5}`)
	if !strings.Contains(stream, `"type":"tool-output-error"`) || !strings.Contains(stream, "invalid_tool_input") {
		t.Errorf("an invalid input was not refused:\n%s", stream)
	}
	mu.Lock()
	if len(auths) != 1 {
		t.Errorf("the MCP server ran %d calls, want 1 (the invalid input never executes)", len(auths))
	}
}

// syncBuffer is a bytes.Buffer the stack's goroutines may log into while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
