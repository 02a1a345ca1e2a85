package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/tools"
)

// The sim talks to the engine through an in-process scripted model rather than the offline OpenAI-compatible
// endpoint: the HTTP model streams on its own goroutines and its own timers, so where a stop, a crash or a
// reaper pass lands relative to a streaming reply would be up to the Go scheduler, not the seed. Here every
// model event is a handoff to the sim's scheduler, which decides what happens before the next one. The HTTP
// model and the openai adapter are covered by every other engine test.
type simModel struct{}

// stepScript is one model step: some text deltas, then tool calls.
type stepScript struct {
	deltas []string
	calls  []callScript
}

type callScript struct {
	tool string
	args string
}

// executes reports whether the engine runs the call on the server in the step that makes it (client tools and
// tools that need approval end the run interrupted instead; an approved call runs in the run that continues).
func (c callScript) executes() bool {
	switch c.tool {
	case "sim_effect", "sim_slow", "add_note", "list_notes", "research":
		return true
	}
	return false
}

// asks draws the calls of a step that ends the run interrupted: at most one call that needs approval (so a
// continuation executes at most one tool, and no two tools of one process race for the store), a client tool,
// or both, sometimes beside a server tool that runs at once.
func asks(r *rand.Rand) []callScript {
	var cs []callScript
	if r.IntN(4) == 0 {
		cs = append(cs, callScript{"sim_effect", `{}`})
	}
	approval := []callScript{{"sim_approve", fmt.Sprintf(`{"n":%d}`, r.IntN(1000))}, {"delete_note", `{"id":"note_nope"}`}}[min(r.IntN(4), 1)]
	switch r.IntN(4) {
	case 0, 1:
		cs = append(cs, approval)
	case 2:
		cs = append(cs, callScript{"ask_user_question", fmt.Sprintf(`{"question":"which %d?"}`, r.IntN(100))})
	default:
		cs = append(cs, approval, callScript{"ask_user_question", `{"question":"and then?"}`})
	}
	return cs
}

func callID(proc, step, i int) string { return fmt.Sprintf("call_%d_%d_%d", proc, step, i) }

// newScript draws a model reply: up to four steps, the last without tool calls (or, a third of the time, with a
// client tool or a tool that needs approval, which interrupts the run). With research set (jobs mode), a step
// that calls tools may also dispatch a research job, with the input research draws (false: the schedule's budget
// of jobs is spent).
func newScript(r *rand.Rand, maxSteps int, research func(*rand.Rand) (string, bool)) []stepScript {
	n := 1 + r.IntN(3)
	if r.IntN(8) == 0 {
		n = maxSteps + 1 // runs into the step limit
	}
	var s []stepScript
	for i := 0; i < n; i++ {
		st := stepScript{}
		for range r.IntN(4) {
			st.deltas = append(st.deltas, fmt.Sprintf("w%d ", r.IntN(100)))
		}
		last := i == n-1
		if !last {
			if research != nil && r.IntN(2) == 0 {
				if args, ok := research(r); ok {
					st.calls = append(st.calls, callScript{"research", args})
				}
			}
			for range 1 + r.IntN(2) {
				switch r.IntN(6) {
				case 0, 1, 2:
					st.calls = append(st.calls, callScript{"sim_effect", `{}`})
				case 3:
					st.calls = append(st.calls, callScript{"add_note", fmt.Sprintf(`{"text":"note %d"}`, r.IntN(1000))})
				case 4:
					st.calls = append(st.calls, callScript{"list_notes", `{}`})
				case 5:
					st.calls = append(st.calls, callScript{"sim_effect", `{}`})
				}
			}
		} else if r.IntN(3) == 0 {
			st.calls = asks(r)
		}
		if len(st.deltas) == 0 && len(st.calls) == 0 {
			st.deltas = []string{"ok"}
		}
		s = append(s, st)
	}
	return s
}

