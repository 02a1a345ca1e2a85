package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/jobs"
)

// startLog is a Jobs port that records what it was asked to start and runs nothing.
type startLog struct {
	mu     sync.Mutex
	starts []agent.Job
	wakes  []agent.JobTask
	fail   error // Start answers this when set
}

func (s *startLog) Start(_ context.Context, j agent.Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts = append(s.starts, j)
	return s.fail
}

func (s *startLog) Wake(_ context.Context, w agent.JobTask) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wakes = append(s.wakes, w)
	return nil
}

func (s *startLog) started() []agent.Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]agent.Job(nil), s.starts...)
}

func withJobs(js agent.Jobs) option { return func(o *devserver.Options) { o.Jobs = js } }

// researchCalls is the offline model's command for n parallel research calls in one step.
func researchCalls(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "/tool research {\"question\":\"q%d\"} ", i)
	}
	return b.String()
}

// toolErrors returns the error texts of the stored reply's tool parts, by code prefix.
func toolErrors(t *testing.T, msgs []agent.Message) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range msgs {
		if m.Role != agent.RoleAssistant {
			continue
		}
		for _, raw := range m.Parts {
			var p agent.Part
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			if p.State == agent.StateOutputError {
				code, _, _ := strings.Cut(p.ErrorText, ":")
				out[code]++
			}
		}
	}
	return out
}

// REVIEW S2: a model returning 200 research calls in one step started 200 jobs. The step's calls are capped
// (the extra calls get an error result the model reads and are never executed), and so are a run's jobs.
func TestJobToolCallsAreBounded(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	run, _ := f.turn(t, "th-200", "m1", researchCalls(200))
	if run.Status != agent.RunCompleted {
		t.Fatalf("run %s: %+v", run.Status, run.Error)
	}
	jobs, err := f.store.ListJobs(context.Background(), "th-200")
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != engine.DefaultMaxJobsPerRun || len(js.started()) != engine.DefaultMaxJobsPerRun {
		t.Fatalf("jobs started by one request: %d (%d starts), want %d", len(jobs), len(js.started()), engine.DefaultMaxJobsPerRun)
	}
	errs := toolErrors(t, f.messages(t, "th-200"))
	want := map[string]int{agent.CodeTooManyToolCalls: 200 - engine.DefaultMaxToolCallsPerStep,
		agent.CodeTooManyJobs: engine.DefaultMaxToolCallsPerStep - engine.DefaultMaxJobsPerRun}
	if fmt.Sprint(errs) != fmt.Sprint(want) {
		t.Fatalf("tool errors by code %v, want %v", errs, want)
	}
}

// REVIEW H4: a job's id was thread + tool call id, so a thread deleted and created again on the same id, asked
// the same thing by a model with deterministic call ids, named the old job: its execution (already used) never
// ran. The id includes the dispatching run: a new run names a new job and a new execution.
func TestJobIDIsTheRunsOwn(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	ctx := context.Background()
	ask := `/tool research {"question":"what is Go?"}`
	f.turn(t, "th-again", "m1", ask)
	if err := f.stack.Threads.Delete(ctx, "alice", "th-again"); err != nil {
		t.Fatal(err)
	}
	f.turn(t, "th-again", "m1", ask)
	starts := js.started()
	if len(starts) != 2 || starts[0].ToolCallID != starts[1].ToolCallID {
		t.Fatalf("starts %+v, want two of one tool call id", starts)
	}
	if starts[0].ID == starts[1].ID || starts[0].Execution == starts[1].Execution {
		t.Fatalf("the re-created thread's job is named %s (execution %s) again: its execution never runs", starts[1].ID, starts[1].Execution)
	}
	jobs, err := f.store.ListJobs(ctx, "th-again")
	if err != nil || len(jobs) != 1 || jobs[0].ID != starts[1].ID {
		t.Fatalf("jobs of the new thread %+v (%v)", jobs, err)
	}
}

