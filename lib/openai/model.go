// Package openai adapts agent.Model to any OpenAI-compatible Chat Completions endpoint: OpenAI itself, the
// in-process offline model (package offline), or any provider that speaks the same wire format. It speaks the
// wire itself, with the standard library (wire.go: the request, the streamed chunks, the error bodies), not
// through github.com/openai/openai-go/v3, which linked 17 MB of every OpenAI API's types into the chat Lambda.
// Each streamed chunk is read by a decoder of the fields the adapter uses (chunkdecode.go, about a tenth of
// encoding/json's cost per chunk, which was the largest share of the dev server's CPU per streamed word); what
// it does not fully understand goes to encoding/json, and a fuzzed test holds the two to the same results.
//
// # Events
//
// One Stream call is one streamed completion. Data flows one way: deltas are emitted as they arrive and never
// assembled here (the engine alone builds message parts from the events): text, reasoning (the
// "reasoning_content" or "reasoning" delta field that DeepSeek, vLLM, Ollama and OpenRouter send), and tool calls
// (EventToolCallStart with id and name, then EventToolCallDelta argument fragments, every one carrying the call
// id). The only thing assembled is each call's arguments, so that once the stream has ended with a finish reason
// one EventToolCall per call goes out, in the order the model made them, with the whole arguments text ("{}" when
// the model sent none). A call that never got a name is never announced. The result maps the finish reason to the
// AI SDK's names and reports usage including cached prompt tokens.
//
// # Timeouts and retries
//
// An attempt fails with code model_timeout when no chunk arrives within Config.FirstTokenTimeout of sending the
// request, or when, after the first chunk, no chunk arrives for Config.IdleTimeout (time spent in emit does not
// count: a slow client is not a stalled model). Nothing caps the whole stream: a long reply that keeps streaming
// is never cut, and the run's wall clock bounds it. The SDK's own retries are off; this package retries, with
// exponential backoff and jitter (honouring a provider's Retry-After up to 30 s), on HTTP 429, HTTP 5xx,
// connection failures, truncated streams and timeouts, and only while nothing has been emitted. Once an event was
// emitted, an error is returned as is.
//
// # Errors
//
// Errors are *agent.Error whose Message is safe to show a user and names no provider text, base URL or key (e.g.
// "the model provider returned HTTP 401"); the cause, with the provider's own message, stays in Err for the logs.
// KindUnavailable with CodeModelError or CodeModelTimeout; KindInvalid with CodeFileUnavailable when the
// provider refuses an image it cannot download or read (OpenAI's invalid_image_url, invalid_image_format);
// KindCanceled when ctx ends (the code is that of an *agent.Error cause of ctx, else agent.CodeRunCanceled);
// KindInternal for a request that cannot be built. An
// error returned by emit is returned unchanged.
//
// # Files
//
// A user message's files become content parts after its text: an image is an image_url part whose url is a data
// URL, or the newest user message's https URL as it is (the provider fetches it, and refuses the request with its
// 400 when it cannot: the person's own error); a PDF is a file part whose file_data is a data URL and whose
// filename is the file's (or "document.pdf"). Chat Completions takes PDFs as data only, so a PDF named by an
// https URL is downloaded first, as the AI SDK does for URLs a provider cannot read; so is an older message's
// image named by an https URL, which the provider would otherwise fetch on every later turn and refuse once it is
// gone. Downloads are https only, Config.MaxFileBytes at most, within Config.FileTimeout, with Config.FileClient
// (by default one that dials public addresses only, redirected to https only), and their bytes must be what the
// provider decodes (a PDF's header; a PNG, JPEG, GIF or WebP image, sent as the type its bytes are). A download of
// the newest user message's file that fails fails the request (KindUnavailable, CodeModelError: the model cannot
// see the message); an older message's file that fails (an expired pre-signed URL) is sent as the line
// "[attachment NAME (TYPE) no longer available]" instead, so that it does not fail every later turn of the
// thread (REVIEW S4). The files of
// one request carry Config.MaxRequestFileBytes at most (decoded): the newest kept first, older ones beyond it sent
// as a line; the newest message's own files over it fail the request (KindTooLarge, CodeMessageTooLarge). The data
// URLs of recent downloads are kept (twice MaxFileBytes of them at most, for modelfiles.CacheTTL) so that a run's later
// steps, which send the same history, do not download again.
//
// # Compatibility
//
// Some "OpenAI-compatible" servers refuse max_completion_tokens or stream_options: Config.MaxTokensParam and
// Config.OmitStreamOptions turn them into max_tokens or leave them out. Usage then reads zero unless the server
// reports it anyway.
package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
	"github.com/agentloop/agentloop/lib/modelfiles"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// Defaults for the zero values of Config (DESIGN "Run lifecycle"). lib/config refers to these; nothing else
