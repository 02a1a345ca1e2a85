// Package engine runs the agent loop on a thread: claim → read and plan the turn → steps → finish (DESIGN.md
// "Run lifecycle"). It depends only on the domain ports, so the same engine runs under Lambda (DynamoDB, openai)
// and in `agentloop dev` (SQLite, the offline model).
//
// Fencing (DESIGN principle 8): every store write a run makes after its claim carries the run's fence (run id and
// epoch), and the run stops itself, writing nothing more, as soon as it learns it lost the claim, or when its
// heartbeats have failed for half of StaleAfter (its claim is in doubt: a reaper may take it at StaleAfter).
//
// Keeping claims alive and noticing stops (keeper.go, issue 18 item 3). The store work for it is per process, not
// per run: an Engine is one process's, and its keeper sends one agent.RunStore.KeepClaims batch every Heartbeat
// (on the engine's timers) for all the runs streaming in it. Each run joins the keeper when its loop starts and
// leaves when it ends; each claim in a batch carries its run's fence and write gate, and each answer is that
// run's alone, read exactly as its own heartbeat's was: accepted moves the run's horizon (Turn.kept at the time
// the batch was stamped with); run_canceled moves it too and stops the run (a stop is not a fence, REVIEW D2:
// the run stays in the batches until it has stored its outcome); run_fenced stops the run writing anything more;
// a transient error changes nothing. The batch's deadline is the earliest horizon among its members, and a run
// whose horizon passed is sent no more: it has stopped itself as in doubt, as before. So on SQLite a process
// pays one transaction of one statement per Heartbeat whatever its number of runs; on DynamoDB, which has no
// multi-item condition outside transactions (DESIGN principle 2), a batch is one conditional UpdateItem per run:
// the same cost per run as before, and one write per second per chat Lambda, which runs one run at a time
// (infra/DYNAMODB.md "Heartbeats"). No run polls the store for a stop: the stop endpoint and multitask interrupt
// store the request (RequestCancel) and then call StopLocal, which stops the run at once when it streams in the
// same process; a run in another process reads the stop in its keeper's next batch (run_canceled), within one
// Heartbeat. keepClaim, the heartbeat of a long close-out (an edit far back) before the run streams, still sends
// its own Heartbeat: it runs before the run could join the keeper, on the writer's goroutine between its writes,
// and only when a close-out outlasts a Heartbeat.
//
// Resumed-stream readers (keeper.go, issue 18 item 4). A reader in another process marks its presence on the
// run's claim (agent.RunStore.MarkReader, the reader's write); the run then flushes its stream segments every
// SegmentHurry instead of SegmentFlush. The keeper learns of the mark two ways: from its heartbeat batch's answer
// (within a Heartbeat), and sooner from its reader probe: every ReaderProbe it sends one agent.RunStore.ReadersOf
// read for all its runs' threads (one SQLite SELECT; one eventually consistent BatchGetItem per 100 runs on
// DynamoDB) and, for each run whose claim carries a live mark, hurries its Segmenter and cuts what is pending at
// once. The probe writes nothing and moves no horizon (a read is not a heartbeat: principle 8 stays the
// batches'); one that fails or outlasts a Heartbeat is dropped, and the next goes a ReaderProbe after it ends.
//
// Runs longer than one invocation, and background runs (handover.go, issue 21): at a step boundary past its
// invocation's deadline less HandOverMargin a run stores what it has and launches its continuation
// (Deps.Launcher), which takes the claim at the next epoch (agent.HandOverStore) and streams on (Continue).
package engine

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/transcript"
)

