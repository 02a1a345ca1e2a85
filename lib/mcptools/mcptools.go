// Package mcptools turns the MCP servers of the tools file (lib/toolsfile) into agent tools: one agent.ToolSource
// per server, over Streamable HTTP with the official Go SDK (github.com/modelcontextprotocol/go-sdk). Servers of
// the stateless 2026-07-28 revision (server/discover) and session-based earlier ones (initialize) are both
// spoken: the SDK's Connect tries the first and falls back to the second.
//
// Listing: a server's tools are listed the first time a turn asks (once per process: a cold start) and cached for
// the life of the process. A listing that fails (a server down, a timeout) is an error for that turn (the engine
// leaves the server's tools out and logs agent.tool_source unavailable; the turn goes on) and is tried again by
// the first turn RelistAfter later. The file's include/exclude choose among the server's names. Each tool is
// offered as <server>__<tool>, every character outside [a-zA-Z0-9_-] made '_' and the whole cut at 64 (two that
// end up the same: the first is kept, the log names the other).
//
// Pinning (Options.Pins set): the first definition seen of each tool (its name, description, input schema and
// annotations, hashed: 16 hex digits) is recorded in the store's value area (namespace "mcp-pins/<server>", one
// read of the namespace per listing). A tool whose definition differs from its pin is held back, not offered,
// and the log says which (mcp.definition_changed, with the pinned hash and the new one), until the deployer
// accepts it: accept: {<tool>: <new hash>} on the server in the tools file, after which the new definition is
// pinned (mcp.definition_accepted) and offered. A pin store that cannot be read fails the listing (nothing
// unchecked is offered). Two processes that first see different definitions at once: the later write wins.
//
// Approval (the file's approval): never; always; annotations (the default): readOnlyHint never asks, else
// destructiveHint true always asks, else the thread's reviewTools setting decides (agent.ApprovalMutating).
//
// A call:
//
//   - Progress: the call carries a progress token when the engine takes progress reports (agent.ToolInvocation.
//     Progress); the server's notifications/progress for it become reports, stage "<progress>/<total>" (or
//     "<progress>") and the notification's message (the client sees transient data-tool-progress parts). The SDK
//     hands notifications over asynchronously: one sent just before the result may come after it, and is dropped.
//   - Headers: the file's, their references expanded (toolsfile.Secrets). forwardUserToken: the end user's JWT
//     (agent.ToolInvocation.UserToken) goes as Authorization: Bearer on the call's requests, and the call opens
//     a session of its own (a session is never shared between users); a call without one (a turn no request of
//     the user runs) fails as a tool error the model reads. Other servers share one session per process, opened
//     again once if the server forgot it (404: the call never reached it). Redirects are not followed.
//   - _meta: {"agentloop/idempotencyKey": <thread>/<message>/<tool call>} (MetaIdempotencyKey), the same for every
//     execution of one call (DESIGN principle 9).
//   - Timeout: the file's timeout (none: the engine's tool timeout alone), inside the engine's.
//   - Result: text contents joined with newlines are the output (a JSON string); when other contents come too
//     (images, audio, resources) the output is {"text": …, "parts": [<each as the server sent it>]}. An output
//     past maxOutputBytes (default DefaultMaxOutputBytes) is cut, with a note the model reads. isError: the text is
//     a tool error the model reads (tool_failed). A JSON-RPC error of the server (an unknown tool, bad params) is
//     a tool error with its message; a transport failure (an HTTP error status, a dropped connection: the SDK's
//     own "rejected by transport" included) is a tool error that says the server could not be reached
//     (unavailable; the details go to the log, never to the model).
package mcptools

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/toolsfile"
)

