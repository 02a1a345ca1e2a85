package boot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/anthropic"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httptools"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/mcptools"
	"github.com/agentloop/agentloop/lib/modelset"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/openairesponses"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/secretref"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/titles"
	"github.com/agentloop/agentloop/lib/toolrouter"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/toolschema"
	"github.com/agentloop/agentloop/lib/toolsfile"
)

// The Lambda compositions below are lib/devserver's over DynamoDB, the configured model and Step Functions: the
// same tools, job kinds and contract, so a thread behaves the same in AWS and in `agentloop dev`.

// Contract is the job state machine's contract as infra/jobs.asl.json states it.
func Contract() agent.JobContract { return agent.DefaultJobContract() }

// JobKinds are the sub-agent job kinds every function knows (the job tools, the sub-agent task, delivery).
func JobKinds() jobs.Registry { return jobs.NewRegistry(jobs.Research()) }

// ModelName is the model the function's turns ask: the provider's model id, or with a models file
// (AGENT_MODELS_FILE) the name of its default entry.
func (b Base) ModelName() string { return cmp.Or(b.Config.Model, config.DefaultModel) }

// SubagentModelName is the model the research sub-agent asks (AGENT_SUBAGENT_MODEL; unset: ModelName).
func (b Base) SubagentModelName() string { return cmp.Or(b.Config.SubagentModel, b.ModelName()) }

// TitleModelName is the model thread titles are asked of (AGENT_TITLE_MODEL; unset: ModelName).
func (b Base) TitleModelName() string { return cmp.Or(b.Config.TitleModel, b.ModelName()) }

// Titles titles a thread after its first reply, on the request's goroutine (titles.Config.Background unset):
// Lambda freezes the execution environment once the handler returns, so the title is made after the stream's
// last byte and before the response ends, bounded by AGENT_TITLE_TIMEOUT (lib/titles' package doc says why not a
// job of the state machine). Nil with AGENT_TITLES=off.
func (b Base) Titles(model agent.Model) engine.Titler {
	if b.Config.TitlesOff {
		return nil
	}
	return titles.New(titles.Deps{Store: b.Store, Model: model, Clock: b.Clock, Logger: b.Log, Prices: b.Config.Prices, Metrics: b.Metrics},
		b.Config.Titles(b.TitleModelName()))
}

// Model is the model port the function asks. Without a models file: the OpenAI-compatible adapter, with the key
// the function read. With one: lib/modelset over the file's entries, one adapter each, their keys' references
// resolved now (${env:…} from the environment, ${ssm:…} from SSM; in Lambda an ${ssm:…} key must be a
// parameter the roles may read: OPENAI_API_KEY_PARAM's, or one under AGENT_MODEL_KEYS_PATH), so a bad key or an
// entry whose provider is not built fails the cold start.
func (b Base) Model(ctx context.Context) (agent.Model, error) { return b.model(ctx, b.ssm()) }

// model is Model with the SSM client the keys' ${ssm:…} references are read through.
func (b Base) model(ctx context.Context, api ssmsecrets.API) (agent.Model, error) {
	cfg := b.Config
	if cfg.Models == nil {
		return openai.New(cfg.OpenAI(cfg.OpenAIBaseURL, b.ModelKey, b.ModelName(), b.Log)), nil
	}
	var granted []string
	if cfg.OpenAIAPIKeyParam != "" {
		granted = append(granted, cfg.OpenAIAPIKeyParam)
	}
	o := modelsfile.Options{SSMScoped: true, SSMParams: granted, SSMPrefix: cfg.ModelKeysPath,
		SSMHint: "keep a model key in the parameter OPENAI_API_KEY_PARAM names (the template's OpenAIKeyParameterName) or under " +
			"AGENT_MODEL_KEYS_PATH (the template's ModelKeysPath), which the functions that ask a model may read"}
	r := secretref.Resolvers{secretref.Env: secretref.EnvResolver(b.getenv), secretref.SSM: ssmRefs{api: api, what: "models file"}}
	// An entry with neither baseURL nor apiKey is the offline model's in `agentloop dev`; here it would call its
	// provider with no key: refused now, at its line, rather than as a 401 on the first turn.
	for i, e := range cfg.Models.Models {
		if e.BaseURL == "" && e.APIKey == "" && !modelsfile.Bedrock(e.Provider) {
			return nil, fmt.Errorf("%s:%d: models[%d] (%s) has neither baseURL nor apiKey: agentloop dev talks to the offline model then, "+
				"but here it would call %s with no key (give it an apiKey reference, or the baseURL of a server that needs none)",
				cfg.Models.Name, e.Line, i, e.Name, e.Provider)
		}
	}
	keys, err := modelsfile.Startup(ctx, cfg.Models, o, r, b.Log)
	if err != nil {
		return nil, err
	}
	failovers, _ := b.Metrics.(agent.Failovers)
	return modelset.New(cfg.Models, keys, b.Constructors(), modelset.WithLogger(b.Log), modelset.WithFailovers(failovers))
}