// Defaults, written once here (lib/config maps env names onto Config).
const (
	DefaultMaxSteps        = 30
	DefaultRunTimeout      = 600 * time.Second // below the chat Lambda's 900 s timeout
	DefaultToolTimeout     = 30 * time.Second
	DefaultMaxMessageBytes = 2 << 20
	// DefaultMaxMessageParts bounds the parts of a user message (text, files, data parts).
	DefaultMaxMessageParts = 100
	// DefaultCancelPoll was how often each run read its claim for a stop request. No run polls any more (a stop
	// reaches a run of the same process at once through StopLocal, and another process's run with its keeper's
	// next batch, keeper.go); Config.CancelPoll and AGENT_CANCEL_POLL are accepted and unused.
	DefaultCancelPoll = 100 * time.Millisecond
	// DefaultInterruptWait bounds how long `multitask: interrupt` waits for the active run to let go.
	DefaultInterruptWait = 5 * time.Second
	// DefaultReaderProbe is how often the keeper reads, in one store call for all of its runs, whether a
	// resumed-stream reader in another process has attached to one of them (keeper.go): a run learns of a new
	// reader within it instead of within a Heartbeat. Config.ReaderProbe negative: no probe.
	DefaultReaderProbe = 100 * time.Millisecond
	// DefaultFinishRetry bounds the retries of the final writes (message, outcome) on transient store errors.
	DefaultFinishRetry = 10 * time.Second
)

// Config bounds a run. Zero values take the defaults (above, and those of the packages named).
type Config struct {
	Model           string
	System          string
	MaxSteps        int
	MaxOutputTokens int // zero: the model adapter's default
	RunTimeout      time.Duration
	ToolTimeout     time.Duration
	Heartbeat       time.Duration // agent.DefaultHeartbeat
	StaleAfter      time.Duration // agent.DefaultStaleAfter
	CancelPoll      time.Duration // unused: no run polls for a stop any more (DefaultCancelPoll)
	InterruptWait   time.Duration
	FinishRetry     time.Duration
	MaxMessageBytes int
	MaxMessageParts int           // DefaultMaxMessageParts: parts of a user message
	SegmentFlush    time.Duration // segments.DefaultSegmentInterval
	SegmentHurry    time.Duration // segments.DefaultHurryInterval: the flush period while a reader elsewhere is attached
	ReaderProbe     time.Duration // DefaultReaderProbe: the keeper's reader-presence probe period; negative: none
	CloseTimeout    time.Duration // segments.DefaultCloseTimeout: how long the final segment may take
	InterruptTTL    time.Duration // agent.DefaultInterruptTTL: how long an approval or client tool waits
	MaxQueued       int           // agent.DefaultMaxQueued: a thread's queue bound (multitask enqueue)
	// WindowPage is the first page of a turn's read of its thread (DefaultWindowPage; window.go): each further
	// page doubles, up to MaxWindowPage.
	WindowPage int
	// WindowTokens is what a turn's read of its thread must cover, in estimated tokens (zero: the transcript's
	// budget, which is what the model can use). Only tests set it apart, to plan turns from the smallest windows
	// while the model still takes every message.
	WindowTokens int
	// Per-user limits (limits.go); a negative value means no limit.
	MaxActiveRunsPerUser int           // DefaultMaxActiveRunsPerUser
	ThreadsPerMinute     int           // DefaultThreadsPerMinute
	RunLeaseTTL          time.Duration // DefaultRunLeaseTTL
	// What one model turn may start (limits.go); a negative value means no limit.
	MaxToolCallsPerStep int // DefaultMaxToolCallsPerStep
	MaxJobsPerRun       int // DefaultMaxJobsPerRun
	MaxJobChain         int // DefaultMaxJobChain
	// Admission control (admission.go); a negative value means no bound.
	MaxRunsPerProcess int           // DefaultMaxRunsPerProcess
	MaxHeartbeatLag   time.Duration // DefaultMaxHeartbeatLag
	// LateWait is how long a run left to the reaper waits in the background for the reaper's outcome before it
	// records its late usage (late.go; zero: two stale windows and lateReaperPeriod); negative: it does not wait
	// (the simulation, whose virtual clock such a real-time waiter would race).
	LateWait time.Duration
	// HandOverMargin is how long before its invocation's deadline a run hands over to a continuation
	// (handover.go; DefaultHandOverMargin).
	HandOverMargin time.Duration
	Transcript     transcript.Config
}

