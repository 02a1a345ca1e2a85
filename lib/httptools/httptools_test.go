package httptools_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/httptools"
	"github.com/agentloop/agentloop/lib/toolsfile"
)

// backend is a local service that checks both identities and the idempotency key, and records every request.
type backend struct {
	mu   sync.Mutex
	reqs []seen
	// answer scripts the reply to the n-th request (from 1).
	answer func(n int, w http.ResponseWriter, r *http.Request)
}

type seen struct {
	method, uri, body, auth, user, key, apiKey string
}

func (b *backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.reqs = append(b.reqs, seen{method: r.Method, uri: r.URL.RequestURI(), body: string(body), auth: r.Header.Get("Authorization"),
		user: r.Header.Get("X-User-JWT"), key: r.Header.Get("Idempotency-Key"), apiKey: r.Header.Get("X-Api-Key")})
	n := len(b.reqs)
	b.mu.Unlock()
	if b.answer != nil {
		b.answer(n, w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"ok":true}`)
}

func (b *backend) requests() []seen {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]seen(nil), b.reqs...)
}

// source builds the tools of a file whose URLs point at srv.
func source(t *testing.T, srv *httptest.Server, file string) map[string]agent.Tool {
	t.Helper()
	f, err := toolsfile.Parse("tools.yaml", []byte(strings.ReplaceAll(file, "BACKEND", srv.URL)), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := f.Resolve(context.Background(), toolsfile.Resolvers{
		toolsfile.RefEnv: toolsfile.EnvResolver(func(n string) string { return map[string]string{"API_KEY": "k-123"}[n] }),
		toolsfile.RefSSM: resolver(func(refs []toolsfile.Ref) map[toolsfile.Ref]string {
			out := map[toolsfile.Ref]string{}
			for _, r := range refs {
				out[r] = "service-token"
			}
			return out
		})})
	if err != nil {
		t.Fatal(err)
	}
	tools, _ := httptools.New(f, secrets, httptools.Options{Client: srv.Client(), Backoff: 1}).Tools(context.Background())
	byName := map[string]agent.Tool{}
	for _, tl := range tools {
		byName[tl.Name] = tl
	}
	return byName
}

type resolver func([]toolsfile.Ref) map[toolsfile.Ref]string

func (r resolver) Resolve(_ context.Context, refs []toolsfile.Ref) (map[toolsfile.Ref]string, error) {
	return r(refs), nil
}

const file = `httpTools:
  - name: create_ticket
    description: Open a ticket.
    inputSchema: {type: object, properties: {team: {type: string}, title: {type: string}, n: {type: integer}}}
    method: POST
    url: BACKEND/teams/{team}/tickets?notify={team}
    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}", X-Api-Key: "${env:API_KEY}"}
  - name: get_ticket
    description: Read a ticket.
    inputSchema: {type: object, properties: {id: {type: string}, fields: {type: array}}}
    url: BACKEND/tickets/{id}
    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}"}
  - name: put_ticket
    description: Replace a ticket.
    inputSchema: {type: object, properties: {id: {type: string}}}
    method: PUT
    url: BACKEND/tickets/{id}
    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}"}
  - name: delete_ticket
    description: Delete a ticket.
    inputSchema: {type: object, properties: {id: {type: string}}}
    method: DELETE
    url: BACKEND/tickets/{id}
    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}"}
  - name: patch_ticket
    description: Change a ticket.
    inputSchema: {type: object, properties: {id: {type: string}}}
    method: PATCH
    url: BACKEND/tickets/{id}
    headers: {Authorization: "Bearer ${ssm:/agentloop/backend-token}"}
  - name: small
    description: A small answer.
    url: BACKEND/big
    maxOutputBytes: 16
  - name: slow
    description: Too slow.
    url: BACKEND/slow
    timeout: 100ms
