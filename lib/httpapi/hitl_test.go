package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// Human in the loop over HTTP, with request bodies shaped as the AI SDK client sends them (DefaultChatTransport:
// the whole message list, trigger submit-message, messageId = the answered assistant message), on both stores.

// hitlStack is a running local stack that a test can restart on the same data (SQLite file or DynamoDB table).
type hitlStack struct {
	t      *testing.T
	data   string
	model  string
	store  func() agent.Store // nil: SQLite in data
	cfg    func(*config.Config)
	tools  func(agent.ValueStore, agent.Clock) []agent.Tool
	wrap   func(agent.Store) agent.Store // devserver.Options.Wrap
	clock  agent.Clock                   // devserver.Options.Clock (nil: real time)
	stack  *devserver.Stack
	server *httptest.Server
	f      *fixture
}

// aheadClock is real time moved ahead by what the test adds.
type aheadClock struct {
	mu    sync.Mutex
	ahead time.Duration
}

func (c *aheadClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return agent.SystemClock{}.Now().Add(c.ahead)
}

func (c *aheadClock) add(d time.Duration) {
	c.mu.Lock()
	c.ahead += d
	c.mu.Unlock()
}

// newStore makes the store of one test (nil: SQLite in the stack's data directory).
type newStore func(t *testing.T) agent.Store

// storeKinds are the stores every flow runs on.
func storeKinds(t *testing.T) map[string]newStore {
	kinds := map[string]newStore{"sqlite": nil}
	if !testing.Short() {
		kinds["dynalite"] = func(t *testing.T) agent.Store {
			endpoint := dynamotest.Start(t)
			client := dynamotest.Client(endpoint)
			table := fmt.Sprintf("hitl_%d", time.Now().UnixNano())
			if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
				t.Fatal(err)
			}
			return dynamo.New(client, table)
		}
	}
	return kinds
}

func startHITL(t *testing.T, store newStore, opts ...func(*hitlStack)) *hitlStack {
	t.Helper()
	model := httptest.NewServer(offline.New(offline.WithWordDelay(time.Millisecond)))
	t.Cleanup(model.Close)
	h := &hitlStack{t: t, data: t.TempDir(), model: model.URL + "/v1/"}
	if store != nil {
		s := store(t) // one table for the life of the test, across restarts
		h.store = func() agent.Store { return s }
	}
	for _, o := range opts {
		o(h)
	}
	h.start()
	return h
}

func (h *hitlStack) start() {
	t := h.t
	cfg := config.Config{Secret: string(secret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond,
		CancelPoll: 20 * time.Millisecond, MaxBodyBytes: 1 << 20, ResumePollMax: 20 * time.Millisecond}
	if h.cfg != nil {
		h.cfg(&cfg)
	}
	o := devserver.Options{Data: h.data, ModelURL: h.model, Config: cfg, Tools: h.tools, Wrap: h.wrap, Clock: h.clock,
		OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond }}
	if h.store != nil {
		o.Store = h.store()
	}
	stack, err := devserver.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	h.stack = stack
	h.server = httptest.NewServer(stack.Handler)
	h.f = &fixture{url: h.server.URL, store: stack.Store}
	t.Cleanup(h.stop)
}

// restart stops the stack and starts a new one on the same data: nothing held in memory survives.
func (h *hitlStack) restart() {
	h.stop()
	h.start()
}

func (h *hitlStack) stop() {
	if h.server != nil {
		h.server.Close()
		h.stack.Close()
		h.server = nil
	}
}

// threadView is GET /threads/{id}.
type threadView struct {
	Thread     agent.Thread
	Messages   []agent.Message
	ActiveRun  *agent.Run
	Interrupts []agent.Interrupt
}

func (h *hitlStack) view(thread string) threadView {
	h.t.Helper()
	resp := h.f.do(h.t, "GET", "/threads/"+thread, token(h.t, "alice"), nil)
	if resp.StatusCode != 200 {
		h.t.Fatalf("GET /threads/%s: %d %s", thread, resp.StatusCode, readAll(h.t, resp))
	}
	var v threadView
	if err := json.Unmarshal(readAll(h.t, resp), &v); err != nil {
		h.t.Fatal(err)
	}
	return v
}

// post sends a chat body and returns the status and the body (the stream, or the error).
func (h *hitlStack) post(body any) (int, string) {
	h.t.Helper()
	resp := h.f.do(h.t, "POST", "/chat", token(h.t, "alice"), body)
	return resp.StatusCode, string(readAll(h.t, resp))
}

