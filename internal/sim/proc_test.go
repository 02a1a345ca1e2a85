package sim

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/threads"
)

// proc is one simulated process: a Lambda invocation (a POST /chat, a stop, a delete, a reaper sweep) with its
// own engine, reaper, tools and threads service over its own procStore. Processes never share memory, only the
// store, exactly as invocations of the deployed system do; a crash kills one process.
//
// A process is a coroutine of the scheduler: its goroutines run only between a grant and the process's next
// report (parked, done, dead), so at any moment at most one process touches the store and the order of every
// store call of a schedule is a function of the seed.
type proc struct {
	w    *world
	id   int
	kind string // post, answer, regen, stop, delete, reaper, final-reaper, final-reader
	name string
	rng  *rand.Rand // fault decisions, drawn once per counted store call, in order

	eng    *engine.Engine
	reaper *reaper.Reaper
	svc    *threads.Service
	tasks  *jobs.Tasks // the job tasks (jobs mode)
	// delivers: the process runs a delivery task (jobs.Tasks.Deliver). The sim never holds its turn (Drain runs
	// BeginQueued and Stream), so it cannot tell when the turn's user-message goroutine is over: that goroutine's
	// calls are not parked, and the turn's first model step makes no handoff. Until the goroutine is over the
	// run makes no store call of its own (every one of them waits for it: Turn.awaitUser), so its calls come in
	// program order, and the process's next handoff comes after them.
	delivers bool
	store    *procStore
	script   []stepScript // the model's replies, step by step (post and regenerate processes)

	resume    chan struct{} // grants the main goroutine (parked in the model, a claim retry or a backoff)
	toolCh    chan struct{} // wakes the slow tool that parked last (time mode) when its time is up
	uwResume  chan struct{} // grants the user-message write
	uwArrived chan struct{} // closed when the user-message write first reaches the store
	// hold, while the process's slow tool is parked and the scheduler moves the clock or ticks its guard, keeps
	// the process from going on alone when its engine gives the tool up: the engine's log line of that tool
	// (toolLog) waits for it. The scheduler then lets such processes go on one at a time (world.goOn).
	hold chan struct{}

	// Fault plan.
	crashAt    int // the store call (from 1) that kills the process; 0: never
	crashAfter bool
	faultRate  float64
	delayProb  float64 // of a run's own writes, the share held in flight
	noopWrite  bool    // the PutMessage being made rewrites what is stored, byte for byte
	lostFrac   float64 // of injected write faults, the share that hit after the write applied
	crashable  bool
	// faultRng draws what the fault plan added after the seeds were first drawn (its own stream, so p.rng draws
	// what it drew before): how many transient faults in a row a method may get (maxStreak), and whether an
	// injected fault is permanent (a store error no retry passes).
	faultRng  *rand.Rand
	maxStreak int
	// Request-level faults (DynamoDB, requests_test.go): the process's requests draw fates from reqRng at
	// reqRate while reqCall (the store call being made) is set; reqN counts that call's requests.
	reqRng    *rand.Rand
	reqRate   float64
	reqCall   string
	reqN      int
	reqStreak int // faults in a row on the call's requests

	// Everything below is guarded by w.mu.
	calls        int
	consecFaults map[string]int
	dead         bool
	done         bool // the main goroutine returned
	parkedAt     string
	claims       int
	runID        string
	run          agent.Run
	listing      []agent.Message // the messages Begin's ListMessages returned
	listedOK     bool
	expectUW     bool          // Begin started a user-message goroutine (Turn.apply)
	uwChan       reflect.Value // its result channel (userWriteOf)
	uwSeen       bool
	uwPending    bool
	uwDone       bool                             // the goroutine is over
	uwApplied    bool                             // the store answered ok to its write of the user message
	ownMsg       string                           // the request's user message id (queued ones the turn takes are others)
	resolved     map[string]agent.InterruptStatus // tool call id → the answer this process's Begin resolved it with
	sent         map[string]sentAnswer            // tool call id → the answer this process's request carries
	toolsRunning map[string]context.Context       // the tools running, by call id, with their contexts
	tampered     bool                             // the request's answer changes a signed input
	runCtx       context.Context                  // the run's context, as the model received it
	lastOK       time.Time                        // the guard's view: claim time or last accepted heartbeat
	step         int                              // model calls so far
	nextEndsLoop bool                             // the model's next grant returns a result that ends the run loop
	armed        map[callKind]bool
	awaitSettle  map[callKind]bool
	settled      chan struct{}
	guardDone    chan error
	toolGates    map[string]chan struct{}
	toolNext     map[string]string
	releasedOwn  bool   // the run's own FinishRun released its claim
	loopEnded    bool   // the run loop is over (its guard stopped): a final write, FinishRun or DeleteMessage came
	claimTried   bool   // a delivery pass made its first ClaimRun
	askedAtClaim string // a delivery pass's claim found the newest message waiting for a person (jobscheck_test.go)
	passUser     bool   // that pass stored a queued user message (which closes the question, as a new message does)
	inDoubt      bool   // the sim expects the guard to stop the run as in doubt
	result       *agent.Run
	beginErr     error
	enqueued     *agent.QueuedMessage // what this process's last Enqueue stored (or found)
	enqueuedAt   int                  // the event of the first Enqueue of that message that applied (jobs_test.go acceptQueued)
	freshID      bool                 // the process posts a message id never posted before
	// wakeAt is when the process parked in a backoff or a slow tool means to go on (time mode); toolCtx is that
	// tool's context (the engine cancels it when it gives the tool up).
	wakeAt  time.Time
	toolCtx context.Context
	// The engine's waits for the tools of its step (lib/engine stepper.executeOne: one goroutine per tool, each
	// on a timer at the tool timeout and one at the claim's horizon), observed rather than predicted (time
	// mode). A step's waits are all made before any tool runs (toolStarted of the stepWaits its step has: the
	// calls that execute, less those the engine logged as not run), at one moment, so they share their timers'
	// deadlines (toolTimeoutAt, toolHorizonAt); a horizon timer that fires wakes each wait, which either gives
	// the tool up (the claim is in doubt: its agent.tool line, toolLog) or re-arms it at once, to the same new
	// deadline. toolWaits is how many wait, toolOwed how many reactions to a fired horizon timer the scheduler
	// still waits for, toolGiven the waits that gave their tool up (their log line) so far, givenAtHold that
	// count when the scheduler held the process.
	toolWaits, toolStarted, stepWaits int
	toolTimeoutAt, toolHorizonAt      time.Time
	toolTimerNext                     bool // the step's toolDeadline made its timeout timer; its horizon timer is next
	toolOwed, toolGiven, givenAtHold  int
	stepCalls                         map[string]bool // the step's calls that execute
	// keptAt is when the store last confirmed the run's claim: its claim, or a heartbeat it accepted (one that
	// answers run_canceled too). The engine's horizon is half of staleAfter past it, or past an earlier moment
	// (the claim's first attempt): see checkHorizon.
	keptAt time.Time
	// claimFrom is the time of the first of the ClaimRun attempts that answered only transient errors so far: the
	// engine counts its claim from there (one of them may have applied), and in time mode their backoff may take
	// long enough to leave the claim in doubt at once.
	claimFrom time.Time
	// Shared keepers (keeper_test.go, shared mode): host is the process whose keeper keeps this one's runs (nil:
	// its own), guests the processes whose runs its keeper keeps; both are one process for a crash. keepRng draws
	// a host's per-claim faults and held batches; threadID is the thread of a turn process.
	host     *proc
	guests   []*proc
	keepRng  *rand.Rand
	threadID string
	// turn is the process's Turn once Begin returned one (its guard's batches in flight: inflightOf); batchGo
	// lets a host's batch held in flight arrive (nil: none is held).
	turn    *engine.Turn
	batchGo chan struct{}
	// modelRun is the run of a turn process's Begin, then of the pass chained in its stream; chainStep is one
	// more than the process's first model step of that pass (0: none). See modelCalled.
	modelRun  string
	chainStep int
}

