package benchmarks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
)

// marks are the moments a benchmark watches on one thread, stamped when the store call that makes them true has
// returned (from then on every read sees them: both stores read their base data strongly consistently).
type marks struct {
	result time.Time // FinishJob stored the job's result
	runEnd time.Time // a user turn's FinishRun: its outcome recorded and the claim released
	steer  time.Time // the steer message is stored in the thread
	reply  time.Time // the first finalized assistant message after the steer: the steer's answer
	// replied is closed at reply.
	replied chan struct{}
}

// watcher stamps marks per thread from the ledger's calls.
type watcher struct {
	mu      sync.Mutex
	threads map[string]*marks
	// then, when set, is called after a call was stamped (the cost benchmark switches phases from it).
	then func(method string, arg any)
}

func (w *watcher) of(thread string) *marks {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, ok := w.threads[thread]
	if !ok {
		m = &marks{replied: make(chan struct{})}
		w.threads[thread] = m
	}
	return m
}

func (w *watcher) watch(method string, arg any) {
	now := time.Now()
	var thread string
	switch a := arg.(type) {
	case agent.JobResult:
		thread = a.ThreadID
	case agent.Run:
		thread = a.ThreadID
	case agent.MessageWrite:
		thread = a.ThreadID
	}
	if thread != "" {
		m := w.of(thread)
		w.mu.Lock()
		switch a := arg.(type) {
		case agent.JobResult:
			if m.result.IsZero() {
				m.result = now
			}
		case agent.Run:
			if method == "FinishRun" && a.Trigger == agent.TriggerUser && m.runEnd.IsZero() {
				m.runEnd = now
			}
		case agent.MessageWrite:
			switch {
			case strings.HasPrefix(a.Message.ID, "steer_") && m.steer.IsZero():
				m.steer = now
			case a.Message.Role == agent.RoleAssistant && a.Final && !m.steer.IsZero() && m.reply.IsZero():
				m.reply = now
				close(m.replied)
			}
		}
		w.mu.Unlock()
	}
	w.mu.Lock()
	then := w.then
	w.mu.Unlock()
	if then != nil {
		then(method, arg)
	}
}

// onCall sets (nil: clears) what watch calls after each call.
func (w *watcher) onCall(then func(method string, arg any)) {
	w.mu.Lock()
	w.then = then
	w.mu.Unlock()
}

// snapshot returns a copy of the thread's marks.
func (w *watcher) snapshot(thread string) marks {
	m := w.of(thread)
	w.mu.Lock()
	defer w.mu.Unlock()
	return *m
}

// jobStack is the local stack with a ledger around its store, a watcher on it, and two tools: "hold" blocks
// until the benchmark lets it go (a run that holds its thread), "guarded" needs approval (a pending question).
type jobStack struct {
	*stack
	dev    *devserver.Stack
	ledger *ledger
	marks  *watcher
	meter  *meter // DynamoDB only, for the cost benchmark

	mu      sync.Mutex
	letGo   chan struct{} // the current hold's
	holding chan struct{} // receives when a hold starts
	seq     atomic.Int64
}

func (js *jobStack) tools(agent.ValueStore, agent.Clock) []agent.Tool {
	schema := json.RawMessage(`{"type":"object"}`)
	return []agent.Tool{
		{Name: "hold", Kind: agent.ToolServer, InputSchema: schema, Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			js.mu.Lock()
			letGo := js.letGo
			js.mu.Unlock()
			js.holding <- struct{}{}
			select {
			case <-letGo:
			case <-ctx.Done():
			}
			return json.RawMessage(`"held"`), nil
		}},
		{Name: "guarded", Kind: agent.ToolServer, Approval: agent.ApprovalAlways, InputSchema: schema,
			Execute: func(context.Context, agent.ToolInvocation) (json.RawMessage, error) {
				return json.RawMessage(`"done"`), nil
			}},
	}
}

