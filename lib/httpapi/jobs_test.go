package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Sub-agent jobs, delivery and the thread's queue over HTTP on both stores: dispatch, the steer as its own turn
// or coalesced into the next, delivery races, recovery by the reaper, and multitask enqueue.

// jobsView is GET /threads/{id} with the job fields.
type jobsView struct {
	Thread     agent.Thread
	Messages   []agent.Message
	ActiveRun  *agent.Run
	Interrupts []agent.Interrupt
	Jobs       []agent.Job
	Queued     []struct {
		MessageID string
		Kind      string
		JobID     string
		Position  int
	}
}

func (h *hitlStack) jobsView(thread string) jobsView {
	h.t.Helper()
	resp := h.f.do(h.t, "GET", "/threads/"+thread, token(h.t, "alice"), nil)
	if resp.StatusCode != 200 {
		h.t.Fatalf("GET /threads/%s: %d %s", thread, resp.StatusCode, readAll(h.t, resp))
	}
	var v jobsView
	if err := json.Unmarshal(readAll(h.t, resp), &v); err != nil {
		h.t.Fatal(err)
	}
	return v
}

// waitFor polls cond until it holds or 2 minutes pass: a bound for a thread that never gets there, not a measure
// of how soon it does (10 queued turns on dynalite took over 15 s under a load average of 33).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// steers returns the thread's steer messages by job id.
func steers(ms []agent.Message) map[string]int {
	out := map[string]int{}
	for _, m := range ms {
		var md struct {
			SubagentResult *struct{ JobID string } `json:"subagentResult"`
		}
		_ = json.Unmarshal(m.Metadata, &md)
		if md.SubagentResult != nil {
			out[md.SubagentResult.JobID]++
			if m.ID != agent.SteerMessageID(md.SubagentResult.JobID) || m.Role != agent.RoleUser {
				panic(fmt.Sprintf("steer message %s (%s) for job %s", m.ID, m.Role, md.SubagentResult.JobID))
			}
		}
	}
	return out
}

// gate is a server tool that blocks until the test opens it: it holds a thread busy for as long as needed.
type gate struct{ open chan struct{} }

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) tools(agent.ValueStore, agent.Clock) []agent.Tool {
	return []agent.Tool{{Name: "hold", Kind: agent.ToolServer, InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			select {
			case <-g.open:
			case <-ctx.Done():
			}
			return json.RawMessage(`"held"`), nil
		}}}
}

// hold starts a turn that holds the thread until the gate opens (text: "/tool hold {}" unless given); it
// returns when the run is claimed and its user message stored, so the turn has planned (a message queued before
// the turn read the queue is taken by it, placed before its own message: not what a test of a busy thread means).
func (h *hitlStack) hold(thread, id string, text ...string) <-chan string {
	done := make(chan string, 1)
	msg := "/tool hold {}"
	if len(text) > 0 {
		msg = text[0]
	}
	go func() {
		status, body := h.post(chatBody(thread, id, msg))
		done <- fmt.Sprint(status, " ", body)
	}()
	waitFor(h.t, "the holding run", func() bool {
		th, err := h.stack.Store.GetThread(context.Background(), thread)
		if err != nil || th.ActiveRun == nil {
			return false
		}
		_, err = h.stack.Store.GetMessage(context.Background(), thread, id)
		return err == nil
	})
	return done
}

// finishedJob creates a job in the thread with its result stored, as a sub-agent that reported back leaves it
// (the delivery is then the test's to drive).
func (h *hitlStack) finishedJob(thread, callID, brief string) agent.Job {
	h.t.Helper()
	ctx := context.Background()
	now := time.Now().UTC()
	j := agent.Job{ID: agent.JobID(thread, "run_1", callID), ThreadID: thread, Owner: "alice", Kind: "research", ToolCallID: callID,
		Input: json.RawMessage(`{"question":"q"}`), Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now, DueAt: now.Add(time.Hour)}
	if _, _, err := h.stack.Store.CreateJob(ctx, j); err != nil {
		h.t.Fatal(err)
	}
	res, _ := json.Marshal(map[string]any{"brief": brief, "sources": []any{}})
	j, _, err := h.stack.Store.FinishJob(ctx, agent.JobResult{ThreadID: thread, ID: j.ID, Result: res, DueAt: now.Add(time.Hour), Now: now})
	if err != nil {
		h.t.Fatal(err)
	}
	return j
}

