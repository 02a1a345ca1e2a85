// Package jobstest is the conformance suite for the agent.Jobs port: the state machine's contract (DESIGN.md
// "Sub-agent jobs", infra/jobs.asl.json), checked the same way against every adapter. lib/localjobs runs it on
// its in-process runner; lib/sfn runs it on the repository's state machine, executed by aws-local-stepfunctions
// (infra/sfnlocal through lib/sfn/sfntest):
//
//	func TestConformance(t *testing.T) {
//		jobstest.Run(t, func(t *testing.T, threadID string, tasks jobstest.Tasks) jobstest.Adapter { ... })
//	}
//
// Each case scripts the two tasks (Tasks: the sub-agent task and the delivery task, with the signatures of the
// Lambda handlers) and hands them to the harness, which builds the adapter around them under Contract(), a
// contract scaled down to a second or less so that the whole suite takes seconds. The harness must honour every
// number of that contract (the Step Functions harness runs a copy of the definition with these numbers written
// in).
//
// Each case uses a thread id of its own, and every task call it causes carries that id (JobTask.ThreadID), so a
// harness may build one adapter over one server for all cases and route task calls by thread. Cases run in
// parallel. Adapter.Wait must return once every execution the case's Jobs started has ended.
//
// What the suite requires beyond agent.Jobs's doc comments, because the delivery task relies on it:
//
//   - A task error is named as the Go Lambda runtime names it: the error's dynamic type without package or
//     pointer (the task returns *agent.TransientError and *agent.JobFailedError unwrapped). TransientError is
//     retried (TaskRetries, DeliverRetries times; RetryInterval, then doubling); any other error is not.
//   - A sub-agent failure that ends the task (another error, exhausted retries, a timeout) reaches delivery as
//     the execution's input with Failure = {Error: the name, Cause: the Lambda error document as text,
//     {"errorMessage": ..., "errorType": ...}}; a timeout's name is "States.Timeout" (its Cause is not pinned).
//   - An attempt ends at TaskTimeout even when the task ignores its context, and the execution at
//     ExecutionTimeout even when a task ignores its context.
//   - An execution outlives the context its Start or Wake was given.
//   - Start of a job without an id or a thread, and Wake without a thread or a key, is KindInvalid/CodeInvalidJob.
package jobstest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Contract is the contract the suite runs under: every number small, the retry counts as deployed.
func Contract() agent.JobContract {
	return agent.JobContract{
		TaskTimeout:      time.Second,
		TaskRetries:      2,
		DeliverRetries:   2,
		RetryInterval:    100 * time.Millisecond,
		ExecutionTimeout: 5 * time.Second,
		DeliveryGrace:    time.Second,
	}
}

// Tasks are the two task handlers, with the Lambda handlers' signatures.
type Tasks struct {
	// Subagent runs one job's sub-agent and returns its input on success.
	Subagent func(ctx context.Context, in agent.JobTask) (agent.JobTask, error)
	// Deliver delivers a job's result (or failure) into its thread.
	Deliver func(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error)
}

// Adapter is the adapter under test for one case.
type Adapter struct {
	Jobs agent.Jobs
	// Wait returns once every execution that Jobs started so far has ended, or with ctx's error.
	Wait func(ctx context.Context) error
}

// NewAdapter builds the adapter for one case: tasks under Contract(), for the case's thread threadID.
type NewAdapter func(t *testing.T, threadID string, tasks Tasks) Adapter

// slack is how late a state may begin after the moment the contract sets for it (a loaded machine, an HTTP hop
// and Node in between).
const slack = 800 * time.Millisecond

// waitLimit bounds one case's wait for its executions.
const waitLimit = 30 * time.Second