// newJobStack builds the stack on SQLite (endpoint "") or on a fresh dynalite table; metered routes every
// DynamoDB call through the meter (per phase and method, index write units computed).
func newJobStack(b *testing.B, onDynamo, metered bool) *jobStack {
	js := &jobStack{marks: &watcher{threads: map[string]*marks{}}, holding: make(chan struct{}, 1)}
	var store agent.Store
	if onDynamo {
		endpoint := dynamotest.Start(b)
		client := dynamotest.Client(endpoint)
		table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
			b.Fatal(err)
		}
		store = dynamo.New(client, table)
		if metered {
			m, err := newMeter(endpoint, table)
			if err != nil {
				b.Fatal(err)
			}
			js.meter = m
		}
	}
	js.stack = setup(b, store, nil, config.Config{}, func(o *devserver.Options, p *probe) {
		o.Tools = js.tools
		o.Wrap = func(s agent.Store) agent.Store {
			js.ledger = newLedger(s)
			js.ledger.watch = js.marks.watch
			if js.meter != nil {
				js.ledger.route = js.meter.route
			}
			return counting{Store: js.ledger, p: p}
		}
	})
	js.dev = js.stack.dev
	return js
}

func (js *jobStack) thread(kind string) string { return fmt.Sprintf("%s%d", kind, js.seq.Add(1)) }

// settle waits for the steer's answer on thread and for the job runner to go idle, then checks the thread.
func (js *jobStack) settle(b *testing.B, thread string) marks {
	m := js.await(b, thread)
	js.check(b, thread)
	return m
}

// await waits for the steer's answer on thread and for the job runner to go idle (the delivery pass ends with
// one more look at the queue).
func (js *jobStack) await(b *testing.B, thread string) marks {
	m := js.marks.of(thread)
	select {
	case <-m.replied:
	case <-time.After(30 * time.Second):
		b.Fatalf("%s: no answer to the steer within 30 s", thread)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.dev.Runner.Wait(ctx); err != nil {
		b.Fatalf("job runner: %v", err)
	}
	return js.marks.snapshot(thread)
}

// check reads the thread through GET /threads/{id}: the steer is there, answered, and nothing is queued.
func (js *jobStack) check(b *testing.B, thread string) {
	req, _ := http.NewRequest("GET", js.url+"/threads/"+thread, nil)
	req.Header.Set("Authorization", "Bearer "+js.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct {
		Messages []agent.Message `json:"messages"`
		Queued   []any           `json:"queued"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET /threads/%s: %d %v", thread, resp.StatusCode, err)
	}
	steer := -1
	for i, msg := range v.Messages {
		if strings.HasPrefix(msg.ID, "steer_") {
			steer = i
		}
	}
	if n := len(v.Messages); steer < 0 || v.Messages[n-1].Role != agent.RoleAssistant || len(v.Queued) != 0 {
		b.Fatalf("GET /threads/%s: steer at %d of %d messages, %d queued", thread, steer, n, len(v.Queued))
	}
}

// dispatch posts a turn that dispatches a research job and reads it to its end, holding the sub-agent (its first
// store call, GetJob) until the turn has ended, so that the result arrives on an idle thread.
func (js *jobStack) dispatch(b *testing.B, thread string) {
	js.ledger.hold()
	js.turn(b, thread, "u-research", `/tool research {"question":"What is the capital of France?"}`)
	js.ledger.release()
}

// finishedJob stores a job of thread with its result, as a sub-agent that reported back leaves it.
func (js *jobStack) finishedJob(b *testing.B, thread string) agent.Job {
	ctx := context.Background()
	now := time.Now().UTC()
	j := agent.Job{ID: agent.JobID(thread, "run_bench", "call_bench"), ThreadID: thread, Owner: "bench", Kind: "research", ToolCallID: "call_bench",
		Input: json.RawMessage(`{"question":"q"}`), Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now, DueAt: now.Add(time.Hour)}
	if _, _, err := js.dev.Store.CreateJob(ctx, j); err != nil {
		b.Fatal(err)
	}
	j, _, err := js.dev.Store.FinishJob(ctx, agent.JobResult{ThreadID: thread, ID: j.ID, Now: now, DueAt: now.Add(time.Hour),
		Result: json.RawMessage(`{"brief":"Paris is the capital of France.","sources":[]}`)})
	if err != nil {
		b.Fatal(err)
	}
	return j
}

// deliverQueued runs the wake for j and requires that it queued the steer (the thread is busy or asks someone).
func (js *jobStack) deliverQueued(b *testing.B, j agent.Job) {
	out, err := js.dev.JobTasks.Deliver(context.Background(), agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID})
	if err != nil || out.Status != agent.DeliveredQueued {
		b.Fatalf("deliver %s: %+v %v", j.ID, out, err)
	}
}

func (s *stack) request(body string) *http.Request {
	req, _ := http.NewRequest("POST", s.url+"/chat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	return req
}

func pctMs(ds []time.Duration, p float64) float64 {
	return pct(ds, p) / 1000
}
