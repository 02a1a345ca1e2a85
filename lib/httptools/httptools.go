// Package httptools turns the HTTP tools of the tools file (lib/toolsfile) into agent tools: an agent.ToolSource
// whose tools call the deployer's backend.
//
// The wiring (lib/devserver, functions/internal/boot) builds the source from the file read at cold start and
// gives it to the engine (engine.Deps.Sources).
//
// One call, from the tool's definition and the checked input (lib/toolschema ran before Execute):
//
//   - URL: each {name} of the template is the input property's value (a string as it is, anything else as
//     compact JSON), path-escaped before the '?' and query-escaped after it. The template's host is fixed
//     (lib/toolsfile refuses a placeholder there). A path placeholder whose value is absent, null, empty, "." or
//     ".." refuses the call before anything is sent (invalid_tool_input: the request would act on another
//     resource, e.g. DELETE /tickets/ for /tickets/{id}); a query placeholder may be empty.
//   - The rest of the input: a JSON object body for POST, PUT and PATCH; query parameters for GET and DELETE
//     (sorted by name).
//   - Headers: the file's, with their references expanded (toolsfile.Secrets); Idempotency-Key: the call's
//     idempotency key (the same for every execution of one tool call: DESIGN principle 9); X-User-JWT: the end
//     user's token when the invocation carries one (dual identity: Authorization says the service, X-User-JWT the
//     user, so the backend authorises the user, not the agent).
//   - Redirects are not followed (a redirect would carry the headers elsewhere): a 3xx is an error.
//   - Retries: only idempotent methods (GET, PUT, DELETE), on a transport error or a 502, 503 or 504, at most
//     Options.Retries more times; POST and PATCH are sent once.
//   - Timeout: the tool's own (the file's timeout), inside the engine's tool timeout.
//   - Output: a 2xx body that is JSON is the output as it is; any other body is a JSON string. A body past the
//     tool's maxOutputBytes is cut, and the output says so: {"truncated": true, "note": …, "body": "<first bytes>"}.
//   - A 4xx or 5xx is a tool error the model reads (tool_failed), with the status and the body's first 512 bytes.
package httptools

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/toolsfile"
)

// Defaults of the calls.
const (
	DefaultMaxOutputBytes = 32 << 10
	DefaultRetries        = 2
	DefaultBackoff        = 200 * time.Millisecond
	// errorBodyBytes is how much of an error answer's body the model reads.
	errorBodyBytes = 512
)

// Options configure the source.
type Options struct {
	// Client sends the requests (nil: a client of its own). Redirects are never followed, whatever it says.
	Client *http.Client
	// Retries is how many more times an idempotent call is tried after a transport error or a 502/503/504
	// (0: DefaultRetries; -1: none); Backoff the wait before the first retry, doubled each time.
	Retries int
	Backoff time.Duration
	// Timers waits between retries (nil: the system clock's).
	Timers agent.Timers
}

// Source is an agent.ToolSource over the HTTP tools of a tools file.
type Source struct{ tools []agent.Tool }

// New builds the tools of f's httpTools; secrets holds the values of their headers' references.
func New(f *toolsfile.File, secrets toolsfile.Secrets, o Options) *Source {
	o.Retries = cmp.Or(o.Retries, DefaultRetries)
	o.Backoff = cmp.Or(o.Backoff, DefaultBackoff)
	if o.Timers == nil {
		o.Timers = agent.TimersOf(agent.SystemClock{})
	}
	client := *cmp.Or(o.Client, &http.Client{})
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	s := &Source{}
	for _, t := range f.HTTPTools {
		c := &caller{def: t, secrets: secrets, client: &client, o: o}
		s.tools = append(s.tools, agent.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema,
			InputExamples: t.InputExamples, Kind: agent.ToolServer, Approval: approval(t), Execute: c.execute, AlwaysOn: t.AlwaysOn})
	}
	return s
}

// Name implements agent.ToolSource.
func (s *Source) Name() string { return "http" }

// Tools implements agent.ToolSource.
func (s *Source) Tools(context.Context) ([]agent.Tool, error) { return s.tools, nil }

// approval maps the file's policy: never, always, or by method (GET never asks; the others ask when the
// thread's reviewTools setting is on).
func approval(t toolsfile.HTTPTool) agent.ApprovalPolicy {
	switch t.Approval {
	case toolsfile.ApprovalAlways:
		return agent.ApprovalAlways
	case toolsfile.ApprovalNever:
		return agent.ApprovalNever
	}
	if t.Method == http.MethodGet {
		return agent.ApprovalNever
	}
	return agent.ApprovalMutating
}

type caller struct {
	def     toolsfile.HTTPTool
	secrets toolsfile.Secrets
	client  *http.Client
	o       Options
}

var placeholderRE = regexp.MustCompile(`\{([a-zA-Z_][a-zA-Z0-9_]*)\}`)

