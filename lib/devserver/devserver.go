// Package devserver is the one composition of the local stack: SQLite, the offline model (or any
// OpenAI-compatible endpoint), the engine with the demo tools and the job tools, the in-process job runner (the
// job state machine's contract), the reaper ticker and one handler serving every
// route. `agentloop dev` runs it, and every test that needs the whole stack builds it here (with t.TempDir(), and
// its store wrapped for fault injection when needed) instead of wiring it again. `agentloop serve` runs the same
// stack over a DynamoDB table as a deployment does (serve.go: NewServe, Options.Deployment).
package devserver

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/anthropic"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/emf"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/eventbridge"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/httptools"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/localjobs"
	"github.com/agentloop/agentloop/lib/locallaunch"
	"github.com/agentloop/agentloop/lib/mcptools"
	"github.com/agentloop/agentloop/lib/modelset"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/openairesponses"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/secretref"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/titles"
	"github.com/agentloop/agentloop/lib/toolrouter"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/toolschema"
	"github.com/agentloop/agentloop/lib/toolsfile"
	"github.com/agentloop/agentloop/lib/webhooks"
	"github.com/agentloop/agentloop/web"
)

// OfflineReplyDelay makes the offline model's replies arrive word by word, as a real model's do.
const OfflineReplyDelay = 30 * time.Millisecond

// MemorySize is the memory, in MB, that `agentloop dev` holds its Go runtime to (config.MemoryLimit: 80% of it
// as the soft memory limit, unless GOMEMLIMIT is set), the size of the smallest chat function the template
// allows. Dev runs the functions' handlers in one process and should fit where they fit: with Go's default pacing
// alone the heap may grow to twice what is live plus every goroutine's stack, which at 1,000 streams was 140–166
// MB of which about 60 MB was live (issue 18); under the limit the collector runs sooner instead. The limit is
// soft: a process that needs more still gets it, at more collector CPU (bounded by the runtime at half of it).
const MemorySize = 128

// DefaultJobsCloseWait bounds how long Close waits for job executions in flight.
const DefaultJobsCloseWait = 10 * time.Second

// Options configure a stack. Only Data (or Store) is required.
type Options struct {
	// Data is the directory holding the SQLite file and the HS256 dev secret.
	Data string
	// Config is the environment's configuration (config.FromEnv); the zero value means every default.
	Config config.Config
	// Store, when set, is used instead of opening SQLite in Data (benchmarks run the stack over DynamoDB).
	Store agent.Store
	// Wrap, when set, wraps the store every component uses (fault injection in tests).
	Wrap func(agent.Store) agent.Store
	// Offline options for the in-process offline model (used when Config.OpenAIAPIKey is empty and ModelURL is
	// not set).
	Offline []offline.Option
	// ModelURL, when set, is the OpenAI-compatible endpoint to use (tests serve their own offline.Server).
	ModelURL string
	// OpenAI, when set, adjusts the model adapter's configuration (tests shorten retry backoff).
	OpenAI func(*openai.Config)
	// Tools replaces the demo tools when set (it receives the store's value area).
	Tools func(agent.ValueStore, agent.Clock) []agent.Tool
	// JobContract, when set, replaces the job state machine's numbers in the local runner (tests shorten them).
	JobContract *agent.JobContract
	// Jobs, when set, is used instead of the local job runner (tests run the state machine on sfnlocal, its tasks
	// bound to Stack.JobTasks).
	Jobs  agent.Jobs
	Clock agent.Clock
	IDs   agent.IDs
	// Exclusive: the stack holds its data directory's lock (LockFile, an flock) for its life, and New refuses
	// when another process holds it. Holding it proves every earlier process on this SQLite file is dead (the
	// kernel gives a flock back when its holder dies), so New reaps every claim the store still holds before it
	// returns (reaper.ReapAllClaims: the ticker's takeover, without waiting AGENT_STALE_AFTER). `agentloop dev`
	// sets it; it applies only to the SQLite file the stack opens itself (not to Options.Store).
	Exclusive bool
	// ToolsClient, when set, sends the tools file's HTTP requests (nil: a client of the tools' own).
	ToolsClient *http.Client
	// Logger for every component; nil discards.
	Logger *slog.Logger
	// Metrics receives run outcomes and reaped runs. Nil: CloudWatch EMF documents on stdout when
	// Config.Metrics is "emf", else none (the dev server's default is off).
	Metrics agent.Metrics
	// TitleModel, when set, wraps the model thread titles are asked of (fault injection in tests).
	TitleModel func(agent.Model) agent.Model
	// Deployment: the stack serves as a deployment does (`agentloop serve`, serve.go): tokens are verified as the
	// functions verify them (dev tokens refused; AGENT_JWKS_URL's keys taken too), there is no POST /dev/token,
	// the web app asks for a token as it does in AWS, and a models file's Bedrock entries call Bedrock (not the
	// offline model) with the process's AWS configuration. Config.Secret must be set (no data directory's secret).
	Deployment bool
	// Admit, when set, is asked before a chat route admits a request (httpapi.Deps.Admit: serve's drain gate).
	Admit func(*http.Request) error
	// Pages are further routes served beside the API and the web app (serve's GET /readyz).
	Pages map[string]http.Handler
	// SignalSinks, when set, receive the completion signals too (tests).
	SignalSinks []agent.SignalSink
	// launchers, when set, wraps the in-process launcher the engine and the reaper continue runs through
	// (Serve: a drain leaves continuations to the other replicas).
	launchers func(agent.RunLauncher) agent.RunLauncher
}

