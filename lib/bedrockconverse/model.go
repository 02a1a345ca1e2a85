// Package bedrockconverse adapts agent.Model to Amazon Bedrock's ConverseStream API, through
// github.com/aws/aws-sdk-go-v2/service/bedrockruntime: the one API for the Bedrock models that are not Anthropic's
// (Nova, Llama, Mistral, DeepSeek and the like). Requests are signed with SigV4 from the default AWS configuration
// (the environment, the function's own IAM role) in Config.Region; Config.BaseURL points tests at the offline
// model's POST /model/{modelId}/converse-stream.
//
// # Events
//
// One Stream call is one ConverseStream call. contentBlockDelta text is emitted as EventTextDelta,
// reasoningContent text as EventReasoningDelta, a toolUse contentBlockStart as EventToolCallStart (its id and
// name) and its input fragments as EventToolCallDelta. Once the stream has ended with messageStop, one
// EventToolCall per toolUse block goes out, in the order the model made them, with the whole input ("{}" when the
// model sent none); several toolUse blocks are parallel calls. ModelEvent.More is never set.
//
// # Reasoning and its replay
//
// The reasoningContent blocks of a reply (their text with its signature, or redacted content) are kept, as the
// model sent them, in ModelResult.ReasoningData as {"converse":[{"text","signature"} | {"redacted"}]}; an
// assistant ModelMessage whose ReasoningData holds that object gets them back as reasoningContent blocks first in
// its content. Anything else in ReasoningData (another adapter's state) is ignored, as is ModelMessage.Reasoning.
//
// # Transcript
//
// The system prompt is the system text block. Tool results become toolResult blocks of the user message right
// after the assistant message with their toolUse blocks; consecutive tool messages (and a user message that
// follows them) are merged into that one user message, so roles alternate as Bedrock requires. A user message's
// files follow its text: an image given as a data URL as an image block, a PDF as a document block (named after
// the file, in the characters Bedrock allows), both as bytes; a file named by an https URL (Converse takes bytes
// or S3 locations only) as the line "[attachment NAME (TYPE): URL]". Tools are toolSpec entries whose inputSchema
// json is the tool's parameters. A request that offers no tools (a title's) carries the history's tool calls and
// results as text lines, since Bedrock refuses toolUse and toolResult blocks without a toolConfig.
//
// # Prompt caching
//
// For the models Bedrock caches prompts of (PromptCaching: Amazon Nova, Anthropic Claude) a request carries two
// cache points: after the system prompt, and at the end of its last message, so that each step writes the
// transcript so far and the next step (the same messages, byte for byte, and more: package transcript prunes in
// blocks so that they are) reads it back; Claude's take a third after the tools (Nova caches no tools). The
// usage's cache reads and writes say what happened. Config.NoPromptCache leaves them out. A cache point before the
// model's minimum of tokens caches nothing and costs nothing.
//
// # Usage and finish
//
// Usage from the metadata event: InputTokens is the whole prompt (inputTokens + cacheReadInputTokens +
// cacheWriteInputTokens), CachedInputTokens the cache reads, CacheWriteTokens the cache writes, OutputTokens the
// output. Stop reasons: end_turn and stop_sequence → stop; tool_use → tool-calls; max_tokens and
// model_context_window_exceeded → length; content_filtered and guardrail_intervened → content-filter; anything
// else → other. ConverseStream does not name the model in its answer: ModelResult.Model is the model id the
// request was sent to.
//
// # Timeouts, retries, errors
//
// As in every adapter (lib/modelcall): Config.FirstTokenTimeout and Config.IdleTimeout bound the waits on the provider (code
// model_timeout); the SDK's own retries are off and this package retries, with backoff and jitter, on
// ThrottlingException, ServiceUnavailableException, ModelNotReadyException, InternalServerException and
// ModelStreamErrorException, HTTP 429 and 5xx, connection failures, truncated streams and timeouts, only while
// nothing has been emitted. Errors are *agent.Error with a message safe to show a user (what Bedrock said stays in
// the cause, for the logs): KindUnavailable with CodeModelError ("the model provider refused the request
// (ValidationException)") or CodeModelTimeout; KindTooLarge with CodeMessageTooLarge when a ValidationException
// says the input is over the model's context window; KindInvalid with CodeFileUnavailable when it says an image
// or document could not be read; AccessDeniedException (and a 403 of any kind: missing or bad credentials) is
// KindUnavailable with CodeModelError and a message that names the configuration ("the deployment may not call
// this model on Bedrock"), never retried; KindCanceled when ctx ends; KindInternal for a request that cannot be
// built or an AWS configuration that cannot be loaded.
package bedrockconverse

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime"
	"github.com/aws/aws-sdk-go-v2/service/bedrockruntime/schemas"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/transport/http/protocol/restjson1"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelcall"
	"github.com/agentloop/agentloop/lib/sdkhttp"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxOutputTokens = modelcall.DefaultMaxOutputTokens
	// The attempts' timing and retries: lib/modelcall's defaults, the same for every adapter.
	DefaultFirstTokenTimeout = modelcall.DefaultFirstTokenTimeout
	DefaultIdleTimeout       = modelcall.DefaultIdleTimeout
	DefaultMaxRetries        = modelcall.DefaultMaxRetries
	DefaultBackoffBase       = modelcall.DefaultBackoffBase
	DefaultBackoffMax        = modelcall.DefaultBackoffMax
)

