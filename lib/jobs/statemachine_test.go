package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/auth"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

// The repository's job state machine (infra/jobs.asl.json, its numbers scaled down) executed by a real ASL
// interpreter (aws-local-stepfunctions on sfnlocal), its two Lambda task states bound to the real task handlers
// (Tasks.Subagent, Tasks.Deliver) over the whole local stack, which starts executions through the Step
// Functions adapter: dispatch → sub-agent → delivery → steer in the thread.

var smSecret = []byte("test-secret-test-secret-test-secret")

// counted serves a typed task handler and counts its calls; fail makes the first calls fail first.
func counted[In, Out any](n *atomic.Int32, fail int32, h func(context.Context, In) (Out, error)) http.Handler {
	return sfntest.Function(func(ctx context.Context, in In) (Out, error) {
		if n.Add(1) <= fail {
			var zero Out
			return zero, &agent.TransientError{Err: fmt.Errorf("injected outage")}
		}
		return h(ctx, in)
	})
}

func TestStateMachineRunsTheTaskHandlers(t *testing.T) {
	t.Parallel()
	contract := agent.JobContract{TaskTimeout: time.Second, TaskRetries: 2, DeliverRetries: 2, RetryInterval: 100 * time.Millisecond,
		ExecutionTimeout: 30 * time.Second, DeliveryGrace: time.Minute}
	js := sfntest.StartJobs(t, contract)
	model := httptest.NewServer(offline.New(offline.WithWordDelay(300 * time.Millisecond)))
	t.Cleanup(model.Close)
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: model.URL + "/v1/",
		Config: config.Config{Secret: string(smSecret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond,
			CancelPoll: 20 * time.Millisecond, ResumePollMax: 20 * time.Millisecond},
		OpenAI:      func(c *openai.Config) { c.BackoffBase = time.Millisecond },
		JobContract: &contract, Jobs: sfn.New(js.Client, js.Server.StateMachineARN)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	srv := httptest.NewServer(stack.Handler)
	t.Cleanup(srv.Close)
	tok, err := auth.MintHS256(smSecret, "alice", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name            string
		question        string
		failDeliveries  int32
		subagentCalls   int32 // at least
		deliverCalls    int32 // at least
		status          agent.JobStatus
		steer           string
		executionStatus string
	}{
		{name: "success", question: "What is Go? See [Go](https://go.dev)", subagentCalls: 1, deliverCalls: 1,
			status: agent.JobDone, steer: "Research complete", executionStatus: "SUCCEEDED"},
		// The model fails 4 times: the adapter's own 2 retries, then the state machine retries the task.
		{name: "retry then success", question: "/flaky 4 503 hello", subagentCalls: 2, deliverCalls: 1,
			status: agent.JobDone, steer: "Research complete", executionStatus: "SUCCEEDED"},
		// 10 words 300 ms apart outlast the 1 s TimeoutSeconds: the Catch takes the failure to delivery.
		{name: "timeout, failure path, failure steer", question: "/slow 10", subagentCalls: 1, deliverCalls: 1,
			status: agent.JobError, steer: "The research job failed: it did not finish within 1s", executionStatus: "SUCCEEDED"},
		{name: "delivery retry", question: "What is a retry?", failDeliveries: 1, subagentCalls: 1, deliverCalls: 2,
			status: agent.JobDone, steer: "Research complete", executionStatus: "SUCCEEDED"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			thread := fmt.Sprintf("sm%d", i)
			var subCalls, delCalls atomic.Int32
			js.Route(t, thread, counted(&subCalls, 0, stack.JobTasks.Subagent), counted(&delCalls, c.failDeliveries, stack.JobTasks.Deliver))
			input, _ := json.Marshal(map[string]string{"question": c.question})
			body, _ := json.Marshal(map[string]any{"id": thread, "trigger": "submit-message", "messages": []any{map[string]any{
				"id": "u1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": "/tool research " + string(input)}}}}})
			req, _ := http.NewRequest("POST", srv.URL+"/chat", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var stream bytes.Buffer
			stream.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(stream.String(), `"jobId"`) {
				t.Fatalf("dispatch: %d %s", resp.StatusCode, stream.String())
			}
			jobID := ackedJobID(t, stream.String())
			ctx := context.Background()
			var j agent.Job
			deadline := time.Now().Add(20 * time.Second)
			for {
				if j, err = stack.Store.GetJob(ctx, thread, jobID); err == nil && j.SteerDelivered {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("job not delivered: %+v, %v\n%s", j, err, js.Server.Output())
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := js.Wait(ctx, jobID); err != nil {
				t.Fatal(err)
			}
			if ex, err := js.Describe(ctx, jobID); err != nil || string(ex.Status) != c.executionStatus {
				t.Fatalf("execution: %+v, %v", ex, err)
			}
			if j.Status != c.status || subCalls.Load() < c.subagentCalls || delCalls.Load() < c.deliverCalls {
				t.Fatalf("job %s, sub-agent calls %d, delivery calls %d", j.Status, subCalls.Load(), delCalls.Load())
			}
			m, err := stack.Store.GetMessage(ctx, thread, agent.SteerMessageID(jobID))
			if err != nil || !strings.Contains(m.Message.Text(), c.steer) {
				t.Fatalf("steer %q, %v", m.Message.Text(), err)
			}
			recs, err := stack.Store.ListMessages(ctx, thread)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range recs {
				if r.Message.ID == agent.SteerMessageID(jobID) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%d steers", n)
			}
		})
	}
}

// toolCallID reads the dispatch's tool call id from the stream.
// ackedJobID is the job id the stream's dispatch acknowledged (the job tool's output).
func ackedJobID(t *testing.T, stream string) string {
	t.Helper()
	for _, f := range strings.Split(stream, "\n\n") {
		var c struct {
			Type   string
			Output jobs.Ack
		}
		if json.Unmarshal([]byte(strings.TrimPrefix(f, "data: ")), &c) == nil && c.Type == "tool-output-available" && c.Output.JobID != "" {
			return c.Output.JobID
		}
	}
	t.Fatalf("no tool output in %s", stream)
	return ""
}