`

func call(t *testing.T, tool agent.Tool, input string) (json.RawMessage, error) {
	t.Helper()
	return tool.Execute(context.Background(), agent.ToolInvocation{ThreadID: "th", ToolCallID: "c1", Input: json.RawMessage(input),
		IdempotencyKey: "th/m1/c1", UserToken: "user.jwt.value"})
}

// Dual identity, the idempotency key, the URL template (escaped) and the body for the rest of the input.
func TestRequestShape(t *testing.T) {
	t.Parallel()
	b := &backend{}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	tools := source(t, srv, file)
	out, err := call(t, tools["create_ticket"], `{"team":"ops/east","title":"Printer on fire","n":2}`)
	if err != nil || string(out) != `{"ok":true}` {
		t.Fatalf("out %s err %v", out, err)
	}
	if _, err := call(t, tools["get_ticket"], `{"id":"T 1","fields":["a","b"]}`); err != nil {
		t.Fatal(err)
	}
	reqs := b.requests()
	want := []seen{
		{method: "POST", uri: "/teams/ops%2Feast/tickets?notify=ops%2Feast", body: `{"n":2,"title":"Printer on fire"}`,
			auth: "Bearer service-token", user: "user.jwt.value", key: "th/m1/c1", apiKey: "k-123"},
		{method: "GET", uri: "/tickets/T%201?fields=%5B%22a%22%2C%22b%22%5D", auth: "Bearer service-token", user: "user.jwt.value", key: "th/m1/c1"},
	}
	for i, w := range want {
		if reqs[i] != w {
			t.Errorf("request %d:\n%+v\nwant\n%+v", i, reqs[i], w)
		}
	}
	if tools["create_ticket"].Approval != agent.ApprovalMutating || tools["get_ticket"].Approval != agent.ApprovalNever {
		t.Errorf("approvals %q %q", tools["create_ticket"].Approval, tools["get_ticket"].Approval)
	}
}

// Retries: an idempotent method (GET, PUT, DELETE) is tried again after a 502, 503, 504 or a dropped connection,
// every attempt with the same idempotency key and both identities; a non-idempotent one (POST, PATCH) never is; a
// 500 or a 4xx is the model's to read at once.
func TestRetriesAndErrors(t *testing.T) {
	t.Parallel()
	const drop = -1 // the backend drops the connection without an answer
	cases := []struct {
		name, tool, input string
		status            []int // the backend's answers, in order (200 after the list)
		calls             int
		errText           string // in the error ("" : no error)
		body              string // of the failed answers ("": {"error":"no ticket"})
	}{
		{"GET retried after 503", "get_ticket", `{"id":"1"}`, []int{503, 503}, 3, "", ""},
		{"GET retried after 502 and 504", "get_ticket", `{"id":"1"}`, []int{502, 504}, 3, "", ""},
		{"GET retried after a dropped connection", "get_ticket", `{"id":"1"}`, []int{drop}, 2, "", ""},
		{"GET gives up", "get_ticket", `{"id":"1"}`, []int{503, 503, 503, 503}, 3, "503", ""},
		{"GET not retried after 500", "get_ticket", `{"id":"1"}`, []int{500}, 1, "500 Internal Server Error", ""},
		{"PUT retried", "put_ticket", `{"id":"1"}`, []int{503}, 2, "", ""},
		{"DELETE retried", "delete_ticket", `{"id":"1"}`, []int{504}, 2, "", ""},
		{"POST never retried", "create_ticket", `{"team":"a"}`, []int{503}, 1, "503", ""},
		{"POST never retried after a dropped connection", "create_ticket", `{"team":"a"}`, []int{drop}, 1, "could not be reached", ""},
		{"PATCH never retried", "patch_ticket", `{"id":"1"}`, []int{503}, 1, "503", ""},
		{"PATCH never retried after a dropped connection", "patch_ticket", `{"id":"1"}`, []int{drop}, 1, "could not be reached", ""},
		{"4xx read by the model", "get_ticket", `{"id":"1"}`, []int{404}, 1, `404 Not Found: {"error":"no ticket"}`, ""},
		{"4xx body not UTF-8", "get_ticket", `{"id":"1"}`, []int{400}, 1, "400 Bad Request: caf\uFFFD is closed", "caf\xe9 is closed"},
		{"4xx body cut at 512 bytes", "get_ticket", `{"id":"1"}`, []int{400}, 1, "400 Bad Request: " + strings.Repeat("y", 512), strings.Repeat("y", 600)},
		{"redirect not followed", "get_ticket", `{"id":"1"}`, []int{302}, 1, "302", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &backend{answer: func(n int, w http.ResponseWriter, r *http.Request) {
				if n <= len(tc.status) {
					switch tc.status[n-1] {
					case drop:
						panic(http.ErrAbortHandler)
					case 302:
						w.Header().Set("Location", "https://elsewhere.example.com/")
					}
					w.WriteHeader(tc.status[n-1])
					_, _ = io.WriteString(w, cmp.Or(tc.body, `{"error":"no ticket"}`))
					return
				}
				_, _ = io.WriteString(w, `{"ok":true}`)
			}}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			_, err := call(t, source(t, srv, file)[tc.tool], tc.input)
			reqs := b.requests()
			if len(reqs) != tc.calls {
				t.Errorf("%d calls, want %d", len(reqs), tc.calls)
			}
			for i, r := range reqs {
				if r.key != "th/m1/c1" || r.auth != "Bearer service-token" || r.user != "user.jwt.value" {
					t.Errorf("attempt %d carried key %q, Authorization %q, X-User-JWT %q: want the call's key and both identities", i+1, r.key, r.auth, r.user)
				}
			}
			switch {
			case tc.errText == "" && err != nil:
				t.Errorf("err %v", err)
			case tc.errText != "" && (err == nil || !strings.Contains(err.Error(), tc.errText) || agent.CodeOf(err) != agent.CodeToolFailed):
				t.Errorf("err %v, want tool_failed with %q", err, tc.errText)
			}
		})
	}
}

// An oversized answer is cut (small: 16 bytes), and the output says so; a rune the cut splits is left out, and
// bytes that are not UTF-8 become U+FFFD without losing the rest; a JSON answer is the output as it is, a text
// answer a JSON string.
func TestOutput(t *testing.T) {
	t.Parallel()
	x := strings.Repeat("x", 100)
	cases := []struct {
		name, tool, body string
		want             string // the output, or the body kept when cut
		cut              bool
	}{
		{"text cut", "small", x, strings.Repeat("x", 16), true},
		{"a split rune left out", "small", strings.Repeat("x", 15) + "é" + x, strings.Repeat("x", 15), true},
		{"not UTF-8, cut", "small", "caf\xe9 au lait, " + x, "caf\uFFFD au lait, xx", true},
		{"text", "get_ticket", x, `"` + x + `"`, false},
		{"not UTF-8", "get_ticket", "caf\xe9", "\"caf\uFFFD\"", false},
		{"JSON as it is", "get_ticket", `{"a": [1, 2]}`, `{"a": [1, 2]}`, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &backend{answer: func(n int, w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, tc.body) }}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			out, err := call(t, source(t, srv, file)[tc.tool], `{"id":"1"}`)
			if err != nil {
				t.Fatal(err)
			}
			if !tc.cut {
				if string(out) != tc.want {
					t.Errorf("out %s, want %s", out, tc.want)
				}
				return
			}
			var got struct {
				Truncated bool
				Note      string
				Body      string
			}
			if err := json.Unmarshal(out, &got); err != nil || !got.Truncated || got.Body != tc.want || !strings.Contains(got.Note, "16 bytes") {
				t.Errorf("out %s, want the body %q and a note", out, tc.want)
			}
		})
	}
}

// The tool's own timeout ends a call to a backend that does not answer: tool_timeout, whatever the backend does,
// and the call is not tried again.
func TestTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := &backend{answer: func(n int, w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}}
	srv := httptest.NewServer(b)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	_, err := call(t, source(t, srv, file)["slow"], `{}`)
	if agent.CodeOf(err) != agent.CodeToolTimeout {
		t.Fatalf("err %v, want tool_timeout", err)
	}
	if n := len(b.requests()); n != 1 {
		t.Errorf("%d requests, want 1 (a timed-out GET is not tried again)", n)
	}
}

// The file's alwaysOn reaches the tool (agent.Tool.AlwaysOn: a router offers it in every step).
func TestAlwaysOn(t *testing.T) {
	t.Parallel()
	f, err := toolsfile.Parse("t.yaml", []byte("httpTools:\n  - name: ping\n    description: Ping.\n    url: https://api.example.com/ping\n    alwaysOn: true\n"+
		"  - name: pong\n    description: Pong.\n    url: https://api.example.com/pong\n"), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tools, _ := httptools.New(f, toolsfile.Secrets{}, httptools.Options{}).Tools(context.Background())
	if len(tools) != 2 || !tools[0].AlwaysOn || tools[1].AlwaysOn {
		t.Errorf("tools %+v, want ping always-on and pong not", tools)
	}
}

// The file's approval: never and always whatever the method; by default GET never asks and the other methods ask
// when the thread's reviewTools is on (agent.ApprovalMutating).
func TestApproval(t *testing.T) {
	t.Parallel()
	cases := []struct {
		method, approval string
		want             agent.ApprovalPolicy
	}{
		{"GET", "", agent.ApprovalNever},
		{"POST", "", agent.ApprovalMutating},
		{"PUT", "", agent.ApprovalMutating},
		{"PATCH", "", agent.ApprovalMutating},
		{"DELETE", "", agent.ApprovalMutating},
		{"GET", "always", agent.ApprovalAlways},
		{"DELETE", "never", agent.ApprovalNever},
		{"POST", "always", agent.ApprovalAlways},
	}
	var file strings.Builder
	file.WriteString("httpTools:\n")
	for i, tc := range cases {
		fmt.Fprintf(&file, "  - name: t%d\n    description: A tool.\n    method: %s\n    url: https://api.example.com/x\n", i, tc.method)
		if tc.approval != "" {
			fmt.Fprintf(&file, "    approval: %s\n", tc.approval)
		}
	}
	f, err := toolsfile.Parse("t.yaml", []byte(file.String()), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tools, _ := httptools.New(f, toolsfile.Secrets{}, httptools.Options{}).Tools(context.Background())
	for i, tc := range cases {
		if got := tools[i].Approval; got != tc.want {
			t.Errorf("%s with approval %q: %q, want %q", tc.method, tc.approval, got, tc.want)
		}
	}
}

// A path placeholder picks which resource a call acts on, so the input must give it: a value that is absent, null
// or empty, or that is "." or ".." (a path that climbs out of the template), is refused before anything is sent
// (invalid_tool_input, which the model reads and may call again); a query placeholder may be empty.
func TestURLPlaceholders(t *testing.T) {
	t.Parallel()
	const tools = `httpTools:
  - name: delete_ticket
    description: Delete a ticket.
    inputSchema: {type: object, properties: {id: {type: string}, reason: {type: string}}}
    method: DELETE
    url: BACKEND/tickets/{id}?reason={reason}