// Run runs every case.
func Run(t *testing.T, newAdapter NewAdapter) {
	cases := []struct {
		name string
		run  func(t *testing.T, f *fixture)
	}{
		{"Success", testSuccess},
		{"RetryThenSuccess", testRetryThenSuccess},
		{"RetriesExhausted", testRetriesExhausted},
		{"Timeout", testTimeout},
		{"TimeoutIgnoringContext", testTimeoutIgnoringContext},
		{"JobFailed", testJobFailed},
		{"DeliveryRetry", testDeliveryRetry},
		{"StartTwice", testStartTwice},
		{"OutlivesContext", testOutlivesContext},
		{"Wake", testWake},
		{"ExecutionTimeout", testExecutionTimeout},
		{"Refuses", testRefuses},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, &fixture{t: t, newAdapter: newAdapter, thread: threadID(t), contract: Contract(), released: make(chan struct{})})
		})
	}
}

// threadID is a thread id unique to the test.
func threadID(t *testing.T) string {
	sum := sha256.Sum256([]byte(t.Name()))
	return "thr_" + hex.EncodeToString(sum[:8])
}

// call is one task invocation the suite saw.
type call struct {
	task string // "subagent" or "deliver"
	in   agent.JobTask
	at   time.Time
}

// fixture is one case's thread, its scripted tasks and what they saw.
type fixture struct {
	t          *testing.T
	newAdapter NewAdapter
	thread     string
	contract   agent.JobContract
	// released ends the tasks that ignore their context, when the case ends.
	released chan struct{}

	mu    sync.Mutex
	calls []call
}

// script is a case's tasks: each gets its attempt number (from 1) and its input.
type script struct {
	subagent func(ctx context.Context, n int, in agent.JobTask) (agent.JobTask, error)
	deliver  func(ctx context.Context, n int, in agent.JobTask) (agent.DeliveryResult, error)
}

// start builds the adapter around s; tasks s leaves nil succeed at once.
func (f *fixture) start(s script) Adapter {
	f.t.Helper()
	f.t.Cleanup(func() { close(f.released) })
	if s.subagent == nil {
		s.subagent = func(_ context.Context, _ int, in agent.JobTask) (agent.JobTask, error) { return in, nil }
	}
	if s.deliver == nil {
		s.deliver = delivered
	}
	return f.newAdapter(f.t, f.thread, Tasks{
		Subagent: func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
			return s.subagent(ctx, f.record("subagent", in), in)
		},
		Deliver: func(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
			return s.deliver(ctx, f.record("deliver", in), in)
		},
	})
}

func delivered(_ context.Context, _ int, in agent.JobTask) (agent.DeliveryResult, error) {
	return agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredSteer}, nil
}

// record notes a call and returns its attempt number among calls of that task.
func (f *fixture) record(task string, in agent.JobTask) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if in.ThreadID != f.thread {
		f.t.Errorf("%s called for thread %q, want the case's %q", task, in.ThreadID, f.thread)
	}
	f.calls = append(f.calls, call{task: task, in: in, at: time.Now()})
	n := 0
	for _, c := range f.calls {
		if c.task == task {
			n++
		}
	}
	return n
}

// seen returns the calls so far, and those of task.
func (f *fixture) seen(task string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.task == task {
			out = append(out, c)
		}
	}
	return out
}

func (f *fixture) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.calls))
	for i, c := range f.calls {
		out[i] = c.task
	}
	return out
}

// job is the case's job (tool call tc).
func (f *fixture) job(tc string) agent.Job {
	return agent.Job{ID: agent.JobID(f.thread, "run_1", tc), ThreadID: f.thread, Kind: "research", ToolCallID: tc, Status: agent.JobRunning}
}

// wait waits for the case's executions to end.
func (f *fixture) wait(a Adapter) time.Duration {
	f.t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.Wait(ctx); err != nil {
		f.t.Fatalf("Wait: %v (calls so far: %v)", err, f.order())
	}
	return time.Since(began)
}

// run starts job and waits for its execution, returning the time from Start to the end.
func (f *fixture) run(a Adapter, j agent.Job) time.Duration {
	f.t.Helper()
	began := time.Now()
	if err := a.Jobs.Start(context.Background(), j); err != nil {
		f.t.Fatalf("Start(%s): %v", j.ID, err)
	}
	f.wait(a)
	return time.Since(began)
}

