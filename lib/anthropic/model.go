// Package anthropic adapts agent.Model to Anthropic's Messages API with streaming, through
// github.com/anthropics/anthropic-sdk-go/v2: directly with an API key (Config.APIKey; Config.BaseURL points tests
// at the offline model's /v1/messages), or on Amazon Bedrock (Config.Bedrock: the SDK's bedrock package, SigV4
// with the default AWS credentials, e.g. the function's own IAM role; the offline model serves Bedrock's
// InvokeModel routes too).
//
// The SDK is large: a binary that already links lib/openai and the AWS SDK's configuration grows from 11.5 MB to
// 21.5 MB when it links this package (linux/amd64, not stripped; 8.5 MB of it for the SDK's Messages streaming
// alone). A Lambda should link it only when a models file can select it.
//
// # Events
//
// One Stream call is one streamed message. Deltas are emitted as they arrive: text_delta as EventTextDelta,
// thinking_delta as EventReasoningDelta, and each tool_use block as EventToolCallStart (its id and name) then its
// input_json_delta fragments as EventToolCallDelta. Once the stream has ended with a stop reason, one EventToolCall
// per tool_use block goes out, in the order the model made them, with the whole input ("{}" when the model sent
// none); several tool_use blocks are parallel calls. ModelEvent.More is never set: the SDK's stream does not say
// whether the next event is already at hand.
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
// request has two (of the four allowed), ephemeral (5 minutes): on the system prompt, so tools and system are
// read from the cache across threads, and on the last block of the last message, so each step writes the
// transcript and the next step or turn reads it back (Anthropic finds the longest cached prefix within 20 blocks
// before a breakpoint). The tools' input schemas go out as given, byte for byte, so the prefix stays stable.
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
// As in lib/openai: Config.FirstTokenTimeout and Config.IdleTimeout bound the waits on the provider (code
// model_timeout); the SDK's own retries are off and this package retries, with backoff and jitter (honouring
// retry-after up to 30 s), on HTTP 429, 5xx and 529, on overloaded_error, rate_limit_error, api_error and
// timeout_error events (and Bedrock's throttling, service-unavailable, internal-server and model-not-ready
// exceptions), on connection failures, truncated streams and timeouts, and only while nothing has been
// emitted. Errors are *agent.Error with a message safe to show a user (the provider's own text stays in the
// cause, for the logs): KindUnavailable with CodeModelError (e.g. "the model provider returned HTTP 400" for a
// refused request) or CodeModelTimeout; KindTooLarge with CodeMessageTooLarge when the prompt is over the model's
// context window ("prompt is too long"); KindInvalid with CodeFileUnavailable when Anthropic cannot download or
// read an image or document of the message; KindCanceled when ctx ends; KindInternal for a request that cannot be
// built. A refusal (stop_reason "refusal") is no error: the result's FinishReason is content-filter.
package anthropic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sdk "github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/bedrock"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxOutputTokens   = 8192
	DefaultFirstTokenTimeout = 120 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxRetries        = 2
	DefaultBackoffBase       = 500 * time.Millisecond
	DefaultBackoffMax        = 8 * time.Second

	// BedrockVersion is the anthropic_version of a request on Bedrock.
	BedrockVersion = "bedrock-2023-05-31"

	// maxRetryAfter bounds how long a provider's retry-after header can make us wait.
	maxRetryAfter = 30 * time.Second
)

// Config configures a Model. Zero values take the defaults above.
type Config struct {
	// APIKey is sent as x-api-key (direct API only).
	APIKey string
	// BaseURL is the API root (default Anthropic's, or Bedrock's regional endpoint); tests point it at the
	// offline model, e.g. "http://127.0.0.1:PORT/" (the SDK adds "v1/messages"; a final "/v1" is dropped, so
	// the offline model's ".../v1/" works too).
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
	// HTTPClient sends the requests (default: the SDK's).
	HTTPClient *http.Client
	// Bedrock sends the requests to Amazon Bedrock (InvokeModelWithResponseStream) signed with SigV4 from the
	// default AWS configuration (environment, the function's role), in Region (default: the configuration's).
	// Model is then a Bedrock model id, e.g. "anthropic.claude-sonnet-4-5-20250929-v1:0".
	// BaseURL then points at Bedrock's runtime endpoint, or at the offline model (its /model/{id}/invoke routes).
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
	cfg     Config
	client  sdk.MessageService
	initErr error // the AWS configuration could not be loaded: every request fails with it
}