// steer queues a steer message whose text asks the offline model for a research call.
func (f *fixture) steer(t *testing.T, thread string, n int) {
	t.Helper()
	jobID := fmt.Sprintf("job_chain%d", n)
	p, _ := json.Marshal(map[string]string{"type": "text", "text": fmt.Sprintf(`/tool research {"question":"follow-up %d"}`, n)})
	m := agent.Message{ID: agent.SteerMessageID(jobID), Role: agent.RoleUser, Parts: []json.RawMessage{p}}
	if _, _, err := f.store.Enqueue(context.Background(), agent.QueuedMessage{ThreadID: thread, Kind: agent.QueueSteer, Message: m,
		JobID: jobID, Status: agent.QueueQueued, CreatedAt: time.Now()}, 100); err != nil {
		t.Fatal(err)
	}
}

// REVIEW S2: a delivery turn may dispatch jobs whose delivery turns dispatch more, without end. The server-side
// turns in a row (since the thread's last turn a person started) that may dispatch are bounded; past the bound a
// job tool gets an error result the model reads, and a person's next message starts the count again.
func TestJobChainIsBounded(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	ctx := context.Background()
	const thread = "th-chain"
	f.turn(t, thread, "m1", `/tool research {"question":"first"}`)
	for n := 1; n <= engine.DefaultMaxJobChain+1; n++ {
		f.steer(t, thread, n)
		tr, err := f.eng.BeginQueued(ctx, thread)
		if err != nil {
			t.Fatalf("delivery turn %d: %v", n, err)
		}
		run := tr.Stream(ctx, io.Discard)
		if run.Trigger != agent.TriggerSteer {
			t.Fatalf("delivery turn %d: trigger %s", n, run.Trigger)
		}
	}
	if got, want := len(js.started()), 1+engine.DefaultMaxJobChain; got != want {
		t.Fatalf("%d jobs started by a user turn and %d delivery turns in a row, want %d", got, engine.DefaultMaxJobChain+1, want)
	}
	if errs := toolErrors(t, f.messages(t, thread)); errs[agent.CodeJobChainTooDeep] != 1 {
		t.Fatalf("tool errors %v, want one %s", errs, agent.CodeJobChainTooDeep)
	}
	f.turn(t, thread, "m2", `/tool research {"question":"again"}`)
	if got := len(js.started()); got != 2+engine.DefaultMaxJobChain {
		t.Fatalf("a person's message after the chain started %d jobs in all, want one more", got)
	}
}

// REVIEW S2: jobs were outside every per-user limit. A user's active jobs are leased like runs ("jobs/<owner>"):
// a job tool called at the limit gets an error result the model reads, and a job's lease is given back once its
// result (or failure) is delivered.
func TestActiveJobsPerUserAreLeased(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	ctx := context.Background()
	f.turn(t, "th-a", "m1", researchCalls(4))
	f.turn(t, "th-b", "m1", researchCalls(4))
	f.turn(t, "th-c", "m1", researchCalls(2))
	if got := len(js.started()); got != jobs.DefaultMaxActiveJobsPerUser {
		t.Fatalf("%d jobs started by one user at once, want %d", got, jobs.DefaultMaxActiveJobsPerUser)
	}
	if errs := toolErrors(t, f.messages(t, "th-c")); errs[agent.CodeTooManyJobs] != 2 {
		t.Fatalf("tool errors of the third thread %v, want two %s", errs, agent.CodeTooManyJobs)
	}
	// One job fails and its failure is delivered: its lease is free again.
	first := js.started()[0]
	if _, err := f.stack.JobTasks.Deliver(ctx, agent.JobTask{ThreadID: first.ThreadID, JobID: first.ID,
		Failure: &agent.TaskFailure{Error: "States.Timeout"}}); err != nil {
		t.Fatal(err)
	}
	f.turn(t, "th-d", "m1", researchCalls(1))
	if got := len(js.started()); got != jobs.DefaultMaxActiveJobsPerUser+1 {
		t.Fatalf("after one job was delivered, %d jobs started in all, want one more", got)
	}
}