func (h *hitlStack) deliver(j agent.Job) agent.DeliveryResult {
	h.t.Helper()
	out, err := h.stack.JobTasks.Deliver(context.Background(), agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID})
	if err != nil {
		h.t.Fatalf("deliver %s: %v", j.ID, err)
	}
	return out
}

// settled waits until the thread is idle with nothing queued and every job's steer delivered, as two views in a
// row agree (one view's reads are not a snapshot: a delivery pass may claim between them).
func (h *hitlStack) settled(thread string) jobsView {
	h.t.Helper()
	var v jobsView
	quiet := func(v jobsView) bool {
		n := steers(v.Messages)
		for _, j := range v.Jobs {
			if !j.SteerDelivered || n[j.ID] != 1 {
				return false
			}
		}
		return v.ActiveRun == nil && len(v.Queued) == 0
	}
	waitFor(h.t, "the thread to settle", func() bool {
		first := h.jobsView(thread)
		if !quiet(first) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
		v = h.jobsView(thread)
		return quiet(v) && len(v.Messages) == len(first.Messages) && v.Thread.Epoch == first.Thread.Epoch
	})
	return v
}

func TestJobDispatchAndSteer(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			body := h.send("th", "u1", `/tool research {"question":"What is Go? See [The Go site](https://go.dev)"}`)
			cs := chunks(t, body)
			out := chunkOf(cs, "tool-output-available")
			if out == nil {
				t.Fatalf("no acknowledgement: %s", body)
			}
			ack := out["output"].(map[string]any)
			jobID, _ := ack["jobId"].(string)
			if ack["status"] != "dispatched" || jobID == "" {
				t.Fatalf("ack = %v", ack)
			}
			v := h.settled("th")
			if len(v.Jobs) != 1 || v.Jobs[0].ID != jobID || v.Jobs[0].Status != agent.JobDone || v.Jobs[0].Activity == "" {
				t.Fatalf("jobs = %+v", v.Jobs)
			}
			if n := steers(v.Messages); len(n) != 1 || n[jobID] != 1 {
				t.Fatalf("steers = %v", n)
			}
			// u1, the dispatching reply, the steer, the reply to the steer.
			if len(v.Messages) != 4 || v.Messages[2].ID != agent.SteerMessageID(jobID) || v.Messages[3].Role != agent.RoleAssistant {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			steer := v.Messages[2]
			var art struct {
				Type string
				Data struct {
					Kind   string
					Result struct {
						Brief   string
						Sources []struct{ Title, URL string }
					}
				}
			}
			if err := json.Unmarshal(steer.Parts[1], &art); err != nil || art.Type != "data-subagent-artifact" || art.Data.Kind != "research" {
				t.Fatalf("artifact part %s: %v", steer.Parts[1], err)
			}
			if len(art.Data.Result.Sources) != 1 || art.Data.Result.Sources[0].URL != "https://go.dev" || !strings.Contains(art.Data.Result.Brief, "What is Go?") {
				t.Fatalf("research result = %+v", art.Data.Result)
			}
			if !strings.Contains(v.Messages[3].Text(), "Research complete") {
				t.Fatalf("the reply did not read the steer: %q", v.Messages[3].Text())
			}
			// The dispatch part's output is the acknowledgement, forever.
			if p := lastPart(t, v.Messages[1], "research"); p.State != agent.StateOutputAvailable || !strings.Contains(string(p.Output), jobID) {
				t.Fatalf("dispatch part = %+v", p)
			}
			runs := h.runs("th")
			if len(runs) != 2 || runs[1].Trigger != agent.TriggerSteer || runs[1].Status != agent.RunCompleted {
				t.Fatalf("runs = %+v", runs)
			}
		})
	}
}

