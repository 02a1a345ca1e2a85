// Package config maps environment variables onto the components' configurations, so the Lambda functions and
// `agentloop dev` share one set of overrides. It has no numbers of its own: an unset variable leaves the field
// zero, and zero means "the owning component's default" everywhere (the defaults are written once, beside their
// owners: engine, transcript, segments, reaper, threads, httpapi, openai, toolrouter). It only reads values; wiring stays
// in the mains and lib/devserver.
package config

import (
	"cmp"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/drain"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/openairesponses"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/titles"
	"github.com/agentloop/agentloop/lib/toolrouter"
	"github.com/agentloop/agentloop/lib/toolsfile"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/webhooks"
)

// Defaults that belong to no component but the deployment itself.
const (
	DefaultModel    = "gpt-4o-mini"
	DefaultTokenTTL = 24 * time.Hour
)

// Config is everything the handlers and the engine read from the environment. Zero means the owner's default.
type Config struct {
	// Model is AGENT_MODEL: the provider's model id, or, with a models file, the name of its default entry (the
	// first entry when unset).
	Model string
	// ModelsFile is AGENT_MODELS_FILE: the models file (lib/modelsfile, YAML or JSON), a path, a relative one read
	// from the deployment package's root (LAMBDA_TASK_ROOT) when set; Models is that file, read and checked by
	// Load (its keys' references are resolved by the wiring at cold start). Unset: one OpenAI-compatible model,
	// AGENT_MODEL at OPENAI_BASE_URL, as before models files.
	ModelsFile string
	Models     *modelsfile.File
	// SubagentModel is AGENT_SUBAGENT_MODEL: the research sub-agent's model ("": the main model's). With a models
	// file, an entry's name (Load fills the default's when unset).
	SubagentModel string
	// TitleModel is AGENT_TITLE_MODEL: the model that titles threads ("": the main model's; lib/titles). With a
	// models file, an entry's name (Load fills the default's when unset).
	TitleModel string
	// TitlesOff is AGENT_TITLES=off: threads keep their first message as title, and no title model is asked.
	TitlesOff bool
	// TitleTimeout is AGENT_TITLE_TIMEOUT: how long one title may take, the model call and the write
	// (titles.DefaultTimeout).
	TitleTimeout     time.Duration
	OpenAIBaseURL    string        // OPENAI_BASE_URL
	OpenAIAPIKey     string        // OPENAI_API_KEY
	SystemPrompt     string        // AGENT_SYSTEM_PROMPT, or the file AGENT_SYSTEM_PROMPT_FILE (any size)
	MaxSteps         int           // AGENT_MAX_STEPS
	MaxOutputTokens  int           // AGENT_MAX_OUTPUT_TOKENS
	ModelTimeout     time.Duration // AGENT_MODEL_TIMEOUT: time to the first token
	ModelIdleTimeout time.Duration // AGENT_MODEL_IDLE_TIMEOUT: longest gap between two tokens
	ModelRetries     *int          // AGENT_MODEL_RETRIES (0 means none; unset means the adapter's default)
	// OPENAI_MAX_TOKENS_FIELD: max_completion_tokens (default), max_tokens or none, for OpenAI-compatible servers
	// that refuse the newer field. (Not "..._PARAM": that suffix names SSM parameters here.)
	ModelMaxTokensField  string
	ModelOmitStreamUsage bool          // OPENAI_STREAM_USAGE=false leaves stream_options out, for servers that refuse it
	ModelFileMaxBytes    int           // AGENT_MODEL_FILE_MAX_BYTES: a PDF the adapter downloads for the model
	ModelFileTimeout     time.Duration // AGENT_MODEL_FILE_TIMEOUT: one such download
	ModelFilesMaxBytes   int           // AGENT_MODEL_FILES_MAX_BYTES: the files of one model request, decoded
	RunTimeout           time.Duration // AGENT_RUN_TIMEOUT
	HandOverMargin       time.Duration // AGENT_HANDOVER_MARGIN: a run hands over this long before its invocation's deadline
	RequestDeadline      time.Duration // AGENT_REQUEST_DEADLINE: dev and serve only, each POST /chat's invocation deadline (httpapi.Deps.RequestDeadline)
	ToolTimeout          time.Duration // AGENT_TOOL_TIMEOUT
	StoreTimeout         time.Duration // AGENT_STORE_TIMEOUT: one DynamoDB request attempt (dynamo.DefaultRequestTimeout)
	Heartbeat            time.Duration // AGENT_HEARTBEAT
	StaleAfter           time.Duration // AGENT_STALE_AFTER
	CancelPoll           time.Duration // AGENT_CANCEL_POLL: accepted, unused (engine.DefaultCancelPoll)
	SegmentFlush         time.Duration // AGENT_SEGMENT_FLUSH
	ResumePollMax        time.Duration // AGENT_RESUME_POLL_MAX
	SegmentHurry         time.Duration // AGENT_SEGMENT_HURRY
	ResumePollAttached   time.Duration // AGENT_RESUME_POLL_ATTACHED
	ReaderPresence       time.Duration // AGENT_READER_PRESENCE
	ReaderProbe          time.Duration // AGENT_READER_PROBE: 0 means no probe (stored here as -1, the engine's "none")
	InterruptTTL         time.Duration // AGENT_INTERRUPT_TTL: how long an approval or client tool waits
	ReaperInterval       time.Duration // AGENT_REAPER_INTERVAL
	ReaperBatch          int           // AGENT_REAPER_BATCH
	MaxQueued            int           // AGENT_MAX_QUEUED: a thread's queue bound (multitask enqueue)
	// Per-user limits. The env value 0 means no limit (stored here as -1, the components' "none"); unset means
	// the component's default.
	MaxActiveRunsPerUser int           // AGENT_MAX_ACTIVE_RUNS_PER_USER
	ThreadsPerMinute     int           // AGENT_THREADS_PER_MINUTE
	MaxStreamsPerUser    int           // AGENT_MAX_STREAMS_PER_USER
	MaxStreamsPerRun     int           // AGENT_MAX_STREAMS_PER_RUN
	RunLeaseTTL          time.Duration // AGENT_RUN_LEASE_TTL: how long a dead run's slot stays taken
	MaxToolCallsPerStep  int           // AGENT_MAX_TOOL_CALLS_PER_STEP: the tool calls of one model step that run
	MaxJobsPerRun        int           // AGENT_MAX_JOBS_PER_RUN: the sub-agent jobs one run dispatches
	MaxJobChain          int           // AGENT_MAX_JOB_CHAIN: server-side turns in a row that may dispatch jobs
	MaxActiveJobsPerUser int           // AGENT_MAX_ACTIVE_JOBS_PER_USER: sub-agent jobs one user has going at once
	// Admission control (lib/engine admission.go): 0 means no bound, as for the per-user limits.
	MaxRunsPerProcess int           // AGENT_MAX_RUNS_PER_PROCESS: runs one process runs at once
	MaxHeartbeatLag   time.Duration // AGENT_MAX_HEARTBEAT_LAG: how far the runs' heartbeats may fall behind
	StreamLeaseTTL    time.Duration // AGENT_STREAM_LEASE_TTL: how long a dead reader's lease stays taken
	// SQLite group commit (lib/sqlite batch.go; the local stack only: the functions never open SQLite, so this
	// package maps the names and lib/devserver hands them to sqlite.OpenWith).
	SQLiteBatchWrites int   // AGENT_SQLITE_BATCH_WRITES: the writes one transaction runs at most
	SQLiteBatchBytes  int   // AGENT_SQLITE_BATCH_BYTES: the bytes one transaction's writes bind, past which the rest wait
	PageBytes         int   // AGENT_PAGE_BYTES: a page of GET /threads/{id} messages, encoded
	MaxBodyBytes      int64 // AGENT_MAX_BODY_BYTES
	MaxMessageBytes   int   // AGENT_MAX_MESSAGE_BYTES
	MaxMessageParts   int   // AGENT_MAX_MESSAGE_PARTS: parts of a user message
	ContextBytes      int   // AGENT_CONTEXT_BYTES
	ContextTokens     int   // AGENT_CONTEXT_TOKENS: the model's context budget (the smaller of the two wins)
	// ContextBlockTokens is AGENT_CONTEXT_BLOCK_TOKENS: the step by which pruning moves its cutoff, so that the
	// prompt's prefix stays cached (transcript.DefaultBlockPercent of the budget when unset; 1 prunes every step).
	ContextBlockTokens  int
	ToolOutputBytes     int           // AGENT_TOOL_OUTPUT_BYTES
	Secret              string        // AGENT_SECRET: the application secret (HS256 JWT key and HKDF root)
	JWTIssuer           string        // AGENT_JWT_ISSUER (optional check)
	JWTAudience         string        // AGENT_JWT_AUDIENCE (optional check)
	JWTMaxAge           time.Duration // AGENT_JWT_MAX_AGE: when set, tokens need an iat at most this old (auth.Config.MaxAge)
	JWKSURL             string        // AGENT_JWKS_URL: an identity provider's JWKS (https): its RS256/ES256 tokens are accepted too
	JWTSubjectClaim     string        // AGENT_JWT_SUBJECT_CLAIM: the claim naming the user ("" means sub)
	ChatURL             string        // AGENT_CHAT_URL: the chat function's URL, for the web app the API function serves
	ChatFunction        string        // AGENT_CHAT_FUNCTION: the chat function's name, which the reaper function invokes to continue handed-over runs
	LogLevel            string        // AGENT_LOG_LEVEL: debug|info|warn|error
	PprofAddr           string        // AGENT_PPROF_ADDR: `agentloop dev` only: net/http/pprof there (unset: none)
	TableName           string        // TABLE_NAME: the DynamoDB table
	SecretParam         string        // AGENT_SECRET_PARAM: SSM parameter holding the application secret
	OpenAIAPIKeyParam   string        // OPENAI_API_KEY_PARAM: SSM parameter holding the OpenAI API key
	JobsStateMachineARN string        // JOBS_STATE_MACHINE_ARN: the job state machine (set on the functions that start executions)
	// DynamoEndpoint is AGENTLOOP_DYNAMO_ENDPOINT: `agentloop serve` only, a DynamoDB-compatible endpoint (dynalite)
	// instead of the region's DynamoDB; the tests read the same name (lib/dynamo/dynamotest).
	DynamoEndpoint string
	// DrainGrace is AGENT_DRAIN_GRACE: `agentloop serve` only, how long a SIGTERM lets the runs finish before
	// stopping them (drain.DefaultGrace).
	DrainGrace time.Duration
	// ToolsFile is AGENT_TOOLS_FILE: the tools file (lib/toolsfile: MCP servers and HTTP tools, YAML or JSON),
	// as a path, a relative one read from the deployment package's root (LAMBDA_TASK_ROOT) when set, or as
	// ssm:<parameter name> (toolsfile.SSMSource; a name that starts with "/", e.g. ssm:/agentloop/tools), the
	// file kept whole in that SSM parameter (the template's ToolsFileParameterName grants ssm:GetParameter on it).
	// The wiring reads and checks it at cold start.
	ToolsFile string
	// ToolsSecretsPath is AGENT_TOOLS_SECRETS_PATH: the SSM path (a prefix such as /agentloop/tools/, starting and
	// ending with "/") under which the tools file's ${ssm:…} references must lie, the parameters the functions'
	// roles may read (the template's ToolsSecretsPath grants ssm:GetParameters on <path>*). Empty: none; in
	// Lambda a tools file with an ${ssm:…} reference then fails the cold start, naming its line.
	ToolsSecretsPath string
	// ModelKeysPath is AGENT_MODEL_KEYS_PATH: an SSM path (starting and ending with "/") under which the models
	// file's ${ssm:…} keys may lie besides OPENAI_API_KEY_PARAM's parameter (the template's ModelKeysPath grants
	// ssm:GetParameters on <path>* to the functions that ask a model), so an OpenAI and an Anthropic key can both
	// come from SSM. Empty: only OPENAI_API_KEY_PARAM's parameter.
	ModelKeysPath string
	// The tool router (lib/toolrouter): a catalog above ToolRouterMin tools offers each step a subset.
	ToolRouterMin        int     // AGENT_TOOL_ROUTER_MIN: the largest catalog offered whole (0: route every catalog; stored -1)
	ToolRouterTopK       int     // AGENT_TOOL_ROUTER_TOP_K: the keyword matches a step offers at most
	ToolRouterMinMatches int     // AGENT_TOOL_ROUTER_MIN_MATCHES: below this many keyword matches the embedding fallback fills up
	ToolRouterThreshold  float64 // AGENT_TOOL_ROUTER_THRESHOLD: the BM25 score a keyword match needs (0: none; stored -1)
	ToolRouterSimilarity float64 // AGENT_TOOL_ROUTER_SIMILARITY: the cosine similarity the embedding fallback needs (0: none; stored -1)
	EmbeddingModel       string  // AGENT_EMBEDDING_MODEL: the provider's embeddings model (openai.DefaultEmbeddingModel)
	// The router's backoff after a failed embeddings call, and how long a cached tool vector no catalog uses is kept.
	ToolRouterCoolDown    time.Duration // AGENT_TOOL_ROUTER_COOL_DOWN: the first wait
	ToolRouterMaxCoolDown time.Duration // AGENT_TOOL_ROUTER_MAX_COOL_DOWN: the longest wait
	ToolRouterVectorTTL   time.Duration // AGENT_TOOL_ROUTER_VECTOR_TTL
	// Prices is the price table (agent.ParsePrices) from AGENT_PRICES (the JSON itself) or AGENT_PRICES_FILE (a
	// path to it); not both. Empty: usage carries no cost.
	Prices agent.Prices
	// Metrics is AGENT_METRICS: "emf" writes CloudWatch Embedded Metric Format documents to stdout, "off" writes
	// none; "" is the runtime's default (emf in Lambda, off in `agentloop dev`).
	Metrics string
	// MetricsNamespace is AGENT_METRICS_NAMESPACE, the CloudWatch namespace ("" is emf.DefaultNamespace).
	MetricsNamespace string
	// Completion signals (lib/signals; README "Completion signals"): an agentloop.run.finished event on the
	// default EventBridge bus (the log in `agentloop dev`) and, with WebhookURL, a signed webhook, whenever a run
	// ends. SignalsOff is AGENT_SIGNALS=off: none of them.
	SignalsOff bool
	// WebhookURL is AGENT_WEBHOOK_URL: where the webhook POSTs go (https; http only to localhost or a loopback
	// address). Empty: no webhook.
	WebhookURL string
	// WebhookSecret is AGENT_WEBHOOK_SECRET ("whsec_" + base64 of the key), the plain fallback outside AWS;
	// WebhookSecretParam is AGENT_WEBHOOK_SECRET_PARAM, the SSM parameter holding it (read only with a WebhookURL).
	WebhookSecret      string
	WebhookSecretParam string
	SignalBackoff      time.Duration // AGENT_SIGNAL_BACKOFF: the first retry's wait, doubled each time (signals.DefaultBackoff)
	SignalMaxBackoff   time.Duration // AGENT_SIGNAL_MAX_BACKOFF (signals.DefaultMaxBackoff)
	SignalMaxAttempts  int           // AGENT_SIGNAL_MAX_ATTEMPTS: attempts before a signal is dropped (signals.DefaultMaxAttempts)
	SignalTimeout      time.Duration // AGENT_SIGNAL_TIMEOUT: one attempt at every sink (signals.DefaultTimeout)
}

