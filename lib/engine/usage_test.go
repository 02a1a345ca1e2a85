package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/emf"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
)

// syncBuffer is a log sink many goroutines write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records parses the JSON log lines with the given msg.
func (b *syncBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, line)
		}
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

func withJSONLog(b *syncBuffer) option {
	return func(o *devserver.Options) { o.Logger = slog.New(slog.NewJSONHandler(b, nil)) }
}

func withMetrics(m agent.Metrics) option {
	return func(o *devserver.Options) { o.Metrics = m }
}

// num reads a JSON number field as int64.
func num(t *testing.T, rec map[string]any, key string) int64 {
	t.Helper()
	v, ok := rec[key].(float64)
	if !ok {
		t.Fatalf("field %s = %v (%T), want a number in %v", key, rec[key], rec[key], rec)
	}
	return int64(v)
}

// Each run writes exactly one agent.run line, whatever its outcome, one agent.step per model step and one
// agent.tool per tool call, with the fields an operator needs; the numbers agree with the stored run.
func TestLogLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		text    string
		status  agent.RunStatus
		code    string
		steps   int
		tools   map[string]string // tool name → outcome
		stepErr bool
	}{
		{"completed", "hello there", agent.RunCompleted, "", 1, nil, false},
		{"tool then reply", `/tool add_note {"text": "milk"}`, agent.RunCompleted, "", 2, map[string]string{"add_note": "ok"}, false},
		{"client tool", `/tool ask_user_question {"question": "why?"}`, agent.RunInterrupted, "", 1,
			map[string]string{"ask_user_question": "client"}, false},
		{"unknown tool", `/tool no_such_tool {}`, agent.RunCompleted, "", 2, map[string]string{"no_such_tool": "unknown_tool"}, false},
		{"model error", "/error 400", agent.RunFailed, agent.CodeModelError, 1, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs, metrics syncBuffer
			f := setup(t, withJSONLog(&logs), withMetrics(emf.New(&metrics, "test", nil)))
			run, _ := f.turn(t, "th", "u1", tc.text)
			if run.Status != tc.status {
				t.Fatalf("run status %s, want %s (%+v)", run.Status, tc.status, run.Error)
			}
			stored, err := f.store.GetRun(context.Background(), "th", run.ID)
			if err != nil {
				t.Fatal(err)
			}

			runs := logs.records(t, "agent.run")
			if len(runs) != 1 {
				t.Fatalf("%d agent.run lines, want exactly 1: %v", len(runs), runs)
			}
			r := runs[0]
			if r["run_id"] != run.ID || r["thread_id"] != "th" || r["trigger"] != string(agent.TriggerUser) ||
				r["status"] != string(tc.status) || r["error_code"] != tc.code || num(t, r, "steps") != int64(tc.steps) {
				t.Fatalf("agent.run = %v", r)
			}
			for key, want := range map[string]int64{"input_tokens": stored.Usage.InputTokens, "output_tokens": stored.Usage.OutputTokens,
				"cached_input_tokens": stored.Usage.CachedInputTokens, "total_tokens": stored.Usage.TotalTokens} {
				if got := num(t, r, key); got != want {
					t.Fatalf("agent.run %s = %d, want the stored run's %d", key, got, want)
				}
			}
			if tc.code == "" && stored.Usage.InputTokens == 0 {
				t.Fatalf("stored run has no usage: %+v", stored)
			}
			// The run's outcome records its store requests; the log line counts the writes after it as well.
			if stored.Store == nil || stored.Store.Requests < 2 || num(t, r, "store_requests") <= stored.Store.Requests {
				t.Fatalf("store usage: run %+v, log %v", stored.Store, r["store_requests"])
			}
			if num(t, r, "duration_ms") < 0 {
				t.Fatalf("duration %v", r["duration_ms"])
			}

			steps := logs.records(t, "agent.step")
			if len(steps) != tc.steps {
				t.Fatalf("%d agent.step lines, want %d: %v", len(steps), tc.steps, steps)
			}
			var in, out int64
			for i, s := range steps {
				if s["run_id"] != run.ID || s["thread_id"] != "th" || num(t, s, "step") != int64(i) || s["model"] == "" ||
					s["finish_reason"] == nil || num(t, s, "latency_ms") < 0 {
					t.Fatalf("agent.step %d = %v", i, s)
				}
				_ = num(t, s, "reasoning_tokens")
				in += num(t, s, "input_tokens")
				out += num(t, s, "output_tokens")
			}
			if in != stored.Usage.InputTokens || out != stored.Usage.OutputTokens {
				t.Fatalf("steps add up to %d in / %d out, the run says %+v", in, out, stored.Usage)
			}
			if tc.stepErr && steps[len(steps)-1]["error_code"] != agent.CodeModelError {
				t.Fatalf("failed step = %v, want error_code %s", steps[len(steps)-1], agent.CodeModelError)
			}

			toolLines := logs.records(t, "agent.tool")
			if len(toolLines) != len(tc.tools) {
				t.Fatalf("%d agent.tool lines, want %d: %v", len(toolLines), len(tc.tools), toolLines)
			}
			for _, l := range toolLines {
				name, _ := l["tool"].(string)
				if want, ok := tc.tools[name]; !ok || l["outcome"] != want || l["run_id"] != run.ID || l["tool_call_id"] == "" {
					t.Fatalf("agent.tool = %v, want outcome %q", l, tc.tools[name])
				}
				_ = num(t, l, "duration_ms")
			}

			// One EMF document for the run, by its outcome, with its tokens (lib/emf validates the format itself).
			metrics.mu.Lock()
			defer metrics.mu.Unlock()
			docs := bytes.Split(bytes.TrimSpace(metrics.buf.Bytes()), []byte("\n"))
			var doc map[string]any
			if len(docs) != 1 || json.Unmarshal(docs[0], &doc) != nil {
				t.Fatalf("EMF output %q, want one document", metrics.buf.Bytes())
			}
			if doc["Outcome"] != string(tc.status) || doc["Runs"] != 1.0 || doc["InputTokens"] != float64(stored.Usage.InputTokens) ||
				doc["OutputTokens"] != float64(stored.Usage.OutputTokens) || doc["StoreRequests"] != r["store_requests"] {
				t.Fatalf("EMF document %v, want outcome %s and the run's numbers", doc, tc.status)
			}
		})
	}
}