func TestSteerWaitsAndCoalesces(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind+"/busy thread: own turn when the run ends", func(t *testing.T) {
			t.Parallel()
			g := newGate()
			h := startHITL(t, store, func(h *hitlStack) { h.tools = g.tools })
			done := h.hold("th", "u1")
			j := h.finishedJob("th", "call_1", "brief one")
			if out := h.deliver(j); out.Status != agent.DeliveredQueued {
				t.Fatalf("delivery into a busy thread: %+v", out)
			}
			if v := h.jobsView("th"); len(v.Queued) != 1 || v.Queued[0].JobID != j.ID || v.Jobs[0].Status != agent.JobRunning {
				t.Fatalf("queued %+v, jobs %+v", v.Queued, v.Jobs)
			}
			close(g.open)
			<-done
			v := h.settled("th")
			if n := steers(v.Messages); n[j.ID] != 1 || v.Jobs[0].Status != agent.JobDone {
				t.Fatalf("steers %v, jobs %+v", n, v.Jobs)
			}
			last := v.Messages[len(v.Messages)-2:]
			if last[0].ID != agent.SteerMessageID(j.ID) || !strings.Contains(last[1].Text(), "brief one") {
				t.Fatalf("tail: %s", texts(v.Messages))
			}
		})
		t.Run(kind+"/pending question: coalesced into the next message", func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			id := h.addNote("keep")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			j := h.finishedJob("th", "call_1", "brief two")
			if out := h.deliver(j); out.Status != agent.DeliveredQueued {
				t.Fatalf("delivery while a question is pending: %+v", out)
			}
			if v := h.jobsView("th"); len(v.Interrupts) != 1 || steers(v.Messages)[j.ID] != 0 {
				t.Fatalf("the steer did not wait: %s", texts(v.Messages))
			}
			h.send("th", "u2", "never mind")
			v := h.settled("th")
			// u1, the asking reply (settled), u2, the steer, one reply for both.
			if len(v.Messages) != 5 || v.Messages[2].ID != "u2" || v.Messages[3].ID != agent.SteerMessageID(j.ID) || v.Messages[4].Role != agent.RoleAssistant {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			if runs := h.runs("th"); len(runs) != 2 || runs[1].Trigger != agent.TriggerUser {
				t.Fatalf("runs = %+v (the steer must ride the user's turn)", runs)
			}
		})
		t.Run(kind+"/pending question: delivered after the answer", func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			id := h.addNote("drop")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			j := h.finishedJob("th", "call_1", "brief three")
			h.deliver(j)
			if status, body := h.post(answerBody(h.view("th"), respond(true, ""))); status != 200 {
				t.Fatalf("answer: %d %s", status, body)
			}
			v := h.settled("th")
			if len(v.Messages) != 4 || v.Messages[2].ID != agent.SteerMessageID(j.ID) || h.notes() != 0 {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			runs := h.runs("th")
			if len(runs) != 3 || runs[1].Trigger != agent.TriggerContinuation || runs[2].Trigger != agent.TriggerSteer {
				t.Fatalf("runs = %+v", runs)
			}
		})
	}
}

func TestDeliveryRaces(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			h.send("th", "u0", "hello")
			for round := range 6 {
				j := h.finishedJob("th", fmt.Sprintf("call_%d", round), fmt.Sprintf("brief %d", round))
				var wg sync.WaitGroup
				wg.Add(2)
				go func() { defer wg.Done(); h.deliver(j) }()
				if round%2 == 0 {
					go func() { defer wg.Done(); h.deliver(j) }() // two wakes for one job
				} else {
					go func() { // a wake racing a user turn
						defer wg.Done()
						status, body := h.post(map[string]any{"id": "th", "trigger": "submit-message", "messages": []any{map[string]any{
							"id": fmt.Sprintf("u%d", round), "role": "user", "parts": []any{map[string]any{"type": "text", "text": "next"}}}}})
						if status != 200 && status != 409 {
							t.Errorf("user turn: %d %s", status, body)
						}
					}()
				}
				wg.Wait()
				v := h.settled("th")
				if n := steers(v.Messages); n[j.ID] != 1 {
					t.Fatalf("round %d: steers %v", round, n)
				}
			}
			v := h.jobsView("th")
			for _, j := range v.Jobs {
				if j.Status != agent.JobDone {
					t.Fatalf("job %+v", j)
				}
			}
			if last := v.Messages[len(v.Messages)-1]; last.Role != agent.RoleAssistant {
				t.Fatalf("the newest steer has no reply: %s", texts(v.Messages))
			}
		})
	}
}

