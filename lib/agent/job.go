package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"time"
)

// JobStatus: running → done | error. A job becomes done/error only after its steer was delivered into the
// thread; a job whose result is stored but not yet delivered is still running (Job.Finished tells).
type JobStatus string

const (
	JobRunning JobStatus = "running"
	JobDone    JobStatus = "done"
	JobError   JobStatus = "error"
)

// Job is an async sub-agent task. ID is derived from thread id + dispatching run + tool call id (JobID) so a
// retried dispatch converges. Created insert-if-absent; its result is stored once (first writer wins); delivery is recorded once.
type Job struct {
	ID       string `json:"id"`
	ThreadID string `json:"threadId"`
	Owner    string `json:"-"`
	// Writer is the fence of the run that dispatched the job (the claim it held). A store keeps the job only in
	// the thread's incarnation that run wrote to: a thread deleted and created again on its id never sees a job
	// a run of the deleted one dispatched late (issue 16 item 2). Written only: a read job has it zero.
	Writer     Fence           `json:"-"`
	Kind       string          `json:"kind"`
	ToolCallID string          `json:"toolCallId"`
	Input      json.RawMessage `json:"input,omitempty"`
	Status     JobStatus       `json:"status"`
	// Activity is the live, human-readable line the sub-agent updates as it works.
	Activity string `json:"activity,omitempty"`
	// Result is the sub-agent's result (the steer artifact's payload), set once by FinishJob. Error, set
	// instead, is the failure text a user may read (no internals).
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Usage is what the sub-agent's model calls reported, stored with its result or with the failure it reported
	// (zero for a failure the state machine caught alone: a timeout, a crash); the turn that delivers the job adds
	// it to its run's, and so to the thread's, usage.
	Usage Usage `json:"usage"`
	// SteerDelivered: the steer message steer_<ID> is stored in the thread.
	SteerDelivered bool `json:"steerDelivered"`
	// Execution names the job's execution (Step Functions: the execution name, which is the job id).
	Execution string `json:"execution,omitempty"`
	// DueAt is when the reaper looks at the job if it is still undelivered then: while running, the deadline
	// of its whole execution; once finished, the grace the wake has to deliver it. Zero once delivered.
	DueAt      time.Time `json:"-"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// Finished reports whether the job's result (or failure) is stored.
func (j Job) Finished() bool { return !j.FinishedAt.IsZero() }

// Failed reports whether the job finished with a failure.
func (j Job) Failed() bool { return j.Finished() && j.Error != "" }

// JobID derives a job's id from its thread, the run that dispatched it and the tool call (as interrupts.ID
// does): the same dispatch, retried within its run or recovered after the run died (recovery asks with the dead
// run's id), names the same job; a later run that repeats the tool call id (a model with deterministic ids
// answering a regenerate, a thread deleted and created again on the same id) names a new job, whose execution
// runs. It is short and safe as a Step Functions execution name (at most 80 characters of [0-9A-Za-z_-]).
func JobID(threadID, runID, toolCallID string) string {
	sum := sha256.Sum256([]byte(threadID + "\x00" + runID + "\x00" + toolCallID))
	return "job_" + idEncoding.EncodeToString(sum[:16])
}

// SteerIDPrefix begins every steer message id; no client message may use it (ValidateIncoming).
const SteerIDPrefix = "steer_"

// JobSlotScope is the lease scope of a user's active jobs; a job holds its slot under its id from its dispatch
// until its result or failure is delivered.
func JobSlotScope(owner string) string { return "jobs/" + owner }

// SteerMessageID is the id of the steer message that delivers job id into its thread.
func SteerMessageID(jobID string) string { return SteerIDPrefix + jobID }

// JobResult stores a job's outcome once.
type JobResult struct {
	ThreadID string
	ID       string
	Result   json.RawMessage // set on success
	Error    string          // set on failure (safe to show)
	Usage    Usage           // the sub-agent's model usage
	// DueAt is when the reaper re-drives delivery if the job is still undelivered then.
	DueAt time.Time
	Now   time.Time
}

// JobsPage is ListJobsPage's answer.
type JobsPage struct {
	Jobs    []Job
	Omitted int // delivered jobs older than the newest `finished`, left out
}

// JobStore keeps jobs, one item each, keyed by (ThreadID, ID). DeleteThread removes a thread's jobs.
type JobStore interface {
	// CreateJob inserts j (Status running, no result) if no job with (j.ThreadID, j.ID) exists. It returns the
	// stored job and whether this call created it; an existing job is returned unchanged. Unknown or tombstoned
	// thread: KindNotFound. j is stored as given (Owner, Activity, Execution, DueAt and the times included); a
	// zero DueAt is due at once (it is before every time).
	CreateJob(ctx context.Context, j Job) (Job, bool, error)
	// GetJob: unknown id is KindNotFound/CodeJobNotFound.
	GetJob(ctx context.Context, threadID, id string) (Job, error)
	// ListJobs returns the thread's jobs, oldest first (ties by id).
	ListJobs(ctx context.Context, threadID string) ([]Job, error)
	// ListJobsPage returns what a thread's view shows of its jobs, oldest first (ties by id): every one still
	// running (undelivered) and the newest `finished` (by creation; <= 0: none) of the delivered ones, and how
	// many older delivered ones it left out. It reads those jobs and an index, never every job the thread ever
	// ran (REVIEW S7). An index may lag a moment behind a delivery on DynamoDB: a job is shown as stored.
	ListJobsPage(ctx context.Context, threadID string, finished int) (JobsPage, error)
	// SetJobActivity replaces the activity line of a job that has not finished, and sets its UpdatedAt to now. A
	// finished job: KindConflict/CodeJobFinished, nothing changes. Unknown id: KindNotFound/CodeJobNotFound.
	SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error
	// SetJobDue moves the DueAt of a job that has not finished to due (its place in ListDueJobs too) and sets its
	// UpdatedAt to now: the sub-agent task moves a start's deadline to its execution's, the reaper gives a job it
	// starts again another start's. A finished job: KindConflict/CodeJobFinished, nothing changes. Unknown id:
	// KindNotFound/CodeJobNotFound.
	SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error
	// FinishJob stores the job's result or failure (exactly one of r.Result, r.Error) by compare-and-set on "not
	// finished": the first writer wins. It returns the job as stored after the call and whether this call
	// stored it; a job already finished is returned unchanged with stored false and no error. The winning write
	// sets FinishedAt and UpdatedAt to r.Now and DueAt to r.DueAt; Status stays running until delivery. Unknown
	// id: KindNotFound/CodeJobNotFound.
	FinishJob(ctx context.Context, r JobResult) (Job, bool, error)
	// MarkJobDelivered records that the job's steer is in the thread: SteerDelivered, status done (or error for
	// a failure), DueAt cleared, UpdatedAt now. The job must be finished (else KindConflict/CodeJobNotFinished,
	// nothing changes). Idempotent: a delivered job is returned unchanged. Unknown id:
	// KindNotFound/CodeJobNotFound.
	MarkJobDelivered(ctx context.Context, threadID, id string, now time.Time) (Job, error)
	// ListDueJobs returns up to limit (<= 0: DefaultListLimit) undelivered jobs whose DueAt is before before,
	// across all threads, in no promised order: the reaper's work list. It reads an index of undelivered jobs,
	// never a scan; the index only nominates. A delivered job is never returned (the stores re-check what the
	// index names); a job created or finished a moment ago may be missing while an eventually consistent index
	// catches up.
	ListDueJobs(ctx context.Context, before time.Time, limit int) ([]Job, error)
}

// Check refuses a job no store keeps (both stores answer the same input with the same code): it is created
// running, unfinished, undelivered and with no result or failure, and its input, when set, is JSON.
func (j Job) Check() error {
	switch {
	case j.ThreadID == "":
		return E(KindInvalid, CodeInvalidThreadID, "job needs a thread id")
	case j.ID == "" || j.Kind == "" || j.ToolCallID == "":
		return E(KindInvalid, CodeInvalidJob, "job needs an id, a kind and a tool call id")
	case j.Status != JobRunning || j.Finished() || j.SteerDelivered:
		return E(KindInvalid, CodeInvalidStatus, "job %s is created running, unfinished and undelivered", j.ID)
	case len(j.Result) > 0 || j.Error != "":
		return E(KindInvalid, CodeInvalidStatus, "job %s is created with no result (FinishJob stores it)", j.ID)
	case len(j.Input) > 0 && !json.Valid(j.Input):
		return E(KindInvalid, CodeInvalidJob, "job %s: input is not valid JSON", j.ID)
	}
	return nil
}

// Check refuses a result no store keeps: it names its job, holds exactly one of Result (JSON) and Error.
func (r JobResult) Check() error {
	if r.ThreadID == "" || r.ID == "" {
		return E(KindInvalid, CodeInvalidJob, "job result needs a thread id and a job id")
	}
	if (len(r.Result) == 0) == (r.Error == "") {
		return E(KindInvalid, CodeInvalidJob, "job %s: a result holds exactly one of result and error", r.ID)
	}
	if len(r.Result) > 0 && !json.Valid(r.Result) {
		return E(KindInvalid, CodeInvalidJob, "job %s: result is not valid JSON", r.ID)
	}
	return nil
}

// Jobs starts sub-agent executions and delivery passes: Step Functions in AWS (lib/sfn), an in-process runner
// with the state machine's contract in agentloop dev (lib/localjobs).
type Jobs interface {
	// Start starts j's execution, named by the job id: a start of a job whose execution exists is success.
	Start(ctx context.Context, j Job) error
	// Wake starts a delivery pass (w.Wake set: the key naming it; the same key again is success, so one
	// finishing run, retried, asks once): the delivery task alone, for w.JobID's result when set (the reaper's
	// re-drive), and over the thread's queued messages.
	Wake(ctx context.Context, w JobTask) error
}

// JobTask is the state machine's execution input and what its task states pass along: a job (JobID set, Wake
// empty: the sub-agent task, then delivery) or a delivery pass (Wake set: delivery only). Failure is where the
// state machine's Catch puts the sub-agent task's error.
type JobTask struct {
	ThreadID string       `json:"threadId"`
	JobID    string       `json:"jobId,omitempty"`
	Wake     string       `json:"wake,omitempty"`
	Failure  *TaskFailure `json:"failure,omitempty"`
}

// TaskFailure is a caught task error in Step Functions' shape ({"Error": name, "Cause": text}).
type TaskFailure struct {
	Error string `json:"Error"`
	Cause string `json:"Cause,omitempty"`
}

// Delivery outcomes a wake reports.
const (
	DeliveredSteer   = "delivered" // the steer is in the thread (this pass or an earlier one)
	DeliveredQueued  = "queued"    // the thread is busy or waits for a person: the steer waits in its queue
	DeliveredNothing = "nothing"   // a wake pass that found nothing to deliver
)

// DeliveryResult is the wake task's output.
type DeliveryResult struct {
	ThreadID string `json:"threadId"`
	JobID    string `json:"jobId,omitempty"`
	Status   string `json:"status"`
	Turns    int    `json:"turns"`
}

// Named task errors: Step Functions matches the Go type name in ErrorEquals (the Lambda Go runtime reports the
// returned error's outermost type as the errorType), and the local runner matches the outermost type the same
// way, so a task must return them unwrapped (a wrapped TransientError is not retried, in AWS or locally).

// TransientError is a task failure that may pass on retry (a store or model outage): the state machine retries it.
type TransientError struct{ Err error }

func (e *TransientError) Error() string { return "transient: " + e.Err.Error() }
func (e *TransientError) Unwrap() error { return e.Err }

// JobFailedError is a sub-agent failure that retrying will not fix: the state machine takes the failure path.
type JobFailedError struct{ Reason string }

func (e *JobFailedError) Error() string { return "job failed: " + e.Reason }

// JobContract is the job state machine's contract: the numbers infra/jobs.asl.json states literally and the
// local runner honours (a test holds the two equal).
type JobContract struct {
	// TaskTimeout bounds one attempt of the sub-agent task (TimeoutSeconds).
	TaskTimeout time.Duration
	// TaskRetries is how often a TransientError (or a Lambda service error) is retried (MaxAttempts).
	TaskRetries int
	// DeliverRetries is how often the delivery task is retried.
	DeliverRetries int
	// RetryInterval is the first retry's wait; each next one doubles (BackoffRate 2).
	RetryInterval time.Duration
	// ExecutionTimeout bounds the whole execution (the state machine's TimeoutSeconds).
	ExecutionTimeout time.Duration
	// DeliveryGrace is how long after a job finished the reaper waits before re-driving an undelivered one.
	DeliveryGrace time.Duration
	// StartDue is how long a dispatched job may wait for its sub-agent task's first report (the task moves the
	// job's deadline to its execution's) before the reaper starts it again (Start is idempotent by execution
	// name), until its execution's deadline. Like DeliveryGrace, the reaper's number, not the state machine's.
	StartDue time.Duration
}

// DefaultJobContract is the contract infra/jobs.asl.json states (a function: no package-level mutable state).
func DefaultJobContract() JobContract {
	return JobContract{
		TaskTimeout:      300 * time.Second,
		TaskRetries:      2,
		DeliverRetries:   5,
		RetryInterval:    2 * time.Second,
		ExecutionTimeout: 1800 * time.Second,
		DeliveryGrace:    60 * time.Second,
		StartDue:         2 * time.Minute,
	}
}
