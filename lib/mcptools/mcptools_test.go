package mcptools_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/mcptools"
	"github.com/agentloop/agentloop/lib/mcptools/mcptest"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/toolsfile"
)

// server is the Go SDK's own MCP server, in-process over Streamable HTTP, with tools that cover every mapping;
// it records what each call carried (headers, _meta, arguments).
type server struct {
	mu    sync.Mutex
	calls []seenCall
	lists int
	// reported is closed by the test once the client reported the work tool's progress: the tool answers only
	// then (the SDK hands notifications to the client asynchronously, so one racing the result may come late).
	reported chan struct{}
}

type seenCall struct {
	tool, auth, apiKey, key, args string
}

func (s *server) record(req *mcp.CallToolRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key, _ := req.Params.Meta[mcptools.MetaIdempotencyKey].(string)
	c := seenCall{tool: req.Params.Name, key: key, args: string(req.Params.Arguments)}
	if req.Extra != nil && req.Extra.Header != nil {
		c.auth, c.apiKey = req.Extra.Header.Get("Authorization"), req.Extra.Header.Get("X-Api-Key")
	}
	s.calls = append(s.calls, c)
}

func (s *server) seen() []seenCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seenCall(nil), s.calls...)
}

func yes() *bool { b := true; return &b }

var object = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)

func (s *server) mcpServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	text := func(parts ...mcp.Content) *mcp.CallToolResult { return &mcp.CallToolResult{Content: parts} }
	add := func(t *mcp.Tool, h func(req *mcp.CallToolRequest) *mcp.CallToolResult) {
		t.InputSchema = object
		srv.AddTool(t, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			s.record(req)
			return h(req), nil
		})
	}
	add(&mcp.Tool{Name: "echo", Description: "Echo the text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(req *mcp.CallToolRequest) *mcp.CallToolResult {
			var in struct{ Text string }
			_ = json.Unmarshal(req.Params.Arguments, &in)
			return text(&mcp.TextContent{Text: "echo:"}, &mcp.TextContent{Text: in.Text})
		})
	add(&mcp.Tool{Name: "wipe", Description: "Delete everything.", Annotations: &mcp.ToolAnnotations{DestructiveHint: yes()}},
		func(*mcp.CallToolRequest) *mcp.CallToolResult { return text(&mcp.TextContent{Text: "wiped"}) })
	add(&mcp.Tool{Name: "touch", Description: "Change something."},
		func(*mcp.CallToolRequest) *mcp.CallToolResult { return text(&mcp.TextContent{Text: "touched"}) })
	add(&mcp.Tool{Name: "fail", Description: "Always fails."}, func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no such ticket"}}}
	})
	add(&mcp.Tool{Name: "picture", Description: "A picture, a sound and resources."}, func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return text(&mcp.TextContent{Text: "a dot"}, &mcp.ImageContent{MIMEType: "image/png", Data: []byte{1, 2, 3}},
			&mcp.AudioContent{MIMEType: "audio/wav", Data: []byte{4, 5}},
			&mcp.EmbeddedResource{Resource: &mcp.ResourceContents{URI: "file:///notes/a.txt", MIMEType: "text/plain", Text: "note a"}},
			&mcp.ResourceLink{URI: "file:///notes/b.txt", Name: "b.txt"}, &mcp.TextContent{Text: "and more"})
	})
	add(&mcp.Tool{Name: "big", Description: "A long answer."}, func(*mcp.CallToolRequest) *mcp.CallToolResult {
		return text(&mcp.TextContent{Text: strings.Repeat("word ", 300)})
	})
	srv.AddTool(&mcp.Tool{Name: "work", Description: "Works in stages.", InputSchema: object},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 1, Total: 2, Message: "reading"})
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: 2, Message: "writing"})
				if s.reported != nil {
					select {
					case <-s.reported:
					case <-ctx.Done():
					}
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "worked"}}}, nil
		})
	add(&mcp.Tool{Name: "odd.name", Description: "A name providers refuse."},
		func(*mcp.CallToolRequest) *mcp.CallToolResult { return text(&mcp.TextContent{Text: "ok"}) })
	return srv
}

// start serves the server over Streamable HTTP: stateless (the 2026-07-28 revision's way, a request at a time)
// or session-based.
func (s *server) start(t testing.TB, stateless bool) *httptest.Server {
	t.Helper()
	m := s.mcpServer()
	h := mcptest.Handler(m, stateless)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			s.mu.Lock()
			s.lists++
			s.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs
}

