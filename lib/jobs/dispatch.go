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

// Dispatcher backs the job tools: a call creates its job insert-if-absent and starts the job's execution, then
// returns the acknowledgement at once, so the main model's turn goes on while the sub-agent works.
type Dispatcher struct {
	Store    agent.JobStore
	Jobs     agent.Jobs
	Clock    agent.Clock
	Contract agent.JobContract
	Logger   *slog.Logger // nil: discard
}

// Ack is a job tool's output: the dispatch tool part's output, forever (the result arrives as a steer message).
type Ack struct {
	JobID   string `json:"jobId"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

// Tools returns one job tool per kind.
func (d Dispatcher) Tools(reg Registry) []agent.Tool {
	tools := make([]agent.Tool, 0, len(reg))
	for _, name := range reg.names() {
		k := reg[name]
		tools = append(tools, agent.Tool{Name: k.Name, Description: k.Description, InputSchema: k.InputSchema, Kind: agent.ToolJob,
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
	j := agent.Job{ID: agent.JobID(inv.ThreadID, inv.RunID, inv.ToolCallID), ThreadID: inv.ThreadID, Owner: inv.Owner, Kind: k.Name,
		ToolCallID: inv.ToolCallID, Input: inv.Input, Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now,
		// The reaper starts the job again if its task has not reported by then.
		DueAt: now.Add(cmp.Or(d.Contract.StartDue, agent.DefaultJobContract().StartDue))}
	j.Execution = j.ID
	stored, _, err := d.Store.CreateJob(ctx, j)
	if err != nil {
		return nil, fmt.Errorf("create the %s job: %w", k.Name, err)
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

func ack(j agent.Job) json.RawMessage {
	b, _ := json.Marshal(Ack{JobID: j.ID, Status: "dispatched",
		Message: "The " + j.Kind + " job is running in the background. Its result will arrive in this thread as a separate message; continue your turn now."})
	return b
}