// launcher is the launcher the engine and the reaper continue runs through: l, wrapped when Options say so.
func (o Options) launcher(l *locallaunch.Launcher) agent.RunLauncher {
	if o.launchers == nil {
		return l
	}
	return o.launchers(l)
}

// toolSources are the tool sources of a tools file (nil: none): its HTTP tools (lib/httptools) and one source per
// MCP server (lib/mcptools, their definitions pinned in pins), with secrets, the values of its references; close
// ends the MCP sessions.
// functions/internal/boot builds the same (it may not import this package: SQLite).
func toolSources(f *toolsfile.File, secrets toolsfile.Secrets, client *http.Client, pins agent.ValueStore, clock agent.Clock, log *slog.Logger) (sources []agent.ToolSource, close func()) {
	if f == nil {
		return nil, func() {}
	}
	if len(f.HTTPTools) > 0 {
		sources = append(sources, httptools.New(f, secrets, httptools.Options{Client: client}))
	}
	servers := mcptools.New(f, secrets, mcptools.Options{Client: client, Pins: pins, Clock: clock, Logger: log})
	for _, s := range servers {
		sources = append(sources, s)
	}
	return sources, func() {
		for _, s := range servers {
			s.Close()
		}
	}
}

// Stack is a running local backend.
type Stack struct {
	Handler http.Handler
	Store   agent.Store   // as the components see it (wrapped when Options.Wrap is set)
	SQLite  *sqlite.Store // nil when Options.Store was given
	Engine  *engine.Engine
	Reaper  *reaper.Reaper
	Threads *threads.Service
	Model   agent.Model
	Tools   []agent.Tool
	// Sources are the tools file's tool sources (AGENT_TOOLS_FILE): its HTTP tools and MCP servers.
	Sources []agent.ToolSource
	// Jobs starts job executions and delivery passes: the in-process runner (the Step Functions contract) unless
	// Options.Jobs was given; JobTasks are the task handlers.
	Jobs agent.Jobs
	// Launcher continues runs on goroutines of this process (Wait: every continuation in flight has ended).
	Launcher *locallaunch.Launcher
	// Runner is the local job runner (Wait: every execution in flight has ended).
	Runner   *localjobs.Runner
	JobTasks *jobs.Tasks
	JobKinds jobs.Registry
	// ModelName is what the engine asks (with a models file, the default entry's name); SubagentModelName what
	// the research sub-agent asks; TitleModelName what thread titles are asked of (AGENT_TITLE_MODEL).
	ModelName         string
	SubagentModelName string
	TitleModelName    string
	ModelURL          string // the OpenAI-compatible base URL in use (with a models file: the offline endpoint's, if an entry uses it)
	Offline           bool   // whether ModelURL is the in-process offline endpoint (with a models file: some entry talks to it)
	Secret            []byte
	// Titles titles threads after their first reply, in the background (Wait: every title in flight is stored);
	// nil with AGENT_TITLES=off.
	Titles *titles.Generator
	// Signals announces every run's end (lib/signals): the agentloop.run.finished event as one log line (where
	// AWS has EventBridge) and, with AGENT_WEBHOOK_URL, the signed webhook, first attempts in the background
	// (Wait), retries by the reaper ticker's sweep. Nil with AGENT_SIGNALS=off.
	Signals *signals.Outbox
	// Signer signs approval requests with a key derived from Secret.
	Signer      *interrupts.Signer
	tokenClaims []auth.MintOption
	closers     []func()
	log         *slog.Logger
	cfg         config.Config
	clock       agent.Clock
}