// repeats the numbers.
const (
	DefaultBaseURL         = openaiwire.DefaultBaseURL
	DefaultMaxOutputTokens = modelcall.DefaultMaxOutputTokens
	// The attempts' timing and retries: lib/modelcall's defaults, the same for every adapter.
	DefaultFirstTokenTimeout = modelcall.DefaultFirstTokenTimeout
	DefaultIdleTimeout       = modelcall.DefaultIdleTimeout
	DefaultMaxRetries        = modelcall.DefaultMaxRetries
	DefaultBackoffBase       = modelcall.DefaultBackoffBase
	DefaultBackoffMax        = modelcall.DefaultBackoffMax

	// The file bounds' defaults are lib/modelfiles's (written once there).
	DefaultMaxFileBytes        = modelfiles.DefaultMaxFileBytes
	DefaultFileTimeout         = modelfiles.DefaultTimeout
	DefaultMaxRequestFileBytes = modelfiles.DefaultMaxRequestBytes
)

// Values of Config.MaxTokensParam.
const (
	MaxCompletionTokens = "max_completion_tokens" // the default: what OpenAI documents
	MaxTokens           = "max_tokens"            // the older name, for servers that predate max_completion_tokens
	MaxTokensNone       = "none"                  // send no output bound (the server's own applies)
)

// Config configures a Model. Zero values take the defaults above.
type Config struct {
	// BaseURL is the API root, e.g. "https://api.openai.com/v1/" or the offline model's "http://127.0.0.1:PORT/v1/".
	BaseURL string
	APIKey  string
	// Model is used when a request names none (AGENT_MODEL).
	Model string
	// EmbeddingModel is the model of Embed's vectors (DefaultEmbeddingModel).
	EmbeddingModel string
	// MaxOutputTokens is used when a request sets none.
	MaxOutputTokens int
	// FirstTokenTimeout bounds the wait from sending a request to its first chunk.
	FirstTokenTimeout time.Duration
	// IdleTimeout bounds the gap between two chunks after the first.
	IdleTimeout time.Duration
	// MaxRetries is the number of retries after the first attempt; 0 means DefaultMaxRetries, negative means none.
	MaxRetries int
	// BackoffBase is the wait before the first retry; it doubles per retry up to BackoffMax, with jitter.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxTokensParam is the request field that carries the output bound: MaxCompletionTokens (default),
	// MaxTokens or MaxTokensNone.
	MaxTokensParam string
	// OmitStreamOptions leaves stream_options.include_usage out, for servers that refuse it.
	OmitStreamOptions bool
	// HTTPClient sends the requests (default: a client of its own, http.DefaultTransport's settings but for
	// DefaultMaxIdleConnsPerHost).
	HTTPClient *http.Client
	// FileClient downloads the PDFs that a user message names by https URL, and older messages' images (default:
	// a client that connects to public addresses only, so a user cannot make the server fetch from its own
	// network; tests inject an httptest TLS server's client). MaxFileBytes and FileTimeout bound each download.
	FileClient   *http.Client
	MaxFileBytes int64
	FileTimeout  time.Duration
	// MaxRequestFileBytes bounds the files of one request (see "Files" above).
	MaxRequestFileBytes int64
	// IDs names tool calls that a provider streams without an id (default agent.RandomIDs).
	IDs agent.IDs
	// Logger receives one warning per retry (default slog.Default()).
	Logger *slog.Logger
}

// Model is the agent.Model adapter. It is safe for concurrent use.
type Model struct {
	openaiwire.Embedder // Embed, EmbeddingModel: the same root's POST embeddings, for the tool router

	cfg         Config
	endpoint    string               // BaseURL's chat/completions
	endpointErr error                // BaseURL is no URL: every request fails with it
	files       *modelfiles.Resolver // a user message's files: downloads, bounds, the recent downloads kept
	policy      modelcall.Policy     // the attempts' timeouts and retries
}

var _ agent.Model = (*Model)(nil)