// sources builds the sources of a tools file whose URLs (MCP) point at url.
func sources(t testing.TB, url, file string, o mcptools.Options) []*mcptools.Source {
	t.Helper()
	f, err := toolsfile.Parse("tools.yaml", []byte(strings.ReplaceAll(file, "MCP", url)), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := f.Resolve(context.Background(), toolsfile.Resolvers{
		toolsfile.RefEnv: toolsfile.EnvResolver(func(n string) string { return map[string]string{"DOCS_KEY": "k-123"}[n] })})
	if err != nil {
		t.Fatal(err)
	}
	srcs := mcptools.New(f, secrets, o)
	for _, s := range srcs {
		t.Cleanup(s.Close)
	}
	return srcs
}

func byName(t testing.TB, src *mcptools.Source) map[string]agent.Tool {
	t.Helper()
	tools, err := src.Tools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]agent.Tool{}
	for _, tl := range tools {
		m[tl.Name] = tl
	}
	return m
}

func invoke(tool agent.Tool, input, userToken string) (json.RawMessage, error) {
	return tool.Execute(context.Background(), agent.ToolInvocation{ThreadID: "th", MessageID: "m1", ToolCallID: "c1",
		Input: json.RawMessage(input), IdempotencyKey: "th/m1/c1", UserToken: userToken})
}

const docsFile = `mcpServers:
  - name: docs
    url: MCP
    headers: {X-Api-Key: "${env:DOCS_KEY}"}
    maxOutputBytes: 1000
`

// Listing, names, approvals from annotations, calling (headers, _meta, text joined; images, audio and resources
// kept as parts), progress, isError, and the output cap: against a stateless and a session-based server alike.
func TestServer(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{reported: make(chan struct{})}
		hs := srv.start(t, stateless)
		tools := byName(t, sources(t, hs.URL, docsFile, mcptools.Options{})[0])
		want := map[string]agent.ApprovalPolicy{"docs__echo": agent.ApprovalNever, "docs__wipe": agent.ApprovalAlways,
			"docs__touch": agent.ApprovalMutating, "docs__fail": agent.ApprovalMutating, "docs__picture": agent.ApprovalMutating,
			"docs__big": agent.ApprovalMutating, "docs__odd_name": agent.ApprovalMutating, "docs__work": agent.ApprovalMutating}
		for n, a := range want {
			tl, ok := tools[n]
			if !ok {
				t.Fatalf("no %s among %v", n, tools)
			}
			if tl.Approval != a || tl.Kind != agent.ToolServer || len(tl.InputSchema) == 0 || tl.Description == "" {
				t.Errorf("%s: approval %q kind %q schema %s, want approval %q", n, tl.Approval, tl.Kind, tl.InputSchema, a)
			}
		}
		if len(tools) != len(want) {
			t.Errorf("%d tools, want %d", len(tools), len(want))
		}

		out, err := invoke(tools["docs__echo"], `{"text":"hi"}`, "")
		if err != nil || string(out) != `"echo:\nhi"` {
			t.Fatalf("echo: %s %v", out, err)
		}
		calls := srv.seen()
		if got := calls[len(calls)-1]; got.key != "th/m1/c1" || got.apiKey != "k-123" || got.tool != "echo" || got.auth != "" {
			t.Errorf("the server saw %+v, want the idempotency key in _meta and X-Api-Key", got)
		}
		if out, err := invoke(tools["docs__odd_name"], `{}`, ""); err != nil || string(out) != `"ok"` {
			t.Errorf("odd.name: %s %v", out, err)
		}

		// The server's progress notifications become the call's progress reports.
		var mu sync.Mutex
		var reports []string
		out, err = tools["docs__work"].Execute(context.Background(), agent.ToolInvocation{ThreadID: "th", ToolCallID: "c2",
			Input: json.RawMessage(`{}`), IdempotencyKey: "th/m1/c2", Progress: func(stage, message string) {
				mu.Lock()
				defer mu.Unlock()
				reports = append(reports, stage+" "+message)
				if len(reports) == 2 {
					close(srv.reported)
				}
			}})
		mu.Lock()
		if err != nil || string(out) != `"worked"` || strings.Join(reports, "|") != "1/2 reading|2 writing" {
			t.Errorf("work: %s %v, progress %q", out, err, reports)
		}
		mu.Unlock()

		_, err = invoke(tools["docs__fail"], `{}`, "")
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Code != agent.CodeToolFailed || !strings.Contains(ae.Message, "no such ticket") {
			t.Errorf("fail: %v, want a tool error with the server's text", err)
		}

		// Images, audio and resources are kept as parts, as the server sent them, in order; the texts are joined.
		out, err = invoke(tools["docs__picture"], `{}`, "")
		var pic struct {
			Text  string
			Parts []map[string]any
		}
		if err != nil || json.Unmarshal(out, &pic) != nil || pic.Text != "a dot\nand more" {
			t.Fatalf("picture: %s %v, want the texts joined and the other contents as parts", out, err)
		}
		var kept []string
		for _, p := range pic.Parts {
			r, _ := p["resource"].(map[string]any)
			kept = append(kept, fmt.Sprintf("%v|%v|%v|%v|%v|%v|%v", p["type"], p["mimeType"], p["data"], p["uri"], p["name"], r["uri"], r["text"]))
		}
		if want := []string{"image|image/png|AQID|<nil>|<nil>|<nil>|<nil>", "audio|audio/wav|BAU=|<nil>|<nil>|<nil>|<nil>",
			"resource|<nil>|<nil>|<nil>|<nil>|file:///notes/a.txt|note a", "resource_link|<nil>|<nil>|file:///notes/b.txt|b.txt|<nil>|<nil>"}; !slices.Equal(kept, want) {
			t.Errorf("picture: parts\n%q\nwant\n%q", kept, want)
		}

		out, err = invoke(tools["docs__big"], `{}`, "")
		var cut struct {
			Truncated bool
			Note      string
			Text      string
		}
		if err != nil || json.Unmarshal(out, &cut) != nil || !cut.Truncated || len(cut.Text) != 1000 || !strings.Contains(cut.Note, "1000 bytes") {
			t.Errorf("big: %s %v, want the text cut at 1000 bytes with a note", out, err)
		}
	})
}

