// Package anthropic adapts agent.Model to Anthropic's Messages API with streaming: directly with an API key
// (POST {BaseURL}/v1/messages with x-api-key and anthropic-version; Config.BaseURL points tests at the offline
// model), or on Amazon Bedrock (Config.Bedrock: POST {endpoint}/model/{modelId}/invoke-with-response-stream,
// signed with SigV4 from the AWS configuration's credentials, e.g. the function's own IAM role; the offline
// model serves that route too).
//
// Like packages openai and openairesponses it speaks the wire itself with the standard library (wire.go, the SSE
// read by lib/sse, the attempts run by lib/modelcall; Bedrock's signing and event stream in bedrock.go, through
// the AWS SDK's signer and eventstream packages, which the functions link already), not through
// github.com/anthropics/anthropic-sdk-go. Measured on the chat Lambda's
// bootstrap as `make build-ChatFunction` builds it (linux/arm64, stripped): 17.83 MB without this adapter, 23.13
// MB with the SDK's version of it wired (+5.3 MB, 1.9 MB short of the 25 MB bound of
// functions/deploytest/footprint_test.go), 17.96 MB with this one (+131 KB), for a stream of eight event types of
// which the adapter reads a few fields.
//
// # Events
//
// One Stream call is one streamed message. Deltas are emitted as they arrive: text_delta as EventTextDelta,
// thinking_delta as EventReasoningDelta, and each tool_use block as EventToolCallStart (its id and name) then its
// input_json_delta fragments as EventToolCallDelta. Once the stream has ended with a stop reason, one EventToolCall
// per tool_use block goes out, in the order the model made them, with the whole input ("{}" when the model sent
// none); several tool_use blocks are parallel calls. ping events are skipped; an error event (overloaded_error
// and the like) or a Bedrock exception ends the attempt. ModelEvent.More is set on an event when the next one is
// already read (the direct API's next SSE event wholly in the read buffer; never on Bedrock, whose event stream
// is read a message at a time): the adapter holds each event until the next one or until it is about to wait.
//
// # Thinking and its replay
//
// Config.ThinkingBudget > 0 enables extended thinking with that budget (max_tokens is raised above it when it is
// not). The thinking and redacted_thinking blocks of a message are kept as Anthropic sent them, signatures
// included, as a JSON array in ModelResult.ReasoningData; an assistant ModelMessage whose ReasoningData holds such
// an array gets those blocks back first in its content, before its text and tool_use blocks, as the API requires
// of the assistant turn of a tool round when thinking is on. An array of anything else (another adapter's state)
// is ignored, as is ModelMessage.Reasoning (Anthropic takes thinking back only with its signature). A request
// that ends on a tool round whose assistant message has no thinking to replay (its calls came from another
// model: a switch or a failover mid-turn) is sent without thinking, which Anthropic would otherwise refuse.
//
// # Transcript
//
// The system prompt is the system parameter. Tool results become tool_result blocks of a user message right after
// the assistant message with their tool_use blocks; consecutive tool messages (and a user message that follows
// them) are merged into that one user message, so roles alternate as the API requires. A user message's files
// follow its text: an image as an image block, a PDF as a document block (title: the file's name), each with a
// base64 source for a data URL and a url source for an https URL (Anthropic fetches those itself). When
// Anthropic cannot download the file of an older message (an expired pre-signed URL), that file is sent as the
// line "[attachment NAME (TYPE) no longer available]" and the request again, so it does not fail every later turn
// of the thread; the newest message's is the person's own to fix (file_unavailable).
// ToolSpec.InputExamples are sent as the tool's input_examples.
//
// # Prompt cache
//
// Anthropic caches a prompt prefix only up to a cache_control breakpoint. Unless Config.NoPromptCache, each
// request has up to four (all Anthropic allows), ephemeral (5 minutes): on the last tool and on the system
// prompt, so tools and system are read from the cache across threads and turns; on the last block of the newest
// message of the stable prefix (the third message from the end: what the previous step or turn ended on, before
// the assistant's reply and the tool results or user message that follow it), which reads exactly what the
// previous request wrote, however many blocks the new content adds (Anthropic looks back only 20 blocks from a
// breakpoint); and on the last block of the last message, which writes the whole prompt for the next step or
// turn. Thinking blocks take none (the block before them does). The tools' input schemas go out as given, byte
// for byte, so the prefix stays stable. agent.ModelRequest.CacheKey is not sent: Anthropic has no such key (its cache
// is found by the prefix itself, per organization or AWS account).
//
// # Usage and finish
//
// Usage: InputTokens is the whole prompt (input_tokens + cache_read_input_tokens + cache_creation_input_tokens),
// CachedInputTokens the cache reads, CacheWriteTokens the cache writes, OutputTokens the output (thinking
// included), ReasoningTokens the thinking tokens when message_delta reports output_tokens_details. Stop reasons: end_turn, stop_sequence and pause_turn → stop; max_tokens and
// model_context_window_exceeded → length; tool_use → tool-calls; refusal → content-filter. ModelResult.Model is
// the model Anthropic reports in message_start.
//
// # Timeouts, retries, errors
//
// As every adapter, through lib/modelcall: Config.FirstTokenTimeout and Config.IdleTimeout bound the waits on
// the provider (code model_timeout); the call is retried, with backoff and jitter (honouring retry-after up to
// 30 s), on HTTP 429, 5xx and 529, on overloaded_error, rate_limit_error, api_error and
// timeout_error events (and Bedrock's throttling, service-unavailable, internal-server and model-not-ready
// exceptions), on connection failures, truncated streams and timeouts, and only while nothing has been
// emitted. A Bedrock request without AWS credentials fails at once (KindUnavailable, "no AWS credentials"). Errors are *agent.Error with a message safe to show a user (the provider's own text stays in the
// cause, for the logs): KindUnavailable with CodeModelError (e.g. "the model provider returned HTTP 400" for a
// refused request) or CodeModelTimeout; KindTooLarge with CodeMessageTooLarge when the prompt is over the model's
// context window ("prompt is too long"); KindInvalid with CodeFileUnavailable when Anthropic cannot download or
// read an image or document of the message; KindCanceled when ctx ends; KindInternal for a request that cannot be
// built. A refusal (stop_reason "refusal") is no error: the result's FinishReason is content-filter.
package anthropic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
	"github.com/agentloop/agentloop/lib/sse"
)