// request is the call's method, URL and body, built once and sent as many times as it is tried.
func (c *caller) request(input json.RawMessage) (target string, body []byte, err error) {
	var in map[string]json.RawMessage
	if err := json.Unmarshal(input, &in); err != nil {
		return "", nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput, "the input must be a JSON object")
	}
	used := map[string]bool{}
	var unset string // a path placeholder the input leaves without a usable value
	path, query, hasQuery := strings.Cut(c.def.URL, "?")
	fill := func(s string, escape func(string) string, inPath bool) string {
		return placeholderRE.ReplaceAllStringFunc(s, func(m string) string {
			name := m[1 : len(m)-1]
			used[name] = true
			v := text(in[name])
			if inPath && (v == "" || v == "." || v == "..") && unset == "" {
				unset = name
			}
			return escape(v)
		})
	}
	target = fill(path, url.PathEscape, true)
	if hasQuery {
		target += "?" + fill(query, url.QueryEscape, false)
	}
	if unset != "" {
		// Absent, empty, "." or "..": the request would act on another resource than the one the tool names.
		return "", nil, agent.E(agent.KindInvalid, agent.CodeInvalidToolInput,
			"the input must give %q a value (not empty, not \".\" or \"..\"): the URL's path needs it", unset)
	}
	rest := map[string]json.RawMessage{}
	for k, v := range in {
		if !used[k] {
			rest[k] = v
		}
	}
	switch c.def.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
		body, err = json.Marshal(rest)
		return target, body, err
	}
	if len(rest) > 0 {
		keys := make([]string, 0, len(rest))
		for k := range rest {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		q := url.Values{}
		for _, k := range keys {
			q.Add(k, text(rest[k]))
		}
		sep := "?"
		if hasQuery {
			sep = "&"
		}
		target += sep + q.Encode()
	}
	return target, nil, nil
}

// text is a value as it goes in a URL: a string as it is, anything else as compact JSON ("" when absent).
func text(v json.RawMessage) string {
	if len(v) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		return s
	}
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return string(v)
	}
	return b.String()
}

func idempotent(method string) bool {
	return method == http.MethodGet || method == http.MethodPut || method == http.MethodDelete
}

func (c *caller) execute(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
	target, body, err := c.request(inv.Input)
	if err != nil {
		return nil, err
	}
	if c.def.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = c.o.Timers.WithTimeoutCause(ctx, c.def.Timeout, agent.E(agent.KindUnavailable, agent.CodeToolTimeout,
			"tool %q timed out after %s", c.def.Name, c.def.Timeout))
		defer cancel()
	}
	tries := 1
	if idempotent(c.def.Method) && c.o.Retries > 0 {
		tries += c.o.Retries
	}
	backoff := c.o.Backoff
	for try := 1; ; try++ {
		out, retry, err := c.send(ctx, inv, target, body)
		if err == nil || !retry || try >= tries {
			return out, err
		}
		if c.o.Timers.Sleep(ctx, backoff) != nil {
			return nil, context.Cause(ctx)
		}
		backoff *= 2
	}
}

// send makes one attempt; retry says whether another may follow (a transport error, a 502/503/504).
func (c *caller) send(ctx context.Context, inv agent.ToolInvocation, target string, body []byte) (json.RawMessage, bool, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, c.def.Method, target, rd)
	if err != nil {
		return nil, false, agent.Wrap(err, agent.KindInternal, agent.CodeToolFailed, fmt.Sprintf("tool %q: build the request", c.def.Name))
	}
	for name, v := range c.def.Headers {
		req.Header.Set(name, c.secrets.Expand(v))
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", cmp.Or(req.Header.Get("Accept"), "application/json"))
	if inv.IdempotencyKey != "" {
		req.Header.Set("Idempotency-Key", inv.IdempotencyKey)
	}
	if inv.UserToken != "" {
		req.Header.Set("X-User-JWT", inv.UserToken)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, context.Cause(ctx)
		}
		// The transport's error names hosts and addresses: the log has it, the model reads the code.
		return nil, true, agent.Wrap(err, agent.KindUnavailable, agent.CodeToolFailed, fmt.Sprintf("tool %q: the backend could not be reached", c.def.Name))
	}
	defer resp.Body.Close()
	limit := cmp.Or(c.def.MaxOutputBytes, DefaultMaxOutputBytes)
	data, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, context.Cause(ctx)
		}
		return nil, true, agent.Wrap(err, agent.KindUnavailable, agent.CodeToolFailed, fmt.Sprintf("tool %q: the answer was cut off", c.def.Name))
	}
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return output(data, limit), false, nil
	case code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
		return nil, true, agent.E(agent.KindUnavailable, agent.CodeToolFailed, "the backend answered %s", resp.Status)
	default:
		snippet := data
		if len(snippet) > errorBodyBytes {
			snippet = cutRune(snippet[:errorBodyBytes])
		}
		return nil, false, agent.E(agent.KindInvalid, agent.CodeToolFailed, "the backend answered %s: %s", resp.Status,
			strings.ToValidUTF8(string(snippet), "\uFFFD"))
	}
}

// output is a 2xx body as the tool's output: JSON as it is, text as a JSON string, a body past limit cut with a
// note.
func output(data []byte, limit int) json.RawMessage {
	if len(data) <= limit {
		if json.Valid(data) {
			return data
		}
		b, _ := json.Marshal(strings.ToValidUTF8(string(data), "\uFFFD"))
		return b
	}
	cut := cutRune(data[:limit])
	b, _ := json.Marshal(map[string]any{"truncated": true,
		"note": fmt.Sprintf("the answer was longer than %d bytes and was cut there; ask for less (a narrower query) if you need the rest", limit),
		"body": strings.ToValidUTF8(string(cut), "\uFFFD")})
	return b
}

// cutRune is cut without the rune its end splits, if any (at most utf8.UTFMax-1 bytes left out); bytes that are
// not UTF-8 stay (the output makes them U+FFFD).
func cutRune(cut []byte) []byte {
	for i := len(cut) - 1; i >= 0 && i >= len(cut)-(utf8.UTFMax-1); i-- {
		if utf8.RuneStart(cut[i]) {
			if !utf8.FullRune(cut[i:]) {
				return cut[:i]
			}
			break
		}
	}
	return cut
}