// wantCalls checks how often each task ran.
func (f *fixture) wantCalls(subagent, deliver int) {
	f.t.Helper()
	if s, d := len(f.seen("subagent")), len(f.seen("deliver")); s != subagent || d != deliver {
		f.t.Fatalf("sub-agent ran %d times and delivery %d (%v), want %d and %d", s, d, f.order(), subagent, deliver)
	}
}

// wantFailure checks the failure delivery got: its name, and (unless cause is "") its Cause, the Lambda
// error document of an error with that message.
func (f *fixture) wantFailure(in agent.JobTask, name, message string) {
	f.t.Helper()
	if in.Failure == nil || in.Failure.Error != name {
		f.t.Fatalf("delivery got failure %+v, want %s", in.Failure, name)
	}
	if message == "" {
		return
	}
	want := fmt.Sprintf(`{"errorMessage":%q,"errorType":%q}`, message, name)
	if in.Failure.Cause != want {
		f.t.Fatalf("failure cause = %s, want the error document %s", in.Failure.Cause, want)
	}
}

// sleep waits d, or until the case ends when ignoreCtx, else until ctx ends too.
func (f *fixture) sleep(ctx context.Context, d time.Duration, ignoreCtx bool) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	done := ctx.Done()
	if ignoreCtx {
		done = nil
	}
	select {
	case <-timer.C:
		return nil
	case <-f.released:
		return errors.New("the case ended")
	case <-done:
		return ctx.Err()
	}
}

// early is how much shorter than the contract's interval a measured one may be: d starts when the task's handler
// ran in this process, which on a loaded machine is an HTTP hop after the runner started the state's timer, so
// the interval can measure short by that hop (986 ms for a 1 s timeout was seen in a fresh-clone make test run
// with another one beside it). A quarter still tells a timeout that works from one mis-set to zero.
func early(lo time.Duration) time.Duration { return lo / 4 }

// within checks that d is at least lo (less early(lo)) and at most lo + slack.
func (f *fixture) within(what string, d, lo time.Duration) {
	f.t.Helper()
	if d < lo-early(lo) || d > lo+slack {
		f.t.Errorf("%s took %v, want %v (up to %v earlier, %v later)", what, d.Round(time.Millisecond), lo, early(lo), slack)
	}
}

// The sub-agent runs once, then delivery once, with the sub-agent's output (which the script marks, so that a
// delivery given the execution's input instead would show) and no failure.
func testSuccess(t *testing.T, f *fixture) {
	const mark = "marked-by-subagent"
	a := f.start(script{subagent: func(_ context.Context, _ int, in agent.JobTask) (agent.JobTask, error) {
		in.Wake = mark
		return in, nil
	}})
	j := f.job("tc_success")
	f.run(a, j)
	f.wantCalls(1, 1)
	if got := f.order(); got[0] != "subagent" || got[1] != "deliver" {
		t.Fatalf("order = %v, want subagent then deliver", got)
	}
	if in := f.seen("subagent")[0].in; in != (agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID}) {
		t.Fatalf("sub-agent got %+v, want {ThreadID, JobID} only", in)
	}
	if in := f.seen("deliver")[0].in; in != (agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID, Wake: mark}) {
		t.Fatalf("delivery got %+v, want the sub-agent's output", in)
	}
}

// TransientError twice, then success: three attempts RetryInterval and then twice that apart, and delivery
// without a failure.
func testRetryThenSuccess(t *testing.T, f *fixture) {
	a := f.start(script{subagent: func(_ context.Context, n int, in agent.JobTask) (agent.JobTask, error) {
		if n <= 2 {
			return agent.JobTask{}, &agent.TransientError{Err: fmt.Errorf("model unavailable (%d)", n)}
		}
		return in, nil
	}})
	f.run(a, f.job("tc_retry"))
	f.wantCalls(3, 1)
	if in := f.seen("deliver")[0].in; in.Failure != nil {
		t.Fatalf("delivery got failure %+v after a successful retry", in.Failure)
	}
	s := f.seen("subagent")
	f.within("the first retry's wait", s[1].at.Sub(s[0].at), f.contract.RetryInterval)
	f.within("the second retry's wait (backoff 2)", s[2].at.Sub(s[1].at), 2*f.contract.RetryInterval)
}