func (w *world) newProc(name string, crashable bool) *proc {
	w.nextProc++
	p := &proc{w: w, id: w.nextProc, kind: name, name: name, resume: make(chan struct{}), uwResume: make(chan struct{}),
		uwArrived: make(chan struct{}), consecFaults: map[string]int{}, armed: map[callKind]bool{},
		awaitSettle: map[callKind]bool{}}
	p.name = name + "#" + itoa(p.id)
	p.rng = rand.New(rand.NewPCG(w.seed, uint64(p.id)))
	if crashable && w.rng.Float64() < w.plan.crashProb {
		p.crashAt = 1 + w.rng.IntN(w.plan.crashWindow)
		p.crashAfter = w.rng.IntN(2) == 0
	}
	if w.rng.Float64() < w.plan.faultyProcs {
		p.faultRate = w.plan.faultRate
		p.lostFrac = w.plan.lostFrac
	}
	if crashable {
		p.delayProb = w.plan.delayProb
	}
	p.faultRng = rand.New(rand.NewPCG(w.seed^0x737472656b, uint64(p.id)))
	p.maxStreak = []int{2, 2, 2, 3, 4}[p.faultRng.IntN(5)]
	p.drawRequestFaults(crashable)
	base := w.base
	if ps, ok := w.base.(procStores); ok {
		base = ps.forProc(p)
	}
	p.store = &procStore{Store: base, p: p}
	tools := w.toolset(p)
	// Outside jobs mode the engine and the reaper get no Jobs port: they then make no job or queue calls, and a
	// schedule drawn before jobs existed replays as it did.
	var js agent.Jobs
	if w.jobsOn {
		js = w.jobs
	}
	p.reaper = reaper.New(reaper.Deps{Store: p.store, Tools: tools, Jobs: js, Clock: w.clock},
		reaper.Config{StaleAfter: w.ecfg.StaleAfter, DeliveryGrace: w.contract.DeliveryGrace})
	p.eng = engine.New(engine.Deps{Store: p.store, Model: simModel{}, Tools: tools, Reaper: p.reaper, Clock: procClock{w.clock, p}, IDs: w.ids, Signer: w.signer, Jobs: js,
		Logger: slog.New(toolLog{p})}, w.ecfg)
	p.svc = threads.New(threads.Deps{Store: p.store, Reaper: p.reaper, Clock: w.clock}, threads.Config{StaleAfter: w.ecfg.StaleAfter})
	if w.jobsOn {
		// One delivery turn per pass (DrainTurns 1): a process runs at most one run; the pass hands the rest to a
		// new pass (a recorded wake), as Drain does at its bound.
		p.tasks = jobs.NewTasks(jobs.Deps{Store: p.store, Model: subagentModel{}, Kinds: w.kinds, Engine: p.eng, Jobs: js, Clock: w.clock, Limits: p.store},
			jobs.Config{Contract: w.contract, DrainTurns: 1})
	}
	w.procs = append(w.procs, p)
	if p.crashAt > 0 || p.faultRate > 0 {
		w.tracef("  %s: crashAt=%d after=%v faultRate=%.2f", p.name, p.crashAt, p.crashAfter, p.faultRate)
	}
	if p.reqRate > 0 {
		w.tracef("  %s: requestFaultRate=%.2f", p.name, p.reqRate)
	}
	return p
}

