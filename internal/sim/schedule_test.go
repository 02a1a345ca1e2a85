package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/interrupts"
)

// simConfig is the engine configuration of every simulated process. Heartbeat and CancelPoll tick in real time
// (the engine takes no ticker), fast, but their store calls pass only when the scheduler arms one (procStore), so
// they are schedule steps like any other. SegmentFlush is switched off (hours): segments are then written only at
// step ends and at the end of the stream, while the run waits. InterruptWait and FinishRetry are real-time
// deadlines; hours, so that no outcome depends on how fast the machine is.
func simConfig() engine.Config {
	return engine.Config{Model: "sim-model", MaxSteps: 4, RunTimeout: 10 * time.Hour, ToolTimeout: 10 * time.Hour,
		Heartbeat: time.Millisecond, CancelPoll: time.Millisecond, StaleAfter: 30 * time.Second,
		InterruptWait: 10 * time.Hour, FinishRetry: 10 * time.Hour, SegmentFlush: 10 * time.Hour}
}

func newWorld(seed uint64, base agent.Store, gaps bool) *world {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	w := &world{seed: seed, rng: r, base: base, ecfg: simConfig(), gaps: gaps, signer: mustSigner(),
		clock:   &vclock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(seed%100000) * time.Hour)},
		ids:     &seqIDs{prefix: fmt.Sprintf("s%dx", seed)},
		owner:   fmt.Sprintf("user%d", seed),
		reports: make(chan report, 16), released: make(chan struct{}),
		faults: map[string]int{}, segTries: map[string]int{}, effects: map[string]int{}}
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
	return w
}