// TransientError every time: 1 + TaskRetries attempts, then delivery with the last error as the failure.
func testRetriesExhausted(t *testing.T, f *fixture) {
	a := f.start(script{subagent: func(_ context.Context, n int, _ agent.JobTask) (agent.JobTask, error) {
		return agent.JobTask{}, &agent.TransientError{Err: fmt.Errorf("still down (%d)", n)}
	}})
	j := f.job("tc_exhausted")
	f.run(a, j)
	attempts := 1 + f.contract.TaskRetries
	f.wantCalls(attempts, 1)
	in := f.seen("deliver")[0].in
	f.wantFailure(in, "TransientError", fmt.Sprintf("transient: still down (%d)", attempts))
	if in.ThreadID != j.ThreadID || in.JobID != j.ID || in.Wake != "" {
		t.Fatalf("delivery got %+v, want the execution's input with the failure added", in)
	}
}

// A sub-agent that runs past TaskTimeout (honouring its context) fails with States.Timeout, is not retried,
// and delivery begins at the timeout.
func testTimeout(t *testing.T, f *fixture) {
	f.timeout(false)
}

// The same when the task ignores its context: the attempt ends at the timeout all the same.
func testTimeoutIgnoringContext(t *testing.T, f *fixture) {
	f.timeout(true)
}

func (f *fixture) timeout(ignoreCtx bool) {
	a := f.start(script{subagent: func(ctx context.Context, _ int, in agent.JobTask) (agent.JobTask, error) {
		if err := f.sleep(ctx, 4*f.contract.TaskTimeout, ignoreCtx); err != nil {
			return agent.JobTask{}, err
		}
		return in, nil
	}})
	f.run(a, f.job("tc_timeout"))
	f.wantCalls(1, 1)
	f.wantFailure(f.seen("deliver")[0].in, "States.Timeout", "")
	f.within("delivery after a timed-out attempt", f.seen("deliver")[0].at.Sub(f.seen("subagent")[0].at), f.contract.TaskTimeout)
}

// JobFailedError is not retried: delivery gets it as the failure.
func testJobFailed(t *testing.T, f *fixture) {
	a := f.start(script{subagent: func(context.Context, int, agent.JobTask) (agent.JobTask, error) {
		return agent.JobTask{}, &agent.JobFailedError{Reason: "the source is gone"}
	}})
	f.run(a, f.job("tc_failed"))
	f.wantCalls(1, 1)
	f.wantFailure(f.seen("deliver")[0].in, "JobFailedError", "job failed: the source is gone")
}

// Delivery that fails with TransientError once is retried after RetryInterval, with the same input.
func testDeliveryRetry(t *testing.T, f *fixture) {
	a := f.start(script{deliver: func(ctx context.Context, n int, in agent.JobTask) (agent.DeliveryResult, error) {
		if n == 1 {
			return agent.DeliveryResult{}, &agent.TransientError{Err: errors.New("store busy")}
		}
		return delivered(ctx, n, in)
	}})
	f.run(a, f.job("tc_deliver_retry"))
	f.wantCalls(1, 2)
	d := f.seen("deliver")
	if d[0].in != d[1].in {
		t.Fatalf("delivery retried with %+v, first had %+v", d[1].in, d[0].in)
	}
	f.within("the delivery retry's wait", d[1].at.Sub(d[0].at), f.contract.RetryInterval)
}

// Start of a job already started, while its execution runs and after it ended, is success and starts nothing.
func testStartTwice(t *testing.T, f *fixture) {
	a := f.start(script{subagent: func(ctx context.Context, _ int, in agent.JobTask) (agent.JobTask, error) {
		return in, f.sleep(ctx, 300*time.Millisecond, false)
	}})
	j := f.job("tc_twice")
	for range 2 {
		if err := a.Jobs.Start(context.Background(), j); err != nil {
			t.Fatalf("Start while running: %v", err)
		}
	}
	f.wait(a)
	if err := a.Jobs.Start(context.Background(), j); err != nil {
		t.Fatalf("Start after the execution ended: %v", err)
	}
	f.wait(a)
	f.wantCalls(1, 1)
}

