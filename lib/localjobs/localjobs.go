// Package localjobs is the in-process agent.Jobs adapter of `agentloop dev`: it runs the job state machine's
// contract (infra/jobs.asl.json, agent.JobContract) in goroutines, with the task handlers called directly.
//
// An execution of a job (Start) runs the sub-agent task, then the delivery task; a delivery pass (Wake) runs the
// delivery task alone. As in the state machine:
//
//   - Each sub-agent attempt has TaskTimeout (its context's deadline). An attempt still running at the deadline
//     ends there, whether or not the task honours its context (its goroutine is left to return on its own and
//     its result is dropped): the failure is "States.Timeout", which is not retried.
//   - A task error is named as the Go Lambda runtime names it, by its dynamic type without package or pointer
//     (the errorType Step Functions matches): a task returning *agent.TransientError is retried, TaskRetries
//     times for the sub-agent and DeliverRetries times for delivery, RetryInterval before the first retry and
//     twice the wait before each next one. Like Step Functions, only the outermost error counts: a
//     TransientError wrapped in another error is not retried (and is logged as such, since the state machine
//     would not retry it either). A panic is an error named by the panic value's type.
//   - A sub-agent failure that ends the task (an error not retried, exhausted retries, a timeout) is caught:
//     delivery gets the execution's input with Failure = {Error: the name, Cause: the Lambda error document,
//     {"errorMessage": ..., "errorType": ...}}, byte for byte what the Go runtime and Step Functions produce. On
//     success delivery gets the sub-agent's output.
//   - The whole execution is bounded by ExecutionTimeout; a delivery that fails for good, or the timeout, ends
//     the execution (logged): the job stays undelivered and the reaper re-drives it.
//   - Idempotent by name: Start of a job id already started, running or ended, is success and starts nothing;
//     so is Wake of a (thread, key) already used. The runner remembers every name it ran for its lifetime (one
//     small entry each: fine for a dev server).
//
// An execution outlives the context its Start or Wake got. Close stops new starts, waits for the executions in
// flight until its context ends, then cancels theirs; Wait waits without stopping anything. The runner keeps
// no package-level state and reads no clock but the timers of its contexts.
package localjobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Tasks are the two task handlers, with the Lambda handlers' signatures.
type Tasks struct {
	// Subagent runs one job's sub-agent and returns its input on success.
	Subagent func(ctx context.Context, in agent.JobTask) (agent.JobTask, error)
	// Deliver delivers a job's result (or failure) into its thread, or runs a wake pass.
	Deliver func(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error)
}

// TimeoutError names the failure of an attempt that reached its timeout, as Step Functions does.
const TimeoutError = "States.Timeout"

// The error names the state machine retries, from the types themselves.
var transientName = typeName(&agent.TransientError{})

// Runner runs executions in goroutines.
type Runner struct {
	tasks    Tasks
	contract agent.JobContract
	log      *slog.Logger

	base   context.Context // executions' parent: canceled by Close once its wait is over
	cancel context.CancelFunc

	mu      sync.Mutex
	started map[string]bool // execution names
	closed  bool
	running int
	idle    chan struct{} // closed when running drops to 0
}

var _ agent.Jobs = (*Runner)(nil)

// New returns a runner of tasks under contract c; zero fields of c take agent.DefaultJobContract's values. A nil
// logger discards.
func New(tasks Tasks, c agent.JobContract, logger *slog.Logger) *Runner {
	d := agent.DefaultJobContract()
	c.TaskTimeout = cmp.Or(c.TaskTimeout, d.TaskTimeout)
	c.TaskRetries = cmp.Or(c.TaskRetries, d.TaskRetries)
	c.DeliverRetries = cmp.Or(c.DeliverRetries, d.DeliverRetries)
	c.RetryInterval = cmp.Or(c.RetryInterval, d.RetryInterval)
	c.ExecutionTimeout = cmp.Or(c.ExecutionTimeout, d.ExecutionTimeout)
	c.DeliveryGrace = cmp.Or(c.DeliveryGrace, d.DeliveryGrace)
	c.StartDue = cmp.Or(c.StartDue, d.StartDue)
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	base, cancel := context.WithCancel(context.Background())
	idle := make(chan struct{})
	close(idle)
	return &Runner{tasks: tasks, contract: c, log: logger, base: base, cancel: cancel, started: map[string]bool{}, idle: idle}
}

// Contract is the contract the runner honours (the defaults filled in).
func (r *Runner) Contract() agent.JobContract { return r.contract }

// Start starts j's execution: the sub-agent task, then delivery. A job id already started is success.
func (r *Runner) Start(_ context.Context, j agent.Job) error {
	if j.ID == "" || j.ThreadID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "job %q of thread %q: a job needs a thread and an id", j.ID, j.ThreadID)
	}
	return r.begin("job\x00"+j.ID, agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID}, true)
}

// Wake starts a delivery pass for w (w.Wake set). A (thread, key) already used is success.
func (r *Runner) Wake(_ context.Context, w agent.JobTask) error {
	if w.ThreadID == "" || w.Wake == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "a wake needs a thread and a key (thread %q, key %q)", w.ThreadID, w.Wake)
	}
	return r.begin("wake\x00"+w.ThreadID+"\x00"+w.Wake, w, false)
}

func (r *Runner) begin(name string, in agent.JobTask, subagent bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return agent.E(agent.KindUnavailable, agent.CodeJobsUnavailable, "the job runner is shut down")
	}
	if r.started[name] {
		return nil
	}
	r.started[name] = true
	if r.running == 0 {
		r.idle = make(chan struct{})
	}
	r.running++
	go func() {
		defer r.end()
		r.execute(in, subagent)
	}()
	return nil
}

