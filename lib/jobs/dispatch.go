package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/agentloop/agentloop/lib/agent"
)

// DefaultMaxActiveJobsPerUser bounds the jobs one user has going at once, across threads and runs (a lease each
// in agent.JobSlotScope, from the dispatch until the job's result or failure is delivered).
const DefaultMaxActiveJobsPerUser = 8

// Dispatcher backs the job tools: a call creates its job insert-if-absent and starts the job's execution, then
// returns the acknowledgement at once, so the main model's turn goes on while the sub-agent works.
type Dispatcher struct {
	Store    agent.JobStore
	Jobs     agent.Jobs
	Clock    agent.Clock
	Contract agent.JobContract
	Logger   *slog.Logger // nil: discard
	// Limits leases each job a slot of its user's active jobs (nil: no limit); MaxActivePerUser is the limit
	// (zero: DefaultMaxActiveJobsPerUser; negative: none).
	Limits           agent.LimitStore
	MaxActivePerUser int
}

// Ack is a job tool's output: the dispatch tool part's output, forever (the result arrives as a steer message).
type Ack struct {
	JobID   string `json:"jobId"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

// Tools returns one job tool per kind, always-on (a router that narrows a large catalog offers them in every
// step: the deployment's own sub-agents).
func (d Dispatcher) Tools(reg Registry) []agent.Tool {
	tools := make([]agent.Tool, 0, len(reg))
	for _, name := range reg.names() {
		k := reg[name]
		tools = append(tools, agent.Tool{Name: k.Name, Description: k.Description, InputSchema: k.InputSchema, Kind: agent.ToolJob,
			AlwaysOn: true,
			Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
				return d.dispatch(ctx, k, inv)
			},
			Recorded: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
				j, err := d.Store.GetJob(ctx, inv.ThreadID, agent.JobID(inv.ThreadID, inv.RunID, inv.ToolCallID))
				switch {
				case errors.Is(err, agent.ErrJobNotFound):
					return nil, false, nil
				case err != nil:
					return nil, false, err
				}
				return ack(j), true, nil
			}})
	}
	return tools
}

// dispatch is idempotent per tool call: a re-executed call (a crash, a retried run) finds its job and starts the
// same execution again, which the Jobs port treats as success.
//
// The job is due (ListDueJobs) when its start is (Contract.StartDue): its sub-agent task moves that to its
// execution's deadline when it begins. A Start that fails (throttling, too many executions, an outage) does not
// fail the call: the job exists, and the reaper starts it again once its start is due, until its execution's
// deadline, and only then fails it (a failure steer follows). So the acknowledgement ("dispatched") is true of
// every job it names, and a job is never left running with no execution and no one to start it (REVIEW H3). The
// other choice, failing the call and marking the job failed and delivered, would refuse a job that a retry a
// minute later runs, and turn a passing outage into a model-visible failure.
func (d Dispatcher) dispatch(ctx context.Context, k Kind, inv agent.ToolInvocation) (json.RawMessage, error) {
	if k.Check != nil {
		if err := k.Check(inv.Input); err != nil {
			return nil, err
		}
	}
	now := d.Clock.Now()
	j := agent.Job{ID: agent.JobID(inv.ThreadID, inv.RunID, inv.ToolCallID), ThreadID: inv.ThreadID, Owner: inv.Owner,
		Writer: agent.Fence{RunID: inv.RunID, Epoch: inv.Epoch}, Kind: k.Name,
		ToolCallID: inv.ToolCallID, Input: inv.Input, Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now,
		// The reaper starts the job again if its task has not reported by then.
		DueAt: now.Add(cmp.Or(d.Contract.StartDue, agent.DefaultJobContract().StartDue))}
	j.Execution = j.ID
	release, err := d.lease(ctx, j)
	if err != nil {
		return nil, err
	}
	stored, _, err := d.Store.CreateJob(ctx, j)
	if err != nil {
		d.releaseIfAbsent(ctx, j, release)
		return nil, fmt.Errorf("create the %s job: %w", k.Name, err)
	}
	if stored.Finished() {
		release(ctx) // a re-executed dispatch of a job that is over
	}
	if !stored.Finished() {
		if err := d.Jobs.Start(ctx, stored); err != nil {
			log := cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
			log.Warn("start a job (the reaper starts it again when its start is due)", "thread_id", inv.ThreadID,
				"run_id", inv.RunID, "job_id", stored.ID, "err", err)
		}
	}
	return ack(stored), nil
}

// releaseIfAbsent gives the slot of a job whose CreateJob failed back only once the job is known absent: a
// failed write may have landed (its answer lost), and a job that exists holds its slot until its result is
// delivered, or the user could have one job more than the limit. The job's id is the tool call's (JobID), so a
// re-read tells; when it cannot, the slot stays leased and expires with its TTL (a retried call re-leases the
// same holder).
func (d Dispatcher) releaseIfAbsent(ctx context.Context, j agent.Job, release func(context.Context)) {
	_, err := d.Store.GetJob(context.WithoutCancel(ctx), j.ThreadID, j.ID)
	switch {
	case errors.Is(err, agent.ErrJobNotFound):
		release(ctx)
	case err != nil:
		cmp.Or(d.Logger, slog.New(slog.DiscardHandler)).Warn("a job's create failed and its re-read too: its slot stays leased until it expires",
			"thread_id", j.ThreadID, "job_id", j.ID, "err", err)
	}
}

// lease takes the job's slot among its user's active jobs, before anything is written; over the limit the call
// gets an error result the model reads. A slot lives as long as a job can (its execution's deadline, a start's
// and the delivery grace), so a lost release frees it then. It returns the release (for a job known not created).
func (d Dispatcher) lease(ctx context.Context, j agent.Job) (func(context.Context), error) {
	limit := cmp.Or(d.MaxActivePerUser, DefaultMaxActiveJobsPerUser)
	if d.Limits == nil || limit < 0 {
		return func(context.Context) {}, nil
	}
	c := d.Contract
	ttl := min(cmp.Or(c.ExecutionTimeout, agent.DefaultJobContract().ExecutionTimeout)+c.DeliveryGrace+
		cmp.Or(c.StartDue, agent.DefaultJobContract().StartDue), agent.MaxLeaseTTL)
	retry, err := d.Limits.AcquireLease(ctx, agent.LeaseRequest{Scope: agent.JobSlotScope(j.Owner), Holder: j.ID, Limit: limit,
		TTL: ttl, Now: j.CreatedAt})
	if err != nil {
		return nil, fmt.Errorf("lease a slot for the %s job: %w", j.Kind, err)
	}
	if retry > 0 {
		return nil, agent.E(agent.KindLimited, agent.CodeTooManyJobs,
			"%s was not dispatched: the user has %d background jobs going, the most allowed at once. Wait for their results.",
			j.Kind, limit)
	}
	return func(ctx context.Context) { ReleaseJobSlot(ctx, d.Limits, j, d.Logger) }, nil
}

// ReleaseJobSlot gives a job's slot among its user's active jobs back (best effort: an unreleased slot expires).
func ReleaseJobSlot(ctx context.Context, limits agent.LimitStore, j agent.Job, log *slog.Logger) {
	if limits == nil || j.Owner == "" {
		return
	}
	if err := limits.ReleaseLease(context.WithoutCancel(ctx), agent.JobSlotScope(j.Owner), j.ID); err != nil {
		cmp.Or(log, slog.New(slog.DiscardHandler)).Warn("release a job's slot", "thread_id", j.ThreadID, "job_id", j.ID, "err", err)
	}
}

func ack(j agent.Job) json.RawMessage {
	b, _ := json.Marshal(Ack{JobID: j.ID, Status: "dispatched",
		Message: "The " + j.Kind + " job is running in the background. Its result will arrive in this thread as a separate message; continue your turn now."})
	return b
}