// Constructors are the model adapters the functions build, by provider: one line each.
func (b Base) Constructors() modelset.Constructors {
	cfg := b.Config
	return modelset.Constructors{
		modelsfile.OpenAIChat: func(e modelsfile.Model, key string) (agent.Model, error) {
			return openai.New(cfg.OpenAI(e.BaseURL, key, e.Model, b.Log)), nil
		},
		modelsfile.OpenAIResponses: func(e modelsfile.Model, key string) (agent.Model, error) {
			return openairesponses.New(cfg.OpenAIResponses(e.BaseURL, key, e.Model, b.Log)), nil
		},
		modelsfile.Anthropic: func(e modelsfile.Model, key string) (agent.Model, error) {
			return anthropic.New(Anthropic(cfg, e, key, nil, b.Log)), nil
		},
		modelsfile.AnthropicBedrock: func(e modelsfile.Model, _ string) (agent.Model, error) {
			return anthropic.New(Anthropic(cfg, e, "", &b.AWS, b.Log)), nil
		},
		modelsfile.BedrockConverse: func(e modelsfile.Model, _ string) (agent.Model, error) {
			return bedrockconverse.New(cfg.BedrockConverse(e, &b.AWS, b.Log)), nil
		},
	}
}

// Anthropic is the Messages adapter's configuration for one models-file entry: an anthropic entry's baseURL and
// key, or an anthropic-bedrock entry's region and baseURL (an endpoint override) signed with awsCfg (the
// function's role); the same timeouts, retries and output bound as the other adapters (lib/config maps them once).
func Anthropic(cfg config.Config, e modelsfile.Model, key string, awsCfg *aws.Config, log *slog.Logger) anthropic.Config {
	o := cfg.OpenAI("", "", e.Model, log)
	return anthropic.Config{APIKey: key, BaseURL: e.BaseURL, Model: e.Model, MaxOutputTokens: o.MaxOutputTokens,
		FirstTokenTimeout: o.FirstTokenTimeout, IdleTimeout: o.IdleTimeout, MaxRetries: o.MaxRetries, Logger: log,
		Bedrock: e.Provider == modelsfile.AnthropicBedrock, Region: e.Region, AWS: awsCfg}
}

// StepFunctions is the Jobs adapter for the job state machine arn (JOBS_STATE_MACHINE_ARN, which a function
// that starts executions must have).
func (b Base) StepFunctions(arn string) (agent.Jobs, error) {
	if arn == "" {
		return nil, fmt.Errorf("JOBS_STATE_MACHINE_ARN is not set")
	}
	return sfn.New(awssfn.NewFromConfig(b.AWS), arn), nil
}

