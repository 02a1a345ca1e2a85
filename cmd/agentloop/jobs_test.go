package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Sub-agent jobs and the thread's queue end to end in the real `agentloop dev` binary (SQLite, the offline model,
// the in-process job runner): a research job whose sub-agent asks the offline model "/slow 30" works for about
// three seconds while the thread goes on, and its result arrives as a steer message, as its own turn (idle
// thread) or coalesced into the next user turn (a question pending); and multitask "enqueue" from two clients.
func TestJobsEndToEnd(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data)
	started := time.Now()
	t.Run("flows", func(t *testing.T) {
		t.Run("steer as its own turn", func(t *testing.T) { t.Parallel(); steerOwnTurn(t, dev) })
		t.Run("steer coalesced into the next turn", func(t *testing.T) { t.Parallel(); steerCoalesced(t, dev) })
		t.Run("enqueue from two clients", func(t *testing.T) { t.Parallel(); enqueueTwoClients(t, dev) })
	})
	t.Logf("three flows in %s", time.Since(started).Round(time.Millisecond))
	dev.stop(t)
}

// slowResearch is a research question whose sub-agent streams 30 words 100 ms apart under `agentloop dev`.
const slowResearch = `/tool research {"question":"/slow 30"}`

// (a) dispatch, (b) chat on while the job runs, (c) the steer's own server-side turn, attached and read to its end.
func steerOwnTurn(t *testing.T, dev *devProc) {
	const thread = "e2e-steer"
	dispatched := time.Now()
	status, stream, err := dev.chat(thread, "u1", slowResearch, "")
	if err != nil || status != 200 {
		t.Fatalf("dispatch: %d %v %s", status, err, stream)
	}
	jobID := ackedJob(t, stream)

	// (b) The job runs in the background: the thread is free for the next message, answered as usual, and the
	// thread lists the job, running, with the sub-agent's live activity line.
	v := waitView(t, dev, thread, "the job's activity line", func(v view) bool { return len(v.Jobs) == 1 && v.Jobs[0].Activity != "" })
	if j := v.Jobs[0]; j.ID != jobID || j.Status != agent.JobRunning || j.SteerDelivered || !strings.Contains(j.Activity, "researching") {
		t.Fatalf("job while it runs: %+v", j)
	}
	status, stream, err = dev.chat(thread, "u2", "still there?", "")
	if err != nil || status != 200 || replyText(stream) != "You said: still there?" {
		t.Fatalf("chat while the job runs: %d %v %s", status, err, stream)
	}
	v = dev.view(t, thread)
	if j := v.Jobs[0]; j.Status != agent.JobRunning || j.Activity == "" || v.ActiveRun != nil || len(v.Messages) != 4 {
		t.Fatalf("after the reply (%s after dispatch): job %+v, active run %+v, %d messages", time.Since(dispatched).Round(time.Millisecond), j, v.ActiveRun, len(v.Messages))
	}

	// (c) The job finishes into an idle thread: the wake claims it and runs a turn with trigger steer, whose
	// stream GET /chat/{id}/stream replays and tails until the run ends.
	v = waitView(t, dev, thread, "the steer turn", func(v view) bool { return v.ActiveRun != nil && v.ActiveRun.Trigger == agent.TriggerSteer })
	run := *v.ActiveRun
	attached := time.Now()
	resp, err := dev.get("/chat/" + thread + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("X-Vercel-Ai-Ui-Message-Stream") != "v1" {
		t.Fatalf("attach to the steer turn: %d %v %q", resp.StatusCode, err, body)
	}
	t.Logf("job done and steer turn claimed %s after dispatch; attached stream read to its end in %s (%d bytes)",
		attached.Sub(dispatched).Round(time.Millisecond), time.Since(attached).Round(time.Millisecond), len(body))
	cs := sseChunks(t, body)
	if cs[0]["type"] != "start" || cs[0]["messageId"] != run.AssistantMessageID || cs[len(cs)-1]["type"] != "finish" ||
		!bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
		t.Fatalf("attached stream of run %s (message %s): %s", run.ID, run.AssistantMessageID, body)
	}
	text := replyText(string(body))
	if !strings.HasPrefix(text, "You said: Research complete.") || !strings.HasSuffix(text, "word30") {
		t.Fatalf("the steer turn's reply: %q", text)
	}

	v = settledView(t, dev, thread)
	// u1, the dispatching reply, u2, its reply, the steer, the steer turn's reply.
	if len(v.Messages) != 6 || v.Messages[2].ID != "u2" || v.Messages[4].ID != agent.SteerMessageID(jobID) || v.Messages[5].ID != run.AssistantMessageID {
		t.Fatalf("messages: %s", summary(v.Messages))
	}
	if got := v.Messages[5].Text(); got != text {
		t.Fatalf("stored reply %q, attached stream %q", got, text)
	}
	checkSteer(t, v, jobID, "word30")
	runs := dev.runs(t, thread)
	if len(runs) != 3 || runs[2].ID != run.ID || runs[2].Trigger != agent.TriggerSteer || runs[2].Status != agent.RunCompleted {
		t.Fatalf("runs: %+v", runs)
	}
	if !runs[2].FinishedAt.After(attached) {
		t.Fatalf("the steer turn finished at %s, before the stream was attached at %s: nothing was tailed", runs[2].FinishedAt, attached)
	}
}