var _ agent.Model = (*Model)(nil)

// New returns a Model for cfg. It reads no ANTHROPIC_* environment variable: every setting comes from cfg (on
// Bedrock, the AWS SDK's default configuration supplies credentials and region).
func New(cfg Config) *Model {
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	if cfg.FirstTokenTimeout <= 0 {
		cfg.FirstTokenTimeout = DefaultFirstTokenTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = DefaultMaxRetries
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffBase)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The Messages service alone, not sdk.NewClient: the client holds every API's service, and linking them
	// all cost the binary about 10 MB more. Given no environment defaults, it reads no ANTHROPIC_* variable.
	opts := []option.RequestOption{option.WithEnvironmentProduction(), option.WithMaxRetries(0)}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	var initErr error
	if cfg.Bedrock {
		awsCfg, err := loadAWS(cfg)
		if err != nil {
			initErr = agent.Wrap(err, agent.KindInternal, agent.CodeModelError, "the AWS configuration for Bedrock could not be loaded")
		}
		// The version Bedrock documents for the Messages body (the SDK would send its own API date).
		opts = append(opts, bedrock.WithConfig(awsCfg), option.WithJSONSet("anthropic_version", BedrockVersion))
	} else {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	if cfg.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(apiRoot(cfg.BaseURL)))
	}
	return &Model{cfg: cfg, client: sdk.NewMessageService(opts...), initErr: initErr}
}

// apiRoot is base without a final "/v1": the SDK adds "v1/messages", and a base URL written the way OpenAI's
// are ("https://api.anthropic.com/v1", the offline model's ".../v1/") would otherwise ask for v1/v1/messages.
func apiRoot(base string) string {
	return strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1") + "/"
}

// loadAWS is Config.AWS, or the default AWS configuration (bedrock.WithLoadDefaultConfig would panic on an error).
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

// The causes an attempt's context is cancelled with when the stream goes quiet.
var (
	errFirstTokenTimeout = errors.New("no first event within the first-token timeout")
	errIdleTimeout       = errors.New("no event within the idle timeout")
	errTruncated         = errors.New("the stream ended before message_stop")
)

// Stream implements agent.Model.
func (m *Model) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	if m.initErr != nil {
		return agent.ModelResult{}, m.initErr
	}
	params, err := m.params(req)
	if err != nil {
		return agent.ModelResult{}, err
	}
	for attempt := 0; ; attempt++ {
		res, fail := m.attempt(ctx, params, emit)
		if fail == nil {
			return res, nil
		}
		if fail.fileAt != nil && dropStaleFile(&params, *fail.fileAt) {
			// An older message's file that can no longer be downloaded (an expired pre-signed URL) fails
			// every later turn of the thread unless it is left out: it goes as a line, and the request again.
			m.cfg.Logger.WarnContext(ctx, "an older message's file could not be downloaded, sent as a line", "err", fail.err)
			attempt--
			continue
		}
		if !fail.retry || attempt >= m.cfg.MaxRetries {
			return res, fail.err
		}
		wait := m.backoff(attempt, fail.retryAfter)
		m.cfg.Logger.WarnContext(ctx, "model request failed, retrying", "attempt", attempt+1, "retry_in", wait, "err", fail.err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return agent.ModelResult{}, canceled(ctx)
		case <-t.C:
		}
	}
}

// failure is a failed attempt.
type failure struct {
	err        error
	retry      bool
	retryAfter time.Duration
	fileAt     *[2]int // the provider could not download this file: message and block index
}

// watchdog cancels an attempt whose stream goes quiet (as in lib/openai).
type watchdog struct {
	timer   *time.Timer
	idle    time.Duration
	started atomic.Bool
}