// Definitions are listed once and cached: a second turn's listing asks the server nothing (stateless and
// session-based alike).
func TestListedOnce(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{}
		hs := srv.start(t, stateless)
		src := sources(t, hs.URL, docsFile, mcptools.Options{})[0]
		byName(t, src)
		srv.mu.Lock()
		first := srv.lists
		srv.mu.Unlock()
		byName(t, src)
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if srv.lists != first || first == 0 {
			t.Errorf("requests: %d after the first listing, %d after the second, want no more", first, srv.lists)
		}
	})
}

// include and exclude choose among the server's names; approval never/always override the annotations (stateless
// and session-based alike).
func TestIncludeExcludeApproval(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{}
		hs := srv.start(t, stateless)
		srcs := sources(t, hs.URL, `mcpServers:
  - name: a
    url: MCP
    include: [echo, wipe]
    approval: never
  - name: b
    url: MCP
    exclude: [echo, wipe, fail, picture, big, odd.name, work]
    approval: always
`, mcptools.Options{})
		a, b := byName(t, srcs[0]), byName(t, srcs[1])
		if len(a) != 2 || a["a__echo"].Approval != agent.ApprovalNever || a["a__wipe"].Approval != agent.ApprovalNever {
			t.Errorf("include [echo wipe], never: %v", a)
		}
		if len(b) != 1 || b["b__touch"].Approval != agent.ApprovalAlways {
			t.Errorf("exclude all but touch, always: %v", b)
		}
	})
}

// forwardUserToken: the user's JWT is the call's Authorization; a call without one is a tool error the model
// reads, and the server sees nothing.
func TestForwardUserToken(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{}
		hs := srv.start(t, stateless)
		tools := byName(t, sources(t, hs.URL, `mcpServers:
  - name: me
    url: MCP
    forwardUserToken: true
    include: [echo]
`, mcptools.Options{})[0])
		if out, err := invoke(tools["me__echo"], `{"text":"x"}`, "user.jwt"); err != nil || string(out) != `"echo:\nx"` {
			t.Fatalf("echo: %s %v", out, err)
		}
		calls := srv.seen()
		if len(calls) != 1 || calls[0].auth != "Bearer user.jwt" {
			t.Fatalf("the server saw %+v, want Authorization: Bearer user.jwt", calls)
		}
		_, err := invoke(tools["me__echo"], `{"text":"x"}`, "")
		if agent.CodeOf(err) != agent.CodeToolFailed || !strings.Contains(err.Error(), "acts as the user") {
			t.Errorf("without a user token: %v", err)
		}
		if n := len(srv.seen()); n != 1 {
			t.Errorf("the server saw %d calls, want 1", n)
		}
	})
}

