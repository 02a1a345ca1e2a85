// Package openairesponses adapts agent.Model to OpenAI's Responses API (POST /v1/responses, stream: true): OpenAI
// itself, the offline model's /v1/responses (package offline), or a server that speaks the same wire. Like
// package openai (Chat Completions) it speaks the wire itself with the standard library (wire.go), not through
// github.com/openai/openai-go/v3: one streaming call through its responses package made the chat Lambda's
// bootstrap 33.9 MB instead of 16.4 MB (issue 20, built as the Makefile builds it; the bound is 25 MB), for a
// stream of a dozen event types of which the adapter reads a few fields. This package adds 64 KB.
//
// # Requests
//
// Every request has store: false (the thread is ours; the provider keeps nothing) and stream: true. The system
// prompt is the instructions; the transcript becomes input items: a user message's text and files as
// input_text, input_image (a data URL, or the newest message's https URL as it is) and input_file (a PDF's data
// URL as file_data; files.go downloads PDFs and older images named by URL, as package openai does); the
// assistant's text as a message of output_text; its tool calls as function_call items and their results as
// function_call_output items. Tools are function tools with strict: false (the API defaults to strict, which
// refuses ordinary JSON schemas), their input examples folded into the description as package openai does.
//
// An assistant message's ReasoningData (this adapter's own ModelResult.ReasoningData of that step: the reasoning
// items as the provider sent them, encrypted_content included; items without it are not kept, since with store
// false the provider could not find them) is replayed as is before the step's text and calls, so a reasoning
// model keeps its reasoning across the steps of a run. It is left out of an assistant message with neither text
// nor calls (the provider refuses a reasoning item without the item that followed it); data of another adapter
// (not a JSON array of reasoning items) is ignored.
//
// The request includes "reasoning.encrypted_content" and asks for reasoning summaries (Config.ReasoningSummary,
// Config.ReasoningEffort). ReasoningNone leaves both out, for models that do not reason; a model that refuses
// them (OpenAI's 400 for reasoning.* or for encrypted content) gets the request again at once without them, and
// never again, so a models-file entry for gpt-4.1 works without configuration.
//
// # Events
//
// Deltas are emitted as they arrive: response.output_text.delta (and refusal deltas) as text,
// response.reasoning_summary_text.delta (and reasoning_text deltas, from servers that stream raw reasoning) as
// reasoning, a later summary part set apart by a blank line; a function_call output item as EventToolCallStart
// (its call_id and name) and its response.function_call_arguments.delta as EventToolCallDelta. Once the
// response has completed, one EventToolCall per call goes out, in the order the model made them, with the
// arguments of the call's .done event ("{}" when empty). The result maps the end: completed → stop or
// tool-calls; incomplete for max_output_tokens → length, for content_filter → content-filter. Usage includes
// input_tokens_details.cached_tokens and output_tokens_details.reasoning_tokens. The model is the one the
// response names.
//
// # Timeouts, retries and errors
//
// As package openai (both through lib/modelcall): a first-token and an idle timeout (not a whole-stream cap);
// retries with backoff and jitter (honouring Retry-After up to 30 s) on HTTP 429 and 5xx, connection failures, truncated streams,
// timeouts, and a response.failed or error event whose code is server_error or rate_limit_exceeded, only
// while nothing has been emitted. Errors are *agent.Error with a message safe for a user (no provider text, URL
// or key; the provider's message stays in the cause, for the logs): KindUnavailable with CodeModelError or
// CodeModelTimeout; KindInvalid with CodeFileUnavailable when the provider cannot read an image of the message;
// KindCanceled when ctx ends; KindInternal for a request that cannot be built. An error returned by emit is
// returned unchanged.
//
// # Embeddings
//
// Embed (agent.Embedder) asks the same endpoint's POST embeddings, as package openai does, for the tool router.
//
// # Prompt caching
//
// prompt_cache_key is the request's agent.ModelRequest.CacheKey (the thread id), else Config.PromptCacheKey.
package openairesponses

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
	"github.com/agentloop/agentloop/lib/modelfiles"
	"github.com/agentloop/agentloop/lib/openaiwire"
)