// run plays the schedule: ops interleaved with grants, guard ticks and clock moves, then a drain (every live
// process runs to its end), then a quiesce (time passes beyond staleAfter and a clean reaper sweeps until no
// claim is left). It returns an error only for a failure of the sim itself; invariant violations are collected.
func (w *world) run() error {
	w.tracef("seed=%d plan=%+v threads=%d", w.seed, w.plan, len(w.threads))
	ops := 4 + w.rng.IntN(12)
	for steps := 0; ops > 0 || steps < 10; steps++ {
		if steps > 400 {
			break
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
				k := callHeartbeat
				if w.rng.IntN(5) < 2 {
					k = callPoll
				}
				err = w.guardTick(p, k)
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
			err = w.op()
		}
		if err != nil {
			return err
		}
	}
	if err := w.drain(); err != nil {
		return err
	}
	return w.quiesce()
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

// beforeClock advances the clock. Unless the sim explores the known gaps, a user-message write still parked is
// let through before its run's claim can be in doubt (the engine does not check its claim before that write:
// see the report).
func (w *world) beforeClock(d time.Duration) error {
	if !w.gaps {
		now := w.clock.Now().Add(d)
		for _, p := range w.pendingUWs() {
			w.mu.Lock()
			risky := now.Sub(p.lastOK) > w.ecfg.StaleAfter/2
			w.mu.Unlock()
			for risky && w.uwPending(p) {
				if err := w.advanceUW(p); err != nil {
					return err
				}
			}
		}
	}
	return w.advanceClock(d)
}

// op starts one operation in a new process.
func (w *world) op() error {
	w.stats.ops++
	th := w.threads[w.rng.IntN(len(w.threads))]
	switch c := w.rng.IntN(100); {
	case c < 55:
		return w.post(th)
	case c < 67:
		return w.regenerate(th)
	case c < 80:
		return w.stop(th)
	case c < 87:
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

func (w *world) post(th *simThread) error {
	var m postedMsg
	dup := len(th.posted) > 0 && w.rng.IntN(5) == 0
	if dup {
		m = th.posted[w.rng.IntN(len(th.posted))]
		if w.rng.IntN(4) == 0 {
			m.text += " (edited)" // the same id with other content: refused as duplicate_message
		}
	} else {
		th.msgs++
		m = postedMsg{id: fmt.Sprintf("%s-m%d", th.id, th.msgs), text: fmt.Sprintf("hello %d", w.rng.IntN(1000))}
		th.posted = append(th.posted, m)
	}
	mt := engine.MultitaskReject
	if w.rng.IntN(4) == 0 {
		mt = engine.MultitaskInterrupt
	}
	req := engine.Request{Owner: w.owner, ThreadID: th.id, Kind: engine.TurnSubmit, Multitask: mt,
		Message: &agent.Message{ID: m.id, Role: agent.RoleUser, Parts: []json.RawMessage{textPart(m.text)}}}
	p := w.newProc("post", true)
	p.script = newScript(p.rng, w.ecfg.MaxSteps)
	w.tracef("%s: post %s %q to %s (interrupt=%v) steps=%d", p.name, m.id, m.text, th.id, mt == engine.MultitaskInterrupt, len(p.script))
	return w.turn(p, th, req)
}

func (w *world) regenerate(th *simThread) error {
	req := engine.Request{Owner: w.owner, ThreadID: th.id, Kind: engine.TurnRegenerate}
	if w.rng.IntN(3) == 0 {
		req.Multitask = engine.MultitaskInterrupt
	}
	p := w.newProc("regen", true)
	p.script = newScript(p.rng, w.ecfg.MaxSteps)
	w.tracef("%s: regenerate on %s steps=%d", p.name, th.id, len(p.script))
	return w.turn(p, th, req)
}

// turn is a POST /chat: Begin, then (when it returned a Turn) Stream to its end.
func (w *world) turn(p *proc, th *simThread, req engine.Request) error {
	gen := th.gen
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseBegin), procKey{}, p)
		t, err := p.eng.Begin(ctx, req)
		w.mu.Lock()
		p.beginErr = err
		if err == nil && !p.dead {
			p.expectUW = req.Kind == engine.TurnSubmit && !slices.Contains(p.listing, req.Message.ID)
			if req.Kind == engine.TurnSubmit {
				th.accepted = append(th.accepted, acceptedMsg{id: req.Message.ID, gen: gen, proc: p})
				w.stats.accepted++
			}
		}
		expect := p.expectUW
		w.mu.Unlock()
		w.tracef("  %s: begin -> %s", p.name, errStr(err))
		if err != nil {
			return
		}
		if expect {
			// Begin started the user-message write beside the stream; wait until it reached the store's door.
			select {
			case <-p.uwArrived:
			case <-time.After(30 * time.Second):
				w.violate("sim", "%s: the user message write never came", p.name)
			}
		}
		var client bytes.Buffer
		run := t.Stream(withPhase(ctx, phaseStream), &client)
		w.afterStream(p, run)
	})
}

// afterStream checks that a run that stopped itself as fenced really had lost its claim (or was in doubt, which
// the sim predicts from the virtual clock): a retried write that is refused although its first attempt applied
// must not make a healthy run give up ("retries converge", DESIGN principle 3).
func (w *world) afterStream(p *proc, run agent.Run) {
	w.mu.Lock()
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
			claimWait := p.parkedAt == "claim retry"
			w.mu.Unlock()
			if claimWait {
				waiting++
			}
			if err := w.advanceMain(p); err != nil {
				return err
			}
		}
		if waiting == len(ps) && waiting > 0 && round%4 == 3 {
			if err := w.advanceClock(w.ecfg.StaleAfter + time.Second); err != nil {
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
			_, gerr := p.svc.Get(ctx, w.owner, th.id)
			_, rerr := p.svc.Runs(ctx, w.owner, th.id)
			w.tracef("  %s: read %s -> %s %s", p.name, th.id, errStr(gerr), errStr(rerr))
		}
	})
}

// mustSigner is the approval signer of a schedule (the key only has to be the same for every process).
func mustSigner() *interrupts.Signer {
	s, err := interrupts.NewSigner([]byte("sim application secret"))
	if err != nil {
		panic(err)
	}
	return s
}
