package sfntest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// Jobs is the repository's job state machine running on a server of its own, under a contract, with its two
// Lambda tasks bound to callbacks that route each call by its JobTask's thread: one server serves many tests,
// each with its own thread and its own task handlers.
type Jobs struct {
	Server *Server
	Client *sfn.Client

	mu     sync.Mutex
	routes map[string]http.Handler // function + "/" + thread id
}

// StartJobs starts the job state machine (infra/jobs.asl.json with c's numbers written in, see WithContract)
// for the test and its subtests; it stops when the test ends.
func StartJobs(t testing.TB, c agent.JobContract) *Jobs {
	t.Helper()
	def, err := ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	scaled, err := WithContract(def, c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jobs.asl.json")
	if err := os.WriteFile(path, scaled, 0o644); err != nil {
		t.Fatal(err)
	}
	j := &Jobs{routes: map[string]http.Handler{}}
	mux := http.NewServeMux()
	mux.Handle("POST /"+SubagentFunction, j.dispatch(SubagentFunction))
	mux.Handle("POST /"+WakeFunction, j.dispatch(WakeFunction))
	cb := httptest.NewServer(mux)
	t.Cleanup(cb.Close)
	j.Server = Start(t, Options{Definition: path, Verbose: true, Lambdas: map[string]string{
		FunctionARN(SubagentFunction): cb.URL + "/" + SubagentFunction,
		FunctionARN(WakeFunction):     cb.URL + "/" + WakeFunction,
	}})
	j.Client = j.Server.Client()
	return j
}

// Route sends the thread's sub-agent and delivery task calls to subagent and deliver (Function serves typed
// handlers) until the test ends. A call for a thread without a route fails with Lambda.AWSLambdaException.
func (j *Jobs) Route(t testing.TB, thread string, subagent, deliver http.Handler) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.routes[SubagentFunction+"/"+thread] = subagent
	j.routes[WakeFunction+"/"+thread] = deliver
	t.Cleanup(func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		delete(j.routes, SubagentFunction+"/"+thread)
		delete(j.routes, WakeFunction+"/"+thread)
	})
}

func (j *Jobs) dispatch(fn string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var in agent.JobTask
		if err == nil {
			err = json.Unmarshal(body, &in)
		}
		j.mu.Lock()
		h := j.routes[fn+"/"+in.ThreadID]
		j.mu.Unlock()
		if err != nil || h == nil {
			http.Error(w, "no route for thread "+in.ThreadID, http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// ExecutionARN is the ARN of the execution called name.
func (j *Jobs) ExecutionARN(name string) string {
	return strings.Replace(j.Server.StateMachineARN, ":stateMachine:", ":execution:", 1) + ":" + name
}

// Describe describes the execution called name.
func (j *Jobs) Describe(ctx context.Context, name string) (*sfn.DescribeExecutionOutput, error) {
	return j.Client.DescribeExecution(ctx, &sfn.DescribeExecutionInput{ExecutionArn: aws.String(j.ExecutionARN(name))})
}

// Wait polls until none of the named executions is running; a name with no execution counts as ended.
func (j *Jobs) Wait(ctx context.Context, names ...string) error {
	for _, name := range names {
		for {
			out, err := j.Describe(ctx, name)
			var missing *types.ExecutionDoesNotExist
			if errors.As(err, &missing) {
				break
			}
			if err != nil {
				return err
			}
			if out.Status != types.ExecutionStatusRunning {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return nil
}