// Defaults for the zero values of Config.
const (
	DefaultBaseURL         = openaiwire.DefaultBaseURL
	DefaultMaxOutputTokens = modelcall.DefaultMaxOutputTokens
	// The attempts' timing and retries: lib/modelcall's defaults, the same for every adapter.
	DefaultFirstTokenTimeout = modelcall.DefaultFirstTokenTimeout
	DefaultIdleTimeout       = modelcall.DefaultIdleTimeout
	DefaultMaxRetries        = modelcall.DefaultMaxRetries
	DefaultBackoffBase       = modelcall.DefaultBackoffBase
	DefaultBackoffMax        = modelcall.DefaultBackoffMax
	// DefaultReasoningSummary asks for the model's own choice of summary ("auto": the most detailed it offers).
	DefaultReasoningSummary = "auto"

	// The file bounds' defaults are lib/modelfiles's (written once there, for both OpenAI adapters).
	DefaultMaxFileBytes        = modelfiles.DefaultMaxFileBytes
	DefaultFileTimeout         = modelfiles.DefaultTimeout
	DefaultMaxRequestFileBytes = modelfiles.DefaultMaxRequestBytes
)

// ReasoningNone as Config.ReasoningSummary sends no reasoning settings and asks for no encrypted reasoning: for
// models that do not reason (the API refuses reasoning settings for them).
const ReasoningNone = "none"

// Config configures a Model. Zero values take the defaults above.
type Config struct {
	// BaseURL is the API root, e.g. "https://api.openai.com/v1/" or the offline model's "http://127.0.0.1:PORT/v1/".
	BaseURL string
	APIKey  string
	// Model is used when a request names none.
	Model string
	// EmbeddingModel is the model of Embed's vectors (DefaultEmbeddingModel).
	EmbeddingModel string
	// MaxOutputTokens is used when a request sets none.
	MaxOutputTokens int
	// ReasoningSummary is reasoning.summary ("auto", "concise", "detailed"; default DefaultReasoningSummary), or
	// ReasoningNone. ReasoningEffort is reasoning.effort ("minimal" … "high"; empty: the model's default).
	ReasoningSummary string
	ReasoningEffort  string
	// PromptCacheKey is sent as prompt_cache_key for a request that has no CacheKey of its own.
	PromptCacheKey string
	// FirstTokenTimeout bounds the wait from sending a request to its first event.
	FirstTokenTimeout time.Duration
	// IdleTimeout bounds the gap between two events after the first.
	IdleTimeout time.Duration
	// MaxRetries is the number of retries after the first attempt; 0 means DefaultMaxRetries, negative none.
	MaxRetries int
	// BackoffBase is the wait before the first retry; it doubles per retry up to BackoffMax, with jitter.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// HTTPClient sends the requests (default: a client with http.DefaultTransport's settings but for
	// DefaultMaxIdleConnsPerHost idle connections).
	HTTPClient *http.Client
	// FileClient downloads the PDFs a user message names by https URL, and older messages' images (default: a
	// client that connects to public addresses only); MaxFileBytes and FileTimeout bound each download, and
	// MaxRequestFileBytes the files of one request (files.go; package openai's defaults and rules).
	FileClient          *http.Client
	MaxFileBytes        int64
	FileTimeout         time.Duration
	MaxRequestFileBytes int64
	// Logger receives one warning per retry (default slog.Default()).
	Logger *slog.Logger
}

// DefaultMaxIdleConnsPerHost is how many idle connections the default client keeps to the provider: about one
// per reply streaming at once (as package openai).
const DefaultMaxIdleConnsPerHost = 256

// Model is the agent.Model adapter. It is safe for concurrent use.
type Model struct {
	openaiwire.Embedder // Embed, EmbeddingModel: the same root's POST embeddings, for the tool router

	cfg         Config
	endpoint    string
	endpointErr error
	files       *modelfiles.Resolver // a user message's files: downloads, bounds, the recent downloads kept
	plain       sync.Map             // model ids that refused reasoning settings (refusesReasoning) → true
	policy      modelcall.Policy     // the attempts' timeouts and retries
}

var _ agent.Model = (*Model)(nil)