// (d) The job finishes while a question is pending (delete_note asks for approval): the steer waits in the queue,
// and a new message sent instead of an answer carries it: one turn answers both, the steer after the user's message.
func steerCoalesced(t *testing.T, dev *devProc) {
	const thread = "e2e-coalesce"
	status, stream, err := dev.chat(thread, "u1", `/tool add_note {"text":"e2e keep"}`, "")
	if err != nil || status != 200 {
		t.Fatalf("add_note: %d %v %s", status, err, stream)
	}
	var note struct{ ID string }
	if err := json.Unmarshal(toolOutput(t, stream), &note); err != nil || note.ID == "" {
		t.Fatalf("add_note output: %v %s", err, stream)
	}
	// One reply dispatches the job and asks for approval (parallel calls): the question is pending before the job
	// can finish.
	status, stream, err = dev.chat(thread, "u2", slowResearch+fmt.Sprintf(` /tool delete_note {"id":%q}`, note.ID), "")
	if err != nil || status != 200 || !strings.Contains(stream, `"type":"tool-approval-request"`) || !strings.Contains(stream, `"status":"interrupted"`) {
		t.Fatalf("dispatch and ask: %d %v %s", status, err, stream)
	}
	jobID := ackedJob(t, stream)

	v := waitView(t, dev, thread, "the steer to wait in the queue", func(v view) bool { return len(v.Queued) == 1 })
	if q := v.Queued[0]; q.Kind != agent.QueueSteer || q.JobID != jobID || q.MessageID != agent.SteerMessageID(jobID) {
		t.Fatalf("queued: %+v", v.Queued)
	}
	if j := v.Jobs[0]; j.Status != agent.JobRunning || !j.Finished() || j.SteerDelivered || len(v.Interrupts) != 1 || v.ActiveRun != nil {
		t.Fatalf("while the question is pending: job %+v, %d interrupts, active run %+v", j, len(v.Interrupts), v.ActiveRun)
	}
	if n := steerCount(v.Messages)[jobID]; n != 0 {
		t.Fatalf("the steer was stored while a question was pending: %s", summary(v.Messages))
	}

	status, stream, err = dev.chat(thread, "u3", "never mind", "")
	if err != nil || status != 200 {
		t.Fatalf("new message: %d %v %s", status, err, stream)
	}
	// The offline model answers the newest user text, which is the steer's (it follows the user's message).
	if text := replyText(stream); !strings.HasPrefix(text, "You said: Research complete.") || !strings.HasSuffix(text, "word30") {
		t.Fatalf("the reply does not read the steer: %q", text)
	}
	v = settledView(t, dev, thread)
	// u1, its reply, u2, the asking reply (settled), u3, the steer, one reply for both.
	if len(v.Messages) != 7 || v.Messages[4].ID != "u3" || v.Messages[5].ID != agent.SteerMessageID(jobID) || v.Messages[6].Role != agent.RoleAssistant {
		t.Fatalf("messages: %s", summary(v.Messages))
	}
	if len(v.Interrupts) != 0 {
		t.Fatalf("interrupts still pending: %+v", v.Interrupts)
	}
	for _, raw := range v.Messages[3].Parts {
		if p, _ := agent.DecodePart(raw); p.Type == "tool-delete_note" && p.State == agent.StateOutputAvailable {
			t.Fatalf("delete_note ran without an answer: %+v", p)
		}
	}
	checkSteer(t, v, jobID, "word30")
	runs := dev.runs(t, thread)
	if len(runs) != 3 || runs[2].Trigger != agent.TriggerUser || runs[2].Status != agent.RunCompleted || runs[2].AssistantMessageID != v.Messages[6].ID {
		t.Fatalf("runs: %+v (the steer must ride the user's turn)", runs)
	}
}