// Config configures a Model. Zero values take the defaults above.
type Config struct {
	// Region is the Bedrock region (default: the AWS configuration's).
	Region string
	// BaseURL overrides Bedrock's regional endpoint; tests point it at the offline model's root,
	// e.g. "http://127.0.0.1:PORT/" (the SDK adds "model/{modelId}/converse-stream").
	BaseURL string
	// Model is the Bedrock model id (or inference profile) used when a request names none,
	// e.g. "amazon.nova-pro-v1:0".
	Model string
	// MaxOutputTokens is used when a request sets none.
	MaxOutputTokens int
	// NoPromptCache leaves the cache points out (see "Prompt caching").
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
	// HTTPClient sends the requests (default: the SDK's).
	HTTPClient *http.Client
	// AWS is the AWS configuration requests are signed with (default: loaded as the AWS SDK loads it, from the
	// environment and the function's role, once, in New). Tests give static credentials.
	AWS *aws.Config
	// Logger receives one warning per retry (default slog.Default()).
	Logger *slog.Logger
}

// Model is the agent.Model adapter. It is safe for concurrent use.
type Model struct {
	cfg     Config
	client  *bedrockruntime.Client
	initErr error            // the AWS configuration could not be loaded: every request fails with it
	policy  modelcall.Policy // the attempts' timeouts and retries
}

var _ agent.Model = (*Model)(nil)

// New returns a Model for cfg.
func New(cfg Config) *Model {
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pol := modelcall.Policy{FirstTokenTimeout: cfg.FirstTokenTimeout, IdleTimeout: cfg.IdleTimeout, MaxRetries: cfg.MaxRetries,
		BackoffBase: cfg.BackoffBase, BackoffMax: cfg.BackoffMax, Logger: cfg.Logger}.WithDefaults()
	awsCfg, err := loadAWS(cfg)
	if err != nil {
		return &Model{cfg: cfg, policy: pol, initErr: agent.Wrap(err, agent.KindInternal, agent.CodeModelError, "the AWS configuration for Bedrock could not be loaded")}
	}
	client := bedrockruntime.NewFromConfig(awsCfg, func(o *bedrockruntime.Options) {
		o.Retryer = aws.NopRetryer{} // retried here, only before the first event
		if cfg.BaseURL != "" {
			o.BaseEndpoint = aws.String(cfg.BaseURL)
		}
		if cfg.HTTPClient != nil {
			o.HTTPClient = cfg.HTTPClient
		}
		o.HTTPClient = sdkhttp.Wrap(o.HTTPClient) // attempts failed before their first event without it
	})
	return &Model{cfg: cfg, policy: pol, client: client}
}

// loadAWS is Config.AWS with Config.Region, or the default AWS configuration in Config.Region.
func loadAWS(cfg Config) (aws.Config, error) {
	if cfg.AWS != nil {
		c := cfg.AWS.Copy()
		if cfg.Region != "" {
			c.Region = cfg.Region
		}
		return c, nil
	}
	var load []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		load = append(load, awsconfig.WithRegion(cfg.Region))
	}
	return awsconfig.LoadDefaultConfig(context.Background(), load...)
}

// errTruncated is the cause of a stream that ended before messageStop.
var errTruncated = errors.New("the stream ended before messageStop")

// Stream implements agent.Model.
func (m *Model) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	if m.initErr != nil {
		return agent.ModelResult{}, m.initErr
	}
	in, err := m.input(req)
	if err != nil {
		return agent.ModelResult{}, err
	}
	return m.policy.Run(ctx, func() (agent.ModelResult, *modelcall.Failure) { return m.attempt(ctx, in, emit) })
}