func newWatchdog(cancel context.CancelCauseFunc, first, idle time.Duration) *watchdog {
	w := &watchdog{idle: idle}
	w.timer = time.AfterFunc(first, func() {
		if w.started.Load() {
			cancel(errIdleTimeout)
		} else {
			cancel(errFirstTokenTimeout)
		}
	})
	return w
}

func (w *watchdog) arrived() bool {
	if !w.timer.Stop() {
		return false
	}
	w.started.Store(true)
	return true
}

func (w *watchdog) waiting() { w.timer.Reset(w.idle) }
func (w *watchdog) stop()    { w.timer.Stop() }

func (m *Model) attempt(ctx context.Context, params sdk.MessageNewParams, emit func(agent.ModelEvent) error) (agent.ModelResult, *failure) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dog := newWatchdog(cancel, m.cfg.FirstTokenTimeout, m.cfg.IdleTimeout)
	defer dog.stop()
	stream := m.client.NewStreaming(actx, params)
	defer stream.Close()
	acc := newAccumulator(emit, string(params.Model))
	timedOut := false
	for stream.Next() {
		if actx.Err() != nil {
			break
		}
		if !dog.arrived() {
			timedOut = true
			break
		}
		if err := acc.add(stream.Current()); err != nil {
			return acc.partial(), &failure{err: err}
		}
		dog.waiting()
	}
	dog.stop()
	err := stream.Err()
	if err == nil && actx.Err() != nil {
		err = context.Cause(actx)
	}
	if timedOut {
		<-actx.Done()
		err = context.Cause(actx)
	}
	if err == nil && !acc.stopped {
		err = errTruncated
	}
	if err != nil {
		return acc.partial(), m.classify(ctx, actx, err, acc.emitted)
	}
	if err := acc.finishCalls(); err != nil {
		return acc.partial(), &failure{err: err}
	}
	return acc.result(), nil
}

// classify turns an attempt's error into an *agent.Error with a message safe for a user, and says whether it
// may be retried. What the provider said goes into the cause, for the logs only.
func (m *Model) classify(ctx, actx context.Context, err error, emitted bool) *failure {
	if ctx.Err() != nil {
		return &failure{err: canceled(ctx)}
	}
	switch cause := context.Cause(actx); {
	case errors.Is(cause, errFirstTokenTimeout):
		msg := fmt.Sprintf("the model sent nothing within %s", m.cfg.FirstTokenTimeout)
		return &failure{err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelTimeout, msg), retry: !emitted}
	case errors.Is(cause, errIdleTimeout):
		msg := fmt.Sprintf("the model stream stalled for %s", m.cfg.IdleTimeout)
		return &failure{err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelTimeout, msg), retry: !emitted}
	}
	var apiErr *sdk.Error
	if errors.As(err, &apiErr) {
		said := providerMessage(apiErr)
		cause := providerSaid(err, said)
		typ := string(apiErr.Type())
		inStream := apiErr.StatusCode == http.StatusOK || apiErr.StatusCode == 0
		transient := apiErr.StatusCode == http.StatusTooManyRequests || apiErr.StatusCode >= 500 || transientTypes[typ]
		switch {
		case inStream:
			return &failure{err: agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError, "the model provider failed mid-stream"),
				retry: transient && !emitted}
		case apiErr.StatusCode == http.StatusBadRequest && contextTooLong.MatchString(said):
			return &failure{err: agent.Wrap(cause, agent.KindTooLarge, agent.CodeMessageTooLarge,
				"the conversation is too long for the model")}
		case apiErr.StatusCode == http.StatusBadRequest && fileRefused.MatchString(said):
			f := &failure{err: agent.Wrap(cause, agent.KindInvalid, agent.CodeFileUnavailable,
				"the model provider could not read a file of the message (HTTP 400)")}
			if at := blockPath.FindStringSubmatch(said); at != nil {
				i, _ := strconv.Atoi(at[1])
				j, _ := strconv.Atoi(at[2])
				f.fileAt = &[2]int{i, j}
			}
			return f
		}
		return &failure{
			err:        agent.Wrap(cause, agent.KindUnavailable, agent.CodeModelError, fmt.Sprintf("the model provider returned HTTP %d", apiErr.StatusCode)),
			retry:      transient && !emitted,
			retryAfter: retryAfter(apiErr.Response),
		}
	}
	if errors.Is(err, errTruncated) {
		return &failure{err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "the model stream ended before the model finished"),
			retry: !emitted}
	}
	var ae *agent.Error
	if errors.As(err, &ae) {
		return &failure{err: err}
	}
	// Below HTTP (refused or reset connections, a body cut mid-stream) or a malformed event.
	return &failure{err: agent.Wrap(err, agent.KindUnavailable, agent.CodeModelError, "the connection to the model provider failed"), retry: !emitted}
}

// transientTypes are the error types of a stream's error event that may pass on retry: Anthropic's, and the
// exceptions of Bedrock's event stream (the SDK names the event's type after the exception).
var transientTypes = map[string]bool{"overloaded_error": true, "rate_limit_error": true, "api_error": true,
	"timeout_error": true, "throttlingException": true, "serviceUnavailableException": true,
	"internalServerException": true, "modelNotReadyException": true}

// contextTooLong matches the refusal of a prompt over the context window: Anthropic's and Bedrock's wording.
var contextTooLong = regexp.MustCompile(`(?i)prompt is too long|input is too long`)

// blockPath reads the message and block index of the block an Anthropic refusal names ("messages.3.content.1.image…").
var blockPath = regexp.MustCompile(`^messages\.(\d+)\.content\.(\d+)\.`)

// fileRefused matches Anthropic's refusals of an image or document it could not fetch or decode.
var fileRefused = regexp.MustCompile(`(?i)unable to download|could not process image|invalid image|could not process pdf|image exceeds`)

// providerMessage is what the provider said: Anthropic's error.message, or the top-level message of Bedrock's
// error body ({"message": …}, its type in the x-amzn-ErrorType header), which the SDK does not read.
func providerMessage(e *sdk.Error) string {
	if e.Message != "" {
		return e.Message
	}
	var body struct {
		Message string `json:"message"`
	}
	if json.Unmarshal([]byte(e.RawJSON()), &body) == nil {
		return body.Message
	}
	return ""
}

// providerSaid keeps the provider's own message beside err for the logs, without any URL query (a pre-signed
// URL's is a credential).
func providerSaid(err error, said string) error {
	if said == "" {
		return err
	}
	return fmt.Errorf("%w (provider said: %s)", err, urlQuery.ReplaceAllString(said, "$1?…"))
}

var urlQuery = regexp.MustCompile(`(https?://[^\s?#]+)[?#]\S*`)

// canceled reports the end of ctx, keeping the code of an *agent.Error cause (e.g. a run timeout).
func canceled(ctx context.Context) error {
	cause := context.Cause(ctx)
	code := agent.CodeRunCanceled
	var ae *agent.Error
	if errors.As(cause, &ae) && ae.Code != "" {
		code = ae.Code
	}
	return &agent.Error{Kind: agent.KindCanceled, Code: code, Message: "model call canceled", Err: cause}
}

// retryAfter reads the provider's requested wait from retry-after-ms or retry-after (seconds).
func retryAfter(res *http.Response) time.Duration {
	if res == nil {
		return 0
	}
	if v, err := strconv.ParseFloat(res.Header.Get("Retry-After-Ms"), 64); err == nil && v > 0 {
		return min(time.Duration(v*float64(time.Millisecond)), maxRetryAfter)
	}
	if v, err := strconv.ParseFloat(res.Header.Get("Retry-After"), 64); err == nil && v > 0 {
		return min(time.Duration(v*float64(time.Second)), maxRetryAfter)
	}
	return 0
}

// backoff is the wait before retry number attempt+1: BackoffBase·2^attempt capped at BackoffMax, of which a
// random half is kept, never less than what the provider asked for.
func (m *Model) backoff(attempt int, providerWait time.Duration) time.Duration {
	d := m.cfg.BackoffBase << min(attempt, 20)
	if d <= 0 || d > m.cfg.BackoffMax {
		d = m.cfg.BackoffMax
	}
	d = d/2 + rand.N(d/2+1)
	return max(d, providerWait)
}
