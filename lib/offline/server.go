package offline

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults.
const (
	DefaultModel     = "offline"
	DefaultWordDelay = 100 * time.Millisecond // per /slow word
	// MaxRequestBytes bounds a request body; a larger one is answered 413.
	MaxRequestBytes = 32 << 20
	// DefaultContextTokens is the context window the offline model enforces (gpt-4o-mini's), in tokens counted
	// as chars/4 of the messages' text and tool calls (see contextTokens).
	DefaultContextTokens = 128_000
)

// Server is the scripted model. It is an http.Handler; the zero value is not usable, call New.
type Server struct {
	wordDelay     time.Duration
	replyDelay    time.Duration
	clock         agent.Clock
	contextTokens int
	fileClient    *http.Client
	fileTimeout   time.Duration

	requests atomic.Int64
	// embeddingRequests and embeddedInputs count POST /v1/embeddings requests and the inputs they embedded.
	embeddingRequests atomic.Int64
	embeddedInputs    atomic.Int64

	mu    sync.Mutex
	flaky map[string]int // requests seen per /flaky turn
	// cache simulates a provider's prompt cache (WithPromptCache); nil: every message but the last is cached.
	cache *promptCache
}

// Option configures a Server.
type Option func(*Server)

// WithWordDelay sets the wait before each /slow word (default 100 ms). Tests shorten it.
func WithWordDelay(d time.Duration) Option { return func(s *Server) { s.wordDelay = d } }

// WithReplyDelay sets a wait before each streamed word of ordinary replies (default 0), so that a person watching
// `agentloop dev` sees the reply arrive word by word.
func WithReplyDelay(d time.Duration) Option { return func(s *Server) { s.replyDelay = d } }

// WithContextTokens sets the context window a request must fit (default DefaultContextTokens); a request over it
// is answered 400 context_length_exceeded, as OpenAI does.
func WithContextTokens(n int) Option { return func(s *Server) { s.contextTokens = n } }

// WithFileClient sets the client that downloads the images a request names by http(s) URL (default
// http.DefaultClient; tests pass an httptest TLS server's client). Each download is bounded by DefaultFileTimeout.
func WithFileClient(c *http.Client) Option { return func(s *Server) { s.fileClient = c } }

// WithClock sets the clock behind the "created" timestamps (default the system clock).
func WithClock(c agent.Clock) Option { return func(s *Server) { s.clock = c } }

// New returns a Server.
func New(opts ...Option) *Server {
	s := &Server{wordDelay: DefaultWordDelay, clock: agent.SystemClock{}, contextTokens: DefaultContextTokens,
		fileClient: http.DefaultClient, fileTimeout: DefaultFileTimeout, flaky: map[string]int{}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Embedded reports how many embedding requests the server has answered, and how many inputs they held.
func (s *Server) Embedded() (requests, inputs int64) {
	return s.embeddingRequests.Load(), s.embeddedInputs.Load()
}

// Requests reports how many chat completion, responses and Messages requests the server has received.
func (s *Server) Requests() int64 { return s.requests.Load() }

// Start serves s on addr (e.g. "127.0.0.1:0" for a free loopback port) until stop is called. baseURL has the
// form "http://127.0.0.1:PORT/v1/", ready for lib/openai's Config.BaseURL. stop closes the listener and every
// open connection and waits for the server loop to end; it may be called more than once.
func (s *Server) Start(addr string) (baseURL string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("offline: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln) // returns http.ErrServerClosed once stop runs
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = srv.Close()
			<-done
		})
	}
	return "http://" + ln.Addr().String() + "/v1/", stop, nil
}

// Start serves a new Server built with opts on addr; see Server.Start.
func Start(addr string, opts ...Option) (baseURL string, stop func(), err error) {
	return New(opts...).Start(addr)
}