// A server that is down: its listing fails (the engine leaves its tools out of the turn and logs it) and is not
// tried again until RelistAfter has passed; once the server is up (stateless or session-based), the next listing
// finds its tools.
func TestServerDown(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{}
		m := srv.mcpServer()
		var up sync.Mutex
		down := true
		h := mcptest.Handler(m, stateless)
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			up.Lock()
			d := down
			up.Unlock()
			if d {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		}))
		t.Cleanup(hs.Close)
		clock := &fakeClock{now: time.Unix(1_000_000, 0)}
		src := sources(t, hs.URL, docsFile, mcptools.Options{Clock: clock, RelistAfter: time.Minute})[0]
		if _, err := src.Tools(context.Background()); err == nil {
			t.Fatal("a server that is down listed its tools")
		}
		up.Lock()
		down = false
		up.Unlock()
		if _, err := src.Tools(context.Background()); err == nil {
			t.Fatal("listed again before RelistAfter")
		}
		clock.advance(time.Minute)
		if tools, err := src.Tools(context.Background()); err != nil || len(tools) == 0 {
			t.Fatalf("after RelistAfter: %v %v", tools, err)
		}
	})
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestToolName(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ server, tool, want string }{
		{"docs", "search", "docs__search"},
		{"docs", "a.b/c d", "docs__a_b_c_d"},
		{"docs", strings.Repeat("x", 80), "docs__" + strings.Repeat("x", 58)},
	} {
		if got := mcptools.ToolName(c.server, c.tool); got != c.want {
			t.Errorf("ToolName(%q, %q) = %q, want %q", c.server, c.tool, got, c.want)
		}
	}
}

// A session-based server that forgot the shared session (it answers 404 for it): the call opens a new session and
// goes once more (it never reached the server), and the server runs it once.
func TestSessionForgotten(t *testing.T) {
	t.Parallel()
	srv := &server{}
	m := srv.mcpServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m }, nil)
	var mu sync.Mutex
	var last, stale string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Mcp-Session-Id")
		mu.Lock()
		if id != "" {
			last = id
		}
		forgotten := id != "" && id == stale
		mu.Unlock()
		if forgotten {
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	tools := byName(t, sources(t, hs.URL, docsFile, mcptools.Options{})[0])
	mu.Lock()
	stale = last
	mu.Unlock()
	if stale == "" {
		t.Fatal("the server gave no session")
	}
	out, err := invoke(tools["docs__echo"], `{"text":"again"}`, "")
	if err != nil || string(out) != `"echo:\nagain"` {
		t.Fatalf("echo after the session was forgotten: %s %v", out, err)
	}
	if n := len(srv.seen()); n != 1 {
		t.Errorf("the server ran %d calls, want 1", n)
	}
}

