package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/threads"
)

// simConfig is the engine configuration of every simulated process. The keeper's Heartbeat ticks in real time
// (procClock keeps them off the virtual clock), fast, but its batches pass only when the scheduler arms one
// (procStore.KeepClaims), so they are schedule steps like any other. CancelPoll is unused (no run polls). SegmentFlush is switched off
// (hours): segments are then written only at step ends and at the end of the stream, while the run waits; the
// keeper's answers carry no readers mark, so nothing hurries them (procStore.KeepClaims), and the keeper's reader
// probe is off (ReaderProbe -1): it only reads (engine's TestReaderProbeCostsOneReadPerProbe: no write
// transaction) and moves no horizon, and what it does (hurry a run's segments) the schedules leave out as they
// leave out the batches' marks.
// Every other wait of the engine is on the virtual clock (procClock): InterruptWait, FinishRetry, RunTimeout and
// ToolTimeout are hours (ToolTimeout is simToolTimeout in time mode); LateWait is off.
func simConfig() engine.Config {
	return engine.Config{Model: "sim-model", MaxSteps: 4, RunTimeout: 10 * time.Hour, ToolTimeout: 10 * time.Hour,
		Heartbeat: time.Millisecond, StaleAfter: 30 * time.Second,
		InterruptWait: 10 * time.Hour, FinishRetry: 10 * time.Hour, SegmentFlush: 10 * time.Hour, ReaderProbe: -1,
		// A fenced run's background wait for the reaper (late usage) runs beside the schedule: its
		// write could land between the check's read of a thread and of its runs (seed 1000001 on dynalite broke
		// "usage" once that way in make test). Without it the run records its late usage only when the reaper
		// finished first, and the thread's usage is still the sum of its runs'.
		LateWait: -1}
}

func newWorld(seed uint64, base agent.Store, gaps bool) *world {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	w := &world{seed: seed, rng: r, base: base, ecfg: simConfig(), gaps: gaps, signer: mustSigner(),
		clock:   &vclock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(seed%100000) * time.Hour)},
		ids:     &seqIDs{prefix: fmt.Sprintf("s%dx", seed)},
		owner:   fmt.Sprintf("user%d", seed),
		reports: make(chan report, 16), released: make(chan struct{}),
		faults: map[string]int{}, segTries: map[string]int{}, effects: map[string]int{}, views: map[string]threads.View{}}
	w.plan = plan{
		crashProb:   []float64{0, 0.15, 0.3}[r.IntN(3)],
		crashWindow: 5 + r.IntN(30),
		faultyProcs: []float64{0, 0.3, 0.6}[r.IntN(3)],
		faultRate:   0.05 + 0.1*r.Float64(),
		lostFrac:    []float64{0, 0.3}[r.IntN(2)],
		delayProb:   []float64{0, 0, 0.2}[r.IntN(3)],
	}
	for i := range 1 + r.IntN(3) {
		w.threads = append(w.threads, &simThread{id: fmt.Sprintf("th%d-%d", seed, i)})
	}
	// Interrupts expire in virtual time: some schedules move the clock past the shortest age (a clock move past
	// half of staleAfter, a stall, the quiesce), others never reach it.
	w.ecfg.InterruptTTL = []time.Duration{45 * time.Second, 2 * time.Minute, 20 * time.Minute}[r.IntN(3)]
	w.contract = agent.DefaultJobContract()
	if page, ok := windowMode(seed); ok {
		// The smallest windows a turn can read (one token's worth, pages of one to three messages), so that every
		// turn plans from a part of its thread: edits, re-posts, regenerates, continuations and queue takes whose
		// messages lie behind the window. The model's own budget stays (a budget of one token would refuse every
		// message as too large for the model).
		w.ecfg.WindowTokens, w.ecfg.WindowPage = 1, page
		w.windowNote = fmt.Sprintf(" window=%d", page)
	}
	if w.timeOn = timeMode(seed); w.timeOn {
		// Time passes inside retries and tools (procClock, sim_slow): a tool may take longer than its timeout,
		// which stays below half of staleAfter as the configuration demands (AGENT_TOOL_TIMEOUT).
		w.ecfg.ToolTimeout = simToolTimeout
		w.windowNote += " time"
		w.stats.time.schedules = 1
	}
	if w.jobsOn = jobsMode(seed); w.jobsOn {
		w.kinds = jobs.NewRegistry(jobs.Research())
		w.jobs = &simJobs{w: w}
		w.stats.jobs.schedules = 1
		w.drawBounds()
	}
	if w.sharedOn = sharedMode(seed); w.sharedOn {
		w.shareRng = rand.New(rand.NewPCG(seed, 0x6e57))
		w.windowNote += " shared"
		w.stats.shared.schedules = 1
	}
	w.initReaders()
	return w
}