// New returns a Model for cfg. It does not read the environment.
func New(cfg Config) *Model {
	if cfg.BaseURL == "" {
		cfg.BaseURL = DefaultBaseURL
	}
	if cfg.ReasoningSummary == "" {
		cfg.ReasoningSummary = DefaultReasoningSummary
	}
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	if cfg.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = DefaultMaxIdleConnsPerHost
		t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
		cfg.HTTPClient = &http.Client{Transport: t}
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

// Stream implements agent.Model.
func (m *Model) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	r, downloaded, err := m.request(ctx, req)
	if err != nil {
		return agent.ModelResult{}, err
	}
	body, err := encodeRequest(r)
	if err != nil {
		return agent.ModelResult{}, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode the model request")
	}
	res, err := m.policy.Run(ctx, func() (agent.ModelResult, *modelcall.Failure) {
		res, fail := m.attempt(ctx, body, emit)
		if fail != nil && r.Reasoning != nil && refusesReasoning(fail.Err) {
			// A model that does not reason (gpt-4.1, gpt-4o) refuses reasoning settings: sent again without them
			// at once (not a retry), and never again to this model.
			m.plain.Store(r.Model, true)
			m.cfg.Logger.InfoContext(ctx, "the model takes no reasoning settings; sending without them", "model", r.Model)
			r.Reasoning, r.Include = nil, nil
			var err error
			if body, err = encodeRequest(r); err != nil {
				return agent.ModelResult{}, &modelcall.Failure{Err: agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode the model request")}
			}
			return res, &modelcall.Failure{Again: true}
		}
		return res, fail
	})
	if err == nil {
		res.FileBytes = downloaded
	}
	return res, err
}

// refusesReasoning reports whether err is the provider's 400 for reasoning settings the model does not take
// ("Unsupported parameter: 'reasoning.effort' is not supported with this model.", param reasoning.effort, code
// unsupported_parameter; "Encrypted content is not supported with this model." for the include).
func refusesReasoning(err error) bool {
	var apiErr *apiError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest {
		return false
	}
	if strings.HasPrefix(apiErr.Param, "reasoning") || apiErr.Param == "include" {
		return apiErr.Code == "unsupported_parameter" || apiErr.Code == "unsupported_value" ||
			strings.Contains(apiErr.Message, "not supported with this model")
	}
	return strings.Contains(apiErr.Message, "Encrypted content is not supported with this model")
}

func (m *Model) attempt(ctx context.Context, body []byte, emit func(agent.ModelEvent) error) (agent.ModelResult, *modelcall.Failure) {
	at := m.policy.Start(ctx)
	defer at.End()
	acc := accumulator{Emitter: at.Emitter(emit)}
	stream, err := m.open(at.Ctx(), body)
	if err != nil {
		return acc.partial(), classify(at, err, false)
	}
	defer stream.Close()

	var ev event
	for {
		data, ok := stream.Next()
		if !ok || !at.Arrived() {
			break
		}
		if err := decodeEvent(data, &ev); err != nil {
			at.Pause()
			return acc.partial(), &modelcall.Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError,
				"the model provider sent a malformed event"), Retry: !acc.Emitted}
		}
		if err := acc.add(&ev); err != nil {
			return acc.partial(), &modelcall.Failure{Err: err}
		}
		if acc.failed != nil || acc.ended != nil {
			break // the response is over: whatever follows is not read
		}
		if !stream.Ready() {
			if err := acc.Release(); err != nil {
				return acc.partial(), &modelcall.Failure{Err: err}
			}
		}
		at.Waiting()
	}
	at.Pause()
	if at.CallerDone() {
		acc.Drop()
	} else if err := acc.Release(); err != nil {
		return acc.partial(), &modelcall.Failure{Err: err}
	}
	err = at.Err(stream.Err())
	if err == nil && acc.failed != nil {
		err = acc.failed
	}
	if err != nil {
		return acc.partial(), classify(at, err, acc.Emitted)
	}
	if acc.ended == nil {
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

// imageCodes are the provider's codes for an image of the message it could not download or read: the
// person's own error, not the provider's.
var imageCodes = map[string]bool{
	"invalid_image_url": true, "invalid_image_format": true, "invalid_image": true, "invalid_base64_image": true,
	"failed_to_download_image": true, "image_file_not_found": true, "unsupported_image_media_type": true,
	"empty_image_file": true, "image_parse_error": true,
}

// classify turns an attempt's error into an *agent.Error with a message safe for a user, and says whether it
// may be retried. What the provider said goes into the cause, for the logs only.
func classify(at *modelcall.Attempt, err error, emitted bool) *modelcall.Failure {
	if f := at.Ended(emitted); f != nil {
		return f
	}
	var apiErr *apiError
	if errors.As(err, &apiErr) {
		if apiErr.StatusCode == http.StatusBadRequest && imageCodes[apiErr.Code] {
			return &modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, apiErr.Message), agent.KindInvalid, agent.CodeFileUnavailable,
				"the model provider could not read an image of the message (HTTP 400)")}
		}
		return modelcall.HTTPStatus(modelcall.ProviderSaid(err, apiErr.Message), apiErr.StatusCode, apiErr.Response, emitted)
	}
	var sf *streamFailure
	if errors.As(err, &sf) {
		if imageCodes[sf.Code] {
			return &modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, sf.Message), agent.KindInvalid, agent.CodeFileUnavailable,
				"the model provider could not read an image of the message")}
		}
		transient := sf.Code == "server_error" || sf.Code == "rate_limit_exceeded"
		return &modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, sf.Message), agent.KindUnavailable, agent.CodeModelError,
			"the model provider failed mid-stream"), Retry: transient && !emitted}
	}
	return modelcall.ConnectionFailed(err, emitted)
}