// New builds the stack. Close releases it; Run serves the reaper ticker.
func New(ctx context.Context, o Options) (s *Stack, err error) {
	s = &Stack{log: o.Logger}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	cfg := o.Config
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clock := o.Clock
	if clock == nil {
		clock = agent.SystemClock{}
	}
	s.cfg, s.clock = cfg, clock
	if s.log == nil {
		s.log = log
	}
	exclusive := o.Exclusive && o.Store == nil
	if exclusive {
		release, held, err := lockData(o.Data)
		if err != nil {
			return s, err
		}
		s.closers = append(s.closers, release)
		exclusive = held
	}
	if o.Deployment && cfg.Secret == "" {
		return s, errors.New("AGENT_SECRET is not set: it is the HS256 token key and the root of the approval signatures")
	}
	if s.Secret, err = Secret(o.Data, cfg.Secret); err != nil {
		return s, err
	}
	s.Store = o.Store
	if s.Store == nil {
		batch := sqlite.Options{BatchWrites: cfg.SQLiteBatchWrites, BatchBytes: cfg.SQLiteBatchBytes}
		if s.SQLite, err = sqlite.OpenWith(ctx, filepath.Join(o.Data, "agentloop.db"), batch); err != nil {
			return s, err
		}
		s.closers = append(s.closers, func() { _ = s.SQLite.Close() })
		s.Store = s.SQLite
	}
	if o.Wrap != nil {
		s.Store = o.Wrap(s.Store)
	}
	// The completion signals' attempts in flight end before the store closes and after everything that can end a
	// run (the job runner's delivery passes, the launcher's continuations) has: closers run last-in first-out.
	s.closers = append(s.closers, func() {
		if s.Signals != nil {
			s.Signals.Wait()
		}
	})

	metrics := o.Metrics
	if metrics == nil && cfg.Metrics == config.MetricsEMF {
		metrics = emf.New(os.Stdout, cfg.MetricsNamespace, clock)
	}
	model, err := s.model(ctx, o, log, metrics)
	if err != nil {
		return s, err
	}
	s.Model = model

	newTools := o.Tools
	if newTools == nil {
		newTools = func(v agent.ValueStore, c agent.Clock) []agent.Tool { return tools.Demo(v, c) }
	}
	contract := agent.DefaultJobContract()
	if o.JobContract != nil {
		contract = *o.JobContract
	}
	// The runner calls the tasks, which need the engine, which needs the runner (for delivery passes): the
	// closures break the cycle.
	var tasks *jobs.Tasks
	runner := localjobs.New(localjobs.Tasks{
		Subagent: func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) { return tasks.Subagent(ctx, in) },
		Deliver: func(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
			return tasks.Deliver(ctx, in)
		},
	}, contract, log)
	s.Jobs, s.Runner = runner, runner
	if o.Jobs != nil {
		s.Jobs = o.Jobs
	}
	// On Close, executions in flight get a moment to finish (a delivery turn writes to the store until its run
	// ends), then are cancelled; the reaper re-drives an unfinished delivery on the next start.
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultJobsCloseWait)
		defer cancel()
		_ = runner.Close(ctx)
	})
	kinds := jobs.NewRegistry(jobs.Research())
	toolset := append(newTools(s.Store, clock), jobs.Dispatcher{Store: s.Store, Jobs: s.Jobs, Clock: clock, Contract: contract, Logger: log,
		Limits: s.Store, MaxActivePerUser: cfg.MaxActiveJobsPerUser}.Tools(kinds)...)
	s.Tools = toolset
	rcfg := cfg.Reaper()
	rcfg.DeliveryGrace, rcfg.StartDue, rcfg.ExecutionTimeout = contract.DeliveryGrace, contract.StartDue, contract.ExecutionTimeout
	var runSignals agent.RunSignals
	if s.Signals, err = newSignals(cfg, s.Store, clock, log, o.SignalSinks); err != nil {
		return s, err
	} else if s.Signals != nil {
		runSignals = s.Signals
	}
	// Background runs and hand-overs (a drain's end) continue on a goroutine of this process (lib/locallaunch);
	// Close waits for those in flight, before the store closes. The reaper continues through it the handed-over
	// runs whose continuation never started (another replica's, drained: Serve).
	s.Launcher = locallaunch.New(nil, log)
	s.Reaper = reaper.New(reaper.Deps{Store: s.Store, Tools: toolset, Jobs: s.Jobs, Clock: clock, Logger: log, Metrics: metrics,
		Signals: runSignals, Launcher: o.launcher(s.Launcher)}, rcfg)
	if s.Signer, err = interrupts.NewSigner(s.Secret); err != nil {
		return s, err
	}
	// One process serves both POST /chat and its resumes: a reader of a run this process writes is fed from the
	// run's Segmenter through the hub, with no flush tick between (segments.Hub).
	hub := segments.NewHub()
	// The tools file (AGENT_TOOLS_FILE) is read and checked now, so a bad one fails the start, and its tools are
	// offered beside the Go ones (engine.Deps.Sources). Only ${env:…} references resolve here: the local stack
	// reads no SSM, so a file with ${ssm:…} references fails the start and says so, and so does the file's own SSM
	// form (ssm:<name>, the functions'), at once and saying how to run with a copy.
	if name, ok := toolsfile.SSMParameter(cfg.ToolsFile); ok {
		return s, fmt.Errorf("AGENT_TOOLS_FILE=%s: agentloop dev reads no SSM parameters (it has no AWS); save the file and set "+
			"AGENT_TOOLS_FILE to its path: aws ssm get-parameter --name %s --with-decryption --query Parameter.Value --output text > tools.yaml",
			cfg.ToolsFile, name)
	}
	var names []string
	for _, t := range toolset {
		names = append(names, t.Name)
	}
	file, secrets, err := toolsfile.Startup(ctx, cfg.ToolsFile, toolsfile.Options{Reserved: names},
		toolsfile.Resolvers{toolsfile.RefEnv: toolsfile.EnvResolver(os.Getenv)}, nil, log)
	if err != nil {
		return s, err
	}
	sources, closeSources := toolSources(file, secrets, o.ToolsClient, s.Store, clock, log)
	s.Sources = sources
	s.closers = append(s.closers, closeSources)
	// Every tool call's input is repaired once if it is not JSON and checked against its tool's schema before
	// anything acts on it; a tool whose schema is not a JSON Schema fails the start.
	inputs, err := toolschema.New(toolset...)
	if err != nil {
		return s, err
	}
	// A thread's first reply gets a title from the title model (AGENT_TITLE_MODEL), made in the background: this
	// process outlives its requests (a Lambda does not: functions/internal/boot). Close waits for those in flight.
	// AGENT_TITLES=off: none (Stack.Titles nil).
	var titler engine.Titler
	if !cfg.TitlesOff {
		titleModel := model
		if o.TitleModel != nil {
			titleModel = o.TitleModel(model)
		}
		tcfg := cfg.Titles(s.TitleModelName)
		tcfg.Background = true
		s.Titles = titles.New(titles.Deps{Store: s.Store, Model: titleModel, Clock: clock, Logger: log, Prices: cfg.Prices, Metrics: metrics}, tcfg)
		s.closers = append(s.closers, s.Titles.Wait)
		titler = s.Titles
	}
	// A catalog above AGENT_TOOL_ROUTER_MIN tools offers each step a subset (lib/toolrouter): keywords, then the
	// model's embeddings (the offline model's deterministic ones here), the tools' vectors cached in the store.
	s.Engine = engine.New(engine.Deps{Launcher: o.launcher(s.Launcher), Store: s.Store, Model: model, Tools: toolset, Sources: s.Sources, Router: toolrouter.New(routerDeps(embedder(model, s.ModelName), s.Store, log, clock), cfg.ToolRouter()), Inputs: inputs, Reaper: s.Reaper, Clock: clock, IDs: o.IDs,
		Signer: s.Signer, Jobs: s.Jobs, Logger: log, Prices: cfg.Prices, Metrics: metrics, Hub: hub, Titles: titler,
		Signals: runSignals},
		cfg.Engine(s.ModelName))
	s.Launcher.SetContinue(s.Engine.Continue)
	s.closers = append(s.closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultJobsCloseWait)
		defer cancel()
		_ = s.Launcher.Close(ctx)
	})
	tasks = jobs.NewTasks(jobs.Deps{Store: s.Store, Model: model, Kinds: kinds, Engine: s.Engine, Jobs: s.Jobs, Clock: clock, Logger: log,
		Limits: s.Store},
		jobs.Config{Contract: contract, ModelName: s.SubagentModelName})
	s.JobTasks, s.JobKinds = tasks, kinds
	// One process runs every route: a stop reaches its run in memory (the engine's StopLocal), not at the run's
	// next heartbeat.
	s.Threads = threads.New(threads.Deps{Store: s.Store, Reaper: s.Reaper, Stopper: s.Engine, Clock: clock, Logger: log, Hub: hub},
		cfg.Threads())
	// The dev server takes dev tokens (auth.DevAudience) and honours AGENT_JWT_ISSUER, AGENT_JWT_AUDIENCE and
	// AGENT_JWT_MAX_AGE as a deployment does (REVIEW S13). A deployment's stack takes no dev token.
	acfg := cfg.Auth(s.Secret, clock, !o.Deployment)
	if o.Deployment && cfg.JWKSURL != "" {
		// The key set is refreshed for the life of the process, not only its start.
		jwks, err := auth.NewJWKSKeys(context.WithoutCancel(ctx), auth.JWKSConfig{URL: cfg.JWKSURL, Logger: log})
		if err != nil {
			return s, err
		}
		acfg.Keys = auth.Keys{acfg.Keys, jwks}
	}
	verifier, err := auth.NewVerifier(acfg)
	if err != nil {
		return s, err
	}
	s.tokenClaims = cfg.DevTokenClaims()
	if o.Deployment {
		s.tokenClaims = cfg.DeploymentTokenClaims()
	}
	refusals, _ := metrics.(agent.Refusals)
	// The web app at the root, same origin as the API; the dev server's gets its token from POST /dev/token
	// (loopback only), a deployment's from its own sign-in (web/src/token.ts).
	wcfg := web.Config{MaxMessageBytes: int64(cmp.Or(cfg.MaxMessageBytes, engine.DefaultMaxMessageBytes))}
	if !o.Deployment {
		wcfg.DevTokenURL = "./dev/token"
	}
	pages := web.Pages(web.Handler(wcfg))
	if !o.Deployment {
		pages["POST /dev/token"] = s.devToken(log)
	}
	for pattern, h := range o.Pages {
		pages[pattern] = h
	}
	s.Handler = httpapi.New(httpapi.Deps{Engine: s.Engine, Threads: s.Threads, Auth: verifier, Clock: clock, Logger: log, Refusals: refusals,
		MaxBodyBytes: cfg.MaxBodyBytes, AllowOrigins: []string{"*"}, Pages: pages, Admit: o.Admit,
		RequestDeadline: cfg.RequestDeadline}) // a POST's deadline, as a Lambda's (its runs go on through s.Launcher)
	if exclusive {
		// Every writer of this store is dead: their runs are reaped now, their slots and readers given back.
		n, err := s.Reaper.ReapAllClaims(ctx)
		if err != nil {
			return s, err
		}
		if n > 0 {
			log.Info("dev.reaped_at_start", "runs", n)
		}
	}
	return s, nil
}