// shifted is the wall clock moved forward, so the reaper sees due work now.
type shifted struct{ by time.Duration }

func (s shifted) Now() time.Time { return agent.SystemClock{}.Now().Add(s.by) }

func TestDeliveryRecoveredByTheReaper(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		for _, crash := range []string{"after the result", "after the queue", "after the steer message", "after the take"} {
			t.Run(kind+"/"+crash, func(t *testing.T) {
				t.Parallel()
				h := startHITL(t, store)
				h.send("th", "u0", "hello")
				j := h.finishedJob("th", "call_1", "recovered brief")
				ctx := context.Background()
				switch crash {
				case "after the queue", "after the steer message", "after the take":
					q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueSteer, Message: steerOf(t, h, j), JobID: j.ID, Status: agent.QueueQueued, CreatedAt: time.Now().UTC()}
					if _, _, err := h.stack.Store.Enqueue(ctx, q, 0); err != nil {
						t.Fatal(err)
					}
					if crash != "after the queue" {
						// A delivery turn stored the steer under its claim (a write needs the claim it names)...
						now := time.Now().UTC()
						res, err := h.stack.Store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th", Owner: "alice", RunID: "run_dead",
							Trigger: agent.TriggerSteer, AssistantMessageID: "msg_dead", Reserve: 2, Now: now})
						if err != nil {
							t.Fatal(err)
						}
						w := agent.MessageWrite{ThreadID: "th", Seq: res.Run.FirstSeq, Message: q.Message, Fence: res.Run.Fence(), Final: true, Now: now}
						if err := h.stack.Store.PutMessage(ctx, w); err != nil {
							t.Fatal(err)
						}
						if crash == "after the take" {
							// ... took the entry, and died before it marked the job delivered.
							if err := h.stack.Store.TakeQueued(ctx, "th", q.Message.ID, now); err != nil {
								t.Fatal(err)
							}
						}
						// Its claim is gone by now (reaped: the thread is idle again).
						dead := res.Run
						dead.Status, dead.FinishedAt, dead.UpdatedAt = agent.RunFailed, now, now
						if err := h.stack.Store.FinishRun(ctx, dead); err != nil {
							t.Fatal(err)
						}
					}
				}
				before := len(h.runs("th"))
				rp := reaper.New(reaper.Deps{Store: h.stack.Store, Tools: h.stack.Tools, Jobs: h.stack.Jobs, Clock: shifted{2 * time.Hour}}, reaper.Config{})
				st, err := rp.Tick(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.Redriven+st.Swept != 1 {
					t.Fatalf("tick = %+v, want one delivery pass", st)
				}
				v := h.settled("th")
				if n := steers(v.Messages); n[j.ID] != 1 || v.Jobs[0].Status != agent.JobDone {
					t.Fatalf("steers %v, jobs %+v", n, v.Jobs)
				}
				runs := h.runs("th")
				if crash == "after the steer message" || crash == "after the take" {
					// The steer was in the thread already: the pass only marks it delivered (no model call, no reply).
					if len(runs) > before+1 || (len(runs) == before+1 && runs[len(runs)-1].Steps != 0) {
						t.Fatalf("runs = %+v", runs)
					}
					if len(runs) == before+1 {
						// A reader attached to that short pass ends like every reader: finish, then [DONE].
						segs, err := h.stack.Store.ListSegments(ctx, runs[before].ID, 0, time.Now())
						if err != nil || len(segs) == 0 || !strings.HasSuffix(string(segs[len(segs)-1].Data), uistream.DoneFrame) {
							t.Fatalf("the pass's stream: %d segments, %v", len(segs), err)
						}
					}
				} else if len(runs) != before+1 || runs[before].Trigger != agent.TriggerSteer {
					t.Fatalf("runs = %+v", runs)
				}
				// A second sweep finds nothing.
				if st, err := rp.Tick(ctx); err != nil || st.Redriven+st.Swept != 0 {
					t.Fatalf("second tick = %+v, %v", st, err)
				}
			})
		}
	}
}