// ServeHTTP answers the Chat Completions and Models routes, with or without the "/v1" prefix.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1"), "/")
	if modelID, ok := converseRoute(path); ok {
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		s.requests.Add(1)
		s.converse(w, r, modelID) // Bedrock's ConverseStream (converse.go)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/model/") {
		s.invoke(w, r) // Bedrock's InvokeModel(WithResponseStream) for Anthropic models (messages.go)
		return
	}
	switch path {
	case "/chat/completions":
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		s.requests.Add(1)
		s.chat(w, r)
	case "/responses":
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		s.requests.Add(1)
		s.responses(w, r)
	case "/messages":
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		s.requests.Add(1)
		s.messages(w, r)
	case "/embeddings":
		if r.Method != http.MethodPost {
			writeError(w, http.StatusMethodNotAllowed, "use POST")
			return
		}
		s.embeddings(w, r)
	case "/models":
		if r.Method != http.MethodGet {
			writeError(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelInfo{{
			ID: DefaultModel, Object: "model", Created: s.clock.Now().Unix(), OwnedBy: "agentloop",
		}}})
	default:
		writeError(w, http.StatusNotFound, "unknown route "+r.Method+" "+r.URL.Path)
	}
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
			return
		}
		writeError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	if bad := validate(body); bad != nil {
		writeJSON(w, http.StatusBadRequest, bad.body())
		return
	}
	// Validated: the body decodes into the wire shapes.
	var req wireRequest
	var msgs []wireMessage
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request: "+err.Error())
		return
	}
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		writeError(w, http.StatusBadRequest, "invalid messages: "+err.Error())
		return
	}

	if bad := s.checkImages(r.Context(), msgs); bad != nil {
		writeJSON(w, http.StatusBadRequest, bad.body())
		return
	}
	if n := contextTokens(msgs); n > s.contextTokens {
		writeJSON(w, http.StatusBadRequest, contextExceeded(s.contextTokens, n).body())
		return
	}

	offered := make([]string, len(req.Tools))
	for i, t := range req.Tools {
		offered[i] = t.Function.Name
	}
	rep, reqHash := s.plan(msgs, offered)
	rep.limit(max(req.MaxCompletionTokens, req.MaxTokens))
	if rep.delay == 0 {
		rep.delay = s.replyDelay
	}
	if rep.status > 0 {
		writeError(w, rep.status, rep.message)
		return
	}
	out := output{
		id:      "chatcmpl-" + reqHash[:24],
		created: s.clock.Now().Unix(),
		model:   req.Model,
		usage:   s.withCache(usage(msgs, rep), req.PromptCacheKey, offered, msgs),
	}
	if req.Stream {
		out.includeUsage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		out.stream(r.Context(), w, rep)
		return
	}
	out.complete(r.Context(), w, rep)
}

// plan finds the turn in msgs and scripts the reply.
func (s *Server) plan(msgs []wireMessage, offered []string) (reply, string) {
	all := hashMessages(msgs)
	last := -1
	for i, m := range msgs {
		if m.Role == "user" {
			last = i
		}
	}
	if last < 0 {
		return textReply("There is no user message to answer."), all
	}
	t := turn{
		text:    strings.TrimSpace(msgs[last].text()),
		content: msgs[last].Content,
		after:   msgs[last+1:],
		key:     hashMessages(msgs[:last+1]),
		reqHash: all,
		offered: offered,
	}
	return s.answer(t, t.text), all
}