func (c Config) withDefaults() Config {
	c.MaxSteps = cmp.Or(c.MaxSteps, DefaultMaxSteps)
	c.RunTimeout = cmp.Or(c.RunTimeout, DefaultRunTimeout)
	c.ToolTimeout = cmp.Or(c.ToolTimeout, DefaultToolTimeout)
	c.Heartbeat = cmp.Or(c.Heartbeat, agent.DefaultHeartbeat)
	c.StaleAfter = cmp.Or(c.StaleAfter, agent.DefaultStaleAfter)
	c.InterruptWait = cmp.Or(c.InterruptWait, DefaultInterruptWait)
	c.FinishRetry = cmp.Or(c.FinishRetry, DefaultFinishRetry)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.MaxMessageParts = cmp.Or(c.MaxMessageParts, DefaultMaxMessageParts)
	c.SegmentFlush = cmp.Or(c.SegmentFlush, segments.DefaultSegmentInterval)
	c.ReaderProbe = cmp.Or(c.ReaderProbe, DefaultReaderProbe)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, segments.DefaultCloseTimeout)
	c.InterruptTTL = cmp.Or(c.InterruptTTL, agent.DefaultInterruptTTL)
	c.MaxQueued = cmp.Or(c.MaxQueued, agent.DefaultMaxQueued)
	c.WindowPage = cmp.Or(c.WindowPage, DefaultWindowPage)
	c.MaxActiveRunsPerUser = cmp.Or(c.MaxActiveRunsPerUser, DefaultMaxActiveRunsPerUser)
	c.ThreadsPerMinute = cmp.Or(c.ThreadsPerMinute, DefaultThreadsPerMinute)
	c.RunLeaseTTL = cmp.Or(c.RunLeaseTTL, DefaultRunLeaseTTL)
	c.MaxToolCallsPerStep = cmp.Or(c.MaxToolCallsPerStep, DefaultMaxToolCallsPerStep)
	c.MaxJobsPerRun = cmp.Or(c.MaxJobsPerRun, DefaultMaxJobsPerRun)
	c.MaxJobChain = cmp.Or(c.MaxJobChain, DefaultMaxJobChain)
	c.MaxRunsPerProcess = cmp.Or(c.MaxRunsPerProcess, DefaultMaxRunsPerProcess)
	c.MaxHeartbeatLag = cmp.Or(c.MaxHeartbeatLag, DefaultMaxHeartbeatLag)
	c.HandOverMargin = cmp.Or(c.HandOverMargin, DefaultHandOverMargin)
	return c
}

// Store is what the engine needs of the store: threads, the run claim, messages and stream segments (tool state
// is the tools' own business).
type Store interface {
	agent.ThreadStore
	agent.RunStore
	agent.MessageStore
	agent.SegmentStore
	agent.InterruptStore
	agent.QueueStore
	agent.JobStore
	agent.LimitStore
	agent.HandOverStore
}

// Reaper finishes a run whose claim went stale (lib/reaper). The engine calls it when a claim finds a stale
// run in its way, so that the reaper's conditional release stays the only reap decision.
type Reaper interface {
	Reap(ctx context.Context, threadID string, c agent.Claim) (bool, error)
	// Orphans finishes the runs of streaming messages that no claim names any more (a reaper died half way).
	Orphans(ctx context.Context, threadID, active string, msgs []agent.Message) int
}

// Engine runs turns. It holds no per-thread state: everything lives in the store.
type Engine struct {
	store Store
	model agent.Model
	// static are the Go tools; sources add tools per turn (toolset.go); inputs checks every call's arguments.
	static  *toolset
	sources []agent.ToolSource
	router  agent.ToolRouter
	inputs  agent.ToolInputs
	reaper  Reaper
	clock   agent.Clock
	timers  agent.Timers // every wait: the clock's own (agent.TimersOf), so a virtual clock moves them too
	ids     agent.IDs
	signer  *interrupts.Signer
	jobs    agent.Jobs
	log     *slog.Logger
	cfg     Config
	// prices turns each step's usage into cost (empty: no cost); metrics receives each run's outcome.
	prices  agent.Prices
	metrics agent.Metrics
	hub     *segments.Hub
	titles  Titler
	// signals announces every run's end (lib/signals; nil: none).
	signals agent.RunSignals
	// background counts the work a run leaves running after it returns (late.go).
	background sync.WaitGroup
	// admission counts the runs the engine is running (admission.go).
	admission admission
	// keeper heartbeats the claims of the runs streaming here, in one batch per Heartbeat (keeper.go).
	keeper *keeper
	// handovers launches the continuations of runs that hand over, and knows when they must (handover.go).
	handovers handovers
}