// REVIEW S2: a sub-agent's model calls were in no usage. Its usage is stored with its result, and the turn that
// delivers it counts it: the delivery run's usage (agent.run, metrics) and the thread's totals include it.
func TestSubagentUsageIsCounted(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	ctx := context.Background()
	const thread = "th-usage"
	f.turn(t, thread, "m1", `/tool research {"question":"What is Go?"}`)
	job := js.started()[0]
	// The sub-agent task runs the job (the offline model reports usage on every reply).
	if _, err := f.stack.JobTasks.Subagent(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID}); err != nil {
		t.Fatal(err)
	}
	stored, err := f.store.GetJob(ctx, thread, job.ID)
	if err != nil || stored.Usage.TotalTokens == 0 {
		t.Fatalf("job %+v (%v): no usage recorded", stored.Usage, err)
	}
	before, err := f.store.GetThread(ctx, thread)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.stack.JobTasks.Deliver(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID}); err != nil {
		t.Fatal(err)
	}
	runs, err := f.store.ListRuns(ctx, thread)
	if err != nil || len(runs) != 2 || runs[1].Trigger != agent.TriggerSteer {
		t.Fatalf("runs %+v (%v), want the delivery turn second", runs, err)
	}
	after, err := f.store.GetThread(ctx, thread)
	if err != nil {
		t.Fatal(err)
	}
	delivery := runs[1].Usage
	if delivery.InputTokens < stored.Usage.InputTokens || delivery.OutputTokens < stored.Usage.OutputTokens {
		t.Fatalf("the delivery run's usage %+v does not include the sub-agent's %+v", delivery, stored.Usage)
	}
	if got, want := after.Usage.TotalTokens-before.Usage.TotalTokens, delivery.TotalTokens; got != want {
		t.Fatalf("the thread's usage grew by %d, want the delivery run's %d (the sub-agent's %d included)", got, want, stored.Usage.TotalTokens)
	}
}

// A sub-agent that fails still spent tokens: they are recorded on its job with the failure and counted into the
// thread's usage by the turn that delivers the failure, like a successful job's (issue 16 item 5). The researcher
// here calls note_source at every step (its question is the offline /loop command) and fails for good at its step
// cap, after eight model calls that reported usage; the state machine's Catch then delivers the failure.
func TestFailedSubagentUsageIsCounted(t *testing.T) {
	t.Parallel()
	js := &startLog{}
	f := setup(t, withJobs(js))
	ctx := context.Background()
	const thread = "th-failed-usage"
	f.turn(t, thread, "m1", `/tool research {"question":"/loop note_source {\"title\":\"a\",\"url\":\"https://a.example\"}"}`)
	job := js.started()[0]
	_, err := f.stack.JobTasks.Subagent(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID})
	var failed *agent.JobFailedError
	if !errors.As(err, &failed) {
		t.Fatalf("sub-agent: %v, want a failure for good", err)
	}
	before, err := f.store.GetThread(ctx, thread)
	if err != nil {
		t.Fatal(err)
	}
	caught := &agent.TaskFailure{Error: "JobFailedError", Cause: failed.Error()}
	if _, err := f.stack.JobTasks.Deliver(ctx, agent.JobTask{ThreadID: thread, JobID: job.ID, Failure: caught}); err != nil {
		t.Fatal(err)
	}
	stored, err := f.store.GetJob(ctx, thread, job.ID)
	if err != nil || !stored.Failed() || stored.Usage.TotalTokens == 0 {
		t.Fatalf("job %s error %q usage %+v (%v): want failed with the sub-agent's usage recorded", stored.Status, stored.Error, stored.Usage, err)
	}
	if stored.Error != failed.Reason {
		t.Fatalf("job error %q, want the sub-agent's reason %q", stored.Error, failed.Reason)
	}
	runs, err := f.store.ListRuns(ctx, thread)
	if err != nil || len(runs) != 2 || runs[1].Trigger != agent.TriggerSteer {
		t.Fatalf("runs %+v (%v), want the delivery turn second", runs, err)
	}
	after, err := f.store.GetThread(ctx, thread)
	if err != nil {
		t.Fatal(err)
	}
	delivery := runs[1].Usage
	if delivery.InputTokens < stored.Usage.InputTokens || delivery.OutputTokens < stored.Usage.OutputTokens {
		t.Fatalf("the delivery run's usage %+v does not include the failed sub-agent's %+v", delivery, stored.Usage)
	}
	if got, want := after.Usage.TotalTokens-before.Usage.TotalTokens, delivery.TotalTokens; got != want {
		t.Fatalf("the thread's usage grew by %d, want the delivery run's %d (the sub-agent's %d included)", got, want, stored.Usage.TotalTokens)
	}
}