func hashMessages(msgs []wireMessage) string {
	h := sha256.New()
	for _, m := range msgs {
		// Re-encoding gives a canonical form: the same transcript hashes the same whatever its spacing.
		b, _ := json.Marshal(m)
		h.Write(b)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// messageTokens estimates one message's tokens: one per word, one for the message, one per tool call.
func messageTokens(m wireMessage) int64 {
	n := 1 + countWords(m.text())
	for _, c := range m.ToolCalls {
		n += 1 + countWords(c.Function.Name+" "+c.Function.Arguments)
	}
	return n
}

// withCache is u with cached_tokens as the simulated prompt cache counts them (WithPromptCache), else u.
func (s *Server) withCache(u wireUsage, key string, tools []string, msgs []wireMessage) wireUsage {
	if s.cache != nil {
		u.PromptTokensDetails.CachedTokens = s.cache.cached(key, tools, msgs)
	}
	return u
}

// usage estimates the request's tokens: one per word, plus one per message and one per tool call.
func usage(msgs []wireMessage, rep reply) wireUsage {
	var prompt, cached int64
	for i, m := range msgs {
		n := messageTokens(m)
		prompt += n
		if i < len(msgs)-1 {
			cached += n
		}
	}
	reasoning := countWords(rep.reasoning)
	completion := reasoning + countWords(rep.text())
	for _, c := range rep.calls {
		completion += 1 + countWords(c.Function.Name+" "+c.Function.Arguments)
	}
	u := wireUsage{
		PromptTokens:        prompt,
		CompletionTokens:    completion,
		TotalTokens:         prompt + completion,
		PromptTokensDetails: promptDetails{CachedTokens: cached},
	}
	if reasoning > 0 {
		u.CompletionTokensDetails = &completionDetails{ReasoningTokens: reasoning}
	}
	return u
}

// output writes one reply in either wire form.
type output struct {
	id           string
	created      int64
	model        string
	usage        wireUsage
	includeUsage bool
}

func (o output) complete(ctx context.Context, w http.ResponseWriter, rep reply) {
	if rep.drop {
		panic(http.ErrAbortHandler) // net/http cuts the connection without logging
	}
	if rep.failAfter > 0 {
		writeError(w, rep.failAfter, rep.message)
		return
	}
	if err := sleep(ctx, rep.delay*time.Duration(len(rep.pieces))); err != nil {
		return
	}
	msg := completionMessage{Role: "assistant", ReasoningContent: rep.reasoning, ToolCalls: rep.calls}
	if text := rep.text(); text != "" || len(rep.calls) == 0 {
		msg.Content = &text
	}
	writeJSON(w, http.StatusOK, completion{
		ID: o.id, Object: "chat.completion", Created: o.created, Model: o.model,
		Choices: []completionChoice{{Index: 0, Message: msg, FinishReason: rep.finish}},
		Usage:   o.usage,
	})
}

func (o output) stream(ctx context.Context, w http.ResponseWriter, rep reply) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	sendDelta := func(d delta, finish *string) bool {
		return send(chunk{
			ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
			Choices: []chunkChoice{{Index: 0, Delta: d, FinishReason: finish}},
		})
	}

	empty := ""
	if !sendDelta(delta{Role: "assistant", Content: &empty}, nil) {
		return
	}
	if rep.reasoning != "" {
		for _, p := range splitWords(rep.reasoning) {
			if !sendDelta(delta{ReasoningContent: p}, nil) {
				return
			}
		}
	}
	for _, p := range rep.pieces {
		if sleep(ctx, rep.delay) != nil {
			return
		}
		if !sendDelta(delta{Content: &p}, nil) {
			return
		}
	}
	if rep.drop {
		panic(http.ErrAbortHandler)
	}
	if rep.failAfter > 0 {
		code := strconv.Itoa(rep.failAfter)
		send(errorBody{Error: errorDetail{Message: rep.message, Type: errorType(rep.failAfter), Code: &code}})
		return
	}
	for i, c := range rep.calls {
		start := toolCallDelta{Index: i, ID: c.ID, Type: "function", Function: functionDelta{Name: c.Function.Name}}
		if !sendDelta(delta{ToolCalls: []toolCallDelta{start}}, nil) {
			return
		}
		for _, frag := range fragments(c.Function.Arguments, 3) {
			d := toolCallDelta{Index: i, Function: functionDelta{Arguments: frag}}
			if !sendDelta(delta{ToolCalls: []toolCallDelta{d}}, nil) {
				return
			}
		}
	}
	finish := rep.finish
	if !sendDelta(delta{}, &finish) {
		return
	}
	if o.includeUsage {
		u := o.usage
		if !send(chunk{
			ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.model,
			Choices: []chunkChoice{}, Usage: &u,
		}) {
			return
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err == nil {
		_ = rc.Flush()
	}
}

// fragments splits s into at most n pieces of about equal length, never inside a UTF-8 sequence.
func fragments(s string, n int) []string {
	size := (len(s) + n - 1) / n
	var out []string
	for len(s) > 0 {
		end := min(size, len(s))
		for end < len(s) && !isRuneStart(s[end]) {
			end++
		}
		out = append(out, s[:end])
		s = s[end:]
	}
	return out
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

func writeError(w http.ResponseWriter, status int, message string) {
	code := strconv.Itoa(status)
	writeJSON(w, status, errorBody{Error: errorDetail{Message: message, Type: errorType(status), Code: &code}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