// Defaults for the zero values of Config.
const (
	DefaultBaseURL         = "https://api.anthropic.com"
	DefaultMaxOutputTokens = 8192
	// The attempts' timing and retries: lib/modelcall's defaults, the same for every adapter.
	DefaultFirstTokenTimeout = modelcall.DefaultFirstTokenTimeout
	DefaultIdleTimeout       = modelcall.DefaultIdleTimeout
	DefaultMaxRetries        = modelcall.DefaultMaxRetries
	DefaultBackoffBase       = modelcall.DefaultBackoffBase
	DefaultBackoffMax        = modelcall.DefaultBackoffMax

	// APIVersion is the anthropic-version header of a direct request.
	APIVersion = "2023-06-01"
	// BedrockVersion is the anthropic_version of a request on Bedrock.
	BedrockVersion = "bedrock-2023-05-31"
)

// DefaultMaxIdleConnsPerHost is how many idle connections the default client keeps to the provider: about one
// per reply streaming at once (as package openai).
const DefaultMaxIdleConnsPerHost = 256

// Config configures a Model. Zero values take the defaults above.
type Config struct {
	// APIKey is sent as x-api-key (direct API only).
	APIKey string
	// BaseURL is the API root (default DefaultBaseURL, or on Bedrock the region's runtime endpoint); tests point
	// it at the offline model, e.g. "http://127.0.0.1:PORT/" (the adapter adds "v1/messages"; a final "/v1" is
	// dropped, so the offline model's ".../v1/" works too).
	BaseURL string
	// Model is used when a request names none.
	Model string
	// MaxOutputTokens is used when a request sets none.
	MaxOutputTokens int
	// ThinkingBudget > 0 enables extended thinking with this many budget tokens.
	ThinkingBudget int
	// NoPromptCache leaves out the prompt cache breakpoints (see "Prompt cache").
	NoPromptCache bool
	// FirstTokenTimeout bounds the wait from sending a request to its first event; IdleTimeout the gap between
	// two events after it.
	FirstTokenTimeout time.Duration
	IdleTimeout       time.Duration
	// MaxRetries is the number of retries after the first attempt; 0 means DefaultMaxRetries, negative none.
	MaxRetries int
	// BackoffBase is the wait before the first retry; it doubles per retry up to BackoffMax, with jitter.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// HTTPClient sends the requests (default: a client with http.DefaultTransport's settings but for
	// DefaultMaxIdleConnsPerHost idle connections).
	HTTPClient *http.Client
	// Bedrock sends the requests to Amazon Bedrock (InvokeModelWithResponseStream) signed with SigV4 from AWS,
	// in Region (default: the configuration's). Model is then a Bedrock model id, e.g.
	// "anthropic.claude-sonnet-4-5-20250929-v1:0", or an inference profile's id or ARN.
	// BaseURL then points at Bedrock's runtime endpoint, or at the offline model (its /model/{id}/… routes).
	Bedrock bool
	Region  string
	// AWS is the AWS configuration Bedrock requests are signed with (default: loaded as the AWS SDK loads it,
	// from the environment and the function's role, once, in New).
	AWS *aws.Config
	// Logger receives one warning per retry (default slog.Default()).
	Logger *slog.Logger
}