// Metrics values.
const (
	MetricsEMF = "emf"
	MetricsOff = "off"
)

// SecretEnv names the variables that carry a secret in plain text. A deployment template must never set them:
// in Lambda the secrets come from SSM (SecretParam, OpenAIAPIKeyParam).
func SecretEnv() []string { return []string{"AGENT_SECRET", "OPENAI_API_KEY", "AGENT_WEBHOOK_SECRET"} }

// ResourceEnv names the variables that carry one of the stack's resources (an ARN, a function URL): a template
// sets each only on the functions whose code uses it.
func ResourceEnv() []string {
	return []string{"JOBS_STATE_MACHINE_ARN", "AGENT_CHAT_URL", "AGENT_CHAT_FUNCTION"}
}

// AgentEnv names the variables only the functions that run turns act on (they read the tools file: chat and
// wake, the mains that compose boot.NewAgent): a template sets each only on them, so that only their roles hold
// the tools file's SSM grant.
func AgentEnv() []string { return []string{"AGENT_TOOLS_FILE", "AGENT_TOOLS_SECRETS_PATH"} }

// ssmPathRE is an SSM path prefix: "/", segments, and a closing "/" (so <path>* is a path, never every parameter).
var ssmPathRE = regexp.MustCompile(`^/([A-Za-z0-9_.\-]+/)+$`)

