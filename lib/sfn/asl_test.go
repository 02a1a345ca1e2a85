package sfn_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobstest"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

// The numbers infra/jobs.asl.json states are agent.DefaultJobContract's (the local runner honours the same
// ones), in the whole seconds AWS requires.
func TestDefinitionStatesTheContract(t *testing.T) {
	t.Parallel()
	def := readDefinition(t)
	got, err := sfntest.Contract(def)
	if err != nil {
		t.Fatal(err)
	}
	want := agent.DefaultJobContract()
	want.DeliveryGrace, want.StartDue = 0, 0 // the reaper's, not the state machine's
	if got != want {
		t.Fatalf("infra/jobs.asl.json states %+v,\nagent.DefaultJobContract() is %+v", got, want)
	}
	for name, d := range map[string]time.Duration{"TaskTimeout": got.TaskTimeout, "RetryInterval": got.RetryInterval, "ExecutionTimeout": got.ExecutionTimeout} {
		if d%time.Second != 0 {
			t.Errorf("%s %v: Step Functions takes whole seconds", name, d)
		}
	}
}

// aslState is the part of a state the structure test reads.
type aslState struct {
	Type       string
	Resource   string
	Parameters map[string]any
	OutputPath string
	Next       string
	Default    string
	Choices    []struct {
		Variable  string
		IsPresent *bool
		Next      string
	}
	Retry []struct {
		ErrorEquals     []string
		IntervalSeconds float64
		MaxAttempts     int
		BackoffRate     float64
		JitterStrategy  string
	}
	Catch []struct {
		ErrorEquals []string
		ResultPath  string
		Next        string
	}
}

// The shape the contract relies on: wake → Deliver, else RunSubagent → Deliver → Succeed; both tasks invoke
// their Lambda with the whole state as the event and take its result as the state; both retry throttling first
// (6 attempts from 1 s, doubling, with full jitter: a burst of invokes must not fail jobs), then the Lambda
// service errors and TransientError, named as the Go runtime names agent.TransientError; every sub-agent error
// is caught into $.failure (the JobTask's field) and delivered; delivery catches nothing.
func TestDefinitionShape(t *testing.T) {
	t.Parallel()
	var def struct {
		StartAt string
		States  map[string]aslState
	}
	if err := json.Unmarshal(readDefinition(t), &def); err != nil {
		t.Fatal(err)
	}
	route := def.States[def.StartAt]
	if route.Type != "Choice" || len(route.Choices) != 1 || route.Choices[0].Variable != "$."+jsonName(t, "Wake") ||
		route.Choices[0].IsPresent == nil || !*route.Choices[0].IsPresent ||
		route.Choices[0].Next != sfntest.StateDeliver || route.Default != sfntest.StateRunSubagent {
		t.Fatalf("start state %s = %+v, want a Choice: wake present → %s, else %s", def.StartAt, route, sfntest.StateDeliver, sfntest.StateRunSubagent)
	}
	transient := reflect.TypeFor[agent.TransientError]().Name()
	retried := []string{"Lambda.ServiceException", "Lambda.AWSLambdaException", "Lambda.SdkClientException",
		"Lambda.ClientExecutionTimeoutException", transient}
	for name, fn := range map[string]string{sfntest.StateRunSubagent: "${SubagentFunctionArn}", sfntest.StateDeliver: "${WakeFunctionArn}"} {
		s := def.States[name]
		if s.Type != "Task" || s.Resource != "arn:aws:states:::lambda:invoke" || s.Parameters["FunctionName"] != fn ||
			s.Parameters["Payload.$"] != "$" || s.OutputPath != "$.Payload" {
			t.Errorf("%s = %+v, want a lambda:invoke task of %s with the state as payload and the payload as output", name, s, fn)
		}
		if len(s.Retry) != 2 || !slices.Equal(s.Retry[1].ErrorEquals, retried) {
			t.Fatalf("%s retries %+v, want throttling's retrier, then one of %v", name, s.Retry, retried)
		}
		if th := s.Retry[0]; !slices.Equal(th.ErrorEquals, []string{"Lambda.TooManyRequestsException"}) || th.MaxAttempts != 6 ||
			th.IntervalSeconds != 1 || th.BackoffRate != 2 || th.JitterStrategy != "FULL" {
			t.Errorf("%s throttling retrier %+v, want 6 attempts from 1 s, backoff 2, full jitter", name, th)
		}
	}
	sub, del := def.States[sfntest.StateRunSubagent], def.States[sfntest.StateDeliver]
	if sub.Next != sfntest.StateDeliver || len(sub.Catch) != 1 || !slices.Equal(sub.Catch[0].ErrorEquals, []string{"States.ALL"}) ||
		sub.Catch[0].ResultPath != "$."+jsonName(t, "Failure") || sub.Catch[0].Next != sfntest.StateDeliver {
		t.Errorf("%s: next %s, catch %+v; want every error caught into $.failure and %s next", sfntest.StateRunSubagent, sub.Next, sub.Catch, sfntest.StateDeliver)
	}
	if len(del.Catch) != 0 || def.States[del.Next].Type != "Succeed" {
		t.Errorf("%s: catch %+v, next %s; want no catch and a Succeed next", sfntest.StateDeliver, del.Catch, del.Next)
	}
}