func (p *proc) isDead() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.dead
}

// parkDead blocks a dead process's call until the schedule is over (a dead Lambda's calls never return).
func (p *proc) parkDead() error {
	<-p.w.released
	return errDead
}

func (p *proc) die() {
	p.w.mu.Lock()
	p.dead = true
	var also []string
	for _, q := range p.group() {
		// One process with p (shared keepers): parked, or done, it dies with p and reports nothing.
		if q != p && !q.dead {
			q.dead = true
			also = append(also, q.name)
		}
	}
	p.w.mu.Unlock()
	if len(also) > 0 {
		p.w.tracef("  %s: dies with %s (one process)", strings.Join(also, ", "), p.name)
	}
	p.w.reports <- report{p, repDead}
}

// report tells the scheduler where the process stopped. A dead process reports nothing more.
func (p *proc) report(k repKind) {
	p.w.mu.Lock()
	dead := p.dead
	p.w.mu.Unlock()
	if dead {
		return
	}
	p.w.reports <- report{p, k}
}

// parkMain parks the main goroutine until the scheduler grants it; false when the process died meanwhile.
func (p *proc) parkMain(where string) bool {
	w := p.w
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return false
	}
	p.parkedAt = where
	w.mu.Unlock()
	w.reports <- report{p, repParked}
	select {
	case <-p.resume:
		return true
	case <-w.released:
		return false
	}
}