// Model is the agent.Model adapter. It is safe for concurrent use.
type Model struct {
	cfg      Config
	policy   modelcall.Policy // the attempts' timeouts and retries
	endpoint string           // the direct API's messages URL, or Bedrock's endpoint
	aws      aws.Config
	signer   *v4.Signer
	initErr  error // the configuration cannot make a request: every request fails with it
}

var _ agent.Model = (*Model)(nil)

// New returns a Model for cfg. It reads no ANTHROPIC_* environment variable: every setting comes from cfg (on
// Bedrock, the AWS SDK's default configuration supplies credentials and region when cfg.AWS is nil).
func New(cfg Config) *Model {
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	pol := modelcall.Policy{FirstTokenTimeout: cfg.FirstTokenTimeout, IdleTimeout: cfg.IdleTimeout, MaxRetries: cfg.MaxRetries,
		BackoffBase: cfg.BackoffBase, BackoffMax: cfg.BackoffMax, Logger: cfg.Logger}.WithDefaults()
	cfg.FirstTokenTimeout, cfg.IdleTimeout, cfg.MaxRetries = pol.FirstTokenTimeout, pol.IdleTimeout, pol.MaxRetries
	cfg.BackoffBase, cfg.BackoffMax, cfg.Logger = pol.BackoffBase, pol.BackoffMax, pol.Logger
	if cfg.HTTPClient == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = DefaultMaxIdleConnsPerHost
		t.MaxIdleConnsPerHost = DefaultMaxIdleConnsPerHost
		cfg.HTTPClient = &http.Client{Transport: t}
	}
	m := &Model{cfg: cfg, policy: pol}
	if !cfg.Bedrock {
		m.endpoint, m.initErr = messagesURL(cmpOr(cfg.BaseURL, DefaultBaseURL))
		if m.initErr != nil {
			m.initErr = agent.Wrap(m.initErr, agent.KindInternal, agent.CodeModelError, "the Anthropic base URL is not a URL")
		}
		return m
	}
	awsCfg, err := loadAWS(cfg)
	switch {
	case err != nil:
		m.initErr = agent.Wrap(err, agent.KindInternal, agent.CodeModelError, "the AWS configuration for Bedrock could not be loaded")
	case awsCfg.Region == "":
		m.initErr = agent.E(agent.KindInternal, agent.CodeModelError, "no AWS region for Bedrock (the models file entry's region)")
	}
	m.aws, m.signer = awsCfg, v4.NewSigner()
	m.endpoint = cmpOr(cfg.BaseURL, bedrockEndpoint(awsCfg.Region))
	return m
}