// run plays the schedule: ops interleaved with grants, guard ticks and clock moves, then a drain (every live
// process runs to its end); then, while a thread asks (most of the time), a human phase: answers and what races
// them, interleaved the same way, and a drain again; then a quiesce (time passes beyond staleAfter and a clean
// reaper sweeps until no claim is left). It returns an error only for a failure of the sim itself; invariant
// violations are collected.
func (w *world) run() error {
	jobsNote := ""
	if w.jobsOn {
		jobsNote = " jobs"
	}
	w.tracef("seed=%d plan=%+v threads=%d interruptTTL=%s%s%s", w.seed, w.plan, len(w.threads), w.ecfg.InterruptTTL, jobsNote, w.windowNote)
	if err := w.steps(4+w.rng.IntN(12), 10, w.op); err != nil {
		return err
	}
	if err := w.drain(); err != nil {
		return err
	}
	for round := 0; round < 3 && w.rng.IntN(5) != 0; round++ {
		var asking []*simThread
		for _, th := range w.threads {
			if w.asking(th) != nil {
				asking = append(asking, th)
			}
		}
		if len(asking) == 0 {
			break
		}
		w.tracef("human phase %d", round)
		human := func() error { return w.humanOp(asking[w.rng.IntN(len(asking))]) }
		if err := w.steps(1+w.rng.IntN(3), 4, human); err != nil {
			return err
		}
		if err := w.drain(); err != nil {
			return err
		}
	}
	if w.jobsOn {
		if err := w.settle(); err != nil {
			return err
		}
	}
	return w.quiesce()
}

// humanOp is an op of the human phase: mostly an answer to the thread that asks; else what races one.
func (w *world) humanOp(th *simThread) error {
	w.stats.ops++
	switch c := w.rng.IntN(100); {
	case c < 70:
		return w.answer(th, w.asking(th))
	case c < 80:
		return w.stop(th)
	case c < 88:
		return w.post(th)
	case c < 94:
		return w.regenerate(th)
	default:
		return w.reap(w.rng.IntN(2) == 0)
	}
}