// Pinning: the first definition seen is pinned in the store; after a cold start, a tool whose definition changed
// is held back (the others are offered) and the log says which, with the hash to accept; accepted in the tools
// file, it is offered and pinned again, so the next cold start offers it without the acceptance. Stateless and
// session-based servers alike.
func TestChangedDefinitionHeldBack(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		store, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "pins.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		var mu sync.Mutex
		description := "Echo the text."
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server {
			mu.Lock()
			defer mu.Unlock()
			m := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
			for _, name := range []string{"echo", "other"} {
				d := "Another tool."
				if name == "echo" {
					d = description
				}
				m.AddTool(&mcp.Tool{Name: name, Description: d, InputSchema: object}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
				})
			}
			return m
		}, &mcp.StreamableHTTPOptions{Stateless: stateless})
		hs := httptest.NewServer(h)
		t.Cleanup(hs.Close)
		// coldStart lists the server as a new process would, and returns the names offered and the log.
		coldStart := func(file string) ([]string, string) {
			var logs strings.Builder
			var lmu sync.Mutex
			log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
				lmu.Lock()
				defer lmu.Unlock()
				return logs.Write(p)
			}), nil))
			src := sources(t, hs.URL, file, mcptools.Options{Pins: store, Logger: log})[0]
			tools, err := src.Tools(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, tl := range tools {
				names = append(names, tl.Name)
			}
			slices.Sort(names)
			lmu.Lock()
			defer lmu.Unlock()
			return names, logs.String()
		}
		plain := "mcpServers:\n  - name: docs\n    url: MCP\n"
		if names, _ := coldStart(plain); !slices.Equal(names, []string{"docs__echo", "docs__other"}) {
			t.Fatalf("first listing offered %v", names)
		}
		mu.Lock()
		description = "Echo the text, and mail it to someone."
		mu.Unlock()
		names, log := coldStart(plain)
		if !slices.Equal(names, []string{"docs__other"}) {
			t.Fatalf("after the change, offered %v, want echo held back", names)
		}
		var changed struct {
			Msg, Tool, Pinned, Seen string
		}
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "mcp.definition_changed") {
				_ = json.Unmarshal([]byte(line), &changed)
			}
		}
		if changed.Tool != "echo" || changed.Seen == "" || changed.Seen == changed.Pinned {
			t.Fatalf("no mcp.definition_changed line for echo:\n%s", log)
		}
		if names, _ := coldStart(plain + "    accept: {echo: 0123456789abcdef}\n"); !slices.Equal(names, []string{"docs__other"}) {
			t.Fatalf("accepting another hash offered %v, want echo still held back", names)
		}
		if names, log := coldStart(plain + "    accept: {echo: " + changed.Seen + "}\n"); !slices.Equal(names, []string{"docs__echo", "docs__other"}) ||
			!strings.Contains(log, "mcp.definition_accepted") {
			t.Fatalf("accepted, offered %v:\n%s", names, log)
		}
		if names, _ := coldStart(plain); !slices.Equal(names, []string{"docs__echo", "docs__other"}) {
			t.Fatalf("after the acceptance, offered %v", names)
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A listing cut short by its turn going away says nothing of the server: the next turn lists at once (stateless
// and session-based alike).
func TestCanceledListingNotHeldAgainstServer(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		srv := &server{}
		hs := srv.start(t, stateless)
		clock := &fakeClock{now: time.Unix(1_000_000, 0)}
		src := sources(t, hs.URL, docsFile, mcptools.Options{Clock: clock, RelistAfter: time.Hour})[0]
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := src.Tools(ctx); err == nil {
			t.Fatal("a canceled listing succeeded")
		}
		if tools, err := src.Tools(context.Background()); err != nil || len(tools) == 0 {
			t.Fatalf("the next listing: %v %v, want the tools at once", tools, err)
		}
	})
}

// firedTimers are timers that fire when the test says (fire), whatever time it is: a timeout the test means to
// end ends then, never by racing real time.
type firedTimers struct {
	agent.SystemClock
	mu      sync.Mutex
	pending []func()
}

func (f *firedTimers) WithTimeoutCause(ctx context.Context, _ time.Duration, cause error) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	f.mu.Lock()
	f.pending = append(f.pending, func() { cancel(cause) })
	f.mu.Unlock()
	return ctx, func() { cancel(context.Canceled) }
}

// fire ends every timeout set so far (those already canceled stay as they were).
func (f *firedTimers) fire() {
	f.mu.Lock()
	pending := f.pending
	f.pending = nil
	f.mu.Unlock()
	for _, c := range pending {
		c()
	}
}

// The server's timeout (the file's timeout) ends a call the server does not answer: tool_timeout, the model reads
// it, and the source keeps working (stateless and session-based alike).
func TestCallTimeout(t *testing.T) {
	t.Parallel()
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		started, release := make(chan struct{}, 1), make(chan struct{})
		m := mcp.NewServer(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		for _, name := range []string{"stall", "quick"} {
			m.AddTool(&mcp.Tool{Name: name, InputSchema: object}, func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if name == "stall" {
					started <- struct{}{}
					select {
					case <-ctx.Done():
					case <-release:
					}
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name}}}, nil
			})
		}
		hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m },
			&mcp.StreamableHTTPOptions{Stateless: stateless}))
		t.Cleanup(hs.Close)
		t.Cleanup(func() { close(release) }) // before hs.Close, which waits for the handler
		timers := &firedTimers{}
		tools := byName(t, sources(t, hs.URL, "mcpServers:\n  - name: docs\n    url: MCP\n    timeout: 5s\n", mcptools.Options{Timers: timers})[0])
		done := make(chan error, 1)
		go func() {
			_, err := invoke(tools["docs__stall"], `{}`, "")
			done <- err
		}()
		<-started
		timers.fire()
		if err := <-done; agent.CodeOf(err) != agent.CodeToolTimeout || !strings.Contains(err.Error(), "timed out after 5s") {
			t.Fatalf("stall: %v, want tool_timeout", err)
		}
		if out, err := invoke(tools["docs__quick"], `{}`, ""); err != nil || string(out) != `"quick"` {
			t.Errorf("the next call: %s %v", out, err)
		}
	})
}