// With a price table, each step is priced with its model and the cost adds up exactly on the message, the run
// and the thread.
func TestPricedUsage(t *testing.T) {
	matrix.Skip(t, "its price table names the offline model", modelsfile.Anthropic, modelsfile.AnthropicBedrock, modelsfile.BedrockConverse)
	t.Parallel()
	// The offline model answers as "offline" (offline.DefaultModel); 1.5 $/M input, 0.5 $/M cached, 4 $/M output.
	prices, err := agent.ParsePrices([]byte(`{"offline": {"input": 1.5, "cachedInput": 0.5, "output": 4}}`))
	if err != nil {
		t.Fatal(err)
	}
	f := setup(t, withConfig(func(c *config.Config) { c.Prices = prices }))
	run, _ := f.turn(t, "th", "u1", `/tool add_note {"text": "milk"}`)
	if run.Status != agent.RunCompleted || run.Steps != 2 {
		t.Fatalf("run %+v", run)
	}
	stored, err := f.store.GetRun(context.Background(), "th", run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Model != "offline" {
		t.Fatalf("model %q: the price table above names the wrong model", stored.Model)
	}
	// Each step priced alone and rounded: the sum of two rounded step costs. Recompute them from the offline
	// model's per-step usage, which the steps' sum is (TestLogLines checks that): here the whole run's tokens
	// priced at once may differ by rounding, so the expectation is built from the message's own usage.
	u := stored.Usage
	if u.CostMicroUSD <= 0 {
		t.Fatalf("run usage %+v carries no cost", u)
	}
	whole, _ := prices.Cost("offline", agent.Usage{InputTokens: u.InputTokens, CachedInputTokens: u.CachedInputTokens, OutputTokens: u.OutputTokens})
	if diff := u.CostMicroUSD - whole; diff < -1 || diff > 1 {
		t.Fatalf("run cost %d µ$, the whole run priced at once is %d: more than the two steps' rounding apart", u.CostMicroUSD, whole)
	}
	rec, err := f.store.GetMessage(context.Background(), "th", run.AssistantMessageID)
	if err != nil {
		t.Fatal(err)
	}
	if md := rec.Message.Meta(); md.Usage == nil || *md.Usage != u || md.Model != "offline" {
		t.Fatalf("message metadata %+v, want usage %+v", md, u)
	}
	th, err := f.store.GetThread(context.Background(), "th")
	if err != nil {
		t.Fatal(err)
	}
	if th.Usage != u {
		t.Fatalf("thread usage %+v, want the run's %+v", th.Usage, u)
	}
	// A second turn adds exactly its own cost.
	run2, _ := f.turn(t, "th", "u2", "hello")
	th2, _ := f.store.GetThread(context.Background(), "th")
	if th2.Usage.CostMicroUSD != u.CostMicroUSD+run2.Usage.CostMicroUSD || run2.Usage.CostMicroUSD <= 0 {
		t.Fatalf("thread cost %d after a second turn of %d, want %d", th2.Usage.CostMicroUSD, run2.Usage.CostMicroUSD,
			u.CostMicroUSD+run2.Usage.CostMicroUSD)
	}
}

// freezingStore stands for a process that froze (a paused Lambda, a long GC): while frozen, its heartbeats are
// lost on the way (the run believes its claim is fine), so the claim goes stale and the reaper takes it.
type freezingStore struct {
	agent.Store
	mu     sync.Mutex
	frozen bool
}

func (s *freezingStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return keepEach(ctx, claims, now, s.Heartbeat)
}

func (s *freezingStore) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	s.mu.Lock()
	frozen := s.frozen
	s.mu.Unlock()
	if frozen {
		return nil
	}
	return s.Store.Heartbeat(ctx, threadID, f, now)
}