// New returns a Model for cfg. It does not read the environment: every setting comes from cfg.
func New(cfg Config) *Model {
	cfg.BaseURL = cmpOr(cfg.BaseURL, DefaultBaseURL)
	cfg.MaxTokensParam = cmpOr(cfg.MaxTokensParam, MaxCompletionTokens)
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: modelTransport()}
	}
	if cfg.IDs == nil {
		cfg.IDs = agent.RandomIDs{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pol := modelcall.Policy{FirstTokenTimeout: cfg.FirstTokenTimeout, IdleTimeout: cfg.IdleTimeout, MaxRetries: cfg.MaxRetries,
		BackoffBase: cfg.BackoffBase, BackoffMax: cfg.BackoffMax, Logger: cfg.Logger}.WithDefaults()
	m := &Model{cfg: cfg, policy: pol, files: modelfiles.New(modelfiles.Config{Client: cfg.FileClient, MaxFileBytes: cfg.MaxFileBytes,
		Timeout: cfg.FileTimeout, MaxRequestBytes: cfg.MaxRequestFileBytes, Logger: cfg.Logger})}
	m.endpoint, m.endpointErr = endpoint(cfg.BaseURL)
	m.Embedder = openaiwire.Embedder{Client: openaiwire.Client{HTTP: cfg.HTTPClient, APIKey: cfg.APIKey}, BaseURL: cfg.BaseURL,
		Model: cfg.EmbeddingModel}
	return m
}

// DefaultMaxIdleConnsPerHost is how many idle connections the default client keeps to the provider: about one
// per reply streaming at once. http.DefaultTransport keeps 2, so under load every reply past the second dialed
// anew (and, against a provider over TLS, shook hands anew: issue 18). An idle connection holds about 20 KiB.
const DefaultMaxIdleConnsPerHost = 256

// modelWriteBuffer is the default transport's write buffer per connection (net/http's default is 4 KiB): it
// only ever holds a request's headers and the start of its body (a larger write goes past it), and a server
// streaming a thousand replies holds a thousand of them.
const modelWriteBuffer = 1 << 10

// modelReadBuffer is the default transport's read buffer per connection (net/http's default is 4 KiB): it holds
// the answer's header lines and chunk sizes, and the stream's bytes on their way to the reply's own 1 KiB line
// buffer (chunkReadBuffer), which reads through it; a read larger than it goes past it. A server streaming a
// thousand replies holds a thousand of them.
const modelReadBuffer = 1 << 10

// modelTransport is the default client's transport.
func modelTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = DefaultMaxIdleConnsPerHost
	t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
	t.WriteBufferSize = modelWriteBuffer
	t.ReadBufferSize = modelReadBuffer
	return t
}

func cmpOr(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// Stream implements agent.Model.
func (m *Model) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	r, downloaded, err := m.request(ctx, req)
	if err != nil {
		return agent.ModelResult{}, err
	}
	res, err := m.policy.Run(ctx, func() (agent.ModelResult, *modelcall.Failure) { return m.attempt(ctx, r, emit) })
	if err == nil {
		res.FileBytes = downloaded
	}
	return res, err
}

func (m *Model) attempt(ctx context.Context, req request, emit func(agent.ModelEvent) error) (agent.ModelResult, *modelcall.Failure) {
	at := m.policy.Start(ctx)
	defer at.End()
	acc := accumulator{Emitter: at.Emitter(emit), ids: m.cfg.IDs, model: req.model}
	stream, err := m.open(at.Ctx(), req.body)
	if err != nil {
		return acc.partial(), classify(at, err, false)
	}
	defer stream.Close()

	for stream.Next() {
		if !at.Arrived() {
			break // cancelled while later chunks sat in the read buffer, or timed out as this one came in
		}
		if err := acc.add(stream.Current()); err != nil {
			return acc.partial(), &modelcall.Failure{Err: err}
		}
		if !stream.Ready() {
			// The next chunk is not here yet: the event held back goes out before the wait.
			if err := acc.Release(); err != nil {
				return acc.partial(), &modelcall.Failure{Err: err}
			}
		}
		at.Waiting()
	}
	at.Pause() // no more waits on the provider: the release below is the consumer's time
	if at.CallerDone() {
		acc.Drop() // the caller cancelled: nothing more goes to it
	} else if err := acc.Release(); err != nil {
		return acc.partial(), &modelcall.Failure{Err: err}
	}
	if err := at.Err(stream.Err()); err != nil {
		return acc.partial(), classify(at, err, acc.Emitted)
	}
	if acc.finish == "" {
		// The body ended without a finish reason: a proxy or the provider cut the stream short.
		return acc.partial(), modelcall.Truncated(nil, acc.Emitted)
	}
	if err := acc.finishCalls(); err != nil {
		return acc.partial(), &modelcall.Failure{Err: err}
	}
	if err := acc.Release(); err != nil {
		return acc.partial(), &modelcall.Failure{Err: err}
	}
	return acc.result(), nil
}

