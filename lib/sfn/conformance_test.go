package sfn_test

import (
	"context"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobstest"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

// The Jobs suite on the repository's state machine, executed by aws-local-stepfunctions: one server for all
// cases, running a copy of infra/jobs.asl.json with the suite's contract written in, its two Lambda tasks bound
// to callbacks that serve each case's scripted tasks (routed by the JobTask's thread) as the Go runtime would.
func TestConformance(t *testing.T) {
	local := sfntest.StartJobs(t, jobstest.Contract())
	t.Logf("sfnlocal started in %v", local.Server.Startup)
	jobstest.Run(t, func(t *testing.T, threadID string, tasks jobstest.Tasks) jobstest.Adapter {
		local.Route(t, threadID, sfntest.Function(tasks.Subagent), sfntest.Function(tasks.Deliver))
		rec := &recorder{Jobs: sfn.New(local.Client, local.Server.StateMachineARN)}
		return jobstest.Adapter{Jobs: rec, Wait: func(ctx context.Context) error { return local.Wait(ctx, rec.started()...) }}
	})
}

// recorder notes the execution each Start and Wake names, for Wait to watch.
type recorder struct {
	*sfn.Jobs

	mu    sync.Mutex
	names []string
}

func (r *recorder) Start(ctx context.Context, j agent.Job) error {
	r.note(j.ID)
	return r.Jobs.Start(ctx, j)
}

func (r *recorder) Wake(ctx context.Context, w agent.JobTask) error {
	r.note(sfn.WakeName(w.ThreadID, w.Wake))
	return r.Jobs.Wake(ctx, w)
}

func (r *recorder) note(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, name)
}

func (r *recorder) started() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...)
}