// Defaults.
const (
	// DefaultListTimeout bounds a listing (connect and list) when the file gives the server no timeout: it runs
	// before a turn's first model request.
	DefaultListTimeout = 10 * time.Second
	// DefaultRelistAfter is how long a failed listing is not tried again.
	DefaultRelistAfter = 30 * time.Second
	// DefaultMaxOutputBytes caps a call's output when the file gives none.
	DefaultMaxOutputBytes = 32 << 10
	// MetaIdempotencyKey is the call's _meta key that carries its idempotency key.
	MetaIdempotencyKey = "agentloop/idempotencyKey"
	// errorTextBytes is how much of an isError result's text the model reads.
	errorTextBytes = 2 << 10
)

// Options configure the sources.
type Options struct {
	// Client sends the requests (nil: a client of its own). Redirects are never followed, whatever it says.
	Client *http.Client
	// Clock dates failed listings; Timers enforces the servers' timeouts (nil: the system's).
	Clock  agent.Clock
	Timers agent.Timers
	// RelistAfter: a failed listing is tried again this long after (0: DefaultRelistAfter).
	RelistAfter time.Duration
	// Pins, when set, holds each tool's first definition seen (see Pinning).
	Pins   agent.ValueStore
	Logger *slog.Logger
}

// Source is the agent.ToolSource of one MCP server.
type Source struct {
	def     toolsfile.MCPServer
	secrets toolsfile.Secrets
	o       Options
	http    *http.Client
	client  *mcp.Client

	mu       sync.Mutex // guards the listing (held while listing: one listing at a time)
	listed   []agent.Tool
	ok       bool      // listed holds the listing
	failedAt time.Time // the newest failed listing
	failed   error

	sessMu  sync.Mutex         // guards session (never held while listing: a call's reconnect holds no turn up)
	session *mcp.ClientSession // shared by the calls of a server without forwardUserToken

	// progress maps the progress tokens of the calls in flight to their invocations' Progress.
	progress sync.Map
	calls    atomic.Int64 // numbers the progress tokens
}

// onProgress hands a server's progress notification to the call it is about: stage "<progress>/<total>" (or
// "<progress>" without a total) and the notification's message.
func (s *Source) onProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p := req.Params
	if p == nil {
		return
	}
	f, ok := s.progress.Load(p.ProgressToken)
	if !ok {
		return
	}
	stage := fmt.Sprintf("%g", p.Progress)
	if p.Total > 0 {
		stage = fmt.Sprintf("%g/%g", p.Progress, p.Total)
	}
	f.(func(stage, message string))(stage, p.Message)
}

