package sfntest_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// contract is the one the server tests run under.
var contract = agent.JobContract{TaskTimeout: time.Second, TaskRetries: 2, DeliverRetries: 1, RetryInterval: 50 * time.Millisecond, ExecutionTimeout: 2 * time.Second}

// serverCase is one behaviour of server.mjs, on a thread of its own.
type serverCase struct {
	name string
	run  func(t *testing.T, j *sfntest.Jobs, thread string)
}

// What server.mjs promises beyond running the machine: AWS's answers to StartExecution, the Lambda service
// errors, and the terminal statuses.
func TestServer(t *testing.T) {
	j := sfntest.StartJobs(t, contract)
	for _, tc := range []serverCase{
		{"StartExecutionIdempotence", testStartIdempotence},
		{"StartExecutionRefusals", testStartRefusals},
		{"LambdaServiceErrors", testLambdaServiceErrors},
		{"UnreachableFunction", testUnreachableFunction},
		{"Failed", testFailed},
		{"TimedOut", testTimedOut},
		{"Aborted", testAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, j, "thr_"+tc.name)
		})
	}
}

func ok(_ context.Context, in agent.JobTask) (agent.JobTask, error) { return in, nil }

func delivered(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
	return agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredSteer}, nil
}

// start starts an execution called name for thread with a job task as input.
func start(ctx context.Context, j *sfntest.Jobs, name, thread string) (*sfn.StartExecutionOutput, error) {
	input, _ := json.Marshal(agent.JobTask{ThreadID: thread, JobID: name})
	return j.Client.StartExecution(ctx, &sfn.StartExecutionInput{
		StateMachineArn: aws.String(j.Server.StateMachineARN), Name: aws.String(name), Input: aws.String(string(input)),
	})
}

// finish waits for the execution and describes it.
func finish(t *testing.T, j *sfntest.Jobs, name string) *sfn.DescribeExecutionOutput {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := j.Wait(ctx, name); err != nil {
		t.Fatal(err)
	}
	out, err := j.Describe(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The same name with the same input, while it runs, is the same execution (success, same ARN); with another
// input, or once it ended, ExecutionAlreadyExists.
func testStartIdempotence(t *testing.T, j *sfntest.Jobs, thread string) {
	j.Route(t, thread, sfntest.Function(func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
		}
		return in, nil
	}), sfntest.Function(delivered))
	ctx := context.Background()
	first, err := start(ctx, j, "job_idem", thread)
	if err != nil {
		t.Fatal(err)
	}
	again, err := start(ctx, j, "job_idem", thread)
	if err != nil || aws.ToString(again.ExecutionArn) != aws.ToString(first.ExecutionArn) || !again.StartDate.Equal(*first.StartDate) {
		t.Fatalf("same name and input while running: %+v, %v; want the first answer %+v", again, err, first)
	}
	var exists *types.ExecutionAlreadyExists
	if _, err := start(ctx, j, "job_idem", thread+"_other"); !errors.As(err, &exists) {
		t.Fatalf("same name, other input: %v, want ExecutionAlreadyExists", err)
	}
	if out := finish(t, j, "job_idem"); out.Status != types.ExecutionStatusSucceeded {
		t.Fatalf("status %s (%s: %s)", out.Status, aws.ToString(out.Error), aws.ToString(out.Cause))
	}
	if _, err := start(ctx, j, "job_idem", thread); !errors.As(err, &exists) {
		t.Fatalf("same name and input once ended: %v, want ExecutionAlreadyExists", err)
	}
}

func testStartRefusals(t *testing.T, j *sfntest.Jobs, thread string) {
	ctx := context.Background()
	var invalid *types.InvalidName
	for _, name := range []string{"a/b", "a b", strings.Repeat("n", 81)} {
		if _, err := start(ctx, j, name, thread); !errors.As(err, &invalid) {
			t.Errorf("name %q: %v, want InvalidName", name, err)
		}
	}
	var noMachine *types.StateMachineDoesNotExist
	_, err := j.Client.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(j.Server.StateMachineARN + "x"), Name: aws.String("n")})
	if !errors.As(err, &noMachine) {
		t.Errorf("unknown state machine: %v, want StateMachineDoesNotExist", err)
	}
	var badInput *types.InvalidExecutionInput
	_, err = j.Client.StartExecution(ctx, &sfn.StartExecutionInput{StateMachineArn: aws.String(j.Server.StateMachineARN), Name: aws.String("n"), Input: aws.String("{")})
	if !errors.As(err, &badInput) {
		t.Errorf("input that is not JSON: %v, want InvalidExecutionInput", err)
	}
}

// A 500 and a 429 from the Lambda service are Lambda.ServiceException and Lambda.TooManyRequestsException,
// which the state machine retries.
func testLambdaServiceErrors(t *testing.T, j *sfntest.Jobs, thread string) {
	var n atomic.Int32
	fn := sfntest.Function(ok)
	j.Route(t, thread, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			http.Error(w, `{"Type":"Service","message":"boom"}`, http.StatusInternalServerError)
		case 2:
			http.Error(w, `{"message":"Rate Exceeded."}`, http.StatusTooManyRequests)
		default:
			fn.ServeHTTP(w, r)
		}
	}), sfntest.Function(delivered))
	if _, err := start(context.Background(), j, "job_service_errors", thread); err != nil {
		t.Fatal(err)
	}
	out := finish(t, j, "job_service_errors")
	want := `{"threadId":"` + thread + `","jobId":"job_service_errors","status":"delivered","turns":0}`
	if out.Status != types.ExecutionStatusSucceeded || aws.ToString(out.Output) != want || n.Load() != 3 {
		t.Fatalf("status %s, output %s after %d attempts; want SUCCEEDED, %s after 3", out.Status, aws.ToString(out.Output), n.Load(), want)
	}
}