// model is the stack's model port. Without a models file: one OpenAI-compatible adapter, at Options.ModelURL,
// else OPENAI_BASE_URL with OPENAI_API_KEY, else (no key) the in-process offline model. With one
// (AGENT_MODELS_FILE): lib/modelset over its entries, their keys' ${env:…} references resolved (the local stack
// reads no SSM: an ${ssm:…} key fails the start), and an entry with neither baseURL nor apiKey talks to the offline
// endpoint in its provider's protocol (offlineBaseURL), started only when an entry does.
func (s *Stack) model(ctx context.Context, o Options, log *slog.Logger, metrics agent.Metrics) (agent.Model, error) {
	cfg := o.Config
	openaiConfig := func(baseURL, key, model string) openai.Config {
		mcfg := cfg.OpenAI(baseURL, key, model, log)
		if o.OpenAI != nil {
			o.OpenAI(&mcfg)
		}
		return mcfg
	}
	startOffline := func() (string, error) {
		if o.ModelURL != "" {
			return o.ModelURL, nil
		}
		url, stop, err := offline.Start("127.0.0.1:0", append([]offline.Option{offline.WithReplyDelay(OfflineReplyDelay)}, o.Offline...)...)
		if err != nil {
			return "", err
		}
		s.closers = append(s.closers, stop)
		return url, nil
	}
	if cfg.Models == nil {
		s.ModelURL, s.ModelName = cfg.OpenAIBaseURL, cmp.Or(cfg.Model, config.DefaultModel)
		s.SubagentModelName = cmp.Or(cfg.SubagentModel, s.ModelName)
		s.TitleModelName = cmp.Or(cfg.TitleModel, s.ModelName)
		switch {
		case o.ModelURL != "":
			s.ModelURL, s.ModelName, s.Offline = o.ModelURL, offline.DefaultModel, cfg.OpenAIAPIKey == ""
			s.SubagentModelName, s.TitleModelName = s.ModelName, s.ModelName
		case cfg.OpenAIAPIKey == "":
			url, err := startOffline()
			if err != nil {
				return nil, err
			}
			s.ModelURL, s.ModelName, s.Offline = url, offline.DefaultModel, true
			s.SubagentModelName, s.TitleModelName = s.ModelName, s.ModelName
		}
		return openai.New(openaiConfig(s.ModelURL, cfg.OpenAIAPIKey, s.ModelName)), nil
	}
	s.ModelName, s.SubagentModelName, s.TitleModelName = cfg.Model, cfg.SubagentModel, cfg.TitleModel
	keys, err := modelsfile.Startup(ctx, cfg.Models, modelsfile.Options{}, secretref.Resolvers{secretref.Env: secretref.EnvResolver(os.Getenv)}, log)
	if err != nil {
		return nil, fmt.Errorf("%w (agentloop dev reads no SSM parameters: give a key as ${env:NAME}, or leave out baseURL and apiKey to talk to the offline model)", err)
	}
	build := modelset.Constructors{
		modelsfile.OpenAIChat: func(e modelsfile.Model, key string) (agent.Model, error) {
			return openai.New(openaiConfig(e.BaseURL, key, e.Model)), nil
		},
		modelsfile.OpenAIResponses: func(e modelsfile.Model, key string) (agent.Model, error) {
			return openairesponses.New(cfg.OpenAIResponses(e.BaseURL, key, e.Model, log)), nil
		},
		modelsfile.Anthropic: func(e modelsfile.Model, key string) (agent.Model, error) {
			return anthropic.New(anthropicConfig(cfg, e, key, s.Offline && e.BaseURL == offlineBaseURL(e.Provider, s.ModelURL), log)), nil
		},
		modelsfile.AnthropicBedrock: func(e modelsfile.Model, _ string) (agent.Model, error) {
			return anthropic.New(anthropicConfig(cfg, e, "", s.Offline && e.BaseURL == offlineBaseURL(e.Provider, s.ModelURL), log)), nil
		},
		modelsfile.BedrockConverse: func(e modelsfile.Model, _ string) (agent.Model, error) {
			var awsCfg *aws.Config
			if s.Offline && e.BaseURL == offlineBaseURL(e.Provider, s.ModelURL) {
				// The offline model wants a signature, not a valid one: static placeholder credentials.
				awsCfg = &aws.Config{Region: e.Region, Credentials: credentials.NewStaticCredentialsProvider("offline", "offline", "")}
			}
			return bedrockconverse.New(cfg.BedrockConverse(e, awsCfg, log)), nil
		},
	}
	for provider, c := range build {
		build[provider] = func(e modelsfile.Model, key string) (agent.Model, error) {
			// A deployment's Bedrock entry calls Bedrock with the process's AWS configuration (the adapters load the
			// default chain: an ECS task's role), as the functions' does; it has no key by design.
			if e.BaseURL != "" || e.APIKey != "" || o.Deployment && modelsfile.Bedrock(e.Provider) {
				return c(e, key)
			}
			if s.ModelURL == "" {
				url, err := startOffline()
				if err != nil {
					return nil, err
				}
				s.ModelURL, s.Offline = url, true
			}
			if e.BaseURL = offlineBaseURL(e.Provider, s.ModelURL); e.BaseURL == "" {
				return nil, fmt.Errorf("the offline model does not speak %s yet: give the entry a baseURL and an apiKey", e.Provider)
			}
			return c(e, key)
		}
	}
	failovers, _ := metrics.(agent.Failovers)
	return modelset.New(cfg.Models, keys, build, modelset.WithLogger(log), modelset.WithFailovers(failovers))
}

