package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/threads"
)

// vclock is the virtual clock: it moves only when the scheduler advances it, so "time passing" (heartbeats
// going stale, a claim in doubt, the reaper's cutoff) happens at chosen points of a schedule.
type vclock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *vclock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d).Truncate(time.Millisecond)
}

// seqIDs makes ids that are unique per schedule and sort in creation order (ListRuns orders ties by id).
type seqIDs struct {
	mu     sync.Mutex
	prefix string
	n      int
}

func (s *seqIDs) New(prefix string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	return fmt.Sprintf("%s_%s%05d", prefix, s.prefix, s.n)
}

type repKind int

const (
	repParked   repKind = iota + 1 // the main goroutine parked (in the model, or before a claim retry)
	repDone                        // the main goroutine returned
	repDead                        // the process crashed
	repUWParked                    // the user-message goroutine parked at its next store call
)

type report struct {
	p    *proc
	kind repKind
}

// plan is the per-schedule dial of the fault mix, drawn from the seed.
type plan struct {
	crashProb   float64
	crashWindow int
	faultyProcs float64
	faultRate   float64
	lostFrac    float64
	delayProb   float64
}

// world is one schedule: the underlying store, the virtual clock, the processes, and what the checks need.
type world struct {
	windowNote string // the window mode's note in the trace (windowMode)
	seed       uint64
	rng        *rand.Rand
	base       agent.Store
	clock      *vclock
	ids        *seqIDs
	ecfg       engine.Config
	// signer signs the approval requests of the schedule's runs.
	signer *interrupts.Signer
	plan   plan
	owner  string
	gaps   bool // explore the windows the engine is known not to close (see the report in sim_test.go)

	reports  chan report
	released chan struct{} // closed when the schedule is over: dead processes' calls return errDead

	mu       sync.Mutex
	nextProc int
	procs    []*proc
	threads  []*simThread
	trace    []string
	violates []string
	faults   map[string]int
	segTries map[string]int
	effects  map[string]int          // applied PutValue count per ns/key
	refused  int                     // own-fence writes the store refused as run_fenced (the fence working)
	events   int                     // acceptances and drops, in order
	views    map[string]threads.View // what the final reader got for each thread
	stats    stats

	// Jobs mode (jobs_test.go): the schedule dispatches jobs and queues messages.
	jobsOn   bool
	contract agent.JobContract
	kinds    jobs.Registry
	jobs     *simJobs
	execs    []*execution // what the Jobs port recorded, in order
	bounds   jobBounds    // the jobs-mode caps (bounds_test.go)
	readers  readerState  // stream readers (readers_test.go)
}

// simThread is what the sim knows of one thread of the schedule.
type simThread struct {
	id       string
	gen      int // bumped by every successful delete
	msgs     int
	posted   []postedMsg
	accepted []acceptedMsg
	dropped  map[string]int // message id → the event of the edit that last dropped it
	answers  []answerReq    // the answers sent so far (a client may send one again)
	enqueued []queuedMsg    // the messages posts queued (202)
}

type postedMsg struct {
	id, text string
}

type acceptedMsg struct {
	id   string
	gen  int
	at   int // the event of the acceptance (world.event)
	proc *proc
}

// sentAnswer is one call's answer in an answering request.
type sentAnswer struct {
	status agent.InterruptStatus // approved, denied or answered
	text   string                // what the model should read for a client tool's answer
}

type stats struct {
	ops, crashes, accepted int
	asked, answers         int // interrupts created; answering requests sent
	interrupts             int // interrupts stored after the quiesce
	listed                 int // of those, the ones readers list as waiting
	resolved               map[agent.InterruptStatus]int
	jobs                   jobStats
}

// over reports whether the schedule is over: dead processes' goroutines, let go, may still run a little (their
// store calls return errDead), and nothing they do is recorded.
func (w *world) over() bool {
	select {
	case <-w.released:
		return true
	default:
		return false
	}
}

// release ends the schedule: dead processes' calls return errDead from now on. Under w.mu, so that whatever
// tracef and violate record came before it.
func (w *world) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.released)
}

func (w *world) tracef(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over() {
		return
	}
	w.trace = append(w.trace, fmt.Sprintf(format, args...))
}

func (w *world) violate(inv, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over() {
		return
	}
	w.violates = append(w.violates, inv+": "+fmt.Sprintf(format, args...))
}

func (w *world) countFault(method string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.faults[method]++
}

func (w *world) firstSegmentAttempt(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.segTries[key]++
	return w.segTries[key] == 1
}

func (w *world) valuePut(ns, key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.effects[ns+"\x00"+key]++
}

// event numbers acceptances and drops of user messages (w.mu held).
func (w *world) event() int {
	w.events++
	return w.events
}

// messageDropped: an edit dropped message id (the messages after the edited one go, deliberately).
func (w *world) messageDropped(threadID, id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.threads {
		if t.id == threadID {
			if t.dropped == nil {
				t.dropped = map[string]int{}
			}
			t.dropped[id] = w.event()
		}
	}
}