func cmpOr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// messagesURL is the messages URL under base, without a final "/v1" of base: a base URL written the way OpenAI's
// are ("https://api.anthropic.com/v1", the offline model's ".../v1/") would otherwise ask for v1/v1/messages.
func messagesURL(base string) (string, error) {
	root := strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1")
	u, err := url.Parse(root)
	if err != nil {
		return "", err
	}
	if u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("%q is not an absolute URL", base)
	}
	return u.JoinPath("v1", "messages").String(), nil
}

// errTruncated is a stream that ended before message_stop.
var errTruncated = errors.New("the stream ended before message_stop")

// Stream implements agent.Model.
func (m *Model) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	if m.initErr != nil {
		return agent.ModelResult{}, m.initErr
	}
	p, err := m.request(req)
	if err != nil {
		return agent.ModelResult{}, err
	}
	model := p.Model
	if m.cfg.Bedrock {
		p.Model, p.AnthropicVersion = "", BedrockVersion // the model is in the path; the operation streams
	} else {
		p.Stream = true
	}
	body, err := encodeRequest(p)
	if err != nil {
		return agent.ModelResult{}, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode the model request")
	}
	return m.policy.Run(ctx, func() (agent.ModelResult, *modelcall.Failure) {
		res, fail := m.attempt(ctx, model, body, emit)
		if fail != nil && fail.fileAt != nil && dropStaleFile(p, *fail.fileAt) {
			// An older message's file that can no longer be downloaded (an expired pre-signed URL) fails
			// every later turn of the thread unless it is left out: it goes as a line, and the request again
			// at once (not a retry).
			m.cfg.Logger.WarnContext(ctx, "an older message's file could not be downloaded, sent as a line", "err", fail.Err)
			if body, err = encodeRequest(p); err != nil {
				return agent.ModelResult{}, &modelcall.Failure{Err: agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode the model request")}
			}
			return res, &modelcall.Failure{Again: true}
		}
		if fail != nil {
			return res, &fail.Failure
		}
		return res, nil
	})
}

// failure is a failed attempt, with the file the provider could not download when that is why.
type failure struct {
	modelcall.Failure
	fileAt *[2]int // message and block index
}

// open sends the request and returns its stream of events, or the provider's error answer (*apiError), or the
// transport's error.
func (m *Model) open(ctx context.Context, model string, body []byte) (eventReader, error) {
	if m.cfg.Bedrock {
		return m.openBedrock(ctx, model, body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Anthropic-Version", APIVersion)
	if m.cfg.APIKey != "" {
		req.Header.Set("X-Api-Key", m.cfg.APIKey)
	}
	res, err := m.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 400 {
		defer res.Body.Close()
		return nil, readAPIError(res)
	}
	return sse.NewReader(res.Body), nil
}

func (m *Model) attempt(ctx context.Context, model string, body []byte, emit func(agent.ModelEvent) error) (agent.ModelResult, *failure) {
	at := m.policy.Start(ctx)
	defer at.End()
	toCaller := func(ev agent.ModelEvent) error {
		if at.CallerDone() {
			return nil
		}
		return emit(ev)
	}
	acc := newAccumulator(toCaller, model)
	stream, err := m.open(at.Ctx(), model, body)
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
		ev = event{}
		if err := json.Unmarshal(data, &ev); err != nil {
			at.Pause()
			if err := acc.release(); err != nil {
				return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
			}
			return acc.partial(), &failure{Failure: modelcall.Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError,
				"the model provider sent a malformed event"), Retry: !acc.emitted}}
		}
		if err := acc.add(&ev); err != nil {
			at.Pause()
			var se *streamError
			if !errors.As(err, &se) {
				return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}} // emit's own error, returned unchanged
			}
			if err := acc.release(); err != nil {
				return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
			}
			return acc.partial(), classify(at, se, acc.emitted)
		}
		if acc.stopped {
			break // the message is over: whatever follows is not read
		}
		if !stream.Ready() {
			if err := acc.release(); err != nil { // the next event is not at hand: what is held goes now
				return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
			}
		}
		at.Waiting()
	}
	at.Pause()
	if at.CallerDone() {
		acc.pending = nil
	} else if !acc.stopped {
		if err := acc.release(); err != nil {
			return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
		}
	}
	err = at.Err(stream.Err())
	if err == nil && !acc.stopped {
		err = errTruncated
	}
	if err != nil {
		return acc.partial(), classify(at, err, acc.emitted)
	}
	if err := acc.finishCalls(); err != nil {
		return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
	}
	if err := acc.release(); err != nil {
		return acc.partial(), &failure{Failure: modelcall.Failure{Err: err}}
	}
	return acc.result(), nil
}

