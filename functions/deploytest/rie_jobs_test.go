package deploytest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssfn "github.com/aws/aws-sdk-go-v2/service/sfn"

	"github.com/agentloop/agentloop/functions/deploytest"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/reaper"
)

// The task functions under the emulator, each started by its own events/ payload and answering its typed
// output or its named error, and the whole job path through the repository's state machine on sfnlocal: a job
// tool's call on the chat function starts an execution, whose RunSubagent task invokes the subagent bootstrap
// and whose Deliver task invokes the wake bootstrap, which runs the steer turn; the scheduled reaper re-drives
// an undelivered job through the same machine. Secrets are read only by the functions that need them.
func TestJobsUnderRIE(t *testing.T) {
	t.Parallel()
	e := newEmulated(t)
	e.extra["subagent"] = []string{"AGENT_MODEL_RETRIES=0"} // a failing model call fails at once
	subagent := e.start(t, "subagent")
	wake := e.start(t, "wake")
	reap := e.start(t, "reaper")
	chat := e.start(t, "chat")
	store := dynamo.New(dynamotest.Client(e.dynamo), e.table)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A thread of alice's with a research job, as a job tool's call leaves it (the execution not started).
	seed := func(thread, kind, question string) agent.Job {
		t.Helper()
		now := time.Now()
		if _, _, err := store.CreateThread(ctx, agent.Thread{ID: thread, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		input, _ := json.Marshal(jobs.ResearchInput{Question: question})
		j := agent.Job{ID: agent.JobID(thread, "run-1", "call-1"), ThreadID: thread, Owner: "alice", Kind: kind, ToolCallID: "call-1",
			Input: input, Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now, DueAt: now.Add(time.Hour)}
		j.Execution = j.ID
		stored, _, err := store.CreateJob(ctx, j)
		if err != nil {
			t.Fatal(err)
		}
		return stored
	}
	payload := func(file string, j agent.Job) []byte {
		t.Helper()
		p, err := deploytest.LoadPayload(file, map[string]string{"THREAD_ID": j.ThreadID, "JOB_ID": j.ID})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("subagent runs a job", func(t *testing.T) {
		j := seed("th-sub", "research", "why is the sky blue")
		out, fe := invokeTask(t, subagent, payload("subagent-task.json", j))
		var got agent.JobTask
		if fe != nil || json.Unmarshal(out, &got) != nil || got != (agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID}) {
			t.Fatalf("subagent answered %s (error %+v), want its input task back", out, fe)
		}
		done, err := store.GetJob(ctx, j.ThreadID, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		var res jobs.ResearchResult
		if !done.Finished() || done.Failed() || json.Unmarshal(done.Result, &res) != nil || res.Brief != "You said: why is the sky blue" {
			t.Fatalf("job after the task: %+v (result %s)", done, done.Result)
		}
		// Its cold start read the model key and nothing else.
		if calls := e.ssm.calls(); len(calls) != 1 || !slices.Equal(calls[0].Names, []string{openAIParam}) {
			t.Fatalf("SSM calls %+v, want one for the model key alone", calls)
		}

		// The wake delivers it: the steer goes into the idle thread and a server-side turn answers it.
		out, fe = invokeTask(t, wake, payload("wake-task.json", j))
		var res2 agent.DeliveryResult
		if fe != nil || json.Unmarshal(out, &res2) != nil ||
			res2 != (agent.DeliveryResult{ThreadID: j.ThreadID, JobID: j.ID, Status: agent.DeliveredSteer, Turns: 1}) {
			t.Fatalf("wake answered %s (error %+v), want the steer delivered by one turn", out, fe)
		}
		checkDelivered(ctx, t, store, j)
	})

	t.Run("subagent reports named errors", func(t *testing.T) {
		// The model fails with a 500: worth a retry (TransientError), and the job stays unfinished.
		j := seed("th-err", "research", "/error 500")
		out, fe := invokeTask(t, subagent, payload("subagent-task.json", j))
		if fe == nil || fe.Type != "TransientError" {
			t.Fatalf("subagent answered %s, want errorType TransientError", out)
		}
		if got, err := store.GetJob(ctx, j.ThreadID, j.ID); err != nil || got.Finished() {
			t.Fatalf("job after a transient failure: %+v %v, want it unfinished (a retry runs it)", got, err)
		}
		// A kind this deployment does not know: no retry helps (JobFailedError).
		j = seed("th-kind", "astrology", "what sign")
		out, fe = invokeTask(t, subagent, payload("subagent-task.json", j))
		if fe == nil || fe.Type != "JobFailedError" || !strings.Contains(fe.Message, "astrology") {
			t.Fatalf("subagent answered %s, want errorType JobFailedError naming the kind", out)
		}

		// The state machine's Catch hands the failure to the wake, which records and delivers it.
		task := agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID, Failure: &agent.TaskFailure{Error: fe.Type, Cause: string(out)}}
		in, _ := json.Marshal(task)
		out, fe = invokeTask(t, wake, in)
		var res agent.DeliveryResult
		if fe != nil || json.Unmarshal(out, &res) != nil || res.Status != agent.DeliveredSteer {
			t.Fatalf("wake answered %s (error %+v), want the failure delivered", out, fe)
		}
		failed, err := store.GetJob(ctx, j.ThreadID, j.ID)
		if err != nil || failed.Status != agent.JobError || !strings.Contains(failed.Error, "astrology") {
			t.Fatalf("job %+v %v, want status error with the reason", failed, err)
		}
	})

	t.Run("a job tool runs through the state machine", func(t *testing.T) {
		ev, err := deploytest.LoadEvent("chat-post.json", map[string]string{"TOKEN": e.token, "THREAD_ID": "th-sfn", "MESSAGE_ID": "msg-sfn", "TEXT": "x"})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(map[string]any{"id": "th-sfn", "trigger": "submit-message", "messages": []any{map[string]any{
			"id": "msg-sfn", "role": "user", "parts": []any{map[string]any{"type": "text", "text": `/tool research {"question":"what is dynalite"}`}}}}})
		ev.Request.Body = string(body)
		raw, _ := json.Marshal(ev.Request)
		_, stream := invoke(t, chat, raw)
		s, err := deploytest.ParseStream(stream)
		if err != nil {
			t.Fatal(err)
		}
		jobID := ackedJobID(s)
		if jobID == "" {
			t.Fatalf("the reply acknowledges no job: %s", stream)
		}
		exec := describe(ctx, t, e, jobID)
		var res agent.DeliveryResult
		if exec.Status != "SUCCEEDED" || json.Unmarshal([]byte(aws.ToString(exec.Output)), &res) != nil || res.JobID != jobID ||
			(res.Status != agent.DeliveredSteer && res.Status != agent.DeliveredQueued) {
			t.Fatalf("execution %s: %s, output %s", jobID, exec.Status, aws.ToString(exec.Output))
		}
		// Delivered now, or queued behind the chat turn and delivered by the pass its end asked for.
		checkDelivered(ctx, t, store, agent.Job{ThreadID: "th-sfn", ID: jobID})
	})

	t.Run("the reaper re-drives an undelivered job", func(t *testing.T) {
		j := seed("th-reap", "research", "is anyone there")
		now := time.Now()
		if _, _, err := store.FinishJob(ctx, agent.JobResult{ThreadID: j.ThreadID, ID: j.ID, Result: json.RawMessage(`{"brief":"yes","sources":[]}`),
			DueAt: now.Add(-time.Minute), Now: now}); err != nil {
			t.Fatal(err)
		}
		out, fe := invokeTask(t, reap, payload("reaper-schedule.json", j))
		var st reaper.Stats
		if fe != nil || json.Unmarshal(out, &st) != nil || st.Redriven != 1 {
			t.Fatalf("reaper answered %s (error %+v), want one job re-driven", out, fe)
		}
		checkDelivered(ctx, t, store, j)
		var line map[string]any
		for _, rec := range reap.FunctionLogs() {
			if rec["message"] == "agent.reaper.tick" {
				line = rec
			}
		}
		if line == nil || line["level"] != "INFO" || line["redriven"] != 1.0 || line["reaped"] != 0.0 {
			t.Fatalf("no agent.reaper.tick line with the sweep's counts in:\n%s", reap.Logs())
		}
	})

	// Who read which secret: chat and wake both, subagent the model key (above), the reaper none.
	names := map[int]int{}
	for _, c := range e.ssm.calls() {
		names[len(c.Names)]++
	}
	if names[1] != 1 || names[2] != 2 || len(names) != 2 {
		t.Errorf("SSM calls by number of names %v, want the subagent's (1) and chat's and wake's (2 each)", names)
	}
	for name, r := range map[string]*deploytest.RIE{"subagent": subagent, "wake": wake, "reaper": reap} {
		for _, rec := range r.FunctionLogs() {
			if rec["message"] == "cold start" && rec["secrets_from_ssm"] != (name != "reaper") {
				t.Errorf("%s: cold start secrets_from_ssm = %v", name, rec["secrets_from_ssm"])
			}
		}
	}
}

// invokeTask invokes a task function and returns its output, or its error document.
func invokeTask(t testing.TB, r *deploytest.RIE, payload []byte) ([]byte, *deploytest.FunctionError) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	status, out, err := r.Invoke(ctx, payload)
	if err != nil {
		t.Fatal(err)
	}
	if status != http.StatusOK {
		t.Fatalf("emulator answered %d: %s\nlogs:\n%s", status, out, r.Logs())
	}
	fe, err := deploytest.ParseFunctionError(out)
	if err != nil {
		t.Fatal(err)
	}
	return out, fe
}

// toolCallID is the tool call id of the reply's (one) tool call.
// ackedJobID is the job id the stream's dispatch acknowledged (the job tool's output).
func ackedJobID(s deploytest.Stream) string {
	for _, c := range s.Chunks {
		if out, ok := c["output"].(map[string]any); ok && c["type"] == "tool-output-available" {
			id, _ := out["jobId"].(string)
			return id
		}
	}
	return ""
}

// describe waits for the execution called name to end and describes it.
func describe(ctx context.Context, t *testing.T, e *emulated, name string) *awssfn.DescribeExecutionOutput {
	t.Helper()
	arn := strings.Replace(e.sfn.StateMachineARN, ":stateMachine:", ":execution:", 1) + ":" + name
	client := e.sfn.Client()
	for {
		out, err := client.DescribeExecution(ctx, &awssfn.DescribeExecutionInput{ExecutionArn: aws.String(arn)})
		if err != nil {
			t.Fatalf("execution %s: %v\n--- sfnlocal ---\n%s", name, err, e.sfn.Output())
		}
		if out.Status != "RUNNING" {
			return out
		}
		select {
		case <-ctx.Done():
			t.Fatalf("execution %s still running: %v", name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkDelivered waits until j is delivered: done, its steer in the thread, and an assistant reply after it.
func checkDelivered(ctx context.Context, t *testing.T, store *dynamo.Store, j agent.Job) {
	t.Helper()
	var last string
	for {
		got, err := store.GetJob(ctx, j.ThreadID, j.ID)
		msgs, err2 := store.ListMessages(ctx, j.ThreadID)
		if err == nil && err2 == nil && got.SteerDelivered && got.Status == agent.JobDone {
			i := slices.IndexFunc(msgs, func(m agent.MessageRecord) bool { return m.Message.ID == agent.SteerMessageID(j.ID) })
			if i >= 0 && i+1 < len(msgs) && msgs[i+1].Message.Role == agent.RoleAssistant &&
				strings.HasPrefix(msgs[i+1].Message.Text(), "You said: ") {
				return
			}
		}
		last = fmt.Sprintf("job %+v (%v); %d messages (%v)", got, err, len(msgs), err2)
		select {
		case <-ctx.Done():
			t.Fatalf("job %s not delivered: %s", j.ID, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