// parkUntil parks a goroutine of the process until the scheduler lets it go on at wake (virtual time, time
// mode): the main goroutine in a retry's backoff (granted through resume), or a slow tool (woken through
// toolCh; tool is its context, which the scheduler watches: world.advanceClock). false when the process died
// or the schedule ended meanwhile.
func (p *proc) parkUntil(where string, wake time.Time, tool context.Context) bool {
	w := p.w
	w.mu.Lock()
	if p.dead || w.over() {
		// Dead, or the schedule is over (a tool queued behind one its engine gave up is let go then): nothing
		// parks, and nothing is counted after the schedule's stats were taken.
		w.mu.Unlock()
		return false
	}
	p.parkedAt, p.wakeAt, p.toolCtx = where, wake, tool
	if tool != nil {
		w.stats.time.slowTools++
	} else {
		w.stats.time.backoffs++
	}
	next := p.resume
	if tool != nil {
		// Its own channel: a tool the engine gave up stays parked on the one it had, and is never woken.
		p.toolCh = make(chan struct{})
		next = p.toolCh
	}
	w.mu.Unlock()
	w.reports <- report{p, repParked}
	select {
	case <-next:
		return true
	case <-w.released:
		return false
	}
}

// parkUserWrite parks the user-message write: the scheduler decides when it reaches the store relative to the
// model's events (the engine runs it beside the first model request).
func (p *proc) parkUserWrite() bool {
	w := p.w
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return false
	}
	p.uwPending = true
	first := !p.uwSeen
	p.uwSeen = true
	w.mu.Unlock()
	if first {
		close(p.uwArrived) // the scheduler is still inside the main goroutine's advance: no report
	} else {
		w.reports <- report{p, repUWParked}
	}
	select {
	case <-p.uwResume:
		w.mu.Lock()
		p.uwPending = false
		w.mu.Unlock()
		return true
	case <-w.released:
		return false
	}
}

// nextCall counts a store call and draws its fate.
//
// reqOK tells whether the call's DynamoDB requests may draw faults of their own (requests_test.go): a write that
// got no fault of its own.
func (p *proc) nextCall(method string, write, final bool) (n int, crash, after, fault, lost, reqOK bool) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	p.calls++
	n = p.calls
	r1, r2 := p.rng.Float64(), p.rng.Float64()
	if p.crashAt == n {
		return n, true, p.crashAfter, false, false, false
	}
	// At most maxStreak (two to four) faults in a row per method: the engine's retries (real-time backoff, 20 ms
	// doubling) then succeed. Permanent faults (callD) end a retry loop at once.
	if write && r1 < p.faultRate && p.consecFaults[method] < p.maxStreak {
		p.consecFaults[method]++
		return n, false, false, true, r2 < p.lostFrac, false
	}
	p.consecFaults[method] = 0
	return n, false, false, false, false, write
}

