package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// Store is what the job tasks need of the store.
type Store interface {
	agent.JobStore
	agent.QueueStore
	// GetThread tells a delivery which incarnation of the thread its job belongs to.
	GetThread(ctx context.Context, id string) (agent.Thread, error)
}

// Defaults of the delivery pass.
const (
	// DefaultDrainTurns bounds the turns one delivery pass runs before it hands over to a new pass.
	DefaultDrainTurns = 20
	// DefaultDrainBudget bounds a delivery pass's wall clock (below the wake Lambda's timeout, with room for
	// one whole run: engine.DefaultRunTimeout).
	DefaultDrainBudget = 120 * time.Second
)

// Config configures the tasks. Zero values take the defaults.
type Config struct {
	Contract agent.JobContract // agent.DefaultJobContract()
	// ModelName is the model sub-agents ask.
	ModelName string
	// MaxSteps caps a sub-agent's model calls (DefaultSubagentSteps).
	MaxSteps    int
	DrainTurns  int
	DrainBudget time.Duration
}

// Tasks are the job state machine's two task handlers (functions/subagent and functions/wake in AWS; the local
// runner in agentloop dev), typed func(ctx, In) (Out, error) returning the named errors the state machine
// matches: *agent.TransientError is retried, *agent.JobFailedError and everything else take the failure path.
type Tasks struct {
	store  Store
	model  agent.Model
	kinds  Registry
	engine *engine.Engine
	jobs   agent.Jobs
	clock  agent.Clock
	log    *slog.Logger
	limits agent.LimitStore
	cfg    Config
}

// SubagentStore is all the sub-agent task touches of the store: its job's item (the sub-agent function's IAM
// policy grants what these reach, functions/deploytest).
type SubagentStore interface {
	GetJob(ctx context.Context, threadID, id string) (agent.Job, error)
	SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error
	SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error
	FinishJob(ctx context.Context, r agent.JobResult) (agent.Job, bool, error)
}

// Deps are the tasks' ports. Engine and Jobs are needed by Deliver only (the sub-agent task runs without them).
type Deps struct {
	Store  Store
	Model  agent.Model
	Kinds  Registry
	Engine *engine.Engine
	Jobs   agent.Jobs
	Clock  agent.Clock
	Logger *slog.Logger
	// Limits, when set, is where Deliver gives a delivered job's slot among its user's active jobs back
	// (Dispatcher.Limits leased it).
	Limits agent.LimitStore
}