// (e) Two clients send with multitask "enqueue" while a /slow run holds the thread: both get 202 with their
// queue position, and once the run ends each message gets its own reply, in the order they were accepted.
func enqueueTwoClients(t *testing.T, dev *devProc) {
	const thread = "e2e-enqueue"
	slow := make(chan string, 1)
	go func() {
		status, stream, err := dev.chat(thread, "u1", "/slow 20", "")
		slow <- fmt.Sprint(status, " ", err, " ", replyText(stream))
	}()
	waitView(t, dev, thread, "the /slow run", func(v view) bool { return v.ActiveRun != nil })
	for i, c := range []*http.Client{{}, {}} { // two clients, each with its own connections
		id := fmt.Sprintf("q%d", i+1)
		status, body, err := dev.chatWith(c, thread, id, fmt.Sprintf("queued %d", i+1), "enqueue")
		var r struct {
			Queued struct {
				MessageID string
				Position  int
			}
		}
		if err != nil || status != 202 || json.Unmarshal([]byte(body), &r) != nil || r.Queued.MessageID != id || r.Queued.Position != i+1 {
			t.Fatalf("enqueue %s: %d %v %s", id, status, err, body)
		}
	}
	v := dev.view(t, thread)
	if v.ActiveRun == nil || len(v.Queued) != 2 || v.Queued[0].MessageID != "q1" || v.Queued[1].MessageID != "q2" || v.Queued[0].Kind != agent.QueueUser {
		t.Fatalf("while the /slow run goes on: active run %+v, queued %+v", v.ActiveRun, v.Queued)
	}
	words := make([]string, 20)
	for i := range words {
		words[i] = fmt.Sprintf("word%d", i+1)
	}
	if got, want := <-slow, "200 <nil> "+strings.Join(words, " "); got != want {
		t.Fatalf("the /slow run: %q", got)
	}
	v = settledView(t, dev, thread)
	want := []string{"u1", "", "q1", "You said: queued 1", "q2", "You said: queued 2"}
	if len(v.Messages) != len(want) {
		t.Fatalf("messages: %s", summary(v.Messages))
	}
	for i, w := range want {
		m := v.Messages[i]
		if (i%2 == 0 && m.ID != w) || (i%2 == 1 && (m.Role != agent.RoleAssistant || (w != "" && m.Text() != w))) {
			t.Fatalf("message %d: want %q in order: %s", i, w, summary(v.Messages))
		}
	}
	runs := dev.runs(t, thread)
	if len(runs) != 3 || runs[1].Trigger != agent.TriggerQueued || runs[2].Trigger != agent.TriggerQueued {
		t.Fatalf("runs: %+v", runs)
	}
}

// checkSteer checks the one steer message of job id and that the job ended done.
func checkSteer(t *testing.T, v view, jobID, inBrief string) {
	t.Helper()
	if n := steerCount(v.Messages); len(n) != 1 || n[jobID] != 1 {
		t.Fatalf("steers by job: %v, want one for %s", n, jobID)
	}
	if len(v.Jobs) != 1 || v.Jobs[0].ID != jobID || v.Jobs[0].Status != agent.JobDone || !v.Jobs[0].SteerDelivered {
		t.Fatalf("jobs: %+v", v.Jobs)
	}
	for _, m := range v.Messages {
		if m.ID != agent.SteerMessageID(jobID) {
			continue
		}
		var md struct {
			SubagentResult struct{ JobID, Kind, Status string } `json:"subagentResult"`
		}
		if m.Role != agent.RoleUser || json.Unmarshal(m.Metadata, &md) != nil || md.SubagentResult.Status != "done" || md.SubagentResult.Kind != "research" {
			t.Fatalf("steer %s: role %s, metadata %s", m.ID, m.Role, m.Metadata)
		}
		if len(m.Parts) != 2 {
			t.Fatalf("steer parts: %s", m.Parts)
		}
		var text struct{ Type, Text string }
		var art struct {
			Type string
			ID   string
			Data struct {
				Kind, JobID string
				Result      struct{ Brief string }
			}
		}
		if json.Unmarshal(m.Parts[0], &text) != nil || text.Type != "text" || !strings.Contains(text.Text, inBrief) {
			t.Fatalf("steer text part: %s", m.Parts[0])
		}
		if json.Unmarshal(m.Parts[1], &art) != nil || art.Type != "data-subagent-artifact" || art.Data.JobID != jobID ||
			art.Data.Kind != "research" || !strings.Contains(art.Data.Result.Brief, inBrief) {
			t.Fatalf("steer artifact part: %s", m.Parts[1])
		}
	}
}

// steerCount counts the thread's steer messages by the job their metadata names.
func steerCount(ms []agent.Message) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		var md struct {
			SubagentResult *struct{ JobID string } `json:"subagentResult"`
		}
		if json.Unmarshal(m.Metadata, &md) == nil && md.SubagentResult != nil {
			out[md.SubagentResult.JobID]++
		}
	}
	return out
}

// view is GET /threads/{id}.
type view struct {
	Thread     agent.Thread
	Messages   []agent.Message
	ActiveRun  *agent.Run
	Interrupts []agent.Interrupt
	Jobs       []agent.Job
	Queued     []struct {
		MessageID string
		Kind      agent.QueueKind
		JobID     string
		Position  int
	}
}