// slow decides whether the process pauses after a call of the queue's races (jobs mode only, so that schedules
// without jobs draw what they drew before), and lets the scheduler run others meanwhile: after a delivery pass's
// last read before its claim (what it read of the queue and the interrupts gets old), after a delivery task's
// read of its job (before the steer's Enqueue), and after an Enqueue (a turn may claim, or end, before the
// enqueuer reads the thread again). The pause comes between two calls: a call is instantaneous in virtual time
// (the engine stamps it just before), time passes between calls.
//
// A tool's call never pauses (its draw is made all the same, so the schedule draws what it drew): the engine
// waits for its tools on timers of its own (the tool timeout, the claim's horizon), and a tool paused while the
// clock moved past one of them was given up by its engine, whose process then went on alone, unscheduled (seed
// 4167367679133362216: a delivery pass's research tool, paused after the read of its job, reported while
// another process was advanced).
func (p *proc) slow(ctx context.Context, method string, kind callKind) bool {
	deliver := phaseOf(ctx) == phaseDeliver
	if method == "ClaimRun" && deliver {
		p.w.mu.Lock()
		p.claimTried = true
		p.w.mu.Unlock()
	}
	if !p.w.jobsOn || kind != callPlain {
		return false
	}
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	switch {
	case p.dead:
		return false
	case method == "Enqueue", deliver && method == "GetJob", deliver && method == "ListMessageInterrupts" && !p.claimTried:
		return p.rng.IntN(4) == 0 && goroutineEntry() != entryTool
	}
	return false
}

// entryTool is where the goroutine of a tool call starts (lib/engine stepper.executeOne runs the tool on one).
const entryTool = fnExecuteOne + ".func1"

// delayed decides whether a run's own write is held in flight, and notes when the run loop is over.
func (p *proc) delayed(method string, final bool) bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	if method == "FinishRun" || method == "DeleteMessage" || (method == "PutMessage" && final) {
		p.loopEnded = true // these come after guard.stop (interrupts are stored before it)
	}
	// Any of them may be held. The run's FinishRun: it releases the claim first, on condition that the claim is
	// still the run's (fence C), so one that lands after a reap or a later claim is refused whole. A message's
	// first write: the reaper stubs or fences every id the dead run can still create before it reads anything,
	// and SQLite checks the claim in the write's transaction (fence B). An edit's DeleteMessage: the edit commits
	// in its one write on the edited message (fence D), the deletes are cleanup.
	return p.rng.Float64() < p.delayProb
}

// takeArm lets one guard call through when the scheduler armed it. The first unarmed call after an armed one
// proves the guard goroutine handled the armed call's result (it loops to its next tick only afterwards).
func (p *proc) takeArm(k callKind) bool {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.dead {
		return false
	}
	if p.armed[k] {
		p.armed[k] = false
		return true
	}
	if p.awaitSettle[k] {
		p.awaitSettle[k] = false
		close(p.settled)
	}
	return false
}

// afterCall hands a guard call's answer to the scheduler. (After a call of the user-message goroutine, its next
// call parks again, or the goroutine ends: world.awaitUW tells which.)
func (p *proc) afterCall(k callKind, err error) {
	switch k {
	case callHeartbeat, callPoll:
		p.guardDone <- err
	}
}

// userWriteOf is the channel on which the turn's user-message goroutine (Turn.apply) reports that it is over:
// it is nil when the turn started none, and holds the goroutine's result until the run loop takes it (the
// engine offers no other sign that the goroutine ended, and the scheduler must know: see world.awaitUW).
func userWriteOf(t *engine.Turn) reflect.Value {
	v := reflect.ValueOf(t).Elem().FieldByName("userWrite")
	if !v.IsValid() || v.Kind() != reflect.Chan {
		panic("sim: engine.Turn has no userWrite channel any more: update userWriteOf and world.awaitUW")
	}
	return v
}

