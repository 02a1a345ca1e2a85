// Package sfn is the agent.Jobs adapter over AWS Step Functions: it starts executions of the job state machine
// (infra/jobs.asl.json) and nothing else. The state machine does the rest (DESIGN.md "Sub-agent jobs").
//
// The contract:
//
//   - Start(job) starts an execution named by the job id, with input {"threadId", "jobId"} (an agent.JobTask
//     without wake): the sub-agent task, then delivery. Wake(task) starts an execution with the task as given
//     (wake set): delivery alone. Its name is WakeName(thread, key), so each (thread, key) pair names one
//     execution.
//   - Idempotent by name. Step Functions answers a name already used with ExecutionAlreadyExists (or, while
//     that execution still runs with the same input, with success): both are success here, so a retried Start
//     or Wake converges on the one execution. A name is never reused for a new pass: a job is started once, and
//     a re-drive of its delivery is a Wake under a new key. (AWS keeps names of closed standard executions for 90
//     days; a later start of the same name is then a new execution, which the job's own idempotent delivery
//     absorbs.)
//   - Names follow the rule agent.JobID already keeps: 1 to 80 characters of [0-9A-Za-z_-] (AWS accepts more,
//     but that set is also safe for CloudWatch log names). A job id outside it is KindInvalid/CodeInvalidJob,
//     and the request is not sent.
//   - One StartExecution request per call (the SDK's own retries aside). Errors: throttling, ExecutionLimitExceeded,
//     5xx answers and requests that got no answer are KindUnavailable/CodeJobsUnavailable (they may pass on
//     retry); the caller's context ending is KindCanceled/CodeCanceled; anything else (an unknown state
//     machine, a refused name or input, missing permissions) is KindInternal: a deployment bug, not an outage.
//
// What the state machine promises (and lib/sfn's tests hold it to agent.DefaultJobContract): the sub-agent task
// is bounded by TaskTimeout per attempt, retried TaskRetries times on Lambda service errors and on
// TransientError (RetryInterval, doubling), and throttled invokes apart (Lambda.TooManyRequestsException: 6
// attempts from 1 s, doubling, full jitter, on both tasks, so a burst does not fail jobs); any other error, a timeout or exhausted retries is caught into
// JobTask.Failure ({"Error": errorType or "States.Timeout", "Cause": the Lambda error document as text}) and
// delivered; delivery is retried DeliverRetries times; the whole execution is bounded by ExecutionTimeout. The
// Lambda Go runtime reports an error's Go type name as errorType, so the task handlers return
// *agent.TransientError and *agent.JobFailedError unwrapped for ErrorEquals to see them.
package sfn

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// API is the part of the Step Functions client the adapter uses; *sfn.Client implements it.
type API interface {
	StartExecution(ctx context.Context, in *awssfn.StartExecutionInput, optFns ...func(*awssfn.Options)) (*awssfn.StartExecutionOutput, error)
}

// Jobs starts executions of one state machine.
type Jobs struct {
	api API
	arn string
}

var _ agent.Jobs = (*Jobs)(nil)

// New returns the adapter for the state machine stateMachineARN.
func New(api API, stateMachineARN string) *Jobs {
	return &Jobs{api: api, arn: stateMachineARN}
}

// Start starts j's execution, named by its id. An execution of that name already started is success.
func (s *Jobs) Start(ctx context.Context, j agent.Job) error {
	if j.ThreadID == "" || !ValidName(j.ID) {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "job %q of thread %q: a job needs a thread and an id of 1-80 characters of [0-9A-Za-z_-]", j.ID, j.ThreadID)
	}
	return s.start(ctx, j.ID, agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID})
}

// Wake starts a delivery pass for w (w.Wake set), named WakeName(w.ThreadID, w.Wake). A pass of that name
// already started is success.
func (s *Jobs) Wake(ctx context.Context, w agent.JobTask) error {
	if w.ThreadID == "" || w.Wake == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "a wake needs a thread and a key (thread %q, key %q)", w.ThreadID, w.Wake)
	}
	return s.start(ctx, WakeName(w.ThreadID, w.Wake), w)
}

func (s *Jobs) start(ctx context.Context, name string, in agent.JobTask) error {
	input, err := json.Marshal(in)
	if err != nil {
		return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "encode execution input")
	}
	_, err = s.api.StartExecution(ctx, &awssfn.StartExecutionInput{
		StateMachineArn: aws.String(s.arn),
		Name:            aws.String(name),
		Input:           aws.String(string(input)),
	})
	return classify(ctx, err, name)
}

// classify maps a StartExecution error onto the agent's kinds; ExecutionAlreadyExists is success.
func classify(ctx context.Context, err error, name string) error {
	if err == nil {
		return nil
	}
	var exists *types.ExecutionAlreadyExists
	if errors.As(err, &exists) {
		return nil
	}
	msg := "start execution " + name
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return agent.Wrap(err, agent.KindCanceled, agent.CodeCanceled, msg)
	}
	if retryable(err) {
		return agent.Wrap(err, agent.KindUnavailable, agent.CodeJobsUnavailable, msg)
	}
	return agent.Wrap(err, agent.KindInternal, agent.CodeInternal, msg)
}

// retryable reports whether a Step Functions error may pass on retry: throttling, too many running
// executions, a 5xx answer, or no answer at all.
func retryable(err error) bool {
	var limit *types.ExecutionLimitExceeded
	if errors.As(err, &limit) {
		return true
	}
	if (retry.ThrottleErrorCode{Codes: retry.DefaultThrottleErrorCodes}).IsErrorThrottle(err) == aws.TrueTernary {
		return true
	}
	var send *smithyhttp.RequestSendError // inside a ResponseError of status 0
	if errors.As(err, &send) {
		return true
	}
	var resp *awshttp.ResponseError
	return errors.As(err, &resp) && (resp.HTTPStatusCode() >= http.StatusInternalServerError || resp.HTTPStatusCode() == http.StatusTooManyRequests)
}

// MaxNameLen is Step Functions' limit on an execution name.
const MaxNameLen = 80

// ValidName reports whether name is 1 to MaxNameLen characters of [0-9A-Za-z_-].
func ValidName(name string) bool {
	if name == "" || len(name) > MaxNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return false
		}
	}
	return true
}

func nameByte(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-'
}

// wakeHashLen is how many hex digits of the (thread, key) hash a wake's name carries: 64 bits.
const wakeHashLen = 16

// WakeName names the delivery pass of thread for key: "wake_", the key with every character outside
// [0-9A-Za-z_-] replaced by "-" and cut to fit, "_", and 16 hex digits of SHA-256 over thread and key. The
// hash makes the name one (thread, key) pair's alone (the readable part alone is ambiguous once cut or
// replaced); the key is there for whoever reads the execution list. Never a job id (those start "job_").
func WakeName(thread, key string) string {
	sum := sha256.Sum256([]byte(thread + "\x00" + key))
	room := MaxNameLen - len("wake_") - 1 - wakeHashLen
	var b strings.Builder
	b.WriteString("wake_")
	for i := 0; i < len(key) && i < room; i++ {
		if c := key[i]; nameByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('-')
		}
	}
	b.WriteByte('_')
	b.WriteString(hex.EncodeToString(sum[:])[:wakeHashLen])
	return b.String()
}