// New builds one source per server of f; secrets holds the values of their headers' references.
func New(f *toolsfile.File, secrets toolsfile.Secrets, o Options) []*Source {
	o.RelistAfter = cmp.Or(o.RelistAfter, DefaultRelistAfter)
	if o.Clock == nil {
		o.Clock = agent.SystemClock{}
	}
	if o.Timers == nil {
		o.Timers = agent.TimersOf(o.Clock)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	base := *cmp.Or(o.Client, &http.Client{})
	base.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	var out []*Source
	for _, def := range f.MCPServers {
		s := &Source{def: def, secrets: secrets, o: o}
		s.client = mcp.NewClient(&mcp.Implementation{Name: "agentloop", Version: "1"},
			&mcp.ClientOptions{ProgressNotificationHandler: s.onProgress})
		hc := base
		hc.Transport = headers{s: s, next: cmp.Or[http.RoundTripper](base.Transport, http.DefaultTransport)}
		s.http = &hc
		out = append(out, s)
	}
	return out
}

// Name implements agent.ToolSource.
func (s *Source) Name() string { return "mcp:" + s.def.Name }

// Tools implements agent.ToolSource: the cached listing, listed now the first time (and after a failure, once
// RelistAfter has passed).
func (s *Source) Tools(ctx context.Context) ([]agent.Tool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ok {
		return s.listed, nil
	}
	if s.failed != nil && s.o.Clock.Now().Sub(s.failedAt) < s.o.RelistAfter {
		return nil, s.failed
	}
	tools, err := s.list(ctx)
	if err != nil {
		if ctx.Err() == nil { // a turn that went away says nothing of the server
			s.failed, s.failedAt = err, s.o.Clock.Now()
		}
		return nil, err
	}
	s.listed, s.ok, s.failed = tools, true, nil
	return tools, nil
}

// list connects, lists every page and maps the server's tools.
func (s *Source) list(ctx context.Context) ([]agent.Tool, error) {
	ctx, cancel := s.o.Timers.WithTimeoutCause(ctx, cmp.Or(s.def.Timeout, DefaultListTimeout),
		fmt.Errorf("mcp server %q: listing timed out", s.def.Name))
	defer cancel()
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	kept := false // the listing's session becomes the calls' shared one (a server without forwardUserToken)
	defer func() {
		if !kept {
			_ = sess.Close()
		}
	}()
	pins, err := s.pins(ctx)
	if err != nil {
		return nil, err
	}
	var tools []agent.Tool
	seen := map[string]string{}
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("mcp server %q: list tools: %w", s.def.Name, err)
		}
		if !s.wanted(t.Name) {
			continue
		}
		if ok, err := s.pinned(ctx, pins, t); err != nil {
			return nil, err
		} else if !ok {
			continue
		}
		name := ToolName(s.def.Name, t.Name)
		if other, taken := seen[name]; taken {
			s.o.Logger.Warn("mcp.tool_skipped", "server", s.def.Name, "tool", t.Name, "name", name, "same_as", other)
			continue
		}
		seen[name] = t.Name
		schema, err := json.Marshal(t.InputSchema)
		if err != nil || t.InputSchema == nil {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		c := &caller{s: s, tool: t.Name, name: name}
		tools = append(tools, agent.Tool{Name: name, Description: t.Description, InputSchema: schema, Kind: agent.ToolServer,
			Approval: Approval(s.def.Approval, t.Annotations), Execute: c.execute, AlwaysOn: s.def.AlwaysOn})
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Name
	}
	s.o.Logger.Info("mcp.listed", "server", s.def.Name, "tools", names)
	if !s.def.ForwardUserToken {
		kept = s.adopt(sess)
	}
	return tools, nil
}

// pinNamespace is where the server's pins are kept in the value area.
func (s *Source) pinNamespace() string { return "mcp-pins/" + s.def.Name }

// pins are the server's pinned definition hashes by tool (nil when pinning is off).
func (s *Source) pins(ctx context.Context) (map[string]string, error) {
	if s.o.Pins == nil {
		return nil, nil
	}
	kvs, err := s.o.Pins.ListValues(ctx, s.pinNamespace())
	if err != nil {
		return nil, fmt.Errorf("mcp server %q: read the pinned definitions: %w", s.def.Name, err)
	}
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[kv.Key] = string(kv.Value)
	}
	return out, nil
}

// pinned reports whether t may be offered: its definition is the pinned one (pinned now when it is new), or the
// file accepts the change (pinned again now); else it is held back and the log says so.
func (s *Source) pinned(ctx context.Context, pins map[string]string, t *mcp.Tool) (bool, error) {
	if s.o.Pins == nil {
		return true, nil
	}
	h := DefinitionHash(t)
	old, known := pins[t.Name]
	switch {
	case known && old == h:
		return true, nil
	case known && s.def.Accept[t.Name] != h:
		s.o.Logger.Warn("mcp.definition_changed", "server", s.def.Name, "tool", t.Name, "pinned", old, "seen", h,
			"note", fmt.Sprintf("not offered until accepted: add accept: {%s: %s} to server %s in the tools file", t.Name, h, s.def.Name))
		return false, nil
	}
	if err := s.o.Pins.PutValue(ctx, s.pinNamespace(), t.Name, []byte(h)); err != nil {
		return false, fmt.Errorf("mcp server %q: pin %s: %w", s.def.Name, t.Name, err)
	}
	if known {
		s.o.Logger.Info("mcp.definition_accepted", "server", s.def.Name, "tool", t.Name, "pinned", h, "was", old)
	}
	return true, nil
}