// NewTasks builds the task handlers.
func NewTasks(d Deps, cfg Config) *Tasks {
	if cfg.Contract == (agent.JobContract{}) {
		cfg.Contract = agent.DefaultJobContract()
	}
	cfg.MaxSteps = cmp.Or(cfg.MaxSteps, DefaultSubagentSteps)
	cfg.DrainTurns = cmp.Or(cfg.DrainTurns, DefaultDrainTurns)
	cfg.DrainBudget = cmp.Or(cfg.DrainBudget, DefaultDrainBudget)
	t := &Tasks{store: d.Store, model: d.Model, kinds: d.Kinds, engine: d.Engine, jobs: d.Jobs, clock: d.Clock, log: d.Logger, limits: d.Limits, cfg: cfg}
	if t.clock == nil {
		t.clock = agent.SystemClock{}
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	return t
}

// Subagent runs the job's sub-agent and stores its result. A job that finished already (a retried task, a
// second execution) returns at once: the result is stored once.
func (t *Tasks) Subagent(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
	log := t.log.With("thread_id", in.ThreadID, "job_id", in.JobID)
	var store SubagentStore = t.store
	j, err := store.GetJob(ctx, in.ThreadID, in.JobID)
	switch {
	case errors.Is(err, agent.ErrJobNotFound):
		log.Info("job gone (its thread was deleted); nothing to run")
		return in, nil
	case err != nil:
		return in, transient(err)
	case j.Finished():
		return in, nil
	}
	kind, ok := t.kinds[j.Kind]
	if !ok {
		return in, &agent.JobFailedError{Reason: fmt.Sprintf("unknown job kind %q", j.Kind)}
	}
	// The execution runs: the job is due at its end now, not at its start's (the reaper would start it again).
	now := t.clock.Now()
	switch err := store.SetJobDue(ctx, j.ThreadID, j.ID, now.Add(t.cfg.Contract.ExecutionTimeout+t.cfg.Contract.DeliveryGrace), now); {
	case errors.Is(err, agent.ErrJobFinished), errors.Is(err, agent.ErrJobNotFound):
		return in, nil
	case err != nil:
		return in, transient(err)
	}
	begin := time.Now()
	var used agent.Usage
	env := Env{Model: t.model, ModelName: t.cfg.ModelName, MaxSteps: t.cfg.MaxSteps, Activity: func(line string) {
		if err := store.SetJobActivity(ctx, j.ThreadID, j.ID, line, t.clock.Now()); err != nil && !errors.Is(err, agent.ErrJobFinished) {
			log.Warn("job activity", "err", err)
		}
	}, Used: func(u agent.Usage) { used = used.Add(u) }}
	result, err := kind.Run(ctx, env, j.Input)
	if err != nil {
		log.Warn("agent.job", "kind", j.Kind, "outcome", "error", "ms", time.Since(begin).Milliseconds(), "err", err,
			"input_tokens", used.InputTokens, "output_tokens", used.OutputTokens, "total_tokens", used.TotalTokens)
		var failed *agent.JobFailedError
		switch {
		case ctx.Err() != nil:
			return in, ctx.Err() // the attempt's timeout (States.Timeout) or the execution's end
		case agent.IsKind(err, agent.KindUnavailable):
			return in, transient(err)
		case !errors.As(err, &failed):
			_, msg := agent.Public(err)
			failed = &agent.JobFailedError{Reason: msg}
		}
		t.recordFailure(ctx, j, failed, used, log)
		return in, failed
	}
	now = t.clock.Now()
	_, _, err = store.FinishJob(ctx, agent.JobResult{ThreadID: j.ThreadID, ID: j.ID, Result: result, Usage: used,
		DueAt: now.Add(t.cfg.Contract.DeliveryGrace), Now: now})
	switch {
	case errors.Is(err, agent.ErrJobNotFound):
		log.Info("job gone while it ran (its thread was deleted); result dropped")
		return in, nil
	case err != nil:
		return in, transient(err)
	}
	log.Info("agent.job", "kind", j.Kind, "outcome", "done", "ms", time.Since(begin).Milliseconds(), "bytes", len(result),
		"input_tokens", used.InputTokens, "output_tokens", used.OutputTokens, "cached_input_tokens", used.CachedInputTokens,
		"reasoning_tokens", used.ReasoningTokens, "total_tokens", used.TotalTokens)
	return in, nil
}

// recordFailure stores a sub-agent's failure for good with the usage its model calls reported, before the task
// returns it: the state machine's failure path then delivers that stored failure (record finds the job
// finished), and the delivering turn counts the usage, as for a result (issue 16 item 5). The text is the one
// record would store from the caught JobFailedError. A write that fails is only logged: the failure path stores
// the failure itself, without the usage.
func (t *Tasks) recordFailure(ctx context.Context, j agent.Job, failed *agent.JobFailedError, used agent.Usage, log *slog.Logger) {
	if used == (agent.Usage{}) {
		return // nothing to count: the failure path stores the same failure
	}
	now := t.clock.Now()
	_, _, err := t.store.FinishJob(ctx, agent.JobResult{ThreadID: j.ThreadID, ID: j.ID, Error: failed.Reason, Usage: used,
		DueAt: now.Add(t.cfg.Contract.DeliveryGrace), Now: now})
	if err != nil && !errors.Is(err, agent.ErrJobNotFound) {
		log.Warn("store the failed job's usage", "err", err)
	}
}

// Deliver delivers a job's result into its thread (in.JobID set), recording a caught failure first, and runs a
// delivery pass over the thread's queue: the steer is queued (insert-if-absent, id steer_<jobId>), and when the
// thread is idle and waits for nobody the pass claims it and runs a server-side turn that takes the queue
// (resumable like any turn). A busy thread keeps the steer queued: the turn that holds it asks for a pass when
// it ends, and a turn that adds a user message takes it. Exactly once per job under every race: see
// engine/queue.go.
func (t *Tasks) Deliver(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
	out := agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredNothing}
	if in.JobID != "" {
		// The thread's incarnation, read before the job: a job found after it is of that incarnation (a delete
		// takes the thread's jobs with it, and a job of an earlier one is never read), and its steer is queued
		// only while that incarnation lives, never in a thread created again on the id since (issue 16 item 2).
		th, err := t.store.GetThread(ctx, in.ThreadID)
		switch {
		case agent.IsKind(err, agent.KindNotFound):
			return out, nil // the thread was deleted: the job went with it
		case err != nil:
			return out, transient(err)
		}
		j, err := t.record(ctx, in)
		if err == nil {
			// Its result or failure is final and is delivered now (or waits in the queue): the job no longer
			// counts among its user's active ones.
			ReleaseJobSlot(ctx, t.limits, j, t.log)
		}
		switch {
		case errors.Is(err, agent.ErrJobNotFound):
			return out, nil
		case err != nil:
			return out, err
		case j.SteerDelivered:
			out.Status = agent.DeliveredSteer
			return out, nil
		}
		steer := t.kinds.Steer(j)
		entry, _, err := t.store.Enqueue(ctx, agent.QueuedMessage{ThreadID: j.ThreadID, Kind: agent.QueueSteer, Message: steer, JobID: j.ID,
			Status: agent.QueueQueued, CreatedAt: t.clock.Now(), Epoch: th.Epoch}, math.MaxInt32) // a steer is never refused for the bound
		switch {
		case agent.IsKind(err, agent.KindNotFound):
			// The thread was deleted, maybe created again on its id since: the job went with it, and is delivered
			// nowhere (the new thread never sees it).
			t.log.Info("agent.delivery", "thread_id", in.ThreadID, "job_id", in.JobID, "status", out.Status, "reason", "thread deleted")
			return out, nil
		case err != nil:
			return out, transient(err)
		}
		if entry.Status == agent.QueueTaken {
			// A turn stored the steer (it writes the message before it takes the entry) and died before it
			// marked the job: finish that here, or the job would stay undelivered and be re-driven forever.
			if _, err := t.store.MarkJobDelivered(ctx, j.ThreadID, j.ID, t.clock.Now()); err != nil {
				return out, transient(err)
			}
			out.Status = agent.DeliveredSteer
			t.log.Info("job delivered", "thread_id", j.ThreadID, "job_id", j.ID, "by", "re-drive of a taken steer")
			return out, nil
		}
		out.Status = agent.DeliveredQueued
	}
	turns, err := t.Drain(ctx, in.ThreadID)
	out.Turns = turns
	if err != nil {
		return out, err
	}
	if in.JobID != "" {
		if j, err := t.store.GetJob(ctx, in.ThreadID, in.JobID); err == nil && j.SteerDelivered {
			out.Status = agent.DeliveredSteer
		}
	} else if turns > 0 {
		out.Status = agent.DeliveredSteer
	}
	t.log.Info("agent.delivery", "thread_id", in.ThreadID, "job_id", in.JobID, "status", out.Status, "turns", turns)
	return out, nil
}