// asl-validator accepts the definition, with plausible ARNs in its placeholders (ARN and path checks on).
func TestDefinitionValidates(t *testing.T) {
	t.Parallel()
	def, err := sfntest.Substitute(readDefinition(t), sfntest.JobSubstitutions())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jobs.asl.json")
	if err := os.WriteFile(path, def, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sfntest.Validate(ctx, path); err != nil {
		if sfntest.SkipRequested() {
			t.Skipf("%s=1: %v", sfntest.SkipEnv, err)
		}
		t.Fatal(err)
	}
}

func readDefinition(t *testing.T) []byte {
	t.Helper()
	def, err := sfntest.ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// jsonName is the JSON name of a JobTask field.
func jsonName(t *testing.T, field string) string {
	t.Helper()
	f, ok := reflect.TypeFor[agent.JobTask]().FieldByName(field)
	if !ok {
		t.Fatalf("JobTask has no field %s", field)
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// throttled answers 429 (what sfnlocal reports as Lambda.TooManyRequestsException, as the Lambda service does for
// a throttled invoke) to the first n calls, then serves h; calls counts them all.
func throttled(n int32, calls *atomic.Int32, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= n {
			http.Error(w, "Rate Exceeded.", http.StatusTooManyRequests)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// REVIEW H10: a burst of throttled invokes (Lambda.TooManyRequestsException) got the service errors' 2 retries,
// then the sub-agent's Catch failed the job. Throttling has a retrier of its own (6 attempts, backoff 2, jitter),
// on both tasks: five throttles in a row still run the job and deliver its result.
func TestThrottledTasksAreRetried(t *testing.T) {
	t.Parallel()
	local := sfntest.StartJobs(t, jobstest.Contract())
	const thread = "thr_throttled"
	var subCalls, delCalls atomic.Int32
	delivered := make(chan agent.JobTask, 1)
	local.Route(t, thread,
		throttled(5, &subCalls, sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.JobTask, error) { return in, nil })),
		throttled(5, &delCalls, sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
			delivered <- in
			return agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredSteer}, nil
		})))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	j := agent.Job{ID: "job_throttled", ThreadID: thread}
	if err := sfn.New(local.Client, local.Server.StateMachineARN).Start(ctx, j); err != nil {
		t.Fatal(err)
	}
	if err := local.Wait(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	out, err := local.Describe(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case in := <-delivered:
		if in.Failure != nil {
			t.Fatalf("the job was failed by throttling: %+v (sub-agent calls %d)", in.Failure, subCalls.Load())
		}
	default:
		t.Fatalf("nothing delivered: execution %s, delivery calls %d\n%s", out.Status, delCalls.Load(), local.Server.Output())
	}
	if out.Status != "SUCCEEDED" || subCalls.Load() != 6 || delCalls.Load() != 6 {
		t.Fatalf("execution %s, sub-agent calls %d, delivery calls %d; want SUCCEEDED after 5 throttles each", out.Status, subCalls.Load(), delCalls.Load())
	}
}