// send posts a user message the way useChat does (the whole list: the server reads only the newest).
func (h *hitlStack) send(thread, id, text string) string {
	h.t.Helper()
	msgs := []any{}
	for _, m := range h.viewOrEmpty(thread).Messages {
		msgs = append(msgs, m)
	}
	msgs = append(msgs, map[string]any{"id": id, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}})
	status, body := h.post(map[string]any{"id": thread, "trigger": "submit-message", "messages": msgs})
	if status != 200 {
		h.t.Fatalf("send %q: %d %s", text, status, body)
	}
	return body
}

func (h *hitlStack) viewOrEmpty(thread string) threadView {
	resp := h.f.do(h.t, "GET", "/threads/"+thread, token(h.t, "alice"), nil)
	defer resp.Body.Close()
	var v threadView
	if resp.StatusCode == 200 {
		json.NewDecoder(resp.Body).Decode(&v)
	}
	return v
}

// answerBody is what the AI SDK posts after addToolApprovalResponse / addToolOutput on the newest assistant
// message: every message, the answered one with its tool parts changed by edit.
func answerBody(v threadView, edit func(p map[string]any)) map[string]any {
	msgs := make([]any, len(v.Messages))
	last := len(v.Messages) - 1
	for i, m := range v.Messages {
		var mm map[string]any
		b, _ := json.Marshal(m)
		json.Unmarshal(b, &mm)
		if i == last {
			for _, p := range mm["parts"].([]any) {
				part := p.(map[string]any)
				if strings.HasPrefix(part["type"].(string), "tool-") {
					edit(part)
				}
			}
		}
		msgs[i] = mm
	}
	return map[string]any{"id": v.Thread.ID, "trigger": "submit-message", "messageId": v.Messages[last].ID, "messages": msgs}
}

// respond is addToolApprovalResponse on every requested approval.
func respond(approved bool, reason string) func(map[string]any) {
	return func(p map[string]any) {
		if p["state"] != "approval-requested" {
			return
		}
		p["state"] = "approval-responded"
		a := p["approval"].(map[string]any)
		a["approved"] = approved
		if reason != "" {
			a["reason"] = reason
		}
	}
}