// steerOf is the steer message a wake builds for j.
func steerOf(t *testing.T, h *hitlStack, j agent.Job) agent.Message {
	t.Helper()
	return h.stack.JobKinds.Steer(j)
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind+"/10 concurrent senders", func(t *testing.T) {
			t.Parallel()
			g := newGate()
			h := startHITL(t, store, func(h *hitlStack) { h.tools = g.tools })
			done := h.hold("th", "u0")
			var wg sync.WaitGroup
			positions := make([]int, 10)
			for i := range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := chatBody("th", fmt.Sprintf("q%d", i), fmt.Sprintf("queued %d", i))
					body["multitask"] = "enqueue"
					status, out := h.post(body)
					var r struct {
						Queued struct {
							MessageID string
							Position  int
						}
					}
					if status != 202 || json.Unmarshal([]byte(out), &r) != nil || r.Queued.MessageID != fmt.Sprintf("q%d", i) {
						t.Errorf("enqueue %d: %d %s", i, status, out)
					}
					positions[i] = r.Queued.Position
				}()
			}
			wg.Wait()
			q, err := h.stack.Store.ListQueued(context.Background(), "th")
			if err != nil || len(q) != 10 {
				t.Fatalf("queue: %d entries, %v", len(q), err)
			}
			for _, p := range positions {
				if p < 1 || p > 10 {
					t.Fatalf("positions %v", positions)
				}
			}
			// A repeated send of a queued message converges on its entry.
			body := chatBody("th", "q3", "queued 3")
			body["multitask"] = "enqueue"
			if status, out := h.post(body); status != 202 {
				t.Fatalf("repeat: %d %s", status, out)
			}
			close(g.open)
			<-done
			v := h.settled("th")
			var users, replies []string
			for i, m := range v.Messages[2:] {
				if i%2 == 0 {
					users = append(users, m.ID)
				} else {
					replies = append(replies, m.Text())
				}
			}
			if len(users) != 10 || len(replies) != 10 {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			for i, e := range q {
				if users[i] != e.Message.ID || replies[i] != "You said: "+e.Message.Text() {
					t.Fatalf("answer %d: user %s reply %q, want %s answered in queue order", i, users[i], replies[i], e.Message.ID)
				}
			}
			runs := h.runs("th")
			if len(runs) != 11 || runs[1].Trigger != agent.TriggerQueued {
				t.Fatalf("%d runs, %+v", len(runs), runs[1])
			}
		})
		t.Run(kind+"/idle thread runs at once; full queue refused", func(t *testing.T) {
			t.Parallel()
			g := newGate()
			h := startHITL(t, store, func(h *hitlStack) { h.tools = g.tools; h.cfg = func(c *config.Config) { c.MaxQueued = 2 } })
			body := chatBody("th", "u0", "hi")
			body["multitask"] = "enqueue"
			if status, out := h.post(body); status != 200 || chunkOf(chunks(t, out), "finish") == nil {
				t.Fatalf("idle enqueue: %d %s", status, out)
			}
			done := h.hold("th", "u1")
			// A message the thread holds already is refused, not queued to wait for an answer it will not get.
			body = chatBody("th", "u0", "hi")
			body["multitask"] = "enqueue"
			if resp := h.f.do(t, "POST", "/chat", token(t, "alice"), body); resp.StatusCode != 409 || errorCode(t, resp) != agent.CodeDuplicateMessage {
				t.Fatalf("enqueue of an answered message: %d", resp.StatusCode)
			}
			for i, want := range []int{202, 202, 409} {
				body := chatBody("th", fmt.Sprintf("q%d", i), "later")
				body["multitask"] = "enqueue"
				resp := h.f.do(t, "POST", "/chat", token(t, "alice"), body)
				if resp.StatusCode != want {
					t.Fatalf("enqueue %d: %d %s", i, resp.StatusCode, readAll(t, resp))
				}
				if want == 409 {
					if code := errorCode(t, resp); code != agent.CodeQueueFull {
						t.Fatalf("code %s", code)
					}
				} else {
					resp.Body.Close()
				}
			}
			close(g.open)
			<-done
			if v := h.settled("th"); len(v.Messages) != 8 {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
		})
		t.Run(kind+"/a queued message sent again without enqueue is stored once", func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			h.send("th", "u0", "hello")
			// Queued while a run held the thread; the pass after it had not run yet when the client re-sent it.
			for _, id := range []string{"q1", "q2"} {
				q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Owner: "alice", Status: agent.QueueQueued, CreatedAt: time.Now().UTC(),
					Message: agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"` + id + `"}`)}}}
				if _, _, err := h.stack.Store.Enqueue(context.Background(), q, 0); err != nil {
					t.Fatal(err)
				}
			}
			h.send("th", "q1", "q1")
			// q1 once, in its queue place (before q2, which was accepted after it); one reply for both.
			v := h.settled("th")
			if len(v.Messages) != 5 || v.Messages[2].ID != "q1" || v.Messages[3].ID != "q2" || v.Messages[4].Role != agent.RoleAssistant {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
		})
		t.Run(kind+"/a queued message the thread holds already closes no question", func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			id := h.addNote("keep")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			// u1 queued while its own first send's write was in flight (sim seed 863): the thread holds it.
			q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Owner: "alice", Status: agent.QueueQueued, CreatedAt: time.Now().UTC(),
				Message: agent.Message{ID: "u1", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}
			if _, _, err := h.stack.Store.Enqueue(context.Background(), q, 0); err != nil {
				t.Fatal(err)
			}
			// A steer waits too; the delivery pass must leave both to the answer's turn.
			j := h.finishedJob("th", "call_1", "brief")
			if out := h.deliver(j); out.Status != agent.DeliveredQueued {
				t.Fatalf("delivery: %+v", out)
			}
			v := h.jobsView("th")
			if len(v.Interrupts) != 1 || len(v.Messages) != 2 || lastPart(t, v.Messages[1], "delete_note").State != agent.StateApprovalRequested {
				t.Fatalf("the question was closed: interrupts %+v, messages %s", v.Interrupts, texts(v.Messages))
			}
			if len(v.Queued) != 1 || v.Queued[0].JobID != j.ID {
				t.Fatalf("queued %+v, want the steer alone", v.Queued)
			}
		})
		t.Run(kind+"/a queued message does not wait behind a question", func(t *testing.T) {
			t.Parallel()
			g := newGate()
			h := startHITL(t, store, func(h *hitlStack) {
				h.tools = func(v agent.ValueStore, c agent.Clock) []agent.Tool {
					return append(g.tools(v, c), tools.Demo(v, c)...)
				}
			})
			id := h.addNote("keep me")
			done := h.hold("th", "u1", fmt.Sprintf(`/tool hold {} /tool delete_note {"id":%q}`, id))
			body := chatBody("th", "q1", "after the question")
			body["multitask"] = "enqueue"
			if status, out := h.post(body); status != 202 {
				t.Fatalf("enqueue: %d %s", status, out)
			}
			close(g.open)
			<-done
			v := h.settled("th")
			if n := len(v.Messages); n != 4 || v.Messages[2].ID != "q1" || v.Messages[3].Text() != "You said: after the question" {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			if p := lastPart(t, v.Messages[1], "delete_note"); p.State != agent.StateOutputError || h.notes() != 1 || len(v.Interrupts) != 0 {
				t.Fatalf("the question: part %+v, notes %d, interrupts %+v", p, h.notes(), v.Interrupts)
			}
		})
	}
}

// REVIEW H8: a pending interrupt left on an older message (a turn settled that message and died before it canceled
// the interrupt) holds no steer: the newest message asks nothing, so a delivery pass runs at once, and the reaper's
// sweep wakes the thread for a steer that waits in its queue.
func TestLeftoverInterruptHoldsNoSteer(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			ctx := context.Background()
			id := h.addNote("keep")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			asked := h.view("th").Interrupts
			if len(asked) != 1 {
				t.Fatalf("interrupts: %+v", asked)
			}
			h.send("th", "u2", "never mind") // settles the question and cancels its interrupt
			leftover := asked[0]
			leftover.ID, leftover.Status = "leftover_"+leftover.ID, agent.InterruptPending
			leftover.ExpiresAt = time.Now().Add(48 * time.Hour)
			if _, _, err := h.stack.Store.CreateInterrupt(ctx, leftover); err != nil {
				t.Fatal(err)
			}
			j := h.finishedJob("th", "call_1", "brief past a leftover")
			if out := h.deliver(j); out.Status != agent.DeliveredSteer || out.Turns != 1 {
				t.Fatalf("delivery with a leftover interrupt on an older message: %+v", out)
			}
			v := h.settled("th")
			if n := steers(v.Messages); n[j.ID] != 1 || !strings.Contains(v.Messages[len(v.Messages)-1].Text(), "brief past a leftover") {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			// The reaper's sweep: a steer queued on the idle thread is woken for, the leftover notwithstanding.
			j2 := h.finishedJob("th", "call_2", "brief of the sweep")
			q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueSteer, Message: steerOf(t, h, j2), JobID: j2.ID, Status: agent.QueueQueued, CreatedAt: time.Now().UTC()}
			if _, _, err := h.stack.Store.Enqueue(ctx, q, 0); err != nil {
				t.Fatal(err)
			}
			// Marked delivered, so that only the queue's sweep can find it (a finished undelivered job is re-driven).
			if _, err := h.stack.Store.MarkJobDelivered(ctx, "th", j2.ID, time.Now().UTC()); err != nil {
				t.Fatal(err)
			}
			rp := reaper.New(reaper.Deps{Store: h.stack.Store, Tools: h.stack.Tools, Jobs: h.stack.Jobs, Clock: shifted{2 * time.Hour}}, reaper.Config{})
			st, err := rp.Tick(ctx)
			if err != nil || st.Swept != 1 {
				t.Fatalf("tick = %+v, %v; want one sweep of the queue", st, err)
			}
			v = h.settled("th")
			if n := steers(v.Messages); n[j2.ID] != 1 {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
		})
	}
}

// REVIEW H2, issue 16 item 6 (continuation coalescing): a job finishes while a question is pending, and every
// continuation asks again (/loop). The first answer's turn takes the steer: the answered message is stored final,
// the steer after it, and one new reply answers both, streamed to the answering client (its start names the new
// reply, its metadata says the thread gained a message). The steer never waits through a second answering turn.
func TestSteerCoalescedIntoTheAnsweringTurn(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			h.send("th", "u1", `/loop ask_user_question {"question":"Colour?","options":["red","blue"]}`)
			j := h.finishedJob("th", "call_1", "brief behind a chain")
			if out := h.deliver(j); out.Status != agent.DeliveredQueued {
				t.Fatalf("delivery while a question is pending: %+v", out)
			}
			answer := func(p map[string]any) {
				if p["state"] == agent.StateInputAvailable {
					p["state"], p["output"] = agent.StateOutputAvailable, "blue"
				}
			}
			asked := h.view("th").Messages[1]
			// Answer up to four questions, as long as the newest message asks; note the answer whose turn
			// delivered the steer, and that answer's stream.
			deliveredBy, first := 0, ""
			for i := 1; i <= 4 && deliveredBy == 0; i++ {
				v := h.view("th")
				if len(v.Interrupts) == 0 {
					break
				}
				status, body := h.post(answerBody(v, answer))
				if status != 200 {
					t.Fatalf("answer %d: %d %s", i, status, body)
				}
				if i == 1 {
					first = body
				}
				if steers(h.view("th").Messages)[j.ID] == 1 {
					deliveredBy = i
				}
			}
			if deliveredBy != 1 {
				t.Fatalf("the steer was delivered by answer %d (0: not after four), want the first: %s", deliveredBy, texts(h.view("th").Messages))
			}
			reply := h.view("th").Messages[3]
			start := chunks(t, first)[0]
			md, _ := start["messageMetadata"].(map[string]any)
			if start["messageId"] != reply.ID || md["threadChanged"] != true || md["newMessages"] != float64(1) {
				t.Fatalf("the answer's stream starts %v; the reply is %s", start, reply.ID)
			}
			v := h.settled("th")
			// u1, the asking message (answered, final), the steer, one reply for both.
			if len(v.Messages) != 4 || v.Messages[1].ID != asked.ID || v.Messages[2].ID != agent.SteerMessageID(j.ID) || v.Messages[3].Role != agent.RoleAssistant {
				t.Fatalf("messages: %s", texts(v.Messages))
			}
			if p := lastPart(t, v.Messages[1], "ask_user_question"); p.State != agent.StateOutputAvailable || v.Messages[1].Meta().Status != agent.MessageCompleted {
				t.Fatalf("the answered message: %+v, %s", p, v.Messages[1].Metadata)
			}
			if !strings.Contains(v.Messages[3].Text(), "brief behind a chain") || v.Jobs[0].Status != agent.JobDone {
				t.Fatalf("reply %q, jobs %+v", v.Messages[3].Text(), v.Jobs)
			}
			runs := h.runs("th")
			if len(runs) != 3 || runs[1].Trigger != agent.TriggerContinuation || runs[1].Steps != 0 || runs[2].Trigger != agent.TriggerSteer {
				t.Fatalf("runs = %+v", runs)
			}
		})
	}
}

// REVIEW H7: a client message can never take a steer's id. A user message, a queued one (multitask enqueue) and an
// edit (messageId) named steer_<jobId> are refused with 400 reserved_message_id before anything is stored, and
// the job's own steer is then delivered with its brief.
func TestClientCannotTakeASteerID(t *testing.T) {
	t.Parallel()
	h := startHITL(t, nil)
	h.send("th", "u1", "hello")
	j := h.finishedJob("th", "call_1", "THE-REAL-BRIEF")
	steer := agent.SteerMessageID(j.ID)
	tok := token(t, "alice")
	plain := chatBody("th", steer, "a fake steer")
	enqueue := chatBody("th", steer, "a fake steer")
	enqueue["multitask"] = "enqueue"
	edit := chatBody("th", steer, "a fake steer")
	edit["messageId"] = steer
	for name, body := range map[string]map[string]any{"plain": plain, "enqueue": enqueue, "edit": edit} {
		resp := h.f.do(t, "POST", "/chat", tok, body)
		if resp.StatusCode != 400 {
			t.Fatalf("%s: a user message with id %s: %d %s", name, steer, resp.StatusCode, readAll(t, resp))
		}
		if code := errorCode(t, resp); code != agent.CodeReservedMessageID {
			t.Fatalf("%s: code %q, want %q", name, code, agent.CodeReservedMessageID)
		}
	}
	if out := h.deliver(j); out.Status != agent.DeliveredSteer {
		t.Fatalf("delivery: %+v", out)
	}
	v := h.settled("th")
	i := slices.IndexFunc(v.Messages, func(m agent.Message) bool { return m.ID == steer })
	if i < 0 || !strings.Contains(v.Messages[i].Text(), "THE-REAL-BRIEF") || !strings.Contains(string(v.Messages[i].Metadata), "subagentResult") {
		t.Fatalf("the steer: %s", texts(v.Messages))
	}
}