func (m *Model) attempt(ctx context.Context, in *bedrockruntime.ConverseStreamInput, emit func(agent.ModelEvent) error) (agent.ModelResult, *modelcall.Failure) {
	at := m.policy.Start(ctx)
	defer at.End()
	acc := newAccumulator(emit, aws.ToString(in.ModelId))
	// returns once the answer's headers are in: the first-token clock runs. A protocol of the call's own: the
	// client's is shared by every call, and its event-stream codec decodes into one buffer (smithy-go v1.28.9), so
	// two streams read at once (a server's replies, an aborted attempt's reader and the next attempt) raced on it.
	out, err := m.client.ConverseStream(at.Ctx(), in, ownProtocol)
	if err != nil {
		return acc.partial(), classify(at, err, false)
	}
	stream := out.GetStream()
	defer stream.Close()
	for ev := range stream.Events() {
		if !at.Arrived() {
			break
		}
		if err := acc.add(ev); err != nil {
			return acc.partial(), &modelcall.Failure{Err: err}
		}
		at.Waiting()
	}
	at.Pause()
	err = at.Err(stream.Err())
	if err == nil && !acc.stopped {
		err = errTruncated
	}
	if err != nil {
		return acc.partial(), classify(at, err, acc.emitted)
	}
	if err := acc.finishCalls(); err != nil {
		return acc.partial(), &modelcall.Failure{Err: err}
	}
	return acc.result(), nil
}

// classify turns an attempt's error into an *agent.Error with a message safe for a user, and says whether it
// may be retried. What Bedrock said goes into the cause, for the logs only.
func classify(at *modelcall.Attempt, err error, emitted bool) *modelcall.Failure {
	if f := at.Ended(emitted); f != nil {
		return f
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		return &modelcall.Failure{Err: err}
	}
	if errors.Is(err, errTruncated) {
		return modelcall.Truncated(err, emitted)
	}
	if strings.Contains(err.Error(), "get identity: ") {
		// The AWS configuration holds no credentials (no role, no environment): nothing was sent.
		return &modelcall.Failure{Err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError,
			"the deployment has no AWS credentials to call the model on Bedrock")}
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var apiErr smithy.APIError
	if !errors.As(err, &apiErr) {
		if status >= 500 || status == http.StatusTooManyRequests {
			return modelcall.HTTPStatus(err, status, nil, emitted)
		}
		// Below HTTP (refused or reset connections, a body cut mid-stream) or a malformed event.
		return modelcall.ConnectionFailed(err, emitted)
	}
	code, said := apiErr.ErrorCode(), apiErr.ErrorMessage()
	cause := modelcall.ProviderSaid(err, said)
	switch {
	case code == "ValidationException" && contextTooLong.MatchString(said):
		return &modelcall.Failure{Err: agent.Wrap(cause, agent.KindTooLarge, agent.CodeMessageTooLarge, "the conversation is too long for the model")}
	case code == "ValidationException" && fileRefused.MatchString(said):
		return &modelcall.Failure{Err: agent.Wrap(cause, agent.KindInvalid, agent.CodeFileUnavailable,
			"the model provider could not read a file of the message (ValidationException)")}
	case code == "AccessDeniedException" || status == http.StatusForbidden || status == http.StatusUnauthorized:
		return &modelcall.Failure{Err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError,
			"the deployment may not call this model on Bedrock ("+safeCode(code)+"): check the model's access and the function's role")}
	case transientCodes[code] || status == http.StatusTooManyRequests || status >= 500:
		return &modelcall.Failure{Err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError,
			"the model provider failed ("+safeCode(code)+")"), Retry: !emitted}
	}
	return &modelcall.Failure{Err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError, "the model provider refused the request ("+safeCode(code)+")")}
}

// transientCodes are Bedrock's exceptions that may pass on retry, before a response or in the stream.
var transientCodes = map[string]bool{"ThrottlingException": true, "ServiceUnavailableException": true,
	"ModelNotReadyException": true, "InternalServerException": true, "ModelStreamErrorException": true}

// safeCode is an exception name fit for a user's eyes: letters only, else "error".
func safeCode(code string) string {
	if code == "" || len(code) > 64 || !exceptionName.MatchString(code) {
		return "error"
	}
	return code
}

var exceptionName = regexp.MustCompile(`^[A-Za-z]+$`)

// contextTooLong matches the refusals of a prompt over the context window, in the wordings Bedrock's models use.
var contextTooLong = regexp.MustCompile(`(?i)input is too long|prompt is too long|too many input tokens|input tokens exceed|` +
	`maximum context length|context window|too large for model`)

// fileRefused matches the refusals of an image or document Bedrock could not read.
var fileRefused = regexp.MustCompile(`(?i)could not process (image|document)|unable to process (image|document)|invalid image|` +
	`image exceeds|document exceeds|unsupported image|could not decode`)

// ownProtocol gives one call a protocol (and so an event-stream codec) of its own.
func ownProtocol(o *bedrockruntime.Options) {
	o.Protocol = restjson1.New(schemas.AmazonBedrockFrontendService)
}