// offlineBaseURL is the base URL, in provider's protocol, of the offline endpoint served at root (its Chat
// Completions base, ".../v1/"), for an entry with neither baseURL nor apiKey; "" when the offline model does not
// speak that protocol yet. Each adapter that comes adds its line here beside its constructor above.
func offlineBaseURL(provider, root string) string {
	switch provider {
	case modelsfile.OpenAIChat, modelsfile.OpenAIResponses, modelsfile.Anthropic: // all under the same /v1/ root
		return root
	case modelsfile.BedrockConverse, modelsfile.AnthropicBedrock: // the server's root: model/{modelId}/… below it
		return strings.TrimSuffix(root, "v1/")
	}
	return ""
}

// anthropicConfig is an anthropic or anthropic-bedrock entry's adapter configuration, with the settings the
// OpenAI adapters take (timeouts, retries, output bound: lib/config maps them once). Talking to the offline model,
// an anthropic entry sends a placeholder key (the offline model, as Anthropic, wants an x-api-key) and an
// anthropic-bedrock entry signs with static placeholder credentials (the offline model wants a signature, not a
// valid one); otherwise the entry's key, or the default AWS configuration.
func anthropicConfig(cfg config.Config, e modelsfile.Model, key string, offline bool, log *slog.Logger) anthropic.Config {
	o := cfg.OpenAI("", "", e.Model, log)
	ac := anthropic.Config{APIKey: key, BaseURL: e.BaseURL, Model: e.Model, MaxOutputTokens: o.MaxOutputTokens,
		FirstTokenTimeout: o.FirstTokenTimeout, IdleTimeout: o.IdleTimeout, MaxRetries: o.MaxRetries, Logger: log,
		Bedrock: e.Provider == modelsfile.AnthropicBedrock, Region: e.Region}
	switch {
	case offline && !ac.Bedrock:
		ac.APIKey = "offline"
	case offline:
		ac.AWS = &aws.Config{Region: e.Region, Credentials: credentials.NewStaticCredentialsProvider("offline", "offline", "")}
	}
	return ac
}