// classify turns an attempt's error into an *agent.Error with a message safe for a user, and says whether it
// may be retried. What the provider said goes into the cause, for the logs only.
func classify(at *modelcall.Attempt, err error, emitted bool) *modelcall.Failure {
	if f := at.Ended(emitted); f != nil {
		return f
	}
	var apiErr *apiError
	if errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusBadRequest && (apiErr.Code == "invalid_image_url" || apiErr.Code == "invalid_image_format") {
		// The newest message's image by URL (older ones are sent as data, or as a line): the person's own error.
		return &modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, apiErr.Message), agent.KindInvalid, agent.CodeFileUnavailable,
			"the model provider could not read an image of the message (HTTP 400)")}
	}
	if errors.As(err, &apiErr) {
		return modelcall.HTTPStatus(modelcall.ProviderSaid(err, apiErr.Message), apiErr.StatusCode, apiErr.Response, emitted)
	}
	var streamErr *streamError
	if errors.As(err, &streamErr) {
		// An error event inside a 200 stream: the provider gave up mid-completion. Not retried: it is not
		// one of the transient classes, and usually follows emitted deltas anyway.
		return &modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, streamErrorMessage(streamErr)), agent.KindUnavailable,
			agent.CodeModelError, "the model provider failed mid-stream")}
	}
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &syntaxErr) || errors.As(err, &typeErr) {
		return &modelcall.Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "the model provider sent a malformed chunk")}
	}
	// What is left failed below HTTP: refused or reset connections, a body cut mid-stream.
	return modelcall.ConnectionFailed(err, emitted)
}

func streamErrorMessage(e *streamError) string {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(e.Data, &body) != nil || body.Error.Message == "" {
		return e.Message
	}
	if body.Error.Code != nil {
		return fmt.Sprintf("%s (code %v)", body.Error.Message, body.Error.Code)
	}
	return body.Error.Message
}

// request is one model request, ready to send (again, on a retry).
type request struct {
	model string
	body  []byte
}

// request builds the request; downloaded has the sizes of the files it downloaded, by URL.
func (m *Model) request(ctx context.Context, req agent.ModelRequest) (request, map[string]int64, error) {
	model := req.Model
	if model == "" {
		model = m.cfg.Model
	}
	if model == "" {
		return request{}, nil, agent.E(agent.KindInternal, agent.CodeModelError, "no model configured (AGENT_MODEL)")
	}
	maxTokens := req.MaxOutputTokens
	if maxTokens <= 0 {
		maxTokens = m.cfg.MaxOutputTokens
	}
	msgs, downloaded, err := m.messages(ctx, req)
	if err != nil {
		return request{}, nil, err
	}
	p := chatRequest{Model: model, Messages: msgs, Stream: true, PromptCacheKey: req.CacheKey}
	switch m.cfg.MaxTokensParam {
	case MaxTokens:
		p.MaxTokens = maxTokens
	case MaxTokensNone:
	default:
		p.MaxCompletionTokens = maxTokens
	}
	if !m.cfg.OmitStreamOptions {
		p.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	for _, t := range req.Tools {
		desc, params, err := openaiwire.Function(t)
		if err != nil {
			return request{}, nil, err
		}
		p.Tools = append(p.Tools, chatTool{Type: "function", Function: chatFunction{Name: t.Name, Description: desc, Parameters: params}})
	}
	body, err := encodeRequest(p)
	if err != nil {
		return request{}, nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode the model request")
	}
	return request{model: model, body: body}, downloaded, nil
}

// messages converts the provider-neutral transcript, system prompt first.
func (m *Model) messages(ctx context.Context, req agent.ModelRequest) ([]chatMessage, map[string]int64, error) {
	out := make([]chatMessage, 0, len(req.Messages)+1)
	if req.System != "" {
		out = append(out, chatMessage{Role: "system", Content: req.System})
	}
	files, downloaded, err := m.files.Resolve(ctx, req.Messages)
	if err != nil {
		return nil, nil, err
	}
	for i, msg := range req.Messages {
		switch msg.Role {
		case "user":
			if len(msg.Files) == 0 {
				out = append(out, chatMessage{Role: "user", Content: msg.Text})
				continue
			}
			out = append(out, chatMessage{Role: "user", Content: userParts(msg, files[i])})
		case "assistant":
			a := chatMessage{Role: "assistant"}
			if msg.Text != "" || len(msg.ToolCalls) == 0 {
				a.Content = msg.Text
			}
			for _, c := range msg.ToolCalls {
				args := c.Arguments
				if strings.TrimSpace(args) == "" {
					args = "{}" // providers reject empty arguments
				}
				a.ToolCalls = append(a.ToolCalls, chatToolCall{ID: c.ID, Type: "function",
					Function: chatFunctionCall{Name: c.Name, Arguments: args}})
			}
			out = append(out, a)
		case "tool":
			out = append(out, chatMessage{Role: "tool", Content: msg.Text, ToolCallID: msg.ToolCallID})
		default:
			return nil, nil, agent.E(agent.KindInternal, agent.CodeInternal, "message %d: unknown role %q", i, msg.Role)
		}
	}
	return out, downloaded, nil
}