func (simModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	p := procOf(ctx)
	if p == nil {
		return agent.ModelResult{}, errors.New("sim: model called outside a process")
	}
	if p.startsInDoubt(ctx) {
		return agent.ModelResult{}, ctx.Err()
	}
	if err := validTranscript(req.Messages); err != nil {
		p.w.violate("valid-transcript", "%s: model request: %v", p.name, err)
	}
	p.w.checkResultsSeen(p, req.Messages)
	p.w.steerWaitsThroughAnswer(p)
	var sc stepScript
	p.w.mu.Lock()
	idx := p.step
	p.w.mu.Unlock()
	if idx < len(p.script) {
		sc = p.script[idx]
	} else {
		sc = stepScript{deltas: []string{"done"}}
	}
	step := p.modelCalled(ctx, sc)
	p.w.mu.Lock()
	chainedFirst := p.chainStep == step+1 // the first step of a pass chained in this process (proc.chainStep)
	p.w.mu.Unlock()
	handoffs := (!p.delivers || step > 0) && !chainedFirst // see proc.delivers
	var events []agent.ModelEvent
	for _, d := range sc.deltas {
		events = append(events, agent.ModelEvent{Type: agent.EventTextDelta, Delta: d})
	}
	for i, c := range sc.calls {
		id := callID(p.id, step, i)
		events = append(events,
			agent.ModelEvent{Type: agent.EventToolCallStart, ToolCallID: id, ToolName: c.tool},
			agent.ModelEvent{Type: agent.EventToolCallDelta, ToolCallID: id, Delta: c.args},
			agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: id, ToolName: c.tool, Arguments: c.args})
	}
	endsLoop := step >= p.w.ecfg.MaxSteps-1
	interrupts := false
	executes := false
	for _, c := range sc.calls {
		if c.executes() {
			executes = true
		} else {
			interrupts = true
		}
	}
	if !executes || interrupts {
		endsLoop = true
	}
	usage := agent.Usage{InputTokens: int64(100 + step), OutputTokens: int64(len(events)), TotalTokens: int64(100 + step + len(events))}
	for i, ev := range events {
		// A handoff every other event keeps schedules short while leaving room between any two.
		if i%2 == 0 && handoffs {
			if !p.parkModel(false) {
				return agent.ModelResult{}, errDead
			}
			if err := ctx.Err(); err != nil {
				return agent.ModelResult{}, err
			}
		}
		if err := emit(ev); err != nil {
			return agent.ModelResult{}, err
		}
	}
	// The step's last handoff: after it the engine waits for the user-message write (before it runs tools,
	// writes a draft or finishes), so the scheduler lets that write through first, as for the end of the loop.
	_ = endsLoop
	if handoffs && !p.parkModel(true) {
		return agent.ModelResult{}, errDead
	}
	// Half the time a reply that was complete when the run was stopped is returned anyway (its last bytes were
	// already in flight), so the engine meets tool calls it must not start: "not executed".
	if err := ctx.Err(); err != nil && (p.id+step)%2 == 0 {
		return agent.ModelResult{}, err
	}
	reason := agent.FinishStop
	if len(sc.calls) > 0 {
		reason = agent.FinishToolCalls
	}
	return agent.ModelResult{FinishReason: reason, Usage: usage, Model: "sim-model"}, nil
}

// startsInDoubt: a run whose claim is in doubt when it starts streaming (time mode: its claim's retries backed off
// past the horizon, or the clock moved while it waited before its stream) is stopped by its guard, whose ticks
// read the clock in real time: whether the engine asks the model first (its loop checks the run's context before
// each step) is the Go scheduler's business. So a first model request of such a run waits until the guard has
// stopped the run, and fails as a request the engine did not send would not have been: no handoff, no event. The
// sim's lastOK is the engine's claim time until a heartbeat the scheduler armed, and none comes before the first
// model request (liveStreams).
func (p *proc) startsInDoubt(ctx context.Context) bool {
	w := p.w
	w.mu.Lock()
	doubt := p.step == 0 && !p.lastOK.IsZero() && w.clock.Now().Sub(p.lastOK) > w.ecfg.StaleAfter/2
	w.mu.Unlock()
	if !doubt {
		return false
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		w.violate("sim", "%s: its run started in doubt and its guard did not stop it within 30s", p.name)
	}
	return true
}

func (p *proc) parkModel(endsLoop bool) bool {
	p.w.mu.Lock()
	p.nextEndsLoop = endsLoop
	p.w.mu.Unlock()
	return p.parkMain("model")
}