// record returns the job, storing the failure the state machine caught when the sub-agent stored no result.
func (t *Tasks) record(ctx context.Context, in agent.JobTask) (agent.Job, error) {
	j, err := t.store.GetJob(ctx, in.ThreadID, in.JobID)
	if err != nil {
		if errors.Is(err, agent.ErrJobNotFound) {
			return j, err
		}
		return j, transient(err)
	}
	if j.Finished() {
		return j, nil
	}
	if in.Failure == nil {
		// Delivery without a result and without a failure: nothing to deliver yet (the reaper re-drives it).
		return j, &agent.JobFailedError{Reason: "the job has no result to deliver"}
	}
	now := t.clock.Now()
	j, _, err = t.store.FinishJob(ctx, agent.JobResult{ThreadID: j.ThreadID, ID: j.ID, Error: failureText(in.Failure, t.cfg.Contract),
		DueAt: now.Add(t.cfg.Contract.DeliveryGrace), Now: now})
	if err != nil {
		return j, transient(err)
	}
	return j, nil
}

// Drain runs delivery-pass turns on the thread while its queue holds something it can answer: one turn per
// queued user message (in order), steers coalesced. It stops when there is nothing to answer, when a run holds
// the thread (that run's end asks for the next pass), or at its turn or time bound, handing over to a new pass.
func (t *Tasks) Drain(ctx context.Context, threadID string) (int, error) {
	begin := time.Now()
	for turns := 0; ; turns++ {
		if turns >= t.cfg.DrainTurns || time.Since(begin) > t.cfg.DrainBudget {
			if t.jobs != nil {
				if err := t.jobs.Wake(ctx, agent.JobTask{ThreadID: threadID, Wake: fmt.Sprintf("drain-%s-%d", threadID, t.clock.Now().UnixMilli())}); err != nil {
					return turns, transient(err)
				}
			}
			return turns, nil
		}
		turn, err := t.engine.BeginQueued(ctx, threadID)
		switch {
		case errors.Is(err, engine.ErrNothingQueued), errors.Is(err, agent.ErrRunActive), agent.IsKind(err, agent.KindNotFound),
			errors.Is(err, agent.ErrThreadDeleting):
			return turns, nil
		case err != nil:
			if agent.IsKind(err, agent.KindUnavailable) {
				return turns, transient(err)
			}
			return turns, err
		}
		run := turn.Stream(ctx, io.Discard)
		t.log.Info("delivery turn", "thread_id", threadID, "run_id", run.ID, "trigger", run.Trigger, "status", run.Status)
	}
}

func failureText(f *agent.TaskFailure, c agent.JobContract) string {
	switch f.Error {
	case "States.Timeout":
		return fmt.Sprintf("it did not finish within %s", c.TaskTimeout)
	case "JobFailedError":
		if r, ok := causeReason(f.Cause); ok {
			return r
		}
	}
	return "it stopped with an error (" + f.Error + ")"
}

// causeReason reads the JobFailedError's reason out of a caught cause (the Lambda error JSON or the text).
func causeReason(cause string) (string, bool) {
	const prefix = "job failed: "
	var e struct {
		ErrorMessage string `json:"errorMessage"`
	}
	if err := json.Unmarshal([]byte(cause), &e); err == nil && e.ErrorMessage != "" {
		cause = e.ErrorMessage
	}
	if len(cause) > len(prefix) && cause[:len(prefix)] == prefix {
		return cause[len(prefix):], true
	}
	return "", false
}

func transient(err error) error {
	var te *agent.TransientError
	if errors.As(err, &te) {
		return te
	}
	return &agent.TransientError{Err: err}
}