// Tools are the demo tools and the job tools. js starts the jobs; nil gives the tools of a function that never
// runs a turn (the reaper, the API's lazy reap): they only read what a call recorded, and a dispatch through them
// fails instead of starting anything.
func (b Base) Tools(js agent.Jobs) []agent.Tool {
	// Without js the tools are only asked what a call recorded: they read tool state and write none (the
	// reaper's policy is derived from that: REVIEW H11).
	var values agent.ValueStore = b.Store
	if js == nil {
		js, values = noJobs{}, agent.ReadOnlyValues{ValueReader: b.Store}
	}
	d := jobs.Dispatcher{Store: b.Store, Jobs: js, Clock: b.Clock, Contract: Contract(), Logger: b.Log,
		Limits: b.Store, MaxActivePerUser: b.Config.MaxActiveJobsPerUser}
	return append(tools.Demo(values, b.Clock), d.Tools(JobKinds())...)
}

// Reaper reaps dead runs (asking the tools what they recorded) and, with js set, re-drives undelivered jobs and
// forgotten queues. With a launcher (the reaper function's ChatLauncher, the chat function's SelfLauncher) it
// continues the handed-over runs whose continuation never started (lib/reaper relaunch.go); without one it leaves
// them (reaper.Hold) to a reaper that can, until they are past their bounds.
func (b Base) Reaper(toolset []agent.Tool, js agent.Jobs, launcher agent.RunLauncher) *reaper.Reaper {
	cfg := b.Config.Reaper()
	cfg.DeliveryGrace, cfg.StartDue, cfg.ExecutionTimeout = Contract().DeliveryGrace, Contract().StartDue, Contract().ExecutionTimeout
	rp := reaper.New(reaper.Deps{Store: b.Store, Tools: toolset, Jobs: js, Clock: b.Clock, Logger: b.Log, Metrics: b.Metrics,
		Signals: b.Signals, Launcher: launcher}, cfg)
	if launcher == nil {
		rp.Hold()
	}
	return rp
}

// Threads is the thread service (reads, lazy reaps, stream replay). It has no Stopper: a Lambda execution
// environment serves one request at a time, so a stop never reaches the one running the run (which learns of it
// from its keeper's next heartbeat batch).
func (b Base) Threads(rp *reaper.Reaper) *threads.Service {
	return b.threads(rp, nil)
}

// threads is Threads with the hub of an engine in the same process (nil: none).
func (b Base) threads(rp *reaper.Reaper, hub *segments.Hub) *threads.Service {
	return threads.New(threads.Deps{Store: b.Store, Reaper: rp, Clock: b.Clock, Logger: b.Log, Hub: hub}, b.Config.Threads())
}

// Agent is the composition of the functions that run turns (chat, wake): the model, the demo and job tools,
// the reaper, the engine, the thread service and the job tasks, wired as lib/devserver wires them.
type Agent struct {
	Model agent.Model
	Tools []agent.Tool
	// Sources are the tools file's tool sources (AGENT_TOOLS_FILE).
	Sources []agent.ToolSource
	Reaper  *reaper.Reaper
	Engine  *engine.Engine
	Threads *threads.Service
	Tasks   *jobs.Tasks
}

// NewAgent builds the Agent over b, which must hold the application secret (approval signatures) and the model
// key, and js, the Jobs adapter that job tools and delivery passes start executions with.
// AgentOption adjusts what NewAgent builds.
type AgentOption func(*engine.Deps)

// WithLauncher lets the agent's runs go on in a fresh invocation (the chat function's SelfLauncher): hand-overs
// before the invocation's deadline and background runs.
func WithLauncher(l agent.RunLauncher) AgentOption { return func(d *engine.Deps) { d.Launcher = l } }