// validTranscript is the provider's rule (DESIGN principle 5): every assistant tool call is answered by exactly
// one tool message before the next non-tool message, and no tool message answers a call that was not made.
func validTranscript(msgs []agent.ModelMessage) error {
	pending := map[string]bool{}
	for i, m := range msgs {
		switch m.Role {
		case "tool":
			if !pending[m.ToolCallID] {
				return fmt.Errorf("message %d: tool result for %q answers no pending call", i, m.ToolCallID)
			}
			delete(pending, m.ToolCallID)
		default:
			if len(pending) > 0 {
				return fmt.Errorf("message %d (%s): calls without a result: %v", i, m.Role, pending)
			}
			for _, c := range m.ToolCalls {
				if pending[c.ID] {
					return fmt.Errorf("message %d: call %q twice", i, c.ID)
				}
				pending[c.ID] = true
			}
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("calls without a result at the end: %v", pending)
	}
	return nil
}

// unfinished is what the transcript puts in place of a result for a tool part that has none
// (transcript.ResultText): a request that holds it sends the model a call without a real result.
const unfinished = "No result: the tool call was not completed."

// checkResultsSeen: the model never sees a call without its result (DESIGN principle 5: the transcript papers
// over one with a placeholder, which no turn should ever need), and a continuation's first request shows the
// answers the run applied: a denial as a denial, a client tool's output as that output, an approved call with
// the result of its execution.
func (w *world) checkResultsSeen(p *proc, msgs []agent.ModelMessage) {
	results := map[string]string{}
	for _, m := range msgs {
		if m.Role != "tool" {
			continue
		}
		results[m.ToolCallID] = m.Text
		if m.Text == unfinished {
			w.violate("no-orphan-call", "%s: the model request answers call %s with the placeholder %q", p.name, m.ToolCallID, m.Text)
		}
	}
	w.mu.Lock()
	first := p.step == 0
	resolved, sent := p.resolved, p.sent
	w.mu.Unlock()
	if !first {
		return
	}
	for call, st := range resolved {
		got, ok := results[call]
		want := sent[call]
		switch {
		case !ok:
			w.violate("answers-seen", "%s: call %s was answered (%s) but the model does not see it", p.name, call, st)
		case st == agent.InterruptDenied && got != "The user denied this tool call.":
			w.violate("answers-seen", "%s: call %s was denied but the model reads %q", p.name, call, got)
		case st == agent.InterruptAnswered && got != want.text:
			w.violate("answers-seen", "%s: call %s was answered %q but the model reads %q", p.name, call, want.text, got)
		case st == agent.InterruptApproved && (got == "The user denied this tool call." || got == unfinished):
			w.violate("answers-seen", "%s: call %s was approved but the model reads %q", p.name, call, got)
		}
	}
}

// simEffectNS is where the scripted server tools record their effect, keyed by the call's idempotency key.
func simEffectNS(owner string) string { return "simfx/" + owner }

// toolset is the demo tools over the process's store, plus two scripted server tools with an exactly-once
// effect: sim_effect runs at once, sim_approve only once a human approved the call (agent.ApprovalAlways). Each
// server tool is serialized by the process's turnstile.
func (w *world) toolset(p *proc) []agent.Tool {
	ts := tools.Demo(p.store, w.clock)
	ts = append(ts, w.effectTool(p, "sim_effect", agent.ApprovalNever), w.effectTool(p, "sim_approve", agent.ApprovalAlways))
	if w.timeOn {
		ts = append(ts, w.slowTool(p))
	}
	if w.jobsOn {
		ts = append(ts, jobs.Dispatcher{Store: p.store, Jobs: w.jobs, Clock: w.clock, Contract: w.contract,
			Limits: p.store, MaxActivePerUser: w.bounds.activePerUser}.Tools(w.kinds)...)
	}
	for i := range ts {
		if ts[i].Execute == nil || (ts[i].Kind != agent.ToolServer && ts[i].Kind != agent.ToolJob) {
			continue
		}
		exec := ts[i].Execute
		ts[i].Execute = func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			next := p.toolTurn(ctx, inv.ToolCallID)
			defer next()
			return exec(ctx, inv)
		}
	}
	return ts
}

// effectTool is a server tool that records one effect per call under its idempotency key. One that needs approval
// first checks, on the underlying store, that the call's interrupt was resolved approved ("an approved tool runs
// only after its approval").
func (w *world) effectTool(p *proc, name string, approval agent.ApprovalPolicy) agent.Tool {
	return agent.Tool{
		Name: name, Description: "a side effect, applied once per call", Kind: agent.ToolServer, Approval: approval,
		InputSchema: json.RawMessage(`{"type":"object"}`),
		Execute: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			if approval == agent.ApprovalAlways {
				w.checkApproved(p, inv)
			}
			if b, err := p.store.GetValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey); err == nil {
				return b, nil
			} else if !agent.IsKind(err, agent.KindNotFound) {
				return nil, err
			}
			out, _ := json.Marshal(map[string]string{"effect": inv.IdempotencyKey})
			if err := p.store.PutValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey, out); err != nil {
				return nil, err
			}
			return out, nil
		},
		Recorded: func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, bool, error) {
			b, err := p.store.GetValue(ctx, simEffectNS(inv.Owner), inv.IdempotencyKey)
			if agent.IsKind(err, agent.KindNotFound) {
				return nil, false, nil
			}
			return b, err == nil, err
		},
	}
}