func chunks(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, f := range strings.Split(strings.TrimSuffix(body, "data: [DONE]\n\n"), "\n\n") {
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
	return out
}

func chunkOf(cs []map[string]any, typ string) map[string]any {
	for _, c := range cs {
		if c["type"] == typ {
			return c
		}
	}
	return nil
}

// addNote stores a note for alice through the demo tool, directly (the test's setup, not a turn).
func (h *hitlStack) addNote(text string) string {
	h.t.Helper()
	for _, tl := range h.stack.Tools {
		if tl.Name == "add_note" {
			out, err := tl.Execute(context.Background(), agent.ToolInvocation{ThreadID: "setup", Owner: "alice", ToolCallID: "setup_" + text,
				Input: json.RawMessage(fmt.Sprintf(`{"text":%q}`, text)), IdempotencyKey: "setup/" + text})
			if err != nil {
				h.t.Fatal(err)
			}
			var n tools.Note
			if err := json.Unmarshal(out, &n); err != nil {
				h.t.Fatalf("add_note output %s: %v", out, err)
			}
			return n.ID
		}
	}
	h.t.Fatal("no add_note tool")
	return ""
}

func (h *hitlStack) notes() int {
	h.t.Helper()
	kvs, err := h.stack.Store.ListValues(context.Background(), "notes/alice")
	if err != nil {
		h.t.Fatal(err)
	}
	return len(kvs)
}

func lastPart(t *testing.T, m agent.Message, toolName string) agent.Part {
	t.Helper()
	for i := len(m.Parts) - 1; i >= 0; i-- {
		p, _ := agent.DecodePart(m.Parts[i])
		if p.Type == "tool-"+toolName {
			return p
		}
	}
	t.Fatalf("message %s has no %s part: %s", m.ID, toolName, m.Parts)
	return agent.Part{}
}

// Approve and deny, with a restart of the whole stack between the request and the answer: the approval
// request is signed and stored, the run ends interrupted, GET lists the pending interrupt, and the answer
// continues the same assistant message in a new run.
func TestApprovalFlows(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		for _, approve := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/approved=%v", kind, approve), func(t *testing.T) {
				t.Parallel()
				h := startHITL(t, store)
				id := h.addNote("buy milk")
				body := h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
				cs := chunks(t, body)
				req := chunkOf(cs, "tool-approval-request")
				if chunkOf(cs, "tool-input-available") == nil || req == nil || req["signature"] == "" || req["approvalId"] == "" {
					t.Fatalf("no signed approval request: %s", body)
				}
				v := h.view("th")
				if len(v.Interrupts) != 1 || v.Interrupts[0].ID != req["approvalId"] || v.Interrupts[0].Status != agent.InterruptPending {
					t.Fatalf("pending interrupts = %+v", v.Interrupts)
				}
				asked := v.Messages[1]
				if asked.Meta().Status != agent.MessageInterrupted || lastPart(t, asked, "delete_note").State != agent.StateApprovalRequested {
					t.Fatalf("asking message = %s %s", asked.Meta().Status, asked.Parts)
				}
				h.restart()

				status, body := h.post(answerBody(h.view("th"), respond(approve, "checked")))
				if status != 200 {
					t.Fatalf("answer: %d %s", status, body)
				}
				cs = chunks(t, body)
				if cs[0]["type"] != "start" || cs[0]["messageId"] != asked.ID {
					t.Fatalf("continuation starts %v, want the asking message %s", cs[0], asked.ID)
				}
				v = h.view("th")
				if len(v.Messages) != 2 || v.Messages[1].ID != asked.ID || len(v.Interrupts) != 0 {
					t.Fatalf("after the answer: %d messages, interrupts %+v", len(v.Messages), v.Interrupts)
				}
				final := v.Messages[1]
				part := lastPart(t, final, "delete_note")
				if final.Meta().Status != agent.MessageCompleted {
					t.Fatalf("status %s", final.Meta().Status)
				}
				if approve {
					if chunkOf(cs, "tool-output-available") == nil || part.State != agent.StateOutputAvailable || h.notes() != 0 {
						t.Fatalf("approved: part %+v, notes %d, stream %s", part, h.notes(), body)
					}
				} else {
					if chunkOf(cs, "tool-output-denied") == nil || part.State != agent.StateOutputDenied || h.notes() != 1 {
						t.Fatalf("denied: part %+v, notes %d, stream %s", part, h.notes(), body)
					}
					if !strings.Contains(final.Text(), "denied") {
						t.Fatalf("the model did not read the denial: %q", final.Text())
					}
				}
				if part.Approval == nil || part.Approval.Approved == nil || *part.Approval.Approved != approve || part.Approval.Reason != "checked" {
					t.Fatalf("approval on the part = %+v", part.Approval)
				}
				runs := h.runs("th")
				if len(runs) != 2 || runs[0].Status != agent.RunInterrupted || runs[1].Trigger != agent.TriggerContinuation || runs[1].Status != agent.RunCompleted {
					t.Fatalf("runs = %+v", runs)
				}
			})
		}
	}
}

func (h *hitlStack) runs(thread string) []agent.Run {
	h.t.Helper()
	resp := h.f.do(h.t, "GET", "/threads/"+thread+"/runs", token(h.t, "alice"), nil)
	var body struct{ Runs []agent.Run }
	if err := json.Unmarshal(readAll(h.t, resp), &body); err != nil {
		h.t.Fatal(err)
	}
	return body.Runs
}