// steps interleaves ops (op starts one) with grants, user writes, guard ticks, clock moves and stalls: at least
// `least` of them, and until ops ops have started.
func (w *world) steps(ops, least int, op func() error) error {
	for steps := 0; ops > 0 || steps < least; steps++ {
		if steps > 400 {
			break
		}
		if err := w.maybeAttach(); err != nil {
			return err
		}
		if err := w.sharedTick(); err != nil {
			return err
		}
		if w.jobsOn && w.rng.IntN(100) < 14 {
			if err := w.jobOp(); err != nil {
				return err
			}
			continue
		}
		var err error
		switch c := w.rng.IntN(100); {
		case c < 40:
			if ps := w.liveMains(); len(ps) > 0 {
				p := ps[w.rng.IntN(len(ps))]
				if w.isInFlight(p) && w.rng.IntN(2) == 0 {
					err = w.stall(p)
					break
				}
				w.tracef("grant %s", p.name)
				err = w.advanceMain(p)
			}
		case c < 47:
			if ps := w.pendingUWs(); len(ps) > 0 {
				p := ps[w.rng.IntN(len(ps))]
				w.tracef("user write of %s", p.name)
				err = w.advanceUW(p)
			}
		case c < 57:
			if ps := w.liveStreams(); len(ps) > 0 {
				p := ps[w.rng.IntN(len(ps))]
				// Two in five ticks were a guard's cancel poll before the keeper; no run polls any more (a stop
				// arrives with the next heartbeat batch), and the draw stays so that every seed plays as before.
				_ = w.rng.IntN(5)
				err = w.guardTick(p, callHeartbeat)
			}
		case c < 64:
			err = w.beforeClock(w.smallAdvance())
		case c < 67:
			err = w.beforeClock(w.ecfg.StaleAfter/2 + time.Duration(1+w.rng.IntN(20))*time.Second)
		case c < 71:
			if ps := w.inFlight(); len(ps) > 0 {
				err = w.stall(ps[w.rng.IntN(len(ps))])
			}
		default:
			if ops == 0 {
				continue
			}
			ops--
			err = op()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *world) isInFlight(p *proc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.parkedAt == "in flight"
}

// inFlight lists the processes whose run has a write held in flight.
func (w *world) inFlight() []*proc {
	var ps []*proc
	for _, p := range w.liveMains() {
		w.mu.Lock()
		if p.parkedAt == "in flight" {
			ps = append(ps, p)
		}
		w.mu.Unlock()
	}
	return ps
}

// stall is the worst case for a write in flight: it arrives after its run's claim went stale and a reaper (or
// a new post, which reaps on its way) finished the run. The store must refuse it.
func (w *world) stall(p *proc) error {
	w.tracef("stall %s's write past staleAfter", p.name)
	if err := w.arriveFirst(p); err != nil {
		return err
	}
	if err := w.beforeClock(w.ecfg.StaleAfter + w.smallAdvance()); err != nil {
		return err
	}
	if err := w.reap(false); err != nil {
		return err
	}
	w.tracef("grant %s", p.name)
	return w.advanceMain(p)
}

func (w *world) smallAdvance() time.Duration {
	return time.Duration(100+w.rng.IntN(4900)) * time.Millisecond
}

// beforeClock advances the clock. A user-message write still parked stays parked: the write asks the claim's
// horizon before every attempt (the write gate), so one let through after its run's claim fell in doubt is
// refused, and the run ends fenced.
func (w *world) beforeClock(d time.Duration) error {
	return w.advanceClock(d)
}

// op starts one operation in a new process.
func (w *world) op() error {
	w.stats.ops++
	th := w.threads[w.rng.IntN(len(w.threads))]
	switch c := w.rng.IntN(100); {
	case c < 42:
		return w.post(th)
	case c < 60:
		// A thread that asks, when one does.
		m := w.asking(th)
		if m == nil {
			var asking []*simThread
			var ms []*agent.Message
			for _, t := range w.threads {
				if am := w.asking(t); am != nil && t != th {
					asking, ms = append(asking, t), append(ms, am)
				}
			}
			if len(asking) > 0 {
				i := w.rng.IntN(len(asking))
				th, m = asking[i], ms[i]
			}
		}
		return w.answer(th, m)
	case c < 70:
		return w.regenerate(th)
	case c < 82:
		return w.stop(th)
	case c < 88:
		return w.deleteThread(th)
	case c < 95:
		return w.reap(false)
	default:
		return w.reap(true)
	}
}

func textPart(s string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"type": "text", "text": s})
	return b
}

// post sends a user message: a new one, or one sent before (a retry), sometimes with other content: an edit
// when it is the newest user message or the request names it (messageId), refused as duplicate_message when it is
// an older one and the request does not.
func (w *world) post(th *simThread) error { return w.postMT(th, false) }

// postMT is post; enqueue sends it with multitask enqueue.
func (w *world) postMT(th *simThread, enqueue bool) error {
	var m postedMsg
	dup := len(th.posted) > 0 && w.rng.IntN(5) == 0
	editID := ""
	if dup {
		m = th.posted[w.rng.IntN(len(th.posted))]
		if w.rng.IntN(3) == 0 {
			m.text += " (edited)"
		}
		if w.rng.IntN(4) == 0 {
			editID = m.id
		}
	} else {
		m = w.newMessage(th)
	}
	mt := engine.MultitaskReject
	if w.rng.IntN(4) == 0 {
		mt = engine.MultitaskInterrupt
	} else if w.jobsOn && w.rng.IntN(3) == 0 {
		mt = engine.MultitaskEnqueue // queued when the thread is busy (202), answered by a later turn
	}
	if enqueue {
		mt = engine.MultitaskEnqueue
	}
	req := engine.Request{Owner: w.owner, ThreadID: th.id, Kind: engine.TurnSubmit, Multitask: mt, MessageID: editID,
		Message: &agent.Message{ID: m.id, Role: agent.RoleUser, Parts: []json.RawMessage{textPart(m.text)}}}
	p := w.newProc("post", true)
	p.script = w.timed(p, w.script(p))
	enq := ""
	if mt == engine.MultitaskEnqueue {
		enq = " enqueue"
	}
	w.tracef("%s: post %s %q to %s (interrupt=%v edit=%v) steps=%d%s", p.name, m.id, m.text, th.id, mt == engine.MultitaskInterrupt, editID != "", len(p.script), enq)
	p.freshID = !dup
	return w.turn(p, th, req)
}