// Time mode (issue 16, "time passing inside retry loops and tools"): one seed in two, drawn from a stream of its
// own so that every other draw of a schedule stays what it was, and never a seed listed for a regression or a
// known bug (those replay as they were found), always one of timeRegressions. In time mode the engine's retries
// back off in virtual time, as steps of the schedule (procClock), and some of the model's calls of sim_effect are calls of sim_slow, which
// takes virtual time: less than its timeout, more, or past its run's claim's horizon.
func timeMode(seed uint64) bool {
	if !*flagTime {
		return false
	}
	if slices.Contains(timeRegressions, seed) {
		return true
	}
	if slices.Contains(regressions, seed) {
		return false
	}
	for _, g := range gapRegressions {
		if g.seed == seed {
			return false
		}
	}
	for _, kb := range knownBugs {
		if kb.seed == seed {
			return kb.time
		}
	}
	return rand.New(rand.NewPCG(seed, 0x71e)).IntN(2) == 0
}

// simToolTimeout is the tool timeout in time mode: below half of staleAfter (30 s), as lib/config demands.
const simToolTimeout = 10 * time.Second

// timed turns some of script's sim_effect calls into sim_slow calls (time mode), with a draw of their own.
func (w *world) timed(p *proc, script []stepScript) []stepScript {
	if !w.timeOn {
		return script
	}
	r := rand.New(rand.NewPCG(w.seed, 0x510<<32|uint64(p.id)))
	for i := range script {
		for j, c := range script[i].calls {
			if c.tool != "sim_effect" || r.IntN(3) != 0 {
				continue
			}
			var ms int
			switch r.IntN(4) {
			case 0, 1:
				ms = 500 + r.IntN(8000) // within its timeout
			case 2:
				ms = 11000 + r.IntN(9000) // past its timeout
			default:
				ms = 20000 + r.IntN(25000) // past its claim's horizon, and maybe its stale window
			}
			script[i].calls[j] = callScript{"sim_slow", fmt.Sprintf(`{"ms":%d}`, ms)}
		}
	}
	return script
}

// slowTool is sim_effect that takes virtual time first (its input's ms): it parks until the scheduler moves the
// clock on that far (world.advanceTool). When the engine gives it up before (its timeout, or its run's claim in
// doubt), it stays parked and never reaches the store: a tool whose outcome is unknown, and which has none.
func (w *world) slowTool(p *proc) agent.Tool {
	t := w.effectTool(p, "sim_slow", agent.ApprovalNever)
	t.Description = "a side effect, applied once per call, that takes time"
	effect := t.Execute
	t.Execute = func(ctx context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
		var in struct {
			MS int `json:"ms"`
		}
		_ = json.Unmarshal(inv.Input, &in)
		if !p.awaitStepWaits() || !p.parkUntil("tool", w.clock.Now().Add(time.Duration(in.MS)*time.Millisecond), ctx) {
			return nil, p.parkDead()
		}
		return effect(ctx, inv)
	}
	return t
}

// checkApproved is invariant "approval first": a tool that needs approval starts only once its call's interrupt
// is resolved approved.
func (w *world) checkApproved(p *proc, inv agent.ToolInvocation) {
	ins, err := w.base.ListInterrupts(context.Background(), inv.ThreadID)
	if err != nil {
		w.violate("sim", "%s: list interrupts of %s: %v", p.name, inv.ThreadID, err)
		return
	}
	for _, in := range ins {
		if in.ToolCallID == inv.ToolCallID {
			if in.Status != agent.InterruptApproved {
				w.violate("approval-first", "%s: %s runs call %s while its interrupt %s is %s", p.name, in.ToolName, inv.ToolCallID, in.ID, in.Status)
			}
			return
		}
	}
	w.violate("approval-first", "%s: call %s runs with no interrupt asking for its approval", p.name, inv.ToolCallID)
}

// procOf finds the process of a call from its context (the sim tags the contexts it passes to Begin, Stream and
// the services; context.WithoutCancel keeps values, so the engine's detached contexts carry it too).
func procOf(ctx context.Context) *proc {
	p, _ := ctx.Value(procKey{}).(*proc)
	return p
}

type procKey struct{}