// The idempotency ladder: every refusal changes nothing (the right answer still works after it), a repeat is a
// no-op, a conflicting answer is 409.
func TestApprovalLadder(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			id := h.addNote("n")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			v := h.view("th")
			refusals := []struct {
				name   string
				edit   func(p map[string]any)
				status int
				code   string
			}{
				{"unknown approval id", func(p map[string]any) {
					respond(true, "")(p)
					p["approval"].(map[string]any)["id"] = "apr_forged"
				}, 400, agent.CodeUnknownApproval},
				{"tampered input", func(p map[string]any) {
					respond(true, "")(p)
					p["input"] = map[string]any{"id": "someone-elses-note"}
				}, 400, agent.CodeApprovalMismatch},
				{"tampered tool name", func(p map[string]any) {
					respond(true, "")(p)
					p["type"] = "tool-list_notes"
				}, 400, agent.CodeApprovalMismatch},
				{"missing decision", func(p map[string]any) {}, 400, agent.CodeMissingDecision},
				{"approved field missing", func(p map[string]any) { p["state"] = "approval-responded" }, 400, agent.CodeMissingDecision},
			}
			for _, r := range refusals {
				status, body := h.post(answerBody(v, r.edit))
				if status != r.status || !strings.Contains(body, `"code":"`+r.code+`"`) {
					t.Fatalf("%s: %d %s, want %d %s", r.name, status, body, r.status, r.code)
				}
			}
			if h.notes() != 1 || len(h.view("th").Interrupts) != 1 {
				t.Fatal("a refused answer changed something")
			}
			// The right answer, then the ladder's top rungs.
			if status, body := h.post(answerBody(v, respond(true, ""))); status != 200 {
				t.Fatalf("approve: %d %s", status, body)
			}
			after := h.view("th")
			status, body := h.post(answerBody(v, respond(true, "again")))
			if status != 200 || chunkOf(chunks(t, body), "start-step") != nil {
				t.Fatalf("a repeated answer: %d %s, want a no-op stream", status, body)
			}
			if again := h.view("th"); len(again.Messages) != len(after.Messages) || string(again.Messages[1].Parts[len(again.Messages[1].Parts)-1]) != string(after.Messages[1].Parts[len(after.Messages[1].Parts)-1]) {
				t.Fatal("a repeated answer changed the transcript")
			}
			status, body = h.post(answerBody(v, respond(false, "")))
			if status != 409 || !strings.Contains(body, agent.CodeAlreadyResolved) {
				t.Fatalf("a conflicting answer: %d %s", status, body)
			}
			if h.notes() != 0 {
				t.Fatal("the approved delete did not run")
			}
		})
	}
}

// An interrupt older than AGENT_INTERRUPT_TTL is expired: GET no longer lists it, an answer is 409 expired and
// runs nothing, and the next turn gives the call a result.
func TestApprovalExpires(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			// The interrupt ages on the clock only: it is pending for the first view however slow the machine,
			// and past its age once the clock moves (tokens, minted on real time, stay valid for an hour).
			clock := &aheadClock{}
			h := startHITL(t, store, func(h *hitlStack) {
				h.clock = clock
				h.cfg = func(c *config.Config) { c.InterruptTTL = time.Minute }
			})
			id := h.addNote("n")
			h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
			v := h.view("th")
			clock.add(2 * time.Minute)
			if got := h.view("th").Interrupts; len(got) != 0 {
				t.Fatalf("expired interrupt still listed: %+v", got)
			}
			status, body := h.post(answerBody(v, respond(true, "")))
			if status != 409 || !strings.Contains(body, `"code":"expired"`) || h.notes() != 1 {
				t.Fatalf("answer to an expired request: %d %s (notes %d)", status, body, h.notes())
			}
			h.send("th", "u2", "never mind")
			v = h.view("th")
			p := lastPart(t, v.Messages[1], "delete_note")
			if p.State != agent.StateOutputError || !strings.Contains(p.ErrorText, "expired") {
				t.Fatalf("the expired call's part = %+v", p)
			}
		})
	}
}

// Ten concurrent answers to one interrupt: exactly one resolution, one continuation that does something, the
// tool executed once.
func TestConcurrentAnswers(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var executed atomic.Int32
			h := startHITL(t, store, func(h *hitlStack) {
				h.tools = launchTool(&executed, 50*time.Millisecond)
				// The race is for the thread's claim: every answer must reach it, not stop at the user's run limit.
				h.cfg = func(c *config.Config) { c.MaxActiveRunsPerUser = 20 }
			})
			h.send("th", "u1", `/tool launch {"target":"moon"}`)
			body := answerBody(h.view("th"), respond(true, ""))
			var wg sync.WaitGroup
			statuses := make([]int, 10)
			for i := range statuses {
				wg.Add(1)
				go func() {
					defer wg.Done()
					statuses[i], _ = h.post(body)
				}()
			}
			wg.Wait()
			ok := 0
			for _, s := range statuses {
				switch s {
				case 200:
					ok++
				case 409:
				default:
					t.Fatalf("statuses %v", statuses)
				}
			}
			if ok == 0 || executed.Load() != 1 {
				t.Fatalf("statuses %v, tool executed %d times", statuses, executed.Load())
			}
			working := 0
			for _, r := range h.runs("th") {
				if r.Trigger == agent.TriggerContinuation && r.Steps > 0 {
					working++
				}
			}
			ins, _ := h.stack.Store.ListInterrupts(context.Background(), "th")
			if working != 1 || len(ins) != 1 || ins[0].Status != agent.InterruptApproved {
				t.Fatalf("%d continuations ran; interrupts %+v", working, ins)
			}
		})
	}
}

// A client tool: no server execution, the run waits for the client's output, which continues the same message.
func TestClientToolRoundTrip(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			body := h.send("th", "u1", `/tool ask_user_question {"question":"Which colour?","options":["red","blue"]}`)
			cs := chunks(t, body)
			if chunkOf(cs, "tool-input-available") == nil || chunkOf(cs, "tool-approval-request") != nil {
				t.Fatalf("stream %s", body)
			}
			v := h.view("th")
			if len(v.Interrupts) != 1 || v.Interrupts[0].Kind != agent.InterruptClientTool {
				t.Fatalf("interrupts %+v", v.Interrupts)
			}
			// Missing output: refused.
			if status, body := h.post(answerBody(v, func(map[string]any) {})); status != 400 || !strings.Contains(body, agent.CodeMissingDecision) {
				t.Fatalf("no output: %d %s", status, body)
			}
			addOutput := func(p map[string]any) { p["state"], p["output"] = "output-available", map[string]any{"answer": "blue"} }
			status, body := h.post(answerBody(v, addOutput))
			if status != 200 || !strings.Contains(body, "blue") {
				t.Fatalf("output: %d %s", status, body)
			}
			v = h.view("th")
			if len(v.Messages) != 2 || v.Messages[1].Meta().Status != agent.MessageCompleted || !strings.Contains(v.Messages[1].Text(), "blue") {
				t.Fatalf("after the output: %+v", v.Messages)
			}
			if status, _ := h.post(answerBody(v, func(p map[string]any) { p["output"] = map[string]any{"answer": "red"} })); status != 409 {
				t.Fatalf("another output after the answer: %d, want 409", status)
			}
		})
	}
}

// A new message instead of an answer cancels the request: the call gets a result, and a late answer runs
// nothing.
func TestNewMessageCancelsPendingApproval(t *testing.T) {
	t.Parallel()
	h := startHITL(t, nil)
	id := h.addNote("n")
	h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
	stale := h.view("th")
	h.send("th", "u2", "forget it")
	v := h.view("th")
	p := lastPart(t, v.Messages[1], "delete_note")
	if len(v.Messages) != 4 || p.State != agent.StateOutputError || len(v.Interrupts) != 0 {
		t.Fatalf("messages %d, part %+v, interrupts %+v", len(v.Messages), p, v.Interrupts)
	}
	if status, body := h.post(answerBody(stale, respond(true, ""))); status/100 != 4 || h.notes() != 1 {
		t.Fatalf("late answer: %d %s, notes %d", status, body, h.notes())
	}
}

// Edits: the AI SDK's sendMessage({text, messageId}) replaces an earlier user message and drops everything
// after it; the newest message re-sent with other content is an edit too.
func TestEditMessage(t *testing.T) {
	t.Parallel()
	for kind, store := range storeKinds(t) {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			h.send("th", "u1", "first")
			h.send("th", "u2", "second")
			edit := map[string]any{"id": "th", "trigger": "submit-message", "messageId": "u1", "messages": []any{
				map[string]any{"id": "u1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": "first, edited"}}}}}
			if status, body := h.post(edit); status != 200 {
				t.Fatalf("edit: %d %s", status, body)
			}
			v := h.view("th")
			if len(v.Messages) != 2 || v.Messages[0].ID != "u1" || v.Messages[0].Text() != "first, edited" || v.Messages[1].Text() != "You said: first, edited" {
				t.Fatalf("after the edit: %+v", texts(v.Messages))
			}
			runs := h.runs("th")
			if runs[len(runs)-1].Trigger != agent.TriggerEdit {
				t.Fatalf("trigger %s", runs[len(runs)-1].Trigger)
			}
			// The newest user message re-sent with other content (its reply failed, say): an edit, answered with
			// the new text.
			h.send("th", "u3", "/error 500")
			resend := map[string]any{"id": "th", "trigger": "submit-message", "messages": []any{
				map[string]any{"id": "u3", "role": "user", "parts": []any{map[string]any{"type": "text", "text": "third"}}}}}
			if status, body := h.post(resend); status != 200 {
				t.Fatalf("resend: %d %s", status, body)
			}
			v = h.view("th")
			got := texts(v.Messages)
			if len(got) != 4 || got[2] != "third" || got[3] != "You said: third" {
				t.Fatalf("after the resend: %q", got)
			}
		})
	}
}

func texts(ms []agent.Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Text())
	}
	return out
}

// The thread setting reviewTools makes every mutating tool ask (PATCH /threads/{id}).
func TestReviewToolsSetting(t *testing.T) {
	t.Parallel()
	h := startHITL(t, nil)
	h.send("th", "u1", `/tool add_note {"text":"a"}`)
	if h.notes() != 1 {
		t.Fatal("add_note did not run without review")
	}
	resp := h.f.do(t, "PATCH", "/threads/th", token(t, "alice"), map[string]any{"settings": map[string]any{"reviewTools": true}})
	if resp.StatusCode != 200 {
		t.Fatalf("patch: %d %s", resp.StatusCode, readAll(t, resp))
	}
	resp.Body.Close()
	body := h.send("th", "u2", `/tool add_note {"text":"b"}`)
	if chunkOf(chunks(t, body), "tool-approval-request") == nil || h.notes() != 1 {
		t.Fatalf("with reviewTools add_note ran without approval: %s", body)
	}
	if status, body := h.post(answerBody(h.view("th"), respond(true, ""))); status != 200 || h.notes() != 2 {
		t.Fatalf("approve: %d %s notes %d", status, body, h.notes())
	}
}

// An answer racing a delete, and one racing a stop: whichever wins, nothing is lost and nothing runs twice.
func TestAnswerRacesDeleteAndStop(t *testing.T) {
	t.Parallel()
	for _, race := range []string{"DELETE /threads/%s", "POST /threads/%s/stop"} {
		t.Run(race, func(t *testing.T) {
			t.Parallel()
			var executed atomic.Int32
			h := startHITL(t, nil, func(h *hitlStack) {
				h.tools = launchTool(&executed, 15*time.Millisecond)
			})
			for round := range 6 {
				thread := fmt.Sprintf("th%d", round)
				before := int(executed.Load())
				h.send(thread, "u1", `/tool launch {}`)
				body := answerBody(h.view(thread), respond(true, ""))
				method, path, _ := strings.Cut(race, " ")
				path = fmt.Sprintf(path, thread)
				var wg sync.WaitGroup
				var answer, other int
				wg.Add(2)
				go func() { defer wg.Done(); answer, _ = h.post(body) }()
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(round) * 8 * time.Millisecond) // from before the claim to during the tool
					resp := h.f.do(t, method, path, token(t, "alice"), nil)
					other = resp.StatusCode
					resp.Body.Close()
				}()
				wg.Wait()
				// Settle, then check: the tool ran at most once, and what the stored thread says is true. The deadline
				// only bounds a run that never ends; a loaded machine's run ends well inside it (5 s could pass with
				// the run still active, and then the check read a part it had not stored yet).
				deadline := time.Now().Add(2 * time.Minute)
				for {
					v := h.viewOrEmpty(thread)
					if v.ActiveRun == nil || time.Now().After(deadline) {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				delta := int(executed.Load()) - before
				v := h.viewOrEmpty(thread)
				t.Logf("round %d: answer %d, %s %d, executed %d, messages %d", round, answer, race, other, delta, len(v.Messages))
				if delta > 1 {
					t.Fatalf("round %d: the tool ran %d times", round, delta)
				}
				if answer != 200 && answer/100 != 4 {
					t.Fatalf("answer status %d", answer)
				}
				if len(v.Messages) == 2 {
					p := lastPart(t, v.Messages[1], "launch")
					stored := map[string]int{agent.StateOutputAvailable: 1, agent.StateOutputError: 0, agent.StateApprovalRequested: 0}
					want, ok := stored[p.State]
					if !ok || want != delta {
						t.Fatalf("round %d: the stored part says %s (%s) but the tool ran %d times", round, p.State, p.ErrorText, delta)
					}
				}
			}
		})
	}
}