// Deps are the engine's ports.
type Deps struct {
	Store Store
	Model agent.Model
	Tools []agent.Tool
	// Sources offer tools that are not Go code (MCP servers, HTTP tools), asked when a turn begins.
	Sources []agent.ToolSource
	// Router chooses which of a turn's tools each step offers (lib/toolrouter: a subset of a large catalog).
	// Nil: every step offers them all.
	Router agent.ToolRouter
	// Inputs checks (and repairs) every tool call's arguments before anything acts on them (lib/toolschema).
	// Nil: arguments need only be JSON.
	Inputs agent.ToolInputs
	Reaper Reaper
	Clock  agent.Clock
	IDs    agent.IDs
	// Signer signs approval requests (interrupts.NewSigner over the application secret). Required.
	Signer *interrupts.Signer
	// Jobs starts delivery passes when a run leaves something queued (nil: only a later turn or the reaper
	// takes the queue).
	Jobs   agent.Jobs
	Logger *slog.Logger
	// Prices is the price table (agent.ParsePrices; the zero value prices nothing, and usage carries no cost).
	Prices agent.Prices
	// Metrics receives run outcomes (nil: agent.NopMetrics).
	Metrics agent.Metrics
	// Hub, when set, publishes every run's stream to readers of it in this process (segments.Hub).
	Hub *segments.Hub
	// Titles titles a thread after its first reply (lib/titles; nil: threads get no generated title).
	Titles Titler
	// Launcher continues a run in a fresh invocation (handover.go): hand-overs before an invocation's deadline and
	// background runs. Nil: no run hands over, and a background request is refused.
	Launcher agent.RunLauncher
	// Signals announces every run's end, whatever its status (lib/signals: EventBridge, webhooks; signal.go).
	// Nil: no completion signals.
	Signals agent.RunSignals
}

// Titler titles a thread after its first reply (lib/titles). The engine calls it once the reply is stored
// completed, the run's outcome recorded and its stream ended (final segment and [DONE] written), on the run's
// goroutine before Stream returns: a Titler that must not hold the caller (a long-lived process) goes on in the
// background itself. It reports nothing back: a title that fails changes nothing the client sees.
type Titler interface {
	FirstReply(ctx context.Context, r agent.FirstReply)
}

// New builds an engine.
func New(d Deps, cfg Config) *Engine {
	e := &Engine{store: d.Store, model: d.Model, reaper: d.Reaper, clock: d.Clock, ids: d.IDs, signer: d.Signer, jobs: d.Jobs, log: d.Logger,
		cfg: cfg.withDefaults(), static: newToolset(d.Tools, d.Router), sources: d.Sources, router: d.Router, inputs: d.Inputs, prices: d.Prices, metrics: d.Metrics, hub: d.Hub, titles: d.Titles,
		signals: d.Signals}
	if e.metrics == nil {
		e.metrics = agent.NopMetrics{}
	}
	if e.clock == nil {
		e.clock = agent.SystemClock{}
	}
	e.timers = agent.TimersOf(e.clock)
	e.keeper = newKeeper(e)
	e.handovers.launcher = d.Launcher
	if e.ids == nil {
		e.ids = agent.RandomIDs{Clock: e.clock}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	e.cfg.Transcript = e.transcriptConfig(d.Tools)
	return e
}

// transcriptConfig completes the transcript's bounds with what only the engine knows: which tools return
// snapshots, and what the system prompt and the tool specs cost in every request.
func (e *Engine) transcriptConfig(tools []agent.Tool) transcript.Config {
	tc := e.cfg.Transcript
	if tc.Snapshots == nil {
		for _, t := range tools {
			if t.Snapshot {
				if tc.Snapshots == nil {
					tc.Snapshots = map[string]bool{}
				}
				tc.Snapshots[t.Name] = true
			}
		}
	}
	tc.FixedTokens = cmp.Or(tc.FixedTokens, transcript.Fixed(e.cfg.System, e.static.specs))
	return tc
}

// Wait blocks until the work runs left in the background has ended: the late usage of runs left to the reaper
// (late.go), which waits for their reap.
func (e *Engine) Wait() { e.background.Wait() }

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }
