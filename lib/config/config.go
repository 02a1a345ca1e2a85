// Package config reads every bound and setting from the environment, each with a named default, so the Lambda
// functions and `agentloop dev` share one set of overrides. It only reads values; wiring stays in the mains.
package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/openai"
)

// Defaults (DESIGN.md "Run lifecycle" and principle 6).
const (
	DefaultModel           = "gpt-4o-mini"
	DefaultMaxSteps        = 30
	DefaultRunTimeout      = 600 * time.Second
	DefaultToolTimeout     = 30 * time.Second
	DefaultHeartbeat       = time.Second
	DefaultStaleAfter      = 30 * time.Second
	DefaultSegmentFlush    = 500 * time.Millisecond
	DefaultMaxBodyBytes    = 5 << 20 // below the 6 MB function URL request limit
	DefaultMaxMessageBytes = 2 << 20
	DefaultContextBytes    = 400_000 // model context budget after pruning, in bytes of transcript text
	DefaultTokenTTL        = 24 * time.Hour
	DefaultReaperInterval  = 5 * time.Second // agentloop dev's ticker; in AWS an EventBridge schedule runs the reaper
	DefaultReaperBatch     = 100
)

// The model's defaults are the openai adapter's own, written once there; they are named here only so that
// every env variable's default can be read in one place.
const (
	DefaultMaxOutputTokens        = openai.DefaultMaxOutputTokens
	DefaultModelFirstTokenTimeout = openai.DefaultFirstTokenTimeout
	DefaultModelIdleTimeout       = openai.DefaultIdleTimeout
	DefaultModelRetries           = openai.DefaultMaxRetries
)

// Config is everything the handlers and the engine read from the environment.
type Config struct {
	Model           string // AGENT_MODEL
	OpenAIBaseURL   string // OPENAI_BASE_URL
	OpenAIAPIKey    string // OPENAI_API_KEY
	SystemPrompt    string // AGENT_SYSTEM_PROMPT
	MaxSteps        int    // AGENT_MAX_STEPS
	MaxOutputTokens int    // AGENT_MAX_OUTPUT_TOKENS

	// The model adapter's bounds and compatibility switches; lib/openai owns their defaults. The first-token
	// timeout keeps AGENT_MODEL_TIMEOUT, its name from when it bounded the whole stream; nothing bounds the whole
	// stream now but the run's wall clock. OPENAI_MAX_TOKENS_FIELD is not "..._PARAM": that suffix names SSM
	// parameters here.
	ModelFirstTokenTimeout time.Duration // AGENT_MODEL_TIMEOUT
	ModelIdleTimeout       time.Duration // AGENT_MODEL_IDLE_TIMEOUT
	ModelRetries           int           // AGENT_MODEL_RETRIES (0: none)
	ModelMaxTokensField    string        // OPENAI_MAX_TOKENS_FIELD: max_completion_tokens (default), max_tokens, none
	ModelStreamUsage       bool          // OPENAI_STREAM_USAGE: false leaves stream_options out (default true)

	RunTimeout      time.Duration // AGENT_RUN_TIMEOUT
	ToolTimeout     time.Duration // AGENT_TOOL_TIMEOUT
	Heartbeat       time.Duration // AGENT_HEARTBEAT
	StaleAfter      time.Duration // AGENT_STALE_AFTER
	SegmentFlush    time.Duration // AGENT_SEGMENT_FLUSH
	ReaperInterval  time.Duration // AGENT_REAPER_INTERVAL
	ReaperBatch     int           // AGENT_REAPER_BATCH
	MaxBodyBytes    int64         // AGENT_MAX_BODY_BYTES
	MaxMessageBytes int           // AGENT_MAX_MESSAGE_BYTES
	ContextBytes    int           // AGENT_CONTEXT_BYTES
	Secret          string        // AGENT_SECRET: the application secret (HS256 JWT key and HKDF root)
	JWTIssuer       string        // AGENT_JWT_ISSUER (optional check)
	JWTAudience     string        // AGENT_JWT_AUDIENCE (optional check)
	LogLevel        string        // AGENT_LOG_LEVEL: debug|info|warn|error

	// Lambda wiring. The functions read the two secrets from SSM SecureString parameters named here; the plain
	// AGENT_SECRET and OPENAI_API_KEY above are fallbacks for local runs and tests, used only when the
	// parameter name is unset.
	TableName         string // TABLE_NAME: the DynamoDB table
	SecretParam       string // AGENT_SECRET_PARAM: SSM parameter holding the application secret
	OpenAIAPIKeyParam string // OPENAI_API_KEY_PARAM: SSM parameter holding the OpenAI API key
}

// SecretEnv names the variables that carry a secret in plain text. A deployment template must never set them:
// in Lambda the secrets come from SSM (SecretParam, OpenAIAPIKeyParam).
func SecretEnv() []string { return []string{"AGENT_SECRET", "OPENAI_API_KEY"} }

// FromEnv reads the process environment.
func FromEnv() (Config, error) { return Load(os.Getenv) }