func (p *devProc) do(c *http.Client, method, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(context.Background(), method, p.url+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

func (p *devProc) get(path string) (*http.Response, error) {
	return p.do(http.DefaultClient, "GET", path, "")
}

// chat posts one user message as DefaultChatTransport would (the server reads only the newest message) and
// returns the status and the whole body. Safe to call from any goroutine.
func (p *devProc) chat(thread, id, text, multitask string) (int, string, error) {
	return p.chatWith(http.DefaultClient, thread, id, text, multitask)
}

func (p *devProc) chatWith(c *http.Client, thread, id, text, multitask string) (int, string, error) {
	body := map[string]any{"id": thread, "trigger": "submit-message",
		"messages": []any{map[string]any{"id": id, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}}}}
	if multitask != "" {
		body["multitask"] = multitask
	}
	b, _ := json.Marshal(body)
	resp, err := p.do(c, "POST", "/chat", string(b))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out), err
}

func (p *devProc) view(t *testing.T, thread string) view {
	t.Helper()
	var v view
	p.getJSON(t, "/threads/"+thread, &v)
	return v
}

// tryView is GET /threads/{id}; ok is false while the thread does not exist (404).
func (p *devProc) tryView(t *testing.T, thread string) (v view, ok bool) {
	t.Helper()
	resp, err := p.get("/threads/" + thread)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == 404:
		return v, false
	case resp.StatusCode != 200:
		t.Fatalf("GET /threads/%s: %d %s", thread, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("GET /threads/%s: %v in %s", thread, err, b)
	}
	return v, true
}

func (p *devProc) runs(t *testing.T, thread string) []agent.Run {
	t.Helper()
	var r struct{ Runs []agent.Run }
	p.getJSON(t, "/threads/"+thread+"/runs", &r)
	return r.Runs
}

func (p *devProc) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := p.get(path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v %s", path, resp.StatusCode, err, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, b)
	}
}

// waitView polls GET /threads/{id} every 20 ms until the thread exists and cond holds (15 s at most), and returns
// the view it held on.
func waitView(t *testing.T, p *devProc, thread, what string, cond func(view) bool) view {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		v, ok := p.tryView(t, thread)
		if ok && cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: active run %+v, jobs %+v, queued %+v, messages %s", what, v.ActiveRun, v.Jobs, v.Queued, summary(v.Messages))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settledView waits until the thread is idle, its queue empty and every job delivered.
func settledView(t *testing.T, p *devProc, thread string) view {
	t.Helper()
	return waitView(t, p, thread, "the thread to settle", func(v view) bool {
		for _, j := range v.Jobs {
			if !j.SteerDelivered {
				return false
			}
		}
		return v.ActiveRun == nil && len(v.Queued) == 0
	})
}

// sseChunks decodes a UI message stream's data frames (without [DONE]).
func sseChunks(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, f := range strings.Split(strings.TrimSuffix(string(body), "data: [DONE]\n\n"), "\n\n") {
		data, ok := strings.CutPrefix(f, "data: ")
		if !ok {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("frame %q: %v", data, err)
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		t.Fatalf("no chunks in %q", body)
	}
	return out
}

// replyText joins a stream's text deltas.
func replyText(stream string) string {
	var b strings.Builder
	for _, f := range strings.Split(stream, "\n\n") {
		data, ok := strings.CutPrefix(f, "data: ")
		if !ok || !strings.Contains(data, `"text-delta"`) {
			continue
		}
		var c struct{ Delta string }
		if json.Unmarshal([]byte(data), &c) == nil {
			b.WriteString(c.Delta)
		}
	}
	return b.String()
}

// toolOutput is the output of the stream's first tool-output-available chunk.
func toolOutput(t *testing.T, stream string) json.RawMessage {
	t.Helper()
	for _, c := range sseChunks(t, []byte(stream)) {
		if c["type"] == "tool-output-available" {
			b, _ := json.Marshal(c["output"])
			return b
		}
	}
	t.Fatalf("no tool output in %s", stream)
	return nil
}

// ackedJob returns the job id the research tool acknowledged in stream.
func ackedJob(t *testing.T, stream string) string {
	t.Helper()
	for _, c := range sseChunks(t, []byte(stream)) {
		out, _ := c["output"].(map[string]any)
		if c["type"] == "tool-output-available" && out["status"] == "dispatched" {
			if id, _ := out["jobId"].(string); strings.HasPrefix(id, "job_") {
				return id
			}
		}
	}
	t.Fatalf("no research acknowledgement in %s", stream)
	return ""
}

func summary(ms []agent.Message) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "\n  %s %s %.80q", m.ID, m.Role, m.Text())
	}
	return b.String()
}