// uwOver reports whether the user-message goroutine has sent its result (and so makes no more store calls).
func (p *proc) uwOver() bool {
	p.w.mu.Lock()
	ch := p.uwChan
	p.w.mu.Unlock()
	return ch.IsValid() && !ch.IsNil() && ch.Len() > 0
}

// streaming reports whether a call of the process's run is made by its run loop (Turn.Stream), where its own
// writes may be held in flight: the Stream phase, or a delivery pass's turn once it asked the model (and not
// from the goroutine that stores what the turn takes).
func (p *proc) streaming(ctx context.Context, kind callKind) bool {
	switch phaseOf(ctx) {
	case phaseStream:
		return kind != callUserWrite // not a chained pass's user-message goroutine (modelCalled)
	case phaseDeliver:
		p.w.mu.Lock()
		defer p.w.mu.Unlock()
		return p.runCtx != nil && kind != callUserWrite
	}
	return false
}

func (p *proc) ownRun() string {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.runID
}

func (p *proc) claimed(r agent.Run) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.runID, p.run = r.ID, r
	now := p.w.clock.Now()
	p.lastOK = cmp.Or(p.claimFrom, now)
	p.keptAt = p.lastOK
	if now.Sub(p.lastOK) > p.w.ecfg.StaleAfter/2 {
		p.inDoubt = true
	}
}

func (p *proc) heartbeatOK(now time.Time) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.lastOK = now
	p.keptAt = now
}

// heartbeatKept: a heartbeat answered run_canceled was recorded (the claim is good, the run asked to stop).
func (p *proc) heartbeatKept(now time.Time) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.keptAt = now
}

func (p *proc) listed(rs []agent.MessageRecord) {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	p.listing = p.listing[:0]
	for _, r := range rs {
		p.listing = append(p.listing, r.Message)
	}
	p.listedOK = true
}

// modelCalled records the run's context and step for the scheduler, and sets up the tool turnstile of the
// step: server tools run one after another in call order (the engine starts them concurrently; the sim
// serializes them so their store calls keep a deterministic order).
func (p *proc) modelCalled(ctx context.Context, sc stepScript) int {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if p.turn != nil && p.modelRun != p.runID {
		// A delivery pass the run chained in this process (engine Turn.coalesce: an answer-only turn whose
		// steers wait). Its user-message goroutine (what the pass takes) starts beside its first model request,
		// from the stream's context, and the sim holds no Turn of it: its calls are not parked, as a delivery
		// task's are not (proc.delivers), and its first step makes no handoff, so they come in program order
		// before the process's next handoff. Its guard is the run the scheduler now ticks.
		p.modelRun, p.chainStep = p.runID, p.step+1
		if p.runCtx != nil {
			p.runCtx = ctx
		}
	}
	if p.runCtx == nil {
		p.runCtx = ctx
		// The engine's horizon counts from the claim (proc.claimed), not from the stream's start: the clock may
		// have moved in between (a user-message write parked, a backoff). A run with no claim of its own seen
		// here starts its guard now.
		if p.lastOK.IsZero() {
			p.lastOK = w.clock.Now()
		}
	}
	step := p.step
	p.step++
	// The gates of earlier steps stay (call ids are unique per process): a step whose slow tool its engine gave
	// up goes on without it, and a later tool of that step whose goroutine reaches its turn only now must still
	// wait behind the given-up one, for good (TestToolTurnKeepsEarlierSteps).
	if p.toolGates == nil {
		p.toolGates, p.toolNext = map[string]chan struct{}{}, map[string]string{}
	}
	prev := ""
	p.stepCalls, p.toolStarted, p.stepWaits = map[string]bool{}, 0, 0
	for i, c := range sc.calls {
		if !c.executes() {
			continue
		}
		id := callID(p.id, step, i)
		p.stepCalls[id] = true
		p.stepWaits++
		p.toolGates[id] = make(chan struct{})
		if prev == "" {
			close(p.toolGates[id])
		} else {
			p.toolNext[prev] = id
		}
		prev = id
	}
	return step
}