// classify turns an attempt's error into an *agent.Error with a message safe for a user, and says whether it
// may be retried. What the provider said goes into the cause, for the logs only.
func classify(at *modelcall.Attempt, err error, emitted bool) *failure {
	if f := at.Ended(emitted); f != nil {
		return &failure{Failure: *f}
	}
	var se *streamError
	if errors.As(err, &se) {
		return &failure{Failure: modelcall.Failure{Err: agent.Wrap(modelcall.ProviderSaid(err, se.Message), agent.KindUnavailable,
			agent.CodeModelError, "the model provider failed mid-stream"), Retry: transientTypes[se.Type] && !emitted}}
	}
	var apiErr *apiError
	if errors.As(err, &apiErr) {
		said := apiErr.Message
		cause := modelcall.ProviderSaid(err, said)
		switch {
		case apiErr.StatusCode == http.StatusBadRequest && contextTooLong.MatchString(said):
			return &failure{Failure: modelcall.Failure{Err: agent.Wrap(cause, agent.KindTooLarge, agent.CodeMessageTooLarge,
				"the conversation is too long for the model")}}
		case apiErr.StatusCode == http.StatusBadRequest && fileRefused.MatchString(said):
			f := &failure{Failure: modelcall.Failure{Err: agent.Wrap(cause, agent.KindInvalid, agent.CodeFileUnavailable,
				"the model provider could not read a file of the message (HTTP 400)")}}
			if at := blockPath.FindStringSubmatch(said); at != nil {
				i, _ := strconv.Atoi(at[1])
				j, _ := strconv.Atoi(at[2])
				f.fileAt = &[2]int{i, j}
			}
			return f
		}
		f := modelcall.HTTPStatus(cause, apiErr.StatusCode, apiErr.Response, emitted)
		f.Retry = f.Retry || (transientTypes[apiErr.Type] && !emitted)
		return &failure{Failure: *f}
	}
	if errors.Is(err, errNoCredentials) {
		return &failure{Failure: modelcall.Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "no AWS credentials to call Bedrock")}}
	}
	if errors.Is(err, errTruncated) {
		return &failure{Failure: *modelcall.Truncated(err, emitted)}
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		return &failure{Failure: modelcall.Failure{Err: err}}
	}
	// Below HTTP (refused or reset connections, a body cut mid-stream) or a malformed event stream.
	return &failure{Failure: *modelcall.ConnectionFailed(err, emitted)}
}

// transientTypes are the error types that may pass on retry: Anthropic's (of an error event or an error body),
// and Bedrock's exceptions (an event stream's names them in lower camel case, an error answer's header in
// upper).
var transientTypes = map[string]bool{"overloaded_error": true, "rate_limit_error": true, "api_error": true,
	"timeout_error": true, "throttlingException": true, "serviceUnavailableException": true,
	"internalServerException": true, "modelNotReadyException": true, "ThrottlingException": true,
	"ServiceUnavailableException": true, "InternalServerException": true, "ModelNotReadyException": true}

// contextTooLong matches the refusal of a prompt over the context window: Anthropic's and Bedrock's wording.
var contextTooLong = regexp.MustCompile(`(?i)prompt is too long|input is too long`)

// blockPath reads the message and block index of the block an Anthropic refusal names ("messages.3.content.1.image…").
var blockPath = regexp.MustCompile(`^messages\.(\d+)\.content\.(\d+)\.`)

// fileRefused matches Anthropic's refusals of an image or document it could not fetch or decode.
var fileRefused = regexp.MustCompile(`(?i)unable to download|could not process image|invalid image|could not process pdf|image exceeds`)