// Load reads settings through getenv, so tests need no process environment.
func Load(getenv func(string) string) (Config, error) {
	c := Config{
		Model:         strOr(getenv("AGENT_MODEL"), DefaultModel),
		OpenAIBaseURL: getenv("OPENAI_BASE_URL"),
		OpenAIAPIKey:  getenv("OPENAI_API_KEY"),
		SystemPrompt:  getenv("AGENT_SYSTEM_PROMPT"),
		Secret:        getenv("AGENT_SECRET"),
		JWTIssuer:     getenv("AGENT_JWT_ISSUER"),
		JWTAudience:   getenv("AGENT_JWT_AUDIENCE"),
		LogLevel:      strOr(getenv("AGENT_LOG_LEVEL"), "info"),

		TableName:         strings.TrimSpace(getenv("TABLE_NAME")),
		SecretParam:       strings.TrimSpace(getenv("AGENT_SECRET_PARAM")),
		OpenAIAPIKeyParam: strings.TrimSpace(getenv("OPENAI_API_KEY_PARAM")),
	}
	var errs []string
	intVar := func(name string, def int, dst *int) {
		*dst = def
		if v := strings.TrimSpace(getenv(name)); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a non-negative integer", name, v))
				return
			}
			*dst = n
		}
	}
	durVar := func(name string, def time.Duration, dst *time.Duration) {
		*dst = def
		if v := strings.TrimSpace(getenv(name)); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a positive duration such as 30s", name, v))
				return
			}
			*dst = d
		}
	}
	intVar("AGENT_MAX_STEPS", DefaultMaxSteps, &c.MaxSteps)
	intVar("AGENT_MAX_OUTPUT_TOKENS", DefaultMaxOutputTokens, &c.MaxOutputTokens)
	intVar("AGENT_MODEL_RETRIES", DefaultModelRetries, &c.ModelRetries)
	intVar("AGENT_MAX_MESSAGE_BYTES", DefaultMaxMessageBytes, &c.MaxMessageBytes)
	intVar("AGENT_CONTEXT_BYTES", DefaultContextBytes, &c.ContextBytes)
	var body int
	intVar("AGENT_MAX_BODY_BYTES", DefaultMaxBodyBytes, &body)
	c.MaxBodyBytes = int64(body)
	durVar("AGENT_MODEL_TIMEOUT", DefaultModelFirstTokenTimeout, &c.ModelFirstTokenTimeout)
	durVar("AGENT_MODEL_IDLE_TIMEOUT", DefaultModelIdleTimeout, &c.ModelIdleTimeout)
	switch v := strings.TrimSpace(getenv("OPENAI_MAX_TOKENS_FIELD")); v {
	case "", openai.MaxCompletionTokens, openai.MaxTokens, openai.MaxTokensNone:
		c.ModelMaxTokensField = v
	default:
		errs = append(errs, fmt.Sprintf("OPENAI_MAX_TOKENS_FIELD=%q: want %s, %s or %s", v,
			openai.MaxCompletionTokens, openai.MaxTokens, openai.MaxTokensNone))
	}
	c.ModelStreamUsage = true
	if v := strings.TrimSpace(getenv("OPENAI_STREAM_USAGE")); v != "" {
		if b, err := strconv.ParseBool(v); err == nil {
			c.ModelStreamUsage = b
		} else {
			errs = append(errs, fmt.Sprintf("OPENAI_STREAM_USAGE=%q: want true or false", v))
		}
	}
	durVar("AGENT_RUN_TIMEOUT", DefaultRunTimeout, &c.RunTimeout)
	durVar("AGENT_TOOL_TIMEOUT", DefaultToolTimeout, &c.ToolTimeout)
	durVar("AGENT_HEARTBEAT", DefaultHeartbeat, &c.Heartbeat)
	durVar("AGENT_STALE_AFTER", DefaultStaleAfter, &c.StaleAfter)
	durVar("AGENT_SEGMENT_FLUSH", DefaultSegmentFlush, &c.SegmentFlush)
	durVar("AGENT_REAPER_INTERVAL", DefaultReaperInterval, &c.ReaperInterval)
	intVar("AGENT_REAPER_BATCH", DefaultReaperBatch, &c.ReaperBatch)
	if c.MaxSteps == 0 {
		errs = append(errs, "AGENT_MAX_STEPS must be at least 1")
	}
	if c.Heartbeat >= c.StaleAfter {
		errs = append(errs, "AGENT_HEARTBEAT must be shorter than AGENT_STALE_AFTER")
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

func strOr(v, def string) string {
	if strings.TrimSpace(v) == "" {
		return def
	}
	return v
}

// Engine is the engine's share of the configuration; model is the model name actually used (the offline model
// overrides AGENT_MODEL in `agentloop dev`).
func (c Config) Engine(model string) engine.Config {
	return engine.Config{Model: model, System: c.SystemPrompt, MaxSteps: c.MaxSteps, MaxOutputTokens: c.MaxOutputTokens,
		RunTimeout: c.RunTimeout, ToolTimeout: c.ToolTimeout, Heartbeat: c.Heartbeat, StaleAfter: c.StaleAfter,
		SegmentFlush: c.SegmentFlush, ContextBytes: c.ContextBytes, MaxMessageBytes: c.MaxMessageBytes}
}

// OpenAI is the openai adapter's share of the configuration. baseURL, apiKey and model are passed in because
// the caller decides them: the key comes from SSM in Lambda, and `agentloop dev` points at the offline model.
func (c Config) OpenAI(baseURL, apiKey, model string) openai.Config {
	return openai.Config{
		BaseURL: baseURL, APIKey: apiKey, Model: model, MaxOutputTokens: c.MaxOutputTokens,
		FirstTokenTimeout: c.ModelFirstTokenTimeout, IdleTimeout: c.ModelIdleTimeout, MaxRetries: c.AdapterRetries(),
		MaxTokensParam: c.ModelMaxTokensField, OmitStreamOptions: !c.ModelStreamUsage,
	}
}

// AdapterRetries is ModelRetries in the openai adapter's terms, where 0 means its default and a negative
// number means none (here 0 means none).
func (c Config) AdapterRetries() int {
	if c.ModelRetries == 0 {
		return -1
	}
	return c.ModelRetries
}