// toolTurn waits until the call may run; the returned func lets the next one go. A call with no gate (an
// approved call, which its continuation runs before any model step) runs at once: at most one runs per process
// (see asks), which toolTurn checks.
func (p *proc) toolTurn(ctx context.Context, callID string) func() {
	p.w.mu.Lock()
	gate := p.toolGates[callID]
	p.w.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-p.w.released:
			// The schedule is over (its process died with the call before this one in hand): the call reaches
			// no store (errDead), and nothing is checked any more.
			return func() {}
		}
	}
	p.w.mu.Lock()
	racing := false
	for _, other := range p.toolsRunning {
		// A slow tool the engine gave up (its context canceled) stays parked and never reaches the store.
		racing = racing || other.Err() == nil
	}
	if p.toolsRunning == nil {
		p.toolsRunning = map[string]context.Context{}
	}
	p.toolsRunning[callID] = ctx
	p.w.mu.Unlock()
	if racing {
		p.w.violate("sim", "%s: tool call %s runs beside another one of the process: their store calls race", p.name, callID)
	}
	return func() {
		p.w.mu.Lock()
		defer p.w.mu.Unlock()
		delete(p.toolsRunning, callID)
		if next, ok := p.toolNext[callID]; ok {
			close(p.toolGates[next])
		}
	}
}

func (p *proc) liveStream() bool {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	return !p.dead && !p.done && p.runCtx != nil && p.runCtx.Err() == nil && p.parkedAt == "model"
}

// mayFinish reports whether the next grant of the main goroutine may end a model step (or the run loop), after
// which the engine waits for the user-message write (so that write must not be parked then).
func (p *proc) mayFinish() bool {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.runCtx != nil && (p.runCtx.Err() != nil || p.nextEndsLoop || p.parkedAt == "in flight" || p.parkedAt == "backoff")
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// TestToolTurnKeepsEarlierSteps: a step whose slow tool the engine gave up goes on to the next model step while
// the step's later tools may not have reached their turn yet (their goroutines start when the Go scheduler gets
// to them: under load, after the next step began). Such a tool must still wait behind the given-up one, which
// never returns: it must not find its gate gone and run at once, beside the next step's tools and unscheduled
// (seed 398 under load: "tool call call_9_1_1 runs beside another one of the process"; the same would let a
// crash report come while the scheduler advances another process, as seed 191 did).
func TestToolTurnKeepsEarlierSteps(t *testing.T) {
	w := &world{clock: &vclock{}, released: make(chan struct{})}
	p := &proc{w: w, id: 9}
	ctx := context.Background()
	two := stepScript{calls: []callScript{{"sim_slow", `{"ms":20000}`}, {"sim_effect", `{}`}}}
	p.modelCalled(ctx, two)
	first, second := callID(p.id, 0, 0), callID(p.id, 0, 1)
	p.toolTurn(ctx, first) // runs, and is given up: it never returns, so its next is never called
	p.modelCalled(ctx, stepScript{calls: []callScript{{"sim_effect", `{}`}}})
	w.mu.Lock()
	gate := p.toolGates[second]
	w.mu.Unlock()
	if gate == nil {
		t.Fatalf("the gate of %s is gone once the next step began: the call would run at once", second)
	}
	select {
	case <-gate:
		t.Fatalf("%s may run although %s never returned", second, first)
	default:
	}
}

// toolTimer notes a timer of the engine's tool waits (procClock.After): the timeout or horizon timer toolDeadline
// makes for each tool of a step, or a wait's re-armed horizon timer (a reaction the scheduler may be waiting for).
func (p *proc) toolTimer(rearm bool, d time.Duration) {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	at := w.clock.Now().Add(d)
	switch {
	case rearm:
		p.toolHorizonAt = at
		p.toolOwed = max(p.toolOwed-1, 0)
	case !p.toolTimerNext:
		p.toolTimeoutAt, p.toolTimerNext = at, true
	default:
		p.toolHorizonAt, p.toolTimerNext = at, false
		p.toolWaits++
		p.toolStarted++
		if d <= 0 {
			p.toolOwed++ // due at once (the tool starts at its horizon): the wait wakes before it waits
		}
	}
}

// engineToolTimeout is the outcome of the engine's agent.tool line of a tool its wait gave up (lib/engine toolTimeout).
const engineToolTimeout = "timeout"

// toolLogged notes the engine's agent.tool line of one call: a wait that is over (its tool returned, or it gave
// it up while the scheduler holds the process), or a call of the step the engine does not run (runTools).
// It returns the process's hold, which the line waits for.
func (p *proc) toolLogged(r slog.Record, waited bool) chan struct{} {
	w := p.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if waited {
		p.toolWaits--
		p.toolOwed = max(p.toolOwed-1, 0)
		if p.toolWaits == 0 {
			p.toolOwed = 0
		}
		// Only a line that says the wait gave its tool up counts (outcome timeout): the line of a tool that
		// returned may come late, once the next tool (which its return let go) parked and the scheduler holds the
		// process (seed 2844585748674190591 under load: post#4's fast tool's "ok" line, counted as a give-up,
		// made the scheduler await a report that never came).
		outcome := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "outcome" {
				outcome = a.Value.String()
			}
			return true
		})
		if p.hold != nil && outcome == engineToolTimeout {
			p.toolGiven++
		}
		return p.hold
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "tool_call_id" && p.stepCalls[a.Value.String()] {
			p.stepWaits--
		}
		return true
	})
	return p.hold
}