func (s *freezingStore) freeze(on bool) { s.mu.Lock(); s.frozen = on; s.mu.Unlock() }

// reportingModel sums the usage the model reported to the engine, call by call.
type reportingModel struct {
	agent.Model
	mu    sync.Mutex
	total agent.Usage
}

func (m *reportingModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	res, err := m.Model.Stream(ctx, req, emit)
	m.mu.Lock()
	m.total = m.total.Add(res.Usage)
	m.mu.Unlock()
	return res, err
}

// A run reaped while its step was in flight (its model call had reported its tokens, its tool was running, no
// draft had recorded them) counts those tokens once: the reaper counts what the draft holds, the fenced run the
// rest. The thread's totals equal exactly what the model reported, and a duplicated late write changes nothing.
func TestFencedRunCountsItsTokensOnce(t *testing.T) {
	t.Parallel()
	store := &freezingStore{}
	reaped, frozen := make(chan struct{}), make(chan struct{})
	var freezeOnce sync.Once
	stall := agent.Tool{Name: "stall", Description: "freezes the process until the run is reaped", InputSchema: emptySchema,
		Kind: agent.ToolServer, Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			store.freeze(true)
			freezeOnce.Do(func() { close(frozen) })
			select {
			case <-reaped:
				return json.RawMessage(`"thawed"`), nil
			case <-time.After(20 * time.Second):
				return nil, errors.New("never reaped")
			}
		}}
	var logs syncBuffer
	// The clock stands still until the process has frozen, then moves past staleAfter: no sleep, and no
	// load makes the run doubt its claim before that.
	clock := newManualClock()
	f := setup(t, withTools(stall), withJSONLog(&logs), withClock(clock), withStore(func(s agent.Store) agent.Store { store.Store = s; return store }),
		withConfig(func(c *config.Config) { c.ToolTimeout = 30 * time.Second }))
	model := &reportingModel{Model: f.stack.Model}
	eng := engineWithModel(t, f, model)

	go func() {
		// Once frozen, the stale window passes and the reaper reaps as the scheduled one does.
		<-frozen
		clock.add(f.stack.Reaper.Config().StaleAfter + time.Second)
		if _, err := f.stack.Reaper.Tick(context.Background()); err != nil {
			t.Errorf("reaper tick: %v", err)
		}
		store.freeze(false)
		close(reaped)
	}()
	tr, err := eng.Begin(context.Background(), submit("th", "u1", "/tool stall {}"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	if run.Error == nil || run.Error.Code != agent.CodeRunFenced {
		t.Fatalf("run = %+v, want it fenced", run)
	}
	// The run stops waiting for its tool at the claim's horizon, so it can end before the reap has: read the
	// thread once the reaper's tick and the run's late usage are done.
	<-reaped
	eng.Wait()
	model.mu.Lock()
	reported := model.total
	model.mu.Unlock()
	if reported.InputTokens == 0 {
		t.Fatal("the model reported no tokens: the case tests nothing")
	}
	th, err := f.store.GetThread(context.Background(), "th")
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil || th.Usage != reported {
		t.Fatalf("thread usage %+v (claim %+v), want exactly what the model reported: %+v", th.Usage, th.ActiveRun, reported)
	}
	stored, err := f.store.GetRun(context.Background(), "th", run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Error == nil || stored.Error.Code != agent.CodeStale || stored.Usage != reported || stored.LateUsage == nil {
		t.Fatalf("stored run %+v, want reaped (stale) with usage %+v including its late part", stored, reported)
	}
	// A duplicate of the late write (a retry whose first attempt applied) counts nothing more.
	if err := f.store.RecordLateUsage(context.Background(), agent.LateUsage{ThreadID: "th", Fence: run.Fence(), Usage: *stored.LateUsage}); err != nil {
		t.Fatal(err)
	}
	if th, _ := f.store.GetThread(context.Background(), "th"); th.Usage != reported {
		t.Fatalf("thread usage after a duplicate late write %+v, want %+v", th.Usage, reported)
	}
	if runs := logs.records(t, "agent.run"); len(runs) != 1 || runs[0]["outcome"] != "fenced" {
		t.Fatalf("agent.run lines %v, want one, fenced", runs)
	}
	if reaps := logs.records(t, "agent.reap"); len(reaps) != 1 || reaps[0]["outcome"] != "reaped" || reaps[0]["run_id"] != run.ID {
		t.Fatalf("agent.reap lines %v, want one for the run", reaps)
	}
}

// engineWithModel builds a second engine over the fixture with another model port, logging where the fixture's
// components log.
func engineWithModel(t *testing.T, f *fixture, model agent.Model) *engine.Engine {
	t.Helper()
	return engine.New(engine.Deps{Store: f.store, Model: model, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer,
		Logger: f.log, Clock: f.clock}, f.eng.Config())
}