func (r *Runner) end() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running--; r.running == 0 {
		close(r.idle)
	}
}

// Wait returns once no execution is in flight, or with ctx's error.
func (r *Runner) Wait(ctx context.Context) error {
	r.mu.Lock()
	idle := r.idle
	r.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close refuses new executions (KindUnavailable) and waits for those in flight; when ctx ends first, it cancels
// their contexts, waits for them to unwind (they do at once, whatever the tasks do) and returns ctx's error.
func (r *Runner) Close(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	err := r.Wait(ctx)
	r.cancel()
	if err != nil {
		_ = r.Wait(context.Background())
	}
	return err
}

// execute runs one execution to its end.
func (r *Runner) execute(in agent.JobTask, subagent bool) {
	ctx, cancel := context.WithTimeout(r.base, r.contract.ExecutionTimeout)
	defer cancel()
	log := r.log.With("thread", in.ThreadID, "job", in.JobID, "wake", in.Wake)
	if subagent {
		out, err := retried(ctx, r.contract.TaskTimeout, r.contract.TaskRetries, r.contract.RetryInterval, in, r.tasks.Subagent, log)
		if ctx.Err() != nil {
			r.ended(ctx, log, "sub-agent")
			return
		}
		if err != nil {
			name, cause := describe(err)
			log.Info("job: sub-agent failed, delivering the failure", "error", name, "cause", cause)
			out = in
			out.Failure = &agent.TaskFailure{Error: name, Cause: cause}
		}
		in = out
	}
	res, err := retried(ctx, 0, r.contract.DeliverRetries, r.contract.RetryInterval, in, r.tasks.Deliver, log)
	switch {
	case ctx.Err() != nil:
		r.ended(ctx, log, "delivery")
	case err != nil:
		name, cause := describe(err)
		log.Warn("job: delivery failed; the reaper re-drives it", "error", name, "cause", cause)
	default:
		log.Debug("job: delivered", "status", res.Status, "turns", res.Turns)
	}
}

// ended logs an execution that its timeout or Close ended during state.
func (r *Runner) ended(ctx context.Context, log *slog.Logger, state string) {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		log.Warn("job: execution timed out; the reaper re-drives it", "state", state, "timeout", r.contract.ExecutionTimeout)
		return
	}
	log.Info("job: execution stopped by shutdown", "state", state)
}

// retried runs task until it succeeds, fails with an error other than TransientError, or has been retried
// retries times (each wait twice the one before, from interval). timeout > 0 bounds each attempt.
func retried[T any](ctx context.Context, timeout time.Duration, retries int, interval time.Duration, in agent.JobTask,
	task func(context.Context, agent.JobTask) (T, error), log *slog.Logger) (T, error) {
	wait := interval
	for n := 0; ; n++ {
		out, err := attempt(ctx, timeout, in, task)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
		if name, _ := describe(err); name != transientName || n >= retries {
			if name != transientName && errors.As(err, new(*agent.TransientError)) {
				log.Warn("job: a wrapped TransientError is not retried (Step Functions matches the outermost error's type)", "error", name)
			}
			return out, err
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			var zero T
			return zero, ctx.Err()
		}
		wait *= 2
	}
}

// attempt runs task once in its own goroutine, so that the attempt ends at its deadline (or the execution's)
// whatever the task does with its context.
func attempt[T any](ctx context.Context, timeout time.Duration, in agent.JobTask, task func(context.Context, agent.JobTask) (T, error)) (T, error) {
	actx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		actx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	type result struct {
		out T
		err error
	}
	done := make(chan result, 1) // the task's goroutine never blocks on a result nobody reads
	go func() {
		defer func() {
			if v := recover(); v != nil {
				done <- result{err: &panicError{value: v}}
			}
		}()
		out, err := task(actx, in)
		done <- result{out, err}
	}()
	timedOut := func() (T, error) {
		var zero T
		return zero, &timeoutError{timeout: timeout}
	}
	select {
	case res := <-done:
		// An error that comes back after the deadline is the deadline's doing (the task saw its context end).
		if res.err != nil && timeout > 0 && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			return timedOut()
		}
		return res.out, res.err
	case <-actx.Done():
		if ctx.Err() != nil {
			var zero T
			return zero, ctx.Err()
		}
		return timedOut()
	}
}

// timeoutError is an attempt that reached its timeout.
type timeoutError struct{ timeout time.Duration }

func (e *timeoutError) Error() string {
	return fmt.Sprintf("the task did not finish within %v (TimeoutSeconds)", e.timeout)
}

// panicError is a task that panicked; the Go runtime names it by the panic value's type.
type panicError struct{ value any }

func (e *panicError) Error() string { return fmt.Sprintf("%v", e.value) }

// describe names err as Step Functions would see it, and gives its Cause: the Lambda error document the Go
// runtime reports ({"errorMessage", "errorType"}, in that order), or the timeout's text.
func describe(err error) (name, cause string) {
	var t *timeoutError
	if errors.As(err, &t) {
		return TimeoutError, t.Error()
	}
	name = typeName(err)
	if p, ok := err.(*panicError); ok {
		name = typeName(p.value)
	}
	doc, _ := json.Marshal(struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}{err.Error(), name})
	return name, string(doc)
}

// typeName is the name the Go Lambda runtime reports for a value's type (aws-lambda-go lambda/errors.go).
func typeName(v any) string {
	t := reflect.TypeOf(v)
	if t == nil {
		return ""
	}
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}