func NewAgent(ctx context.Context, b Base, js agent.Jobs, opts ...AgentOption) (*Agent, error) {
	if b.AppSecret == nil {
		return nil, fmt.Errorf("boot: the agent needs the application secret")
	}
	if js == nil {
		return nil, fmt.Errorf("boot: the agent needs a Jobs adapter")
	}
	signer, err := interrupts.NewSigner(b.AppSecret)
	if err != nil {
		return nil, err
	}
	model, err := b.Model(ctx)
	if err != nil {
		return nil, err
	}
	a := &Agent{Model: model, Tools: b.Tools(js)}
	// The tools file (AGENT_TOOLS_FILE, bundled or in SSM) is read and checked now, so a bad one fails the cold
	// start, and its tools are offered beside the Go ones.
	var names []string
	for _, t := range a.Tools {
		names = append(names, t.Name)
	}
	file, secrets, err := b.toolsFile(ctx, b.ssm(), names)
	if err != nil {
		return nil, err
	}
	a.Sources = ToolSources(file, secrets, nil, b.Store, b.Clock, b.Log)
	// The lazy reaps continue handed-over runs through the agent's launcher (the chat function's own), if any.
	var launch engine.Deps
	for _, o := range opts {
		o(&launch)
	}
	a.Reaper = b.Reaper(a.Tools, js, launch.Launcher)
	// The engine and the resume reader share a hub: a reader of a run this invocation's process writes is fed from
	// it (an instance serves one invocation at a time, so in AWS that is rare; the store is the way across).
	hub := segments.NewHub()
	// Every tool call's input is repaired once if it is not JSON and checked against its tool's schema before
	// anything acts on it; a tool whose schema is not a JSON Schema fails the cold start.
	inputs, err := toolschema.New(a.Tools...)
	if err != nil {
		return nil, err
	}
	// A catalog above AGENT_TOOL_ROUTER_MIN tools offers each step a subset (lib/toolrouter): keywords, then the
	// provider's embeddings, the tools' vectors cached in the table.
	deps := engine.Deps{Store: b.Store, Model: a.Model, Tools: a.Tools, Sources: a.Sources, Router: toolrouter.New(routerDeps(embedder(a.Model, b.ModelName()), b.Store, b.Log, b.Clock), b.Config.ToolRouter()), Inputs: inputs, Reaper: a.Reaper, Clock: b.Clock,
		Signer: signer, Jobs: js, Logger: b.Log, Prices: b.Config.Prices, Metrics: b.Metrics, Hub: hub, Titles: b.Titles(a.Model),
		Signals: b.Signals}
	for _, o := range opts {
		o(&deps)
	}
	a.Engine = engine.New(deps, b.Config.Engine(b.ModelName()))
	a.Threads = b.threads(a.Reaper, hub)
	a.Tasks = jobs.NewTasks(jobs.Deps{Store: b.Store, Model: a.Model, Kinds: JobKinds(), Engine: a.Engine, Jobs: js, Clock: b.Clock,
		Logger: b.Log, Limits: b.Store}, jobs.Config{Contract: Contract(), ModelName: b.SubagentModelName()})
	return a, nil
}

// ToolSources are the tool sources of a tools file (nil: none): its HTTP tools (lib/httptools) and one source per
// MCP server (lib/mcptools, each listed by the first turn and cached for the life of the execution environment,
// its definitions pinned in pins), with secrets, the values of its references; client sends their requests (nil: their own). lib/devserver builds
// the same.
func ToolSources(f *toolsfile.File, secrets toolsfile.Secrets, client *http.Client, pins agent.ValueStore, clock agent.Clock, log *slog.Logger) []agent.ToolSource {
	if f == nil {
		return nil
	}
	var sources []agent.ToolSource
	if len(f.HTTPTools) > 0 {
		sources = append(sources, httptools.New(f, secrets, httptools.Options{Client: client}))
	}
	for _, s := range mcptools.New(f, secrets, mcptools.Options{Client: client, Pins: pins, Clock: clock, Logger: log}) {
		sources = append(sources, s)
	}
	return sources
}

// ssmAPI is the part of the SSM client the tools file reads through: its ${ssm:…} references (GetParameters) and,
// in its SSM form, the file itself (GetParameter).
type ssmAPI interface {
	ssmsecrets.API
	ssmsecrets.ParameterAPI
}