// awaitStepWaits waits until the engine made the waits of every tool of the step (a slow tool parks only then:
// until then the engine may still be making them, and the clock must not move under it). False when the schedule
// is over.
func (p *proc) awaitStepWaits() bool {
	w := p.w
	deadline := time.Now().Add(30 * time.Second)
	for spins := 0; ; spins++ {
		w.mu.Lock()
		ok := p.toolStarted >= p.stepWaits && !p.toolTimerNext
		w.mu.Unlock()
		if ok {
			return true
		}
		if w.over() {
			return false
		}
		if time.Now().After(deadline) {
			w.violate("sim", "%s: the engine did not make the waits of its step's tools within 30s", p.name)
			return true
		}
		if spins < 200 {
			runtime.Gosched()
			continue
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// TestLateToolLineIsNoGiveUp: the agent.tool line of a tool that returned may come once the next tool of its step
// (which its return let go) parked and the scheduler holds the process; it is not a give-up (seed
// 2844585748674190591 under load), only a timeout line is.
func TestLateToolLineIsNoGiveUp(t *testing.T) {
	w := &world{clock: &vclock{}, released: make(chan struct{})}
	p := &proc{w: w, id: 4, toolWaits: 2, hold: make(chan struct{})}
	line := func(outcome string) slog.Record {
		r := slog.NewRecord(time.Time{}, slog.LevelInfo, "agent.tool", 0)
		r.AddAttrs(slog.String("tool_call_id", callID(p.id, 0, 0)), slog.String("outcome", outcome))
		return r
	}
	p.toolLogged(line("ok"), true)
	if p.toolGiven != 0 {
		t.Fatalf("a returned tool's late line counted as a give-up (toolGiven %d)", p.toolGiven)
	}
	p.toolLogged(line(engineToolTimeout), true)
	if p.toolGiven != 1 || p.toolWaits != 0 {
		t.Fatalf("a timeout line: toolGiven %d, toolWaits %d; want 1, 0", p.toolGiven, p.toolWaits)
	}
}