// LockFile is the name of the data directory's lock (Options.Exclusive), beside the SQLite file; it holds the
// id of the process that holds it.
const LockFile = "agentloop.lock"

func lockPath(dir string) string { return filepath.Join(dir, LockFile) }

// DevUser is the user of the dev server's tokens: the one `agentloop dev` prints and the one the web app gets.
const DevUser = "dev"

// devToken gives the web app a token for DevUser, to a caller on this machine only: the dev server may listen
// on another address (--addr), and a token is the whole of the dev user's access.
func (s *Stack) devToken(log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip, err := netip.ParseAddr(host); err != nil || !ip.Unmap().IsLoopback() {
			log.Warn("dev.token_refused", "remote", host)
			writeError(w, http.StatusUnauthorized, agent.CodeUnauthenticated, "dev tokens are given on this machine only")
			return
		}
		tok, err := s.Token(DevUser, config.DefaultTokenTTL)
		if err != nil {
			log.Error("dev.token", "err", err)
			writeError(w, http.StatusInternalServerError, agent.CodeInternal, "no token")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(map[string]any{"token": tok, "expiresIn": int(config.DefaultTokenTTL.Seconds())})
	})
}

// newSignals is the local stack's completion signals: the EventBridge event as one log line, and the webhook
// when AGENT_WEBHOOK_URL is set (its secret from AGENT_WEBHOOK_SECRET), as in AWS. Nil with AGENT_SIGNALS=off.
func newSignals(cfg config.Config, store agent.SignalStore, clock agent.Clock, log *slog.Logger, extra []agent.SignalSink) (*signals.Outbox, error) {
	if cfg.SignalsOff {
		return nil, nil
	}
	sinks := []agent.SignalSink{eventbridge.Log{Logger: log}}
	if cfg.WebhookURL != "" {
		if cfg.WebhookSecret == "" {
			return nil, fmt.Errorf("AGENT_WEBHOOK_URL is set but AGENT_WEBHOOK_SECRET is not (whsec_ and base64 of the signing key)")
		}
		hook, err := webhooks.New(webhooks.Config{URL: cfg.WebhookURL, Secret: cfg.WebhookSecret, Clock: clock})
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, hook)
	}
	sinks = append(sinks, extra...)
	return signals.New(signals.Deps{Store: store, Sinks: sinks, Clock: clock, Logger: log}, cfg.Signals(true)), nil
}

// Run serves the reaper ticker until ctx ends (in AWS a scheduled function does this).
func (s *Stack) Run(ctx context.Context) { s.Reaper.Run(ctx) }

// Token mints a bearer token for user that the stack accepts.
func (s *Stack) Token(user string, ttl time.Duration) (string, error) {
	return auth.MintHS256(s.Secret, user, ttl, time.Now(), s.tokenClaims...)
}

// Close stops the offline model and closes the store. It logs what the SQLite store did in the stack's life
// ("store totals": store calls and SQL statements), which the peer benchmark reads as the process's store work.
func (s *Stack) Close() {
	if s.SQLite != nil && s.log != nil {
		s.log.Info("store totals", "store_calls", s.SQLite.Ops(), "statements", s.SQLite.Statements())
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": message}})
}

// Secret returns fromEnv when set, else the data directory's secret file, created on first use.
func Secret(dir, fromEnv string) ([]byte, error) {
	if fromEnv != "" {
		return []byte(fromEnv), nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "secret")
	if b, err := os.ReadFile(path); err == nil {
		s := strings.TrimSpace(string(b))
		if len(s) < 32 {
			return nil, fmt.Errorf("%s: secret shorter than 32 bytes", path)
		}
		return []byte(s), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	s := hex.EncodeToString(raw)
	// O_EXCL: two processes starting at once agree on the first writer's secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return Secret(dir, "")
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.WriteString(s + "\n"); err != nil {
		return nil, err
	}
	return []byte(s), nil
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
