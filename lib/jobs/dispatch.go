package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agentloop/agentloop/lib/agent"
)

// Dispatcher backs the job tools: a call creates its job insert-if-absent and starts the job's execution, then
// returns the acknowledgement at once, so the main model's turn goes on while the sub-agent works.
type Dispatcher struct {
	Store    agent.JobStore
	Jobs     agent.Jobs
	Clock    agent.Clock
	Contract agent.JobContract
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
func (d Dispatcher) dispatch(ctx context.Context, k Kind, inv agent.ToolInvocation) (json.RawMessage, error) {
	if k.Check != nil {
		if err := k.Check(inv.Input); err != nil {
			return nil, err
		}
	}
	now := d.Clock.Now()
	j := agent.Job{ID: agent.JobID(inv.ThreadID, inv.RunID, inv.ToolCallID), ThreadID: inv.ThreadID, Owner: inv.Owner, Kind: k.Name,
		ToolCallID: inv.ToolCallID, Input: inv.Input, Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now,
		// The reaper finishes a job whose execution never reported back, once the execution would have timed out.
		DueAt: now.Add(d.Contract.ExecutionTimeout + d.Contract.DeliveryGrace)}
	j.Execution = j.ID
	stored, _, err := d.Store.CreateJob(ctx, j)
	if err != nil {
		return nil, fmt.Errorf("create the %s job: %w", k.Name, err)
	}
	if !stored.Finished() {
		if err := d.Jobs.Start(ctx, stored); err != nil {
			return nil, fmt.Errorf("start the %s job: %w", k.Name, err)
		}
	}
	return ack(stored), nil
}

func ack(j agent.Job) json.RawMessage {
	b, _ := json.Marshal(Ack{JobID: j.ID, Status: "dispatched",
		Message: "The " + j.Kind + " job is running in the background. Its result will arrive in this thread as a separate message; continue your turn now."})
	return b
}
