package sfn_test

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
	"github.com/agentloop/agentloop/lib/jobstest"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"
	"github.com/aws/aws-sdk-go-v2/service/sfn/types"
)

// The Jobs suite on the repository's state machine, executed by aws-local-stepfunctions: one server for all
// cases, running a copy of infra/jobs.asl.json with the suite's contract written in, its two Lambda tasks bound
// to callbacks that serve each case's scripted tasks (routed by the JobTask's thread) as the Go runtime would.
func TestConformance(t *testing.T) {
	l := setupLocal(t, jobstest.Contract())
	jobstest.Run(t, func(t *testing.T, threadID string, tasks jobstest.Tasks) jobstest.Adapter {
		l.route(t, threadID, tasks)
		rec := &recorder{Jobs: sfn.New(l.client, l.server.StateMachineARN), client: l.client, machine: l.server.StateMachineARN}
		return jobstest.Adapter{Jobs: rec, Wait: rec.wait}
	})
}

// local is a sfnlocal server whose task callbacks route by thread.
type local struct {
	server *sfntest.Server
	client *awssfn.Client

	mu     sync.Mutex
	routes map[string]http.Handler // "subagent/" or "wake/" + thread id
}

// setupLocal starts sfnlocal on the repository's definition under contract c.
func setupLocal(t *testing.T, c agent.JobContract) *local {
	t.Helper()
	def, err := sfntest.ReadDefinition()
	if err != nil {
		t.Fatal(err)
	}
	scaled, err := sfntest.WithContract(def, c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "jobs.asl.json")
	if err := os.WriteFile(path, scaled, 0o644); err != nil {
		t.Fatal(err)
	}
	l := &local{routes: map[string]http.Handler{}}
	mux := http.NewServeMux()
	mux.Handle("POST /subagent", l.dispatch(sfntest.SubagentFunction))
	mux.Handle("POST /wake", l.dispatch(sfntest.WakeFunction))
	cb := httptest.NewServer(mux)
	t.Cleanup(cb.Close)
	began := time.Now()
	l.server = sfntest.Start(t, sfntest.Options{Definition: path, Verbose: true, Lambdas: map[string]string{
		sfntest.FunctionARN(sfntest.SubagentFunction): cb.URL + "/subagent",
		sfntest.FunctionARN(sfntest.WakeFunction):     cb.URL + "/wake",
	}})
	t.Logf("sfnlocal started in %v", time.Since(began).Round(time.Millisecond))
	l.client = l.server.Client()
	return l
}

// route serves tasks for the thread's task calls until the test ends.
func (l *local) route(t *testing.T, thread string, tasks jobstest.Tasks) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.routes[sfntest.SubagentFunction+"/"+thread] = sfntest.Function(tasks.Subagent)
	l.routes[sfntest.WakeFunction+"/"+thread] = sfntest.Function(tasks.Deliver)
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.routes, sfntest.SubagentFunction+"/"+thread)
		delete(l.routes, sfntest.WakeFunction+"/"+thread)
	})
}

func (l *local) dispatch(fn string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var in agent.JobTask
		if err == nil {
			err = json.Unmarshal(body, &in)
		}
		l.mu.Lock()
		h := l.routes[fn+"/"+in.ThreadID]
		l.mu.Unlock()
		if err != nil || h == nil {
			http.Error(w, "no route for thread "+in.ThreadID, http.StatusBadRequest) // Lambda.AWSLambdaException
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	})
}

// recorder notes the execution each Start and Wake names, so that wait can watch them.
type recorder struct {
	*sfn.Jobs
	client  *awssfn.Client
	machine string

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

// wait polls until none of the noted executions is RUNNING.
func (r *recorder) wait(ctx context.Context) error {
	r.mu.Lock()
	names := append([]string(nil), r.names...)
	r.mu.Unlock()
	for _, name := range names {
		for {
			status, err := executionStatus(ctx, r.client, r.machine, name)
			var missing *types.ExecutionDoesNotExist
			if errors.As(err, &missing) {
				break // refused at start
			}
			if err != nil {
				return err
			}
			if status != types.ExecutionStatusRunning {
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

// executionARN is the ARN of the execution name of machine.
func executionARN(machine, name string) string {
	return strings.Replace(machine, ":stateMachine:", ":execution:", 1) + ":" + name
}

func executionStatus(ctx context.Context, c *awssfn.Client, machine, name string) (types.ExecutionStatus, error) {
	out, err := c.DescribeExecution(ctx, &awssfn.DescribeExecutionInput{ExecutionArn: awsString(executionARN(machine, name))})
	if err != nil {
		return "", err
	}
	return out.Status, nil
}

func awsString(s string) *string { return &s }