// ssmNameRE is an SSM parameter name in a hierarchy: "/" and segments (the template's grant is ...:parameter<name>).
var ssmNameRE = regexp.MustCompile(`^(/[A-Za-z0-9_.\-]+)+$`)

// LocalEnv names the variables that only `agentloop dev` and `agentloop serve` act on (Load reads them everywhere): a deployment
// template sets none of them.
func LocalEnv() []string {
	return []string{"AGENT_PPROF_ADDR", "AGENT_SQLITE_BATCH_WRITES", "AGENT_SQLITE_BATCH_BYTES", "AGENTLOOP_DYNAMO_ENDPOINT", "AGENT_DRAIN_GRACE",
		"AGENT_REQUEST_DEADLINE"}
}

// FromEnv reads the process environment.
func FromEnv() (Config, error) { return Load(os.Getenv) }

// Load reads settings through getenv, so tests need no process environment.
func Load(getenv func(string) string) (Config, error) {
	c := Config{
		Model:               strings.TrimSpace(getenv("AGENT_MODEL")),
		SubagentModel:       strings.TrimSpace(getenv("AGENT_SUBAGENT_MODEL")),
		TitleModel:          strings.TrimSpace(getenv("AGENT_TITLE_MODEL")),
		OpenAIBaseURL:       getenv("OPENAI_BASE_URL"),
		OpenAIAPIKey:        getenv("OPENAI_API_KEY"),
		SystemPrompt:        getenv("AGENT_SYSTEM_PROMPT"),
		Secret:              getenv("AGENT_SECRET"),
		JWTIssuer:           getenv("AGENT_JWT_ISSUER"),
		JWTAudience:         getenv("AGENT_JWT_AUDIENCE"),
		ChatURL:             strings.TrimSuffix(getenv("AGENT_CHAT_URL"), "/"),
		ChatFunction:        strings.TrimSpace(getenv("AGENT_CHAT_FUNCTION")),
		LogLevel:            cmp.Or(strings.TrimSpace(getenv("AGENT_LOG_LEVEL")), "info"),
		PprofAddr:           strings.TrimSpace(getenv("AGENT_PPROF_ADDR")),
		TableName:           strings.TrimSpace(getenv("TABLE_NAME")),
		SecretParam:         strings.TrimSpace(getenv("AGENT_SECRET_PARAM")),
		OpenAIAPIKeyParam:   strings.TrimSpace(getenv("OPENAI_API_KEY_PARAM")),
		JobsStateMachineARN: strings.TrimSpace(getenv("JOBS_STATE_MACHINE_ARN")),
		DynamoEndpoint:      strings.TrimSpace(getenv("AGENTLOOP_DYNAMO_ENDPOINT")),
		WebhookURL:          strings.TrimSpace(getenv("AGENT_WEBHOOK_URL")),
		WebhookSecret:       strings.TrimSpace(getenv("AGENT_WEBHOOK_SECRET")),
		WebhookSecretParam:  strings.TrimSpace(getenv("AGENT_WEBHOOK_SECRET_PARAM")),
	}
	var errs []string
	intVar := func(name string, dst *int, min int) bool {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return false
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < min {
			errs = append(errs, fmt.Sprintf("%s=%q: want an integer of at least %d", name, v, min))
			return false
		}
		*dst = n
		return true
	}
	durVar := func(name string, dst *time.Duration) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Sprintf("%s=%q: want a positive duration such as 30s", name, v))
				return
			}
			*dst = d
		}
	}
	intVar("AGENT_MAX_STEPS", &c.MaxSteps, 1)
	intVar("AGENT_MAX_OUTPUT_TOKENS", &c.MaxOutputTokens, 1)
	var retries int
	if intVar("AGENT_MODEL_RETRIES", &retries, 0) {
		c.ModelRetries = &retries
	}
	intVar("AGENT_MAX_MESSAGE_BYTES", &c.MaxMessageBytes, 1)
	intVar("AGENT_MAX_MESSAGE_PARTS", &c.MaxMessageParts, 1)
	intVar("AGENT_MODEL_FILE_MAX_BYTES", &c.ModelFileMaxBytes, 1)
	durVar("AGENT_MODEL_FILE_TIMEOUT", &c.ModelFileTimeout)
	intVar("AGENT_MODEL_FILES_MAX_BYTES", &c.ModelFilesMaxBytes, 1)
	intVar("AGENT_CONTEXT_BYTES", &c.ContextBytes, 1)
	intVar("AGENT_CONTEXT_TOKENS", &c.ContextTokens, 1)
	intVar("AGENT_CONTEXT_BLOCK_TOKENS", &c.ContextBlockTokens, 1)
	intVar("AGENT_TOOL_OUTPUT_BYTES", &c.ToolOutputBytes, 1)
	var body int
	if intVar("AGENT_MAX_BODY_BYTES", &body, 1) {
		c.MaxBodyBytes = int64(body)
	}
	switch v := strings.TrimSpace(getenv("OPENAI_MAX_TOKENS_FIELD")); v {
	case "", openai.MaxCompletionTokens, openai.MaxTokens, openai.MaxTokensNone:
		c.ModelMaxTokensField = v
	default:
		errs = append(errs, fmt.Sprintf("OPENAI_MAX_TOKENS_FIELD=%q: want %s, %s or %s", v,
			openai.MaxCompletionTokens, openai.MaxTokens, openai.MaxTokensNone))
	}
	if v := strings.TrimSpace(getenv("OPENAI_STREAM_USAGE")); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("OPENAI_STREAM_USAGE=%q: want true or false", v))
		}
		c.ModelOmitStreamUsage = err == nil && !b
	}
	durVar("AGENT_MODEL_TIMEOUT", &c.ModelTimeout)
	durVar("AGENT_TITLE_TIMEOUT", &c.TitleTimeout)
	switch v := strings.ToLower(strings.TrimSpace(getenv("AGENT_TITLES"))); v {
	case "", "on":
	case "off":
		c.TitlesOff = true
	default:
		errs = append(errs, fmt.Sprintf("AGENT_TITLES=%q: want on or off", v))
	}
	durVar("AGENT_MODEL_IDLE_TIMEOUT", &c.ModelIdleTimeout)
	durVar("AGENT_RUN_TIMEOUT", &c.RunTimeout)
	durVar("AGENT_HANDOVER_MARGIN", &c.HandOverMargin)
	durVar("AGENT_REQUEST_DEADLINE", &c.RequestDeadline)
	if margin := cmp.Or(c.HandOverMargin, engine.DefaultHandOverMargin); c.RequestDeadline > 0 && margin >= c.RequestDeadline {
		errs = append(errs, fmt.Sprintf("AGENT_HANDOVER_MARGIN (%s) must be shorter than AGENT_REQUEST_DEADLINE (%s): a run hands over "+
			"that long before its request's deadline", margin, c.RequestDeadline))
	}
	durVar("AGENT_TOOL_TIMEOUT", &c.ToolTimeout)
	durVar("AGENT_STORE_TIMEOUT", &c.StoreTimeout)
	durVar("AGENT_HEARTBEAT", &c.Heartbeat)
	durVar("AGENT_STALE_AFTER", &c.StaleAfter)
	durVar("AGENT_DRAIN_GRACE", &c.DrainGrace)
	durVar("AGENT_INTERRUPT_TTL", &c.InterruptTTL)
	durVar("AGENT_JWT_MAX_AGE", &c.JWTMaxAge)
	c.JWKSURL, c.JWTSubjectClaim = strings.TrimSpace(getenv("AGENT_JWKS_URL")), strings.TrimSpace(getenv("AGENT_JWT_SUBJECT_CLAIM"))
	if c.JWKSURL != "" && !strings.HasPrefix(c.JWKSURL, "https://") {
		errs = append(errs, fmt.Sprintf("AGENT_JWKS_URL=%q: want an https URL", c.JWKSURL))
	}
	durVar("AGENT_CANCEL_POLL", &c.CancelPoll)
	durVar("AGENT_SEGMENT_FLUSH", &c.SegmentFlush)
	durVar("AGENT_RESUME_POLL_MAX", &c.ResumePollMax)
	durVar("AGENT_SEGMENT_HURRY", &c.SegmentHurry)
	durVar("AGENT_RESUME_POLL_ATTACHED", &c.ResumePollAttached)
	durVar("AGENT_READER_PRESENCE", &c.ReaderPresence)
	if v := strings.TrimSpace(getenv("AGENT_READER_PROBE")); v == "0" || v == "0s" {
		c.ReaderProbe = -1 // the engine's "none": runs learn of readers from their heartbeats only
	} else {
		durVar("AGENT_READER_PROBE", &c.ReaderProbe)
	}
	durVar("AGENT_REAPER_INTERVAL", &c.ReaperInterval)
	switch v := strings.ToLower(strings.TrimSpace(getenv("AGENT_SIGNALS"))); v {
	case "", "on":
	case "off":
		c.SignalsOff = true
	default:
		errs = append(errs, fmt.Sprintf("AGENT_SIGNALS=%q: want on or off", v))
	}
	if c.WebhookURL != "" {
		if err := webhooks.CheckURL(c.WebhookURL); err != nil {
			errs = append(errs, "AGENT_WEBHOOK_URL: "+err.Error())
		}
	}
	if c.WebhookSecret != "" {
		if _, err := webhooks.ParseSecret(c.WebhookSecret); err != nil {
			errs = append(errs, "AGENT_WEBHOOK_SECRET: "+err.Error())
		}
	}
	durVar("AGENT_SIGNAL_BACKOFF", &c.SignalBackoff)
	durVar("AGENT_SIGNAL_MAX_BACKOFF", &c.SignalMaxBackoff)
	intVar("AGENT_SIGNAL_MAX_ATTEMPTS", &c.SignalMaxAttempts, 1)
	durVar("AGENT_SIGNAL_TIMEOUT", &c.SignalTimeout)
	intVar("AGENT_REAPER_BATCH", &c.ReaperBatch, 1)
	intVar("AGENT_MAX_QUEUED", &c.MaxQueued, 1)
	intVar("AGENT_PAGE_BYTES", &c.PageBytes, 1024)
	intVar("AGENT_SQLITE_BATCH_WRITES", &c.SQLiteBatchWrites, 1)
	intVar("AGENT_SQLITE_BATCH_BYTES", &c.SQLiteBatchBytes, 1)
	// A setting too large for the environment (Lambda's 4 KB for all variables: REVIEW H6) comes from a file in
	// the deployment package instead; a relative path is read from the package's root (LAMBDA_TASK_ROOT).
	inPackage := func(file string) string {
		if root := getenv("LAMBDA_TASK_ROOT"); root != "" && !filepath.IsAbs(file) {
			return filepath.Join(root, file)
		}
		return file
	}
	readFile := func(name, file string) ([]byte, bool) {
		file = inPackage(file)
		data, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s=%q: %v", name, file, err))
			return nil, false
		}
		return data, true
	}
	if file := strings.TrimSpace(getenv("AGENT_SYSTEM_PROMPT_FILE")); file != "" {
		if c.SystemPrompt != "" {
			errs = append(errs, "AGENT_SYSTEM_PROMPT and AGENT_SYSTEM_PROMPT_FILE are both set: use one")
		} else if data, ok := readFile("AGENT_SYSTEM_PROMPT_FILE", file); ok {
			c.SystemPrompt = string(data)
		}
	}
	if file := strings.TrimSpace(getenv("AGENT_TOOLS_FILE")); file != "" {
		if name, ok := toolsfile.SSMParameter(file); ok {
			if !ssmNameRE.MatchString(name) {
				errs = append(errs, fmt.Sprintf("AGENT_TOOLS_FILE=%q: want ssm: and an SSM parameter name that starts with /, e.g. ssm:/agentloop/tools", file))
			}
			c.ToolsFile = file
		} else {
			c.ToolsFile = inPackage(file)
		}
	}
	if path := strings.TrimSpace(getenv("AGENT_TOOLS_SECRETS_PATH")); path != "" {
		if !ssmPathRE.MatchString(path) {
			errs = append(errs, fmt.Sprintf("AGENT_TOOLS_SECRETS_PATH=%q: want an SSM path that starts and ends with /, e.g. /agentloop/tools/", path))
		}
		c.ToolsSecretsPath = path
	}
	if path := strings.TrimSpace(getenv("AGENT_MODEL_KEYS_PATH")); path != "" {
		if !ssmPathRE.MatchString(path) {
			errs = append(errs, fmt.Sprintf("AGENT_MODEL_KEYS_PATH=%q: want an SSM path that starts and ends with /, e.g. /agentloop/models/", path))
		}
		c.ModelKeysPath = path
	}
	switch inline, file := strings.TrimSpace(getenv("AGENT_PRICES")), strings.TrimSpace(getenv("AGENT_PRICES_FILE")); {
	case inline != "" && file != "":
		errs = append(errs, "AGENT_PRICES and AGENT_PRICES_FILE are both set: use one")
	case inline != "" || file != "":
		data, name := []byte(inline), "AGENT_PRICES"
		if file != "" {
			var ok bool
			if data, ok = readFile("AGENT_PRICES_FILE", file); !ok {
				break
			}
			name = "AGENT_PRICES_FILE"
		}
		p, err := agent.ParsePrices(data)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
		}
		c.Prices = p
	}
	if file := strings.TrimSpace(getenv("AGENT_MODELS_FILE")); file != "" {
		c.loadModels(inPackage(file), &errs)
	}
	switch v := strings.TrimSpace(getenv("AGENT_METRICS")); v {
	case "", MetricsEMF, MetricsOff:
		c.Metrics = v
	default:
		errs = append(errs, fmt.Sprintf("AGENT_METRICS=%q: want %s or %s", v, MetricsEMF, MetricsOff))
	}
	c.MetricsNamespace = strings.TrimSpace(getenv("AGENT_METRICS_NAMESPACE"))
	limitVar := func(name string, dst *int) {
		var n int
		if intVar(name, &n, 0) {
			*dst = cmp.Or(n, -1)
		}
	}
	limitVar("AGENT_MAX_ACTIVE_RUNS_PER_USER", &c.MaxActiveRunsPerUser)
	limitVar("AGENT_THREADS_PER_MINUTE", &c.ThreadsPerMinute)
	limitVar("AGENT_MAX_STREAMS_PER_USER", &c.MaxStreamsPerUser)
	limitVar("AGENT_MAX_STREAMS_PER_RUN", &c.MaxStreamsPerRun)
	limitVar("AGENT_MAX_TOOL_CALLS_PER_STEP", &c.MaxToolCallsPerStep)
	limitVar("AGENT_MAX_JOBS_PER_RUN", &c.MaxJobsPerRun)
	limitVar("AGENT_MAX_JOB_CHAIN", &c.MaxJobChain)
	limitVar("AGENT_MAX_ACTIVE_JOBS_PER_USER", &c.MaxActiveJobsPerUser)
	limitVar("AGENT_MAX_RUNS_PER_PROCESS", &c.MaxRunsPerProcess)
	limitVar("AGENT_TOOL_ROUTER_MIN", &c.ToolRouterMin)
	intVar("AGENT_TOOL_ROUTER_TOP_K", &c.ToolRouterTopK, 1)
	intVar("AGENT_TOOL_ROUTER_MIN_MATCHES", &c.ToolRouterMinMatches, 1)
	durVar("AGENT_TOOL_ROUTER_COOL_DOWN", &c.ToolRouterCoolDown)
	durVar("AGENT_TOOL_ROUTER_MAX_COOL_DOWN", &c.ToolRouterMaxCoolDown)
	durVar("AGENT_TOOL_ROUTER_VECTOR_TTL", &c.ToolRouterVectorTTL)
	floatVar := func(name string, dst *float64, maxValue float64, what string) {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return
		}
		f, err := strconv.ParseFloat(v, 64)
		switch {
		case err != nil || f < 0 || f > maxValue || math.IsNaN(f):
			errs = append(errs, fmt.Sprintf("%s=%q: want %s", name, v, what))
		case f == 0:
			*dst = -1 // the router's "none"
		default:
			*dst = f
		}
	}
	floatVar("AGENT_TOOL_ROUTER_THRESHOLD", &c.ToolRouterThreshold, math.MaxFloat64, "a number of at least 0 (a BM25 score)")
	floatVar("AGENT_TOOL_ROUTER_SIMILARITY", &c.ToolRouterSimilarity, 1, "a number from 0 to 1 (a cosine similarity)")
	c.EmbeddingModel = strings.TrimSpace(getenv("AGENT_EMBEDDING_MODEL"))
	if v := strings.TrimSpace(getenv("AGENT_MAX_HEARTBEAT_LAG")); v == "0" || v == "0s" {
		c.MaxHeartbeatLag = -1 // the engine's "none"
	} else {
		durVar("AGENT_MAX_HEARTBEAT_LAG", &c.MaxHeartbeatLag)
	}
	if lag := c.MaxHeartbeatLag; lag > 0 && cmp.Or(c.Heartbeat, agent.DefaultHeartbeat)+lag >= cmp.Or(c.StaleAfter, agent.DefaultStaleAfter)/2 {
		errs = append(errs, "AGENT_HEARTBEAT + AGENT_MAX_HEARTBEAT_LAG must be shorter than half of AGENT_STALE_AFTER (runs that far behind stop themselves: refusing new ones then is too late)")
	}
	durVar("AGENT_RUN_LEASE_TTL", &c.RunLeaseTTL)
	durVar("AGENT_STREAM_LEASE_TTL", &c.StreamLeaseTTL)
	for name, d := range map[string]time.Duration{"AGENT_RUN_LEASE_TTL": c.RunLeaseTTL, "AGENT_STREAM_LEASE_TTL": c.StreamLeaseTTL} {
		if d != 0 && (d < time.Second || d > agent.MaxLeaseTTL) {
			errs = append(errs, fmt.Sprintf("%s=%s: want from 1s to %s (the lease is renewed a few times within it)", name, d, agent.MaxLeaseTTL))
		}
	}
	if cmp.Or(c.Heartbeat, agent.DefaultHeartbeat) >= cmp.Or(c.StaleAfter, agent.DefaultStaleAfter)/2 {
		errs = append(errs, "AGENT_HEARTBEAT must be shorter than half of AGENT_STALE_AFTER (a run stops itself when its heartbeats fail for that long)")
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

// loadModels reads and checks the models file at path (errors by line and field), and the entries AGENT_MODEL,
// AGENT_SUBAGENT_MODEL and AGENT_TITLE_MODEL name; its entries' prices join the price table (over AGENT_PRICES).
func (c *Config) loadModels(path string, errs *[]string) {
	c.ModelsFile = path
	if c.OpenAIBaseURL != "" {
		*errs = append(*errs, "OPENAI_BASE_URL and AGENT_MODELS_FILE are both set: give each entry of the models file its baseURL")
		return
	}
	f, err := modelsfile.Load(path)
	if err != nil {
		*errs = append(*errs, fmt.Sprintf("AGENT_MODELS_FILE=%q:\n%v", path, err))
		return
	}
	roles, err := f.Roles(c.Model, c.SubagentModel, c.TitleModel)
	if err != nil {
		*errs = append(*errs, err.Error()+" (with a models file, AGENT_MODEL, the template's ModelName, names an entry)")
		return
	}
	prices, err := f.Prices()
	if err != nil {
		*errs = append(*errs, fmt.Sprintf("AGENT_MODELS_FILE=%q: %v", path, err))
		return
	}
	c.Models, c.Model, c.SubagentModel, c.TitleModel = f, roles.Default, roles.Subagent, roles.Title
	c.Prices = c.Prices.With(prices)
}

// Engine is the engine's share; model is the model name actually used (the offline model overrides AGENT_MODEL
// in `agentloop dev`; with a models file, an entry's name, whose contextTokens bounds the context budget beside
// AGENT_CONTEXT_TOKENS: the smaller wins).
func (c Config) Engine(model string) engine.Config {
	budget := c.ContextTokens
	if c.Models != nil {
		if e, ok := c.Models.Entry(model); ok && e.ContextTokens > 0 {
			budget = min(cmp.Or(budget, e.ContextTokens), e.ContextTokens)
		}
	}
	return engine.Config{Model: model, System: c.SystemPrompt, MaxSteps: c.MaxSteps, MaxOutputTokens: c.MaxOutputTokens,
		RunTimeout: c.RunTimeout, ToolTimeout: c.ToolTimeout, Heartbeat: c.Heartbeat, StaleAfter: c.StaleAfter,
		CancelPoll: c.CancelPoll, SegmentFlush: c.SegmentFlush, SegmentHurry: c.SegmentHurry, ReaderProbe: c.ReaderProbe, MaxMessageBytes: c.MaxMessageBytes, MaxMessageParts: c.MaxMessageParts, InterruptTTL: c.InterruptTTL,
		MaxQueued: c.MaxQueued, MaxActiveRunsPerUser: c.MaxActiveRunsPerUser, ThreadsPerMinute: c.ThreadsPerMinute,
		RunLeaseTTL: c.RunLeaseTTL, MaxToolCallsPerStep: c.MaxToolCallsPerStep, MaxJobsPerRun: c.MaxJobsPerRun, MaxJobChain: c.MaxJobChain,
		MaxRunsPerProcess: c.MaxRunsPerProcess, MaxHeartbeatLag: c.MaxHeartbeatLag, HandOverMargin: c.HandOverMargin, Transcript: transcript.Config{BudgetBytes: c.ContextBytes, BudgetTokens: budget, ToolOutputBytes: c.ToolOutputBytes,
			BlockTokens: c.ContextBlockTokens}}
}

// ToolRouter is the tool router's share.
func (c Config) ToolRouter() toolrouter.Config {
	return toolrouter.Config{Min: c.ToolRouterMin, TopK: c.ToolRouterTopK, Threshold: c.ToolRouterThreshold,
		Similarity: c.ToolRouterSimilarity, MinMatches: c.ToolRouterMinMatches, CoolDown: c.ToolRouterCoolDown,
		MaxCoolDown: c.ToolRouterMaxCoolDown, VectorTTL: c.ToolRouterVectorTTL}
}

// Auth is the verifier's share for the application secret (HS256); the dev server also takes dev tokens.
func (c Config) Auth(secret []byte, clock agent.Clock, dev bool) auth.Config {
	return auth.Config{Keys: auth.HMACKey{Secret: secret}, Clock: clock, Issuer: c.JWTIssuer, Audience: c.JWTAudience,
		MaxAge: c.JWTMaxAge, DevTokens: dev, SubjectClaim: c.JWTSubjectClaim}
}

// DevTokenClaims are the claims of the tokens `agentloop token` and `agentloop dev` mint: aud auth.DevAudience
// (with AGENT_JWT_AUDIENCE beside it when set, which the dev server then checks) and iss AGENT_JWT_ISSUER when set.
func (c Config) DevTokenClaims() []auth.MintOption {
	aud := []string{auth.DevAudience}
	if c.JWTAudience != "" && c.JWTAudience != auth.DevAudience {
		aud = append(aud, c.JWTAudience)
	}
	opts := []auth.MintOption{auth.WithAudience(aud...)}
	if c.JWTIssuer != "" {
		opts = append(opts, auth.WithIssuer(c.JWTIssuer))
	}
	return opts
}

// DeploymentTokenClaims are the claims of the tokens `agentloop token` mints for `agentloop serve` (TABLE_NAME
// and AGENT_SECRET set): aud AGENT_JWT_AUDIENCE and iss AGENT_JWT_ISSUER when set (which serve then checks),
// never auth.DevAudience. Such a token is a deployment's: any process verifying with the same secret (and the
// same audience and issuer checks) takes it, the functions included; minting one needs the secret itself.
func (c Config) DeploymentTokenClaims() []auth.MintOption {
	var opts []auth.MintOption
	if c.JWTAudience != "" {
		opts = append(opts, auth.WithAudience(c.JWTAudience))
	}
	if c.JWTIssuer != "" {
		opts = append(opts, auth.WithIssuer(c.JWTIssuer))
	}
	return opts
}

// Titles is the thread titles' share (lib/titles), for the title model named model.
func (c Config) Titles(model string) titles.Config {
	return titles.Config{Model: model, Timeout: c.TitleTimeout}
}

// Drain is `agentloop serve`'s drain share (lib/drain).
func (c Config) Drain() drain.Config { return drain.Config{Grace: c.DrainGrace} }

// Signals is the completion signals' share (lib/signals); background: the first attempt goes on in a goroutine
// (a long-lived process), not on the run's.
func (c Config) Signals(background bool) signals.Config {
	return signals.Config{Backoff: c.SignalBackoff, MaxBackoff: c.SignalMaxBackoff, MaxAttempts: c.SignalMaxAttempts,
		Timeout: c.SignalTimeout, Background: background}
}

// Reaper is the reaper's share. RunTimeout is the engine's (its default too): a handed-over run is continued only
// within it.
func (c Config) Reaper() reaper.Config {
	return reaper.Config{StaleAfter: c.StaleAfter, Interval: c.ReaperInterval, Batch: c.ReaperBatch,
		RunTimeout: cmp.Or(c.RunTimeout, engine.DefaultRunTimeout)}
}

// Threads is the thread service's share (resume readers included).
func (c Config) Threads() threads.Config {
	return threads.Config{StaleAfter: c.StaleAfter, Follow: segments.Follower{PollMax: c.ResumePollMax,
		PollAttached: c.ResumePollAttached, Presence: c.ReaderPresence},
		MaxStreamsPerUser: c.MaxStreamsPerUser, MaxStreamsPerRun: c.MaxStreamsPerRun, StreamLeaseTTL: c.StreamLeaseTTL,
		PageBytes: c.PageBytes}
}

// OpenAI is the model adapter's share, for the given endpoint, key and model name.
func (c Config) OpenAI(baseURL, apiKey, model string, log *slog.Logger) openai.Config {
	return openai.Config{BaseURL: baseURL, APIKey: apiKey, Model: model, EmbeddingModel: c.EmbeddingModel, MaxOutputTokens: c.MaxOutputTokens,
		FirstTokenTimeout: c.ModelTimeout, IdleTimeout: c.ModelIdleTimeout, MaxRetries: c.modelRetries(), Logger: log,
		MaxTokensParam: c.ModelMaxTokensField, OmitStreamOptions: c.ModelOmitStreamUsage,
		MaxFileBytes: int64(c.ModelFileMaxBytes), FileTimeout: c.ModelFileTimeout, MaxRequestFileBytes: int64(c.ModelFilesMaxBytes)}
}

// OpenAIResponses is the Responses API adapter's configuration for one models-file entry, from the same
// settings as OpenAI's (timeouts, retries, output and file bounds).
func (c Config) OpenAIResponses(baseURL, apiKey, model string, log *slog.Logger) openairesponses.Config {
	return openairesponses.Config{BaseURL: baseURL, APIKey: apiKey, Model: model, EmbeddingModel: c.EmbeddingModel, MaxOutputTokens: c.MaxOutputTokens,
		FirstTokenTimeout: c.ModelTimeout, IdleTimeout: c.ModelIdleTimeout, MaxRetries: c.modelRetries(), Logger: log,
		MaxFileBytes: int64(c.ModelFileMaxBytes), FileTimeout: c.ModelFileTimeout, MaxRequestFileBytes: int64(c.ModelFilesMaxBytes)}
}

// BedrockConverse is the ConverseStream adapter's configuration for one models-file entry: its region, model id
// and baseURL (an endpoint override), signed with awsCfg (nil: the default AWS configuration, as the AWS SDK
// loads it), and the same timeouts, retries and output bound as the OpenAI adapters.
func (c Config) BedrockConverse(e modelsfile.Model, awsCfg *aws.Config, log *slog.Logger) bedrockconverse.Config {
	return bedrockconverse.Config{Region: e.Region, BaseURL: e.BaseURL, Model: e.Model, MaxOutputTokens: c.MaxOutputTokens,
		FirstTokenTimeout: c.ModelTimeout, IdleTimeout: c.ModelIdleTimeout, MaxRetries: c.modelRetries(), AWS: awsCfg, Logger: log}
}

// modelRetries is AGENT_MODEL_RETRIES in the adapters' terms: 0 their default, negative none.
func (c Config) modelRetries() int {
	if c.ModelRetries == nil {
		return 0
	}
	if *c.ModelRetries == 0 {
		return -1
	}
	return *c.ModelRetries
}