// The execution goes on after the context given to Start ends (a tool call's request returns at once).
func testOutlivesContext(t *testing.T, f *fixture) {
	a := f.start(script{subagent: func(ctx context.Context, _ int, in agent.JobTask) (agent.JobTask, error) {
		return in, f.sleep(ctx, 200*time.Millisecond, false)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	if err := a.Jobs.Start(ctx, f.job("tc_outlives")); err != nil {
		t.Fatal(err)
	}
	cancel()
	f.wait(a)
	f.wantCalls(1, 1)
	if in := f.seen("deliver")[0].in; in.Failure != nil {
		t.Fatalf("delivery got failure %+v: the sub-agent saw Start's context end", in.Failure)
	}
}

// Wake runs delivery alone with the task as given; the same key again runs nothing, another key runs again, and
// a key equal to a job's id is no job's execution.
func testWake(t *testing.T, f *fixture) {
	a := f.start(script{})
	j := f.job("tc_wake")
	w := agent.JobTask{ThreadID: f.thread, JobID: j.ID, Wake: "run_1"}
	for range 2 {
		if err := a.Jobs.Wake(context.Background(), w); err != nil {
			t.Fatalf("Wake: %v", err)
		}
	}
	f.wait(a)
	f.wantCalls(0, 1)
	if in := f.seen("deliver")[0].in; in != w {
		t.Fatalf("delivery got %+v, want the wake's task %+v", in, w)
	}
	if err := a.Jobs.Wake(context.Background(), w); err != nil {
		t.Fatalf("Wake after its pass ended: %v", err)
	}
	f.wait(a)
	f.wantCalls(0, 1)
	queued := agent.JobTask{ThreadID: f.thread, Wake: "run_2"} // a pass over the queue alone
	if err := a.Jobs.Wake(context.Background(), queued); err != nil {
		t.Fatal(err)
	}
	f.wait(a)
	f.wantCalls(0, 2)
	if in := f.seen("deliver")[1].in; in != queued {
		t.Fatalf("second pass got %+v, want %+v", in, queued)
	}
	if err := a.Jobs.Wake(context.Background(), agent.JobTask{ThreadID: f.thread, JobID: j.ID, Wake: j.ID}); err != nil {
		t.Fatal(err)
	}
	f.run(a, j)
	f.wantCalls(1, 4)
}

// A task that runs past ExecutionTimeout (ignoring its context) does not hold the execution: it ends at the
// timeout, and nothing runs after it.
func testExecutionTimeout(t *testing.T, f *fixture) {
	a := f.start(script{deliver: func(ctx context.Context, _ int, in agent.JobTask) (agent.DeliveryResult, error) {
		return agent.DeliveryResult{}, f.sleep(ctx, 3*f.contract.ExecutionTimeout, true)
	}})
	took := f.run(a, f.job("tc_exec_timeout"))
	f.within("an execution past its timeout", took, f.contract.ExecutionTimeout)
	f.wantCalls(1, 1)
}

// Start and Wake refuse what names no execution.
func testRefuses(t *testing.T, f *fixture) {
	a := f.start(script{})
	j := f.job("tc_refuse")
	noID, noThread := j, j
	noID.ID, noThread.ThreadID = "", ""
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"Start without an id", func() error { return a.Jobs.Start(context.Background(), noID) }},
		{"Start without a thread", func() error { return a.Jobs.Start(context.Background(), noThread) }},
		{"Wake without a key", func() error { return a.Jobs.Wake(context.Background(), agent.JobTask{ThreadID: f.thread}) }},
		{"Wake without a thread", func() error { return a.Jobs.Wake(context.Background(), agent.JobTask{Wake: "k"}) }},
	} {
		if err := tc.call(); !agent.IsKind(err, agent.KindInvalid) || agent.CodeOf(err) != agent.CodeInvalidJob {
			t.Errorf("%s: %v, want KindInvalid/%s", tc.name, err, agent.CodeInvalidJob)
		}
	}
	f.wait(a)
	f.wantCalls(0, 0)
}