// Every new chunk and part state parses under ai@6 and ai@7: the approval request (with its signature), the
// continuation after an approval and after a denial (reduced onto the client's copy of the message, as useChat
// does), and the client tool's request and continuation.
func TestProtocolConformanceHumanInTheLoop(t *testing.T) {
	t.Parallel()
	h := startHITL(t, nil)
	dir := t.TempDir()
	var inputs []aisdktest.Input
	capture := func(name, body string, continues *agent.Message) {
		file := filepath.Join(dir, name+".sse")
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, aisdktest.Input{File: file, Continues: continues})
	}
	// The client's copy of the answered message, as the answer body carries it.
	clientCopy := func(body map[string]any) *agent.Message {
		msgs := body["messages"].([]any)
		b, _ := json.Marshal(msgs[len(msgs)-1])
		var m agent.Message
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return &m
	}
	for _, approve := range []bool{true, false} {
		thread := fmt.Sprintf("conf-approve-%v", approve)
		id := h.addNote(thread)
		capture(thread+"-request", h.send(thread, "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id)), nil)
		body := answerBody(h.view(thread), respond(approve, "because"))
		status, stream := h.post(body)
		if status != 200 {
			t.Fatalf("answer: %d %s", status, stream)
		}
		capture(thread+"-continue", stream, clientCopy(body))
	}
	capture("client-request", h.send("conf-client", "u1", `/tool ask_user_question {"question":"Colour?","options":["red","blue"]}`), nil)
	body := answerBody(h.view("conf-client"), func(p map[string]any) { p["state"], p["output"] = "output-available", "blue" })
	status, stream := h.post(body)
	if status != 200 {
		t.Fatalf("client output: %d %s", status, stream)
	}
	capture("client-continue", stream, clientCopy(body))

	parsed := aisdktest.CheckInputs(t, inputs...)
	want := []struct {
		state string // the tool part's state in the message the client ends with
		text  string // in the final text
	}{
		{agent.StateApprovalRequested, ""}, {agent.StateOutputAvailable, "deleted"},
		{agent.StateApprovalRequested, ""}, {agent.StateOutputDenied, "denied"},
		{agent.StateInputAvailable, ""}, {agent.StateOutputAvailable, "blue"},
	}
	if len(parsed) != len(aisdktest.SDKs)*len(want) {
		t.Fatalf("%d results", len(parsed))
	}
	for i, w := range want {
		for _, p := range aisdktest.OfFile(parsed, i) {
			parts, err := p.Parts()
			if err != nil {
				t.Fatal(err)
			}
			var tool *agent.Part
			for j := range parts {
				if agent.IsToolPart(parts[j].Type) {
					tool = &parts[j]
				}
			}
			if tool == nil || tool.State != w.state || !strings.Contains(strings.ToLower(p.Message.Text()), w.text) {
				t.Fatalf("%s under ai@%s: tool part %+v, text %q; want state %s and %q", filepath.Base(p.File), p.SDK, tool, p.Message.Text(), w.state, w.text)
			}
			if w.state == agent.StateApprovalRequested && (tool.Approval == nil || tool.Approval.ID == "") {
				t.Fatalf("%s under ai@%s: no approval on the part", filepath.Base(p.File), p.SDK)
			}
			if inputs[i].Continues != nil && p.Message.ID != inputs[i].Continues.ID {
				t.Fatalf("%s under ai@%s: the continuation made message %s, not %s", filepath.Base(p.File), p.SDK, p.Message.ID, inputs[i].Continues.ID)
			}
		}
	}
}

// A regenerate of a reply that asked for approval, whose new reply asks again: the old reply (and its canceled
// request) is hidden, before and after the new one is answered. (It stayed visible with a dead approval.)
func TestRegenerateAnAskingReply(t *testing.T) {
	t.Parallel()
	h := startHITL(t, nil)
	id := h.addNote("n")
	h.send("th", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
	v := h.view("th")
	old := v.Messages[1]
	status, body := h.post(map[string]any{"id": "th", "trigger": "regenerate-message", "messageId": old.ID, "messages": []any{v.Messages[0]}})
	if status != 200 {
		t.Fatalf("regenerate: %d %s", status, body)
	}
	if v = h.view("th"); len(v.Messages) != 2 || v.Messages[1].ID == old.ID || len(v.Interrupts) != 1 {
		t.Fatalf("after the regenerate: %q, interrupts %+v", texts(v.Messages), v.Interrupts)
	}
	if status, body = h.post(answerBody(v, respond(true, ""))); status != 200 {
		t.Fatalf("answer: %d %s", status, body)
	}
	if v = h.view("th"); len(v.Messages) != 2 || v.Messages[1].Meta().Status != agent.MessageCompleted || h.notes() != 0 {
		t.Fatalf("after the answer: %d messages (%q), notes %d", len(v.Messages), texts(v.Messages), h.notes())
	}
}

// An answer that arrives while the continuation of the same answer runs gets the request's multitask behaviour:
// reject is 409 run_active; interrupt stops the continuation, finds the answer applied, and runs nothing again.
func TestAnswerWhileContinuationRuns(t *testing.T) {
	t.Parallel()
	var executed atomic.Int32
	inTool := make(chan struct{})
	h := startHITL(t, nil, func(h *hitlStack) {
		// The tool holds the continuation until the interrupt stops it, then returns its output (which the
		// stopped run keeps), so both requests below meet the continuation inside the tool, however slow the
		// machine.
		h.tools = func(agent.ValueStore, agent.Clock) []agent.Tool {
			return []agent.Tool{{Name: "launch", Kind: agent.ToolServer, Approval: agent.ApprovalAlways,
				InputSchema: json.RawMessage(`{"type":"object"}`),
				Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
					if executed.Add(1) == 1 {
						close(inTool)
					}
					<-ctx.Done()
					return json.RawMessage(`"launched"`), nil
				}}}
		}
	})
	h.send("th", "u1", `/tool launch {}`)
	body := answerBody(h.view("th"), respond(true, ""))
	first := make(chan int, 1)
	go func() { s, _ := h.post(body); first <- s }()
	<-inTool
	if status, resp := h.post(body); status != 409 || !strings.Contains(resp, agent.CodeRunActive) {
		t.Fatalf("reject: %d %s", status, resp)
	}
	body["multitask"] = "interrupt"
	status, resp := h.post(body)
	if status != 200 || <-first != 200 {
		t.Fatalf("interrupt: %d %s", status, resp)
	}
	v := h.view("th")
	p := lastPart(t, v.Messages[1], "launch")
	if executed.Load() != 1 || p.State != agent.StateOutputAvailable || len(v.Messages) != 2 {
		t.Fatalf("executed %d times; part %+v; %d messages", executed.Load(), p, len(v.Messages))
	}
}

// launchTool serves one tool that needs approval, counting its executions (each taking d).
func launchTool(executed *atomic.Int32, d time.Duration) func(agent.ValueStore, agent.Clock) []agent.Tool {
	return func(agent.ValueStore, agent.Clock) []agent.Tool {
		return []agent.Tool{{Name: "launch", Kind: agent.ToolServer, Approval: agent.ApprovalAlways,
			InputSchema: json.RawMessage(`{"type":"object"}`),
			Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
				executed.Add(1)
				time.Sleep(d)
				return json.RawMessage(`"launched"`), nil
			}}}
	}
}