// interruptResolved notes a resolution that applied: this process's own answers, and the schedule's counts.
func (w *world) interruptResolved(p *proc, in agent.Interrupt) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stats.resolved == nil {
		w.stats.resolved = map[agent.InterruptStatus]int{}
	}
	w.stats.resolved[in.Status]++
	switch in.Status {
	case agent.InterruptApproved, agent.InterruptDenied, agent.InterruptAnswered:
		if p.resolved == nil {
			p.resolved = map[string]agent.InterruptStatus{}
		}
		p.resolved[in.ToolCallID] = in.Status
	}
}

func (w *world) ours(threadID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.threads {
		if t.id == threadID {
			return true
		}
	}
	return false
}

// threadOf reads the thread from the underlying store (never faulted); ok is false when it does not exist.
func (w *world) threadOf(threadID string) (agent.Thread, bool) {
	th, err := w.base.GetThread(context.Background(), threadID)
	return th, err == nil
}

func (w *world) claimOf(threadID string) (*agent.Claim, bool) {
	th, ok := w.threadOf(threadID)
	return th.ActiveRun, ok
}

// checkOwnWrite is invariant "at most one run's writes take effect per thread at a time": a write a run makes
// under its own fence may take effect only while the thread's claim names that run at that epoch, or after the
// run released the claim itself and before anyone claimed again (the engine hides a regenerated reply after its
// FinishRun). The check runs in the process's own goroutine, between the read of the thread and the write,
// while every other process is parked, so nothing can change the claim in between.
func (w *world) checkOwnWrite(p *proc, method, detail string, f agent.Fence, threadID string, before agent.Thread, exists bool, err error) {
	if errors.Is(err, agent.ErrRunFenced) {
		w.mu.Lock()
		w.refused++
		w.mu.Unlock()
		return
	}
	c := before.ActiveRun
	ours := exists && c != nil && c.RunID == f.RunID && c.Epoch == f.Epoch
	if err != nil {
		return
	}
	w.mu.Lock()
	noop := method == "PutMessage" && p.noopWrite
	w.mu.Unlock()
	if noop {
		return
	}
	if ours {
		if method == "FinishRun" {
			w.mu.Lock()
			p.releasedOwn = true
			w.mu.Unlock()
		}
		return
	}
	w.mu.Lock()
	afterOwnRelease := p.releasedOwn && exists && c == nil && before.Epoch == f.Epoch
	w.mu.Unlock()
	if afterOwnRelease {
		return
	}
	claim := "none"
	if !exists {
		claim = "thread gone"
	} else if c != nil {
		claim = fmt.Sprintf("%s@%d", c.RunID, c.Epoch)
	}
	w.violate("one-writer", "%s: %s by run %s@%d took effect on thread %s while the claim was %s (thread epoch %d): %s", p.name, method, f.RunID, f.Epoch, threadID, claim, before.Epoch, detail)
}

// await waits for p's next report. Only p runs, so any other report is a bug in the sim.
func (w *world) await(p *proc, want ...repKind) (repKind, error) {
	select {
	case r := <-w.reports:
		if r.p != p {
			return 0, fmt.Errorf("sim: report %d from %s while advancing %s", r.kind, r.p.name, p.name)
		}
		ok := false
		for _, k := range want {
			ok = ok || k == r.kind
		}
		if !ok {
			return 0, fmt.Errorf("sim: unexpected report %d from %s (want %v)", r.kind, p.name, want)
		}
		w.mu.Lock()
		switch r.kind {
		case repDone:
			p.done = true
		case repDead:
			w.stats.crashes++
		}
		w.mu.Unlock()
		return r.kind, nil
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("sim: %s did not report within 30s (deadlock; parked at %q)", p.name, p.parkedAt)
	}
}

// start runs fn as p's main goroutine and waits for its first report.
func (w *world) start(p *proc, fn func()) error {
	go func() {
		fn()
		p.report(repDone)
	}()
	_, err := w.await(p, repParked, repDone, repDead)
	return err
}

// advanceMain grants p's main goroutine until its next report. When that grant may end the run loop, the
// user-message write goes first: the engine waits for it then, invisibly to the sim.
func (w *world) advanceMain(p *proc) error {
	for w.uwPending(p) && p.mayFinish() {
		if err := w.advanceUW(p); err != nil {
			return err
		}
	}
	if p.isDead() {
		return nil
	}
	p.resume <- struct{}{}
	_, err := w.await(p, repParked, repDone, repDead)
	return err
}

func (w *world) uwPending(p *proc) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.uwPending && !p.dead
}