// answer is a client answering the thread's asking message m (the newest one, when it is an assistant message
// that ended interrupted, read as the client has it): a decision for every waiting call (approve or deny, a
// client tool's output or error), sometimes leaving one out or changing a call's input (both refused); the same
// answer from two processes at once, or two different ones; an earlier answer sent again; and now and then a
// stop or a new message right behind it.
func (w *world) answer(th *simThread, m *agent.Message) error {
	if m == nil || w.rng.IntN(8) == 0 {
		switch {
		case len(th.answers) > 0:
			return w.sendAnswer(th, th.answers[w.rng.IntN(len(th.answers))], "again")
		case m == nil:
			return w.post(th)
		}
	}
	a := w.decide(*m)
	th.answers = append(th.answers, a)
	var err error
	switch c := w.rng.IntN(10); {
	case c < 6:
		err = w.sendAnswer(th, a, "")
	case c < 8:
		if err = w.sendAnswer(th, a, ""); err == nil {
			err = w.sendAnswer(th, a, "twice")
		}
	default:
		b := w.decide(*m)
		th.answers = append(th.answers, b)
		if err = w.sendAnswer(th, a, ""); err == nil {
			err = w.sendAnswer(th, b, "other")
		}
	}
	if err != nil {
		return err
	}
	switch w.rng.IntN(10) {
	case 0:
		return w.stop(th)
	case 1:
		return w.post(th)
	}
	return nil
}

// asking is the thread's newest message if it is an assistant message that ended interrupted (read from the
// underlying store: the client has it from the stream).
func (w *world) asking(th *simThread) *agent.Message {
	recs, err := w.base.ListMessages(context.Background(), th.id)
	if err != nil {
		return nil
	}
	msgs := make([]agent.Message, len(recs))
	for i, r := range recs {
		msgs[i] = r.Message
	}
	msgs = agent.Visible(msgs)
	if len(msgs) == 0 {
		return nil
	}
	m := msgs[len(msgs)-1]
	if m.Role != agent.RoleAssistant || m.Meta().Status != agent.MessageInterrupted {
		return nil
	}
	return &m
}

// answerReq is one answering request's copy of the asking message and what it answers.
type answerReq struct {
	msg      agent.Message
	sent     map[string]sentAnswer
	tampered bool // a call's input differs from the one that was signed: the request must be refused
}

// decide answers each waiting call of m as the client does (addToolApprovalResponse, addToolOutput).
func (w *world) decide(m agent.Message) answerReq {
	a := answerReq{sent: map[string]sentAnswer{}}
	parts := make([]json.RawMessage, 0, len(m.Parts))
	skip := w.rng.IntN(12) == 0
	for _, raw := range m.Parts {
		p, err := agent.DecodePart(raw)
		if err != nil || !agent.IsToolPart(p.Type) {
			parts = append(parts, raw)
			continue
		}
		switch {
		case skip && (p.State == agent.StateApprovalRequested || p.State == agent.StateInputAvailable):
			skip = false // no decision for this one: refused as missing_decision
		case p.State == agent.StateApprovalRequested && p.Approval != nil:
			yes := w.rng.IntN(3) != 0
			p.State, p.Approval = agent.StateApprovalResponded, &agent.PartApproval{ID: p.Approval.ID, Approved: &yes}
			st := agent.InterruptDenied
			if yes {
				st = agent.InterruptApproved
			} else if w.rng.IntN(2) == 0 {
				p.Approval.Reason = "not now"
			}
			a.sent[p.ToolCallID] = sentAnswer{status: st}
			if w.rng.IntN(15) == 0 {
				p.Input, a.tampered = json.RawMessage(`{"n":-1}`), true
			}
		case p.State == agent.StateInputAvailable && p.ToolNameOf() == "ask_user_question":
			if w.rng.IntN(5) == 0 {
				p.State, p.ErrorText = agent.StateOutputError, "the user closed the question"
				a.sent[p.ToolCallID] = sentAnswer{status: agent.InterruptAnswered, text: "Error: " + p.ErrorText}
			} else {
				out := fmt.Sprintf(`{"answer":"yes %d"}`, w.rng.IntN(100))
				p.State, p.Output = agent.StateOutputAvailable, json.RawMessage(out)
				a.sent[p.ToolCallID] = sentAnswer{status: agent.InterruptAnswered, text: out}
			}
		}
		parts = append(parts, agent.EncodePart(p))
	}
	a.msg = m
	a.msg.Parts = parts
	return a
}

// sendAnswer posts a (the AI SDK's request for tool outputs and approval responses: the assistant message).
func (w *world) sendAnswer(th *simThread, a answerReq, label string) error {
	m := a.msg
	m.Parts = slices.Clone(m.Parts)
	req := engine.Request{Owner: w.owner, ThreadID: th.id, Kind: engine.TurnSubmit, Message: &m}
	if w.rng.IntN(3) != 0 {
		req.MessageID = m.ID
	}
	if w.rng.IntN(4) == 0 {
		req.Multitask = engine.MultitaskInterrupt
	}
	p := w.newProc("answer", true)
	p.script = w.timed(p, w.script(p))
	p.sent, p.tampered = a.sent, a.tampered
	w.stats.answers++
	calls := slices.Sorted(maps.Keys(a.sent))
	var ds []string
	for _, c := range calls {
		ds = append(ds, c+"="+string(a.sent[c].status))
	}
	w.tracef("%s: answer %s on %s [%s]%s (interrupt=%v tampered=%v) steps=%d", p.name, m.ID, th.id, strings.Join(ds, " "),
		map[bool]string{true: " " + label, false: ""}[label != ""], req.Multitask == engine.MultitaskInterrupt, a.tampered, len(p.script))
	return w.turn(p, th, req)
}

func (w *world) regenerate(th *simThread) error {
	req := engine.Request{Owner: w.owner, ThreadID: th.id, Kind: engine.TurnRegenerate}
	if w.rng.IntN(3) == 0 {
		req.Multitask = engine.MultitaskInterrupt
	}
	p := w.newProc("regen", true)
	p.script = w.timed(p, w.script(p))
	w.tracef("%s: regenerate on %s steps=%d", p.name, th.id, len(p.script))
	return w.turn(p, th, req)
}

// newMessage is a user message of th never sent before.
func (w *world) newMessage(th *simThread) postedMsg {
	th.msgs++
	m := postedMsg{id: fmt.Sprintf("%s-m%d", th.id, th.msgs), text: fmt.Sprintf("hello %d", w.rng.IntN(1000))}
	th.posted = append(th.posted, m)
	return m
}

// turn is a POST /chat: Begin, then (when it returned a Turn) Stream to its end.
func (w *world) turn(p *proc, th *simThread, req engine.Request) error {
	gen := th.gen
	if req.Message != nil {
		p.ownMsg = req.Message.ID // before the process starts: read under w.mu by its writes
	}
	w.pickHost(p, th)
	w.mu.Lock()
	p.threadID = th.id
	w.mu.Unlock()
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseBegin), procKey{}, p)
		t, err := p.eng.Begin(ctx, req)
		userMsg := req.Kind == engine.TurnSubmit && req.Message.Role == agent.RoleUser
		queued := err == nil && t.Queued() != nil
		w.mu.Lock()
		p.beginErr = err
		if err == nil {
			p.turn, p.modelRun = t, p.runID
		}
		if queued && !p.dead {
			w.acceptQueued(p, th, gen, t.Queued())
		} else if err == nil && !p.dead {
			p.uwChan = userWriteOf(t)
			p.expectUW = !p.uwChan.IsNil()
			if userMsg {
				th.accepted = append(th.accepted, acceptedMsg{id: req.Message.ID, gen: gen, at: w.event(), proc: p})
				w.stats.accepted++
			}
		}
		expect, dead, listed := p.expectUW, p.dead, p.listedOK
		w.mu.Unlock()
		if queued {
			q := t.Queued()
			w.tracef("  %s: begin -> queued %s at position %d (created=%v)", p.name, q.MessageID, q.Position, q.Created)
			return
		}
		w.tracef("  %s: begin -> %s", p.name, errStr(err))
		if userMsg && listed && !dead {
			w.checkEditLadder(p, req, err)
		}
		if p.tampered && err == nil {
			w.violate("answer-ladder", "%s: an answer whose input differs from the signed one was accepted", p.name)
		}
		if err != nil {
			return
		}
		if expect {
			// Begin started the user-message write beside the stream; wait until it reached the store's door, or
			// the goroutine ended without a store call: its claim was in doubt already (time mode: the claim's
			// retries backed off past its horizon, which counts from the claim's first attempt), and the engine
			// asks the claim's age before it writes.
			w.awaitUserWrite(p)
		}
		var client bytes.Buffer
		run := t.Stream(withPhase(ctx, phaseStream), &client)
		w.afterStream(p, run)
	})
}

// afterStream checks that a run that stopped itself as fenced really had lost its claim (or was in doubt, which
// the sim predicts from the virtual clock): a retried write that is refused although its first attempt applied
// must not make a healthy run give up ("retries converge", DESIGN principle 3).
//
// A process that died has no outcome: its run's stream can still end, in its own time, when its engine gives up
// the tool call the crash left hanging (its guard finds the claim in doubt once the clock moved), and nothing it
// does then may show in the trace or the checks (seed 98: "stream -> failed" in one replay and not the next).
func (w *world) afterStream(p *proc, run agent.Run) {
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return
	}
	p.result = &run
	doubt := p.inDoubt
	w.mu.Unlock()
	w.tracef("  %s: stream -> %s %v", p.name, run.Status, run.Error)
	if run.Error == nil || run.Error.Code != agent.CodeRunFenced || doubt || p.isDead() {
		return
	}
	c, ok := w.claimOf(run.ThreadID)
	if ok && c != nil && c.RunID == run.ID && c.Epoch == run.Epoch {
		w.violate("retries-converge", "%s: run %s stopped as fenced while it still held its claim and was not in doubt", p.name, run.ID)
	}
}

func (w *world) stop(th *simThread) error {
	p := w.newProc("stop", true)
	runID := ""
	if w.rng.IntN(3) == 0 {
		w.mu.Lock()
		for i := len(w.procs) - 1; i >= 0; i-- {
			if w.procs[i].runID != "" {
				runID = w.procs[i].runID
				break
			}
		}
		w.mu.Unlock()
	}
	w.tracef("%s: stop %s run=%q", p.name, th.id, runID)
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		id, err := p.svc.Stop(ctx, w.owner, th.id, runID)
		w.tracef("  %s: stop -> %s %s", p.name, id, errStr(err))
	})
}

// threadDeleted: messages accepted before a delete that applied are gone with their thread.
func (w *world) threadDeleted(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.threads {
		if t.id == id {
			t.gen++
		}
	}
}

func (w *world) deleteThread(th *simThread) error {
	p := w.newProc("delete", true)
	w.tracef("%s: delete %s", p.name, th.id)
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		err := p.svc.Delete(ctx, w.owner, th.id)
		w.tracef("  %s: delete -> %s", p.name, errStr(err))
	})
}

// reap is a reaper sweep; stale first moves the clock past staleAfter (the scheduled reaper of a dead run).
func (w *world) reap(stale bool) error {
	if stale {
		if err := w.beforeClock(w.ecfg.StaleAfter + w.smallAdvance()); err != nil {
			return err
		}
	}
	p := w.newProc("reaper", true)
	w.tracef("%s: tick", p.name)
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		st, err := p.reaper.Tick(ctx)
		w.tracef("  %s: tick -> %+v %s", p.name, st, errStr(err))
	})
}

// drain runs every live process to its end: pending user writes first, then grants in creation order; a
// process waiting for a claim held by a dead run gets there once time passes beyond staleAfter.
func (w *world) drain() error {
	w.tracef("drain")
	for _, kp := range w.heldBatches() {
		if err := w.batchArrives(kp); err != nil {
			return err
		}
	}
	for round := 0; ; round++ {
		if round > 2000 {
			return fmt.Errorf("sim: drain did not finish")
		}
		for _, p := range w.pendingUWs() {
			if p.isDead() {
				continue
			}
			if err := w.advanceUW(p); err != nil {
				return err
			}
		}
		ps := w.liveMains()
		if len(ps) == 0 && len(w.pendingUWs()) == 0 {
			return nil
		}
		waiting := 0
		for _, p := range ps {
			w.mu.Lock()
			claimWait := p.parkedAt == "claim retry" || p.kind == "reader" && p.parkedAt == "poll"
			w.mu.Unlock()
			if claimWait {
				waiting++
			}
			if err := w.advanceMain(p); err != nil {
				return err
			}
		}
		if waiting == len(ps) && waiting > 0 && round%4 == 3 {
			// A process that claimed in this round may have its user-message goroutine parked still.
			if err := w.beforeClock(w.ecfg.StaleAfter + time.Second); err != nil {
				return err
			}
		}
	}
}

// quiesce lets time pass beyond staleAfter and sweeps with a reaper that never fails, until no claim is left.
func (w *world) quiesce() error {
	w.tracef("quiesce")
	for i := 0; i < 6; i++ {
		if err := w.advanceClock(w.ecfg.StaleAfter + time.Second); err != nil {
			return err
		}
		p := w.newProc("final-reaper", false)
		p.faultRate = 0
		var st struct{ n int }
		if err := w.start(p, func() {
			ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
			s, err := p.reaper.Tick(ctx)
			st.n = s.Nominated
			w.tracef("  %s: tick -> %+v %s", p.name, s, errStr(err))
		}); err != nil {
			return err
		}
		if st.n == 0 {
			break
		}
	}
	// Then every thread is read once, as a client would (GET /threads/{id} and its runs): a read finishes what a
	// reaper that died half way left (a run no claim names any more), which no sweep can find (DESIGN "Reaper":
	// the routine also runs lazily when a thread is read).
	p := w.newProc("final-reader", false)
	p.faultRate = 0
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		for _, th := range w.threads {
			v, gerr := p.svc.Get(ctx, w.owner, th.id)
			if gerr == nil {
				w.mu.Lock()
				w.views[th.id] = v
				w.mu.Unlock()
			}
			_, rerr := p.svc.Runs(ctx, w.owner, th.id)
			w.tracef("  %s: read %s -> %s %s", p.name, th.id, errStr(gerr), errStr(rerr))
		}
	})
}

// checkEditLadder is the rule for a user message whose id is stored already (DESIGN "edits"): the newest message
// sent again unchanged runs again; with other content it is an edit when it is the newest user message or the
// request names it (messageId); an older one sent again, unchanged or not, without messageId, and an id taken by
// an assistant message, are refused as duplicate_message. Begin's own listing decides.
func (w *world) checkEditLadder(p *proc, req engine.Request, err error) {
	w.mu.Lock()
	msgs := agent.Visible(slices.Clone(p.listing))
	w.mu.Unlock()
	m, edit := *req.Message, req.MessageID != ""
	newestUser := -1
	for i, old := range msgs {
		if old.Role == agent.RoleUser {
			newestUser = i
		}
	}
	want := false
	for i, old := range msgs {
		if old.ID != m.ID {
			continue
		}
		same := sameJSONParts(old.Parts, m.Parts)
		switch {
		case old.Role != agent.RoleUser:
			want = true
		case same && i == len(msgs)-1:
		case same && !edit, !edit && i != newestUser:
			want = true
		}
	}
	if got := errors.Is(err, agent.ErrDuplicateMessage); got != want {
		w.violate("edit-ladder", "%s: post of %s (edit=%v): duplicate_message expected %v, begin -> %s", p.name, m.ID, edit, want, errStr(err))
	}
}

func sameJSONParts(a, b []json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !jsonEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// mustSigner is the approval signer of a schedule (the key only has to be the same for every process).
func mustSigner() *interrupts.Signer {
	s, err := interrupts.NewSigner([]byte("sim application secret"))
	if err != nil {
		panic(err)
	}
	return s
}