// REVIEW H12: an answer sent with multitask "enqueue" while a run holds the thread is not queued (only user
// messages are): it is refused with 409 run_active and a message that says so, changes nothing, and the answer
// sent again once the thread is free is a no-op (the run that held the thread applied the same answer).
func TestAnswerWithEnqueueIsRefusedWhileARunIsActive(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var executed atomic.Int32
	h := startHITL(t, nil, func(h *hitlStack) {
		h.tools = func(agent.ValueStore, agent.Clock) []agent.Tool {
			return []agent.Tool{{Name: "launch", Kind: agent.ToolServer, Approval: agent.ApprovalAlways,
				InputSchema: json.RawMessage(`{"type":"object"}`),
				Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
					executed.Add(1)
					close(started)
					<-release
					return json.RawMessage(`{"launched":true}`), nil
				}}}
		}
	})
	h.send("th", "u1", `/tool launch {}`)
	body := answerBody(h.view("th"), respond(true, ""))
	first := make(chan int, 1)
	go func() { s, _ := h.post(body); first <- s }()
	<-started // the answer's continuation holds the thread, inside the approved tool
	body["multitask"] = "enqueue"
	resp := h.f.do(t, "POST", "/chat", token(t, "alice"), body)
	var e struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(readAll(t, resp), &e); err != nil || resp.StatusCode != 409 || e.Error.Code != agent.CodeRunActive ||
		!strings.Contains(e.Error.Message, "not queued") {
		t.Fatalf("an answer with enqueue while a run is active: %d %+v (%v)", resp.StatusCode, e, err)
	}
	close(release)
	if s := <-first; s != 200 {
		t.Fatalf("the first answer: %d", s)
	}
	if status, stream := h.post(body); status != 200 || executed.Load() != 1 {
		t.Fatalf("the answer again on a free thread: %d %s; executed %d", status, stream, executed.Load())
	}
	if v := h.view("th"); len(v.Messages) != 2 || lastPart(t, v.Messages[1], "launch").State != agent.StateOutputAvailable {
		t.Fatalf("messages: %s", texts(v.Messages))
	}
}