`
	cases := []struct {
		name, input string
		uri         string // what the backend received ("": nothing sent)
	}{
		{"given", `{"id":"T 1","reason":"dup"}`, "/tickets/T%201?reason=dup"},
		{"a slash escaped", `{"id":"a/b"}`, "/tickets/a%2Fb?reason="},
		{"a number", `{"id":42}`, "/tickets/42?reason="},
		{"absent", `{"reason":"dup"}`, ""},
		{"null", `{"id":null}`, ""},
		{"empty", `{"id":""}`, ""},
		{"dot", `{"id":"."}`, ""},
		{"dot dot", `{"id":".."}`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := &backend{}
			srv := httptest.NewServer(b)
			t.Cleanup(srv.Close)
			_, err := call(t, source(t, srv, tools)["delete_ticket"], tc.input)
			reqs := b.requests()
			if tc.uri == "" {
				if len(reqs) != 0 || agent.CodeOf(err) != agent.CodeInvalidToolInput || !strings.Contains(err.Error(), `"id"`) {
					t.Errorf("sent %v, err %v: want nothing sent and invalid_tool_input naming id", reqs, err)
				}
				return
			}
			if err != nil || len(reqs) != 1 || reqs[0].uri != tc.uri {
				t.Errorf("sent %v, err %v: want %s", reqs, err, tc.uri)
			}
		})
	}
}
