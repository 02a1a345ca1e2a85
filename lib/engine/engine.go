// Package engine runs the agent loop on a thread: claim → read and plan the turn → steps → finish (DESIGN.md
// "Run lifecycle"). It depends only on the domain ports, so the same engine runs under Lambda (DynamoDB, openai)
// and in `agentloop dev` (SQLite, the offline model).
//
// Fencing (DESIGN principle 8): every store write a run makes after its claim carries the run's fence (run id and
// epoch), and the run stops itself, writing nothing more, as soon as it learns it lost the claim, or when its
// heartbeats have failed for half of StaleAfter (its claim is in doubt: a reaper may take it at StaleAfter).
package engine

import (
	"cmp"
	"context"
	"log/slog"
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
	// DefaultCancelPoll is how often a run looks for a stop request between heartbeats (a read, not a write), so
	// a stop takes effect within this plus one store round trip.
	DefaultCancelPoll = 100 * time.Millisecond
	// DefaultInterruptWait bounds how long `multitask: interrupt` waits for the active run to let go.
	DefaultInterruptWait = 5 * time.Second
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
	CancelPoll      time.Duration
	InterruptWait   time.Duration
	FinishRetry     time.Duration
	MaxMessageBytes int
	SegmentFlush    time.Duration // segments.DefaultSegmentInterval
	CloseTimeout    time.Duration // segments.DefaultCloseTimeout: how long the final segment may take
	InterruptTTL    time.Duration // agent.DefaultInterruptTTL: how long an approval or client tool waits
	MaxQueued       int           // agent.DefaultMaxQueued: a thread's queue bound (multitask enqueue)
	// Per-user limits (limits.go); a negative value means no limit.
	MaxActiveRunsPerUser int           // DefaultMaxActiveRunsPerUser
	ThreadsPerMinute     int           // DefaultThreadsPerMinute
	RunLeaseTTL          time.Duration // DefaultRunLeaseTTL
	Transcript           transcript.Config
}

func (c Config) withDefaults() Config {
	c.MaxSteps = cmp.Or(c.MaxSteps, DefaultMaxSteps)
	c.RunTimeout = cmp.Or(c.RunTimeout, DefaultRunTimeout)
	c.ToolTimeout = cmp.Or(c.ToolTimeout, DefaultToolTimeout)
	c.Heartbeat = cmp.Or(c.Heartbeat, agent.DefaultHeartbeat)
	c.StaleAfter = cmp.Or(c.StaleAfter, agent.DefaultStaleAfter)
	c.CancelPoll = cmp.Or(c.CancelPoll, DefaultCancelPoll)
	c.InterruptWait = cmp.Or(c.InterruptWait, DefaultInterruptWait)
	c.FinishRetry = cmp.Or(c.FinishRetry, DefaultFinishRetry)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.SegmentFlush = cmp.Or(c.SegmentFlush, segments.DefaultSegmentInterval)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, segments.DefaultCloseTimeout)
	c.InterruptTTL = cmp.Or(c.InterruptTTL, agent.DefaultInterruptTTL)
	c.MaxQueued = cmp.Or(c.MaxQueued, agent.DefaultMaxQueued)
	c.MaxActiveRunsPerUser = cmp.Or(c.MaxActiveRunsPerUser, DefaultMaxActiveRunsPerUser)
	c.ThreadsPerMinute = cmp.Or(c.ThreadsPerMinute, DefaultThreadsPerMinute)
	c.RunLeaseTTL = cmp.Or(c.RunLeaseTTL, DefaultRunLeaseTTL)
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
	store  Store
	model  agent.Model
	tools  map[string]agent.Tool
	specs  []agent.ToolSpec
	reaper Reaper
	clock  agent.Clock
	ids    agent.IDs
	signer *interrupts.Signer
	jobs   agent.Jobs
	log    *slog.Logger
	cfg    Config
}

// Deps are the engine's ports.
type Deps struct {
	Store  Store
	Model  agent.Model
	Tools  []agent.Tool
	Reaper Reaper
	Clock  agent.Clock
	IDs    agent.IDs
	// Signer signs approval requests (interrupts.NewSigner over the application secret). Required.
	Signer *interrupts.Signer
	// Jobs starts delivery passes when a run leaves something queued (nil: only a later turn or the reaper
	// takes the queue).
	Jobs   agent.Jobs
	Logger *slog.Logger
}

// New builds an engine.
func New(d Deps, cfg Config) *Engine {
	e := &Engine{store: d.Store, model: d.Model, reaper: d.Reaper, clock: d.Clock, ids: d.IDs, signer: d.Signer, jobs: d.Jobs, log: d.Logger,
		cfg: cfg.withDefaults(), tools: map[string]agent.Tool{}}
	if e.clock == nil {
		e.clock = agent.SystemClock{}
	}
	if e.ids == nil {
		e.ids = agent.RandomIDs{Clock: e.clock}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	for _, t := range d.Tools {
		e.tools[t.Name] = t
		e.specs = append(e.specs, t.Spec())
	}
	return e
}

// Config returns the effective configuration.
func (e *Engine) Config() Config { return e.cfg }