// request builds the request; downloaded has the sizes of the files it downloaded, by URL.
func (m *Model) request(ctx context.Context, req agent.ModelRequest) (responsesRequest, map[string]int64, error) {
	model := req.Model
	if model == "" {
		model = m.cfg.Model
	}
	if model == "" {
		return responsesRequest{}, nil, agent.E(agent.KindInternal, agent.CodeModelError, "no model configured (AGENT_MODEL)")
	}
	maxTokens := req.MaxOutputTokens
	if maxTokens <= 0 {
		maxTokens = m.cfg.MaxOutputTokens
	}
	files, downloaded, err := m.files.Resolve(ctx, req.Messages)
	if err != nil {
		return responsesRequest{}, nil, err
	}
	input, err := inputItems(req.Messages, files)
	if err != nil {
		return responsesRequest{}, nil, err
	}
	p := responsesRequest{Model: model, Instructions: req.System, Input: input, MaxOutputTokens: maxTokens,
		Stream: true, Store: false, PromptCacheKey: cmp.Or(req.CacheKey, m.cfg.PromptCacheKey)}
	if _, plain := m.plain.Load(model); m.cfg.ReasoningSummary != ReasoningNone && !plain {
		p.Reasoning = &reasoning{Effort: m.cfg.ReasoningEffort, Summary: m.cfg.ReasoningSummary}
		p.Include = []string{includeEncryptedReasoning}
	}
	for _, t := range req.Tools {
		desc, params, err := openaiwire.Function(t)
		if err != nil {
			return responsesRequest{}, nil, err
		}
		p.Tools = append(p.Tools, tool{Type: "function", Name: t.Name, Description: desc, Parameters: params})
	}
	return p, downloaded, nil
}

// inputItems converts the provider-neutral transcript into input items; files has what each user message's
// files become (resolveFiles).
func inputItems(msgs []agent.ModelMessage, files map[int][]modelfiles.Sent) ([]any, error) {
	out := make([]any, 0, len(msgs))
	for i, msg := range msgs {
		switch msg.Role {
		case "user":
			out = append(out, messageItem{Type: "message", Role: "user", Content: userParts(msg, files[i])})
		case "assistant":
			if msg.Text != "" || len(msg.ToolCalls) > 0 {
				for _, r := range reasoningItems(msg.ReasoningData) {
					out = append(out, r)
				}
			}
			if msg.Text != "" || len(msg.ToolCalls) == 0 {
				out = append(out, messageItem{Type: "message", Role: "assistant",
					Content: []any{textPart{Type: "output_text", Text: msg.Text}}})
			}
			for _, c := range msg.ToolCalls {
				args := c.Arguments
				if strings.TrimSpace(args) == "" {
					args = "{}"
				}
				out = append(out, functionCallItem{Type: "function_call", CallID: c.ID, Name: c.Name, Arguments: args})
			}
		case "tool":
			out = append(out, functionCallOutputItem{Type: "function_call_output", CallID: msg.ToolCallID, Output: msg.Text})
		default:
			return nil, agent.E(agent.KindInternal, agent.CodeInternal, "message %d: unknown role %q", i, msg.Role)
		}
	}
	return out, nil
}

// reasoningItems reads ReasoningData as this adapter wrote it: a JSON array of reasoning items. Anything else
// (another adapter's data) yields none.
func reasoningItems(data json.RawMessage) []json.RawMessage {
	if len(data) == 0 {
		return nil
	}
	var items []json.RawMessage
	if json.Unmarshal(data, &items) != nil {
		return nil
	}
	out := items[:0]
	for _, it := range items {
		var probe struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(it, &probe) == nil && probe.Type == "reasoning" {
			out = append(out, it)
		}
	}
	return out
}