// toolsFile reads the tools file (AGENT_TOOLS_FILE) and checks it now, so a bad one fails the cold start, names
// being the Go tools' (reserved). The file is bundled in the package, or kept whole in one SSM parameter
// (ssm:<name>; the template's ToolsFileParameterName, which grants ssm:GetParameter on it alone). Its references
// are resolved once (${env:…} from the environment, ${ssm:…} SecureString parameters in one SSM request per ten
// names). An ${ssm:…} reference must lie under AGENT_TOOLS_SECRETS_PATH, the only parameters the role may read
// (the template's ToolsSecretsPath): one outside it fails the start at its line, not as an AccessDenied from SSM.
func (b Base) toolsFile(ctx context.Context, api ssmAPI, names []string) (*toolsfile.File, toolsfile.Secrets, error) {
	resolve := toolsfile.Resolvers{toolsfile.RefEnv: toolsfile.EnvResolver(b.getenv), toolsfile.RefSSM: ssmRefs{api: api}}
	o := toolsfile.Options{Reserved: names, SSMScoped: true, SSMPrefix: b.Config.ToolsSecretsPath}
	return toolsfile.Startup(ctx, b.Config.ToolsFile, o, resolve, ssmFile{api: api, region: b.AWS.Region}, b.Log)
}

// ssmFile reads the tools file kept in an SSM parameter (AGENT_TOOLS_FILE=ssm:<name>) through lib/ssmsecrets. A
// parameter that does not exist fails the cold start saying what to create, where and how (as firstDeployHint
// does for the secrets); one the role may not read says which template parameter grants it.
type ssmFile struct {
	api    ssmsecrets.ParameterAPI
	region string
}

func (r ssmFile) ReadParameter(ctx context.Context, name string) (string, error) {
	v, err := ssmsecrets.ReadParameter(ctx, r.api, name)
	var missing ssmsecrets.MissingParams
	switch {
	case errors.As(err, &missing):
		return "", fmt.Errorf("%w\nThe stack runs in region %s; create the parameter there from your tools file (String or SecureString; "+
			"a standard parameter holds 4 KB, an advanced one 8 KB: add --tier Advanced above 4 KB):\n"+
			"  aws ssm put-parameter --region %s --type String --name %s --value file://tools.yaml", err, r.region, r.region, name)
	case agent.CodeOf(err) == ssmsecrets.CodeUnavailable:
		return "", fmt.Errorf("%w (the chat and wake roles may read it only when the template's ToolsFileParameterName names it)", err)
	}
	return v, err
}

// ssmRefs resolves the tools file's ${ssm:…} references: SecureString parameters, read at cold start through
// lib/ssmsecrets (a missing, empty or plain parameter fails the start).
type ssmRefs struct {
	api  ssmsecrets.API
	what string // whose references, for errors ("" is the tools file)
}

func (r ssmRefs) Resolve(ctx context.Context, refs []toolsfile.Ref) (map[toolsfile.Ref]string, error) {
	list := make([]ssmsecrets.Secret, len(refs))
	for i, ref := range refs {
		list[i] = ssmsecrets.Secret{Label: cmp.Or(r.what, "tools file") + " " + ref.String(), Param: ref.Name}
	}
	values, err := ssmsecrets.Load(ctx, r.api, list...)
	if err != nil {
		return nil, err
	}
	out := make(map[toolsfile.Ref]string, len(refs))
	for i, ref := range refs {
		out[ref] = values[i]
	}
	return out, nil
}

// noJobs is the Jobs of a function that starts no executions.
type noJobs struct{}

func (noJobs) Start(context.Context, agent.Job) error {
	return agent.E(agent.KindInternal, agent.CodeInternal, "this function starts no jobs")
}

func (noJobs) Wake(context.Context, agent.JobTask) error {
	return agent.E(agent.KindInternal, agent.CodeInternal, "this function starts no delivery passes")
}

// routerDeps are the tool router's: the model's embeddings when it has them (nil: none), the store for their
// cache, the clock of their cool-down and expiry.
func routerDeps(emb agent.Embedder, values agent.ValueStore, log *slog.Logger, clock agent.Clock) toolrouter.Deps {
	return toolrouter.Deps{Embedder: emb, Values: values, Logger: log, Clock: clock}
}

// embedder is the model's embeddings when it has them: with a models file, the entry name's adapter's.
func embedder(model agent.Model, name string) agent.Embedder {
	if set, ok := model.(*modelset.Set); ok {
		return set.Embedder(name)
	}
	emb, _ := model.(agent.Embedder)
	return emb
}