// advanceUW lets the parked call of the user-message goroutine reach the store, and waits until the goroutine
// parks at its next call (a retry, or the next write of what the turn closes, or the user message) or is over.
// It is over once it has sent its result, which the engine gives no other sign of: the sim watches the result
// channel (userWriteOf). That wait ends whatever the Go scheduler does; only its length does not.
func (w *world) advanceUW(p *proc) error {
	p.uwResume <- struct{}{}
	deadline := time.Now().Add(30 * time.Second)
	nap := 20 * time.Microsecond
	for spins := 0; ; spins++ {
		select {
		case r := <-w.reports:
			if r.p != p || (r.kind != repUWParked && r.kind != repDead) {
				return fmt.Errorf("sim: report %d from %s while the user-message goroutine of %s runs", r.kind, r.p.name, p.name)
			}
			if r.kind == repDead {
				w.mu.Lock()
				w.stats.crashes++
				w.mu.Unlock()
			}
			return nil
		default:
		}
		if p.uwOver() {
			w.mu.Lock()
			p.uwDone = true
			w.mu.Unlock()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: the user-message goroutine of %s neither parked nor ended within 30s", p.name)
		}
		if spins < 200 {
			runtime.Gosched() // the goroutine is usually a moment from its end (or its next call)
			continue
		}
		time.Sleep(nap) // an engine retry's backoff (20 ms and up)
		nap = min(2*nap, time.Millisecond)
	}
}

// guardTick lets one heartbeat (or one cancel poll) of p's guard reach the store, then waits until the guard
// handled the answer: it ticks again (and is refused), or the run's context is canceled.
func (w *world) guardTick(p *proc, k callKind) error {
	w.mu.Lock()
	p.armed[k] = true
	p.awaitSettle[k] = true
	p.settled = make(chan struct{})
	p.guardDone = make(chan error, 1)
	ctx, settled, done := p.runCtx, p.settled, p.guardDone
	w.mu.Unlock()
	timeout := time.After(30 * time.Second)
	select {
	case err := <-done:
		w.tracef("  %s: guard %v -> %s", p.name, kindName(k), errStr(err))
	case r := <-w.reports:
		if r.p != p || r.kind != repDead {
			return fmt.Errorf("sim: report %d from %s during a guard tick of %s", r.kind, r.p.name, p.name)
		}
		w.mu.Lock()
		w.stats.crashes++
		w.mu.Unlock()
		return nil
	case <-ctx.Done():
		// The guard stopped before its next tick reached the store (in doubt): nothing was called.
		w.mu.Lock()
		p.armed[k], p.awaitSettle[k] = false, false
		w.mu.Unlock()
		return nil
	case <-timeout:
		return fmt.Errorf("sim: guard of %s never ticked", p.name)
	}
	select {
	case <-settled:
	case <-ctx.Done():
		w.mu.Lock()
		p.awaitSettle[k] = false
		w.mu.Unlock()
	case <-timeout:
		return fmt.Errorf("sim: guard of %s did not settle", p.name)
	}
	return nil
}

func kindName(k callKind) string {
	if k == callHeartbeat {
		return "heartbeat"
	}
	return "cancel poll"
}

// advanceClock moves virtual time on. A streaming run whose last accepted heartbeat is now more than half of
// staleAfter ago stops itself (its guard ticks in real time and finds it in doubt); the sim waits for that, so
// the next step sees the run stopped, whatever the Go scheduler did.
func (w *world) advanceClock(d time.Duration) error {
	// Who will be in doubt is decided before the clock moves: the guards read it in real time, and one may stop
	// its run before the sim looked.
	now := w.clock.Now().Add(d).Truncate(time.Millisecond)
	var doubt []context.Context
	for _, p := range w.procs {
		w.mu.Lock()
		// A run already stopping (canceled) is in doubt too: its final writes check the claim's age first.
		// A run that has not asked the model yet (a continuation running its approved tool, its draft write held
		// in flight) is in doubt too: its next write asks the gate first (seed 721 on dynalite, -gaps).
		if !p.dead && !p.done && (p.runCtx != nil || p.runID != "") && now.Sub(p.lastOK) > w.ecfg.StaleAfter/2 {
			p.inDoubt = true
			if p.runCtx != nil && p.runCtx.Err() == nil && !p.loopEnded {
				doubt = append(doubt, p.runCtx)
			}
		}
		w.mu.Unlock()
	}
	w.clock.advance(d)
	w.tracef("clock +%s -> %s", d, now.Format("15:04:05.000"))
	for _, ctx := range doubt {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return fmt.Errorf("sim: a run did not stop itself in doubt")
		}
	}
	return nil
}

// live lists the processes the scheduler can still advance, in creation order.
func (w *world) liveMains() []*proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ps []*proc
	for _, p := range w.procs {
		if !p.dead && !p.done {
			ps = append(ps, p)
		}
	}
	return ps
}

func (w *world) pendingUWs() []*proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ps []*proc
	for _, p := range w.procs {
		if !p.dead && p.uwPending {
			ps = append(ps, p)
		}
	}
	return ps
}

func (w *world) liveStreams() []*proc {
	var ps []*proc
	for _, p := range w.liveMains() {
		if p.liveStream() {
			ps = append(ps, p)
		}
	}
	return ps
}

func (w *world) dump() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, l := range w.trace {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	fs := make([]string, 0, len(w.faults))
	for k, v := range w.faults {
		fs = append(fs, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(fs)
	fmt.Fprintf(&b, "faults: %s\n", strings.Join(fs, " "))
	return b.String()
}