// A function that cannot be reached is Lambda.SdkClientException: retried, then caught and delivered.
func testUnreachableFunction(t *testing.T, j *sfntest.Jobs, thread string) {
	var n atomic.Int32
	failure := make(chan *agent.TaskFailure, 1)
	j.Route(t, thread, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}), sfntest.Function(func(ctx context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
		failure <- in.Failure
		return delivered(ctx, in)
	}))
	if _, err := start(context.Background(), j, "job_unreachable", thread); err != nil {
		t.Fatal(err)
	}
	if out := finish(t, j, "job_unreachable"); out.Status != types.ExecutionStatusSucceeded {
		t.Fatalf("status %s", out.Status)
	}
	if f := <-failure; f == nil || f.Error != "Lambda.SdkClientException" || int(n.Load()) != 1+contract.TaskRetries {
		t.Fatalf("failure %+v after %d attempts, want Lambda.SdkClientException after %d", f, n.Load(), 1+contract.TaskRetries)
	}
}

// A delivery that fails for good fails the execution, with the task's error and cause.
func testFailed(t *testing.T, j *sfntest.Jobs, thread string) {
	var n atomic.Int32
	j.Route(t, thread, sfntest.Function(ok), sfntest.Function(func(context.Context, agent.JobTask) (agent.DeliveryResult, error) {
		n.Add(1)
		return agent.DeliveryResult{}, &agent.TransientError{Err: errors.New("store down")}
	}))
	if _, err := start(context.Background(), j, "job_failed", thread); err != nil {
		t.Fatal(err)
	}
	out := finish(t, j, "job_failed")
	if out.Status != types.ExecutionStatusFailed || aws.ToString(out.Error) != "TransientError" ||
		aws.ToString(out.Cause) != `{"errorMessage":"transient: store down","errorType":"TransientError"}` || int(n.Load()) != 1+contract.DeliverRetries {
		t.Fatalf("status %s, error %s, cause %s after %d attempts", out.Status, aws.ToString(out.Error), aws.ToString(out.Cause), n.Load())
	}
}

// The definition's TimeoutSeconds ends the execution: TIMED_OUT.
func testTimedOut(t *testing.T, j *sfntest.Jobs, thread string) {
	release := make(chan struct{})
	defer close(release)
	j.Route(t, thread, sfntest.Function(ok), sfntest.Function(func(context.Context, agent.JobTask) (agent.DeliveryResult, error) {
		<-release
		return agent.DeliveryResult{}, nil
	}))
	if _, err := start(context.Background(), j, "job_timed_out", thread); err != nil {
		t.Fatal(err)
	}
	out := finish(t, j, "job_timed_out")
	// The lower bound only tells the definition's timeout from an emulator that times out at once; it is half the
	// timeout because the emulator's own dates (whole milliseconds of Node's clock) have put its timer's end 1 ms
	// short of it (1.999s in a fresh-clone make test under two busy loops). Load can only lengthen it.
	if took := out.StopDate.Sub(*out.StartDate); out.Status != types.ExecutionStatusTimedOut || took < contract.ExecutionTimeout/2 {
		t.Fatalf("status %s after %v, want TIMED_OUT after %v", out.Status, took, contract.ExecutionTimeout)
	}
}

// StopExecution aborts a running execution.
func testAborted(t *testing.T, j *sfntest.Jobs, thread string) {
	release := make(chan struct{})
	defer close(release)
	j.Route(t, thread, sfntest.Function(func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
		<-release
		return in, nil
	}), sfntest.Function(delivered))
	ctx := context.Background()
	if _, err := start(ctx, j, "job_aborted", thread); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Client.StopExecution(ctx, &sfn.StopExecutionInput{ExecutionArn: aws.String(j.ExecutionARN("job_aborted"))}); err != nil {
		t.Fatal(err)
	}
	if out := finish(t, j, "job_aborted"); out.Status != types.ExecutionStatusAborted {
		t.Fatalf("status %s, want ABORTED", out.Status)
	}
}

// A definition the server cannot run is a start-up error that says why.
func TestLaunchErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	def, err := sfntest.ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	invalid := filepath.Join(dir, "invalid.json")
	if err := os.WriteFile(invalid, []byte(strings.Replace(string(def), `"Next": "Delivered"`, `"Next": "Nowhere"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	bound := map[string]string{sfntest.SubagentFunction: "http://127.0.0.1:9/", sfntest.WakeFunction: "http://127.0.0.1:9/"}
	cases := []struct {
		name string
		o    sfntest.Options
		want string
	}{
		{"unbound function", sfntest.Options{Lambdas: map[string]string{sfntest.SubagentFunction: "http://127.0.0.1:9/"}}, "no --lambda for function " + sfntest.FunctionARN(sfntest.WakeFunction)},
		{"missing substitution", sfntest.Options{Substitutions: map[string]string{}, Lambdas: bound}, "no --sub for ${SubagentFunctionArn}"},
		{"invalid definition", sfntest.Options{Definition: invalid, Lambdas: bound}, "Nowhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := sfntest.Launch(context.Background(), tc.o)
			if err == nil {
				s.Close()
				t.Fatal("Launch succeeded")
			}
			if sfntest.SkipRequested() && strings.Contains(err.Error(), "Node") {
				t.Skip(err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Launch: %v\nwant it to mention %q", err, tc.want)
			}
		})
	}
}