// DefinitionHash identifies what the model is told of a tool (name, description, input schema, annotations):
// 16 hex digits of a SHA-256 over their JSON (object keys sorted).
func DefinitionHash(t *mcp.Tool) string {
	var schema any
	if b, err := json.Marshal(t.InputSchema); err == nil {
		_ = json.Unmarshal(b, &schema) // through any: keys sorted whatever type the SDK gave
	}
	b, _ := json.Marshal(map[string]any{"name": t.Name, "description": t.Description, "inputSchema": schema, "annotations": t.Annotations})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func (s *Source) wanted(tool string) bool {
	if len(s.def.Include) > 0 && !slices.Contains(s.def.Include, tool) {
		return false
	}
	return !slices.Contains(s.def.Exclude, tool)
}

func (s *Source) connect(ctx context.Context) (*mcp.ClientSession, error) {
	t := &mcp.StreamableClientTransport{Endpoint: s.def.URL, HTTPClient: s.http, DisableStandaloneSSE: true, MaxRetries: -1}
	sess, err := s.client.Connect(ctx, t, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp server %q: connect: %w", s.def.Name, err)
	}
	return sess, nil
}

// shared is the session of the calls of a server without forwardUserToken, opened when there is none.
func (s *Source) shared(ctx context.Context) (*mcp.ClientSession, error) {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.session != nil {
		return s.session, nil
	}
	sess, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	s.session = sess
	return sess, nil
}

// adopt makes sess the shared session when there is none (false: sess is not kept).
func (s *Source) adopt(sess *mcp.ClientSession) bool {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.session != nil {
		return false
	}
	s.session = sess
	return true
}

// drop forgets sess (the server no longer knows it) and closes it.
func (s *Source) drop(sess *mcp.ClientSession) {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.session == sess {
		s.session = nil
	}
	_ = sess.Close()
}

// Close ends the shared session, if any.
func (s *Source) Close() {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.session != nil {
		_ = s.session.Close()
		s.session = nil
	}
}

var unsafeName = regexp.MustCompile(`[^a-zA-Z0-9_-]`)

// ToolName is how a server's tool is offered: <server>__<tool>, sanitised to ^[a-zA-Z0-9_-]{1,64}$.
func ToolName(server, tool string) string {
	name := unsafeName.ReplaceAllString(server+"__"+tool, "_")
	if len(name) > toolsfile.MaxNameLen {
		name = name[:toolsfile.MaxNameLen]
	}
	return name
}

// Approval maps the file's policy and the tool's annotations to the engine's policy.
func Approval(policy string, a *mcp.ToolAnnotations) agent.ApprovalPolicy {
	switch policy {
	case toolsfile.ApprovalNever:
		return agent.ApprovalNever
	case toolsfile.ApprovalAlways:
		return agent.ApprovalAlways
	}
	switch {
	case a != nil && a.ReadOnlyHint:
		return agent.ApprovalNever
	case a != nil && a.DestructiveHint != nil && *a.DestructiveHint:
		return agent.ApprovalAlways
	}
	return agent.ApprovalMutating
}

type userTokenKey struct{}

// headers sets the server's headers on every request, and the user's token on a call's when the server wants it.
type headers struct {
	s    *Source
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for name, v := range h.s.def.Headers {
		r.Header.Set(name, h.s.secrets.Expand(v))
	}
	if tok, _ := r.Context().Value(userTokenKey{}).(string); tok != "" && h.s.def.ForwardUserToken {
		r.Header.Set("Authorization", "Bearer "+tok)
	}
	return h.next.RoundTrip(r)
}

// localCode reports whether code is one the SDK gives a call that got no answer of the server's: rejected by the
// transport (the request failed or was not sent: an HTTP error status, a dropped connection; -32005) or a
// connection closing (-32003, -32004). Those are transport failures, not the server's refusals.
func localCode(code int64) bool {
	switch code {
	case -32005, -32003, -32004:
		return true
	}
	return false
}

type caller struct {
	s    *Source
	tool string // the server's name for it
	name string // as offered
}

func (c *caller) execute(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
	s := c.s
	if s.def.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = s.o.Timers.WithTimeoutCause(ctx, s.def.Timeout, agent.E(agent.KindUnavailable, agent.CodeToolTimeout,
			"tool %q timed out after %s", c.name, s.def.Timeout))
		defer cancel()
	}
	params := &mcp.CallToolParams{Name: c.tool, Arguments: inv.Input}
	if inv.IdempotencyKey != "" {
		params.Meta = mcp.Meta{MetaIdempotencyKey: inv.IdempotencyKey}
	}
	if inv.Progress != nil {
		token := fmt.Sprintf("agentloop-%d", s.calls.Add(1))
		params.SetProgressToken(token)
		s.progress.Store(token, inv.Progress)
		defer s.progress.Delete(token)
	}
	var res *mcp.CallToolResult
	var err error
	if s.def.ForwardUserToken {
		if inv.UserToken == "" {
			return nil, agent.E(agent.KindInvalid, agent.CodeToolFailed,
				"tool %q acts as the user and this turn has none (it was not started by the user's request): it cannot be called now", c.name)
		}
		ctx = context.WithValue(ctx, userTokenKey{}, inv.UserToken)
		var sess *mcp.ClientSession
		if sess, err = s.connect(ctx); err == nil {
			res, err = sess.CallTool(ctx, params)
			_ = sess.Close()
		}
	} else {
		var sess *mcp.ClientSession
		if sess, err = s.shared(ctx); err == nil {
			res, err = sess.CallTool(ctx, params)
			if errors.Is(err, mcp.ErrSessionMissing) {
				// The server forgot the session (a 404): the call never reached it, so it goes again once.
				s.drop(sess)
				if sess, err = s.shared(ctx); err == nil {
					res, err = sess.CallTool(ctx, params)
				}
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) && !localCode(rpc.Code) {
			return nil, agent.E(agent.KindInvalid, agent.CodeToolFailed, "the MCP server refused the call: %s", clip(rpc.Message, errorTextBytes))
		}
		return nil, agent.Wrap(err, agent.KindUnavailable, agent.CodeToolFailed, fmt.Sprintf("tool %q: the MCP server could not be reached", c.name))
	}
	limit := cmp.Or(s.def.MaxOutputBytes, DefaultMaxOutputBytes)
	text, parts := contents(res)
	if res.IsError {
		return nil, agent.E(agent.KindInvalid, agent.CodeToolFailed, "%s", cmp.Or(clip(text, errorTextBytes), "the tool reported an error"))
	}
	return output(text, parts, res.StructuredContent, limit), nil
}

// contents are a result's text contents joined, and its other contents as the server sent them.
func contents(res *mcp.CallToolResult) (string, []json.RawMessage) {
	var texts []string
	var parts []json.RawMessage
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			texts = append(texts, t.Text)
			continue
		}
		if b, err := json.Marshal(c); err == nil {
			parts = append(parts, b)
		}
	}
	return strings.Join(texts, "\n"), parts
}

// output is a result as the tool's output: the text alone as a JSON string; with other parts (or only
// structured content), an object; past limit, the text cut with a note.
func output(text string, parts []json.RawMessage, structured any, limit int) json.RawMessage {
	var out []byte
	switch {
	case len(parts) > 0:
		out, _ = json.Marshal(map[string]any{"text": text, "parts": parts})
	case text == "" && structured != nil:
		out, _ = json.Marshal(structured)
	default:
		out, _ = json.Marshal(text)
	}
	if len(out) <= limit {
		return out
	}
	note := fmt.Sprintf("the tool's answer was longer than %d bytes and was cut there", limit)
	if len(parts) > 0 {
		note += fmt.Sprintf("; its %d non-text parts were left out", len(parts))
	}
	b, _ := json.Marshal(map[string]any{"truncated": true, "note": note + "; ask for less if you need the rest", "text": clip(text, limit)})
	return b
}

// clip is s cut to at most n bytes on a rune boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