// DefinitionHash changes with whatever the model is told of a tool (its description, input schema, annotations:
// a tool that turns destructive is held back like one whose text changed), and not with how the server spelled
// the same schema (key order, spacing).
func TestDefinitionHash(t *testing.T) {
	t.Parallel()
	base := func() *mcp.Tool {
		return &mcp.Tool{Name: "echo", Description: "Echo the text.", InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}
	}
	want := mcptools.DefinitionHash(base())
	for _, tc := range []struct {
		name string
		edit func(*mcp.Tool)
		same bool
	}{
		{"unchanged", func(*mcp.Tool) {}, true},
		{"schema keys in another order, spaced", func(tl *mcp.Tool) {
			tl.InputSchema = json.RawMessage(`{ "properties": {"text": {"type": "string"}}, "type": "object" }`)
		}, true},
		{"description", func(tl *mcp.Tool) { tl.Description = "Echo the text, and mail it." }, false},
		{"a property added", func(tl *mcp.Tool) {
			tl.InputSchema = json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"},"to":{"type":"string"}}}`)
		}, false},
		{"no longer read-only", func(tl *mcp.Tool) { tl.Annotations = &mcp.ToolAnnotations{DestructiveHint: yes()} }, false},
		{"annotations dropped", func(tl *mcp.Tool) { tl.Annotations = nil }, false},
	} {
		tl := base()
		tc.edit(tl)
		got := mcptools.DefinitionHash(tl)
		if len(got) != 16 || (got == want) != tc.same {
			t.Errorf("%s: hash %s, base %s, want the same: %v", tc.name, got, want, tc.same)
		}
	}
}

// A call that fails: a transport failure (the server answers 503, or drops the connection) says only that the
// server could not be reached (unavailable; the SDK's "rejected by transport" is no refusal of the server's);
// a JSON-RPC error of the server (a tool it no longer has) is a refusal the model reads, with the server's message.
// Either way the next call, the server well again, runs. Stateless and session-based alike.
func TestCallFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		fail func(w http.ResponseWriter) // answers the call's request instead of the server (nil: the server answers)
		kind agent.Kind
		text string // in the message the model reads
	}{
		{"503", func(w http.ResponseWriter) { http.Error(w, "down", http.StatusServiceUnavailable) }, agent.KindUnavailable,
			`tool "docs__echo": the MCP server could not be reached`},
		{"connection dropped", func(http.ResponseWriter) { panic(http.ErrAbortHandler) }, agent.KindUnavailable,
			`tool "docs__echo": the MCP server could not be reached`},
		{"unknown tool", nil, agent.KindInvalid, `the MCP server refused the call: unknown tool "echo"`},
	}
	mcptest.EachTransport(t, func(t *testing.T, stateless bool) {
		for _, tc := range cases {
			srv := &server{}
			m := srv.mcpServer()
			h := mcptest.Handler(m, stateless)
			var mu sync.Mutex
			failing := false
			hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				f := failing
				mu.Unlock()
				if f && tc.fail != nil {
					tc.fail(w)
					return
				}
				h.ServeHTTP(w, r)
			}))
			t.Cleanup(hs.Close)
			tools := byName(t, sources(t, hs.URL, docsFile, mcptools.Options{})[0])
			mu.Lock()
			failing = true
			mu.Unlock()
			if tc.fail == nil {
				m.RemoveTools("echo")
			}
			_, err := invoke(tools["docs__echo"], `{"text":"x"}`, "")
			code, msg := agent.Public(err)
			if agent.KindOf(err) != tc.kind || code != agent.CodeToolFailed || !strings.Contains(msg, tc.text) {
				t.Errorf("%s: %v (kind %s, public %s: %s), want %s with %q", tc.name, err, agent.KindOf(err), code, msg, tc.kind, tc.text)
			}
			mu.Lock()
			failing = false
			mu.Unlock()
			if out, err := invoke(tools["docs__touch"], `{}`, ""); err != nil || string(out) != `"touched"` {
				t.Errorf("%s: the next call: %s %v", tc.name, out, err)
			}
		}
	})
}
