package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/threads"
)

// vclock is the virtual clock: it moves only when the scheduler advances it, so "time passing" (heartbeats
// going stale, a claim in doubt, the reaper's cutoff, a retry's backoff, a tool's timeout) happens at chosen
// points of a schedule. It is also the engine's timers (agent.Timers, through each process's procClock): a timer
// or a context deadline made from it fires inside advance, in the scheduler's goroutine, before anyone can read
// the new time, so whatever it wakes sees the same world in every replay.
type vclock struct {
	mu      sync.Mutex
	t       time.Time
	next    int
	waiters map[int]vwaiter
}

// vwaiter is one timer of the virtual clock: fire runs once the clock reaches at.
type vwaiter struct {
	at   time.Time
	fire func()
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
	var due []int
	for id, wt := range c.waiters {
		if !wt.at.After(c.t) {
			due = append(due, id)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		a, b := c.waiters[due[i]], c.waiters[due[j]]
		if !a.at.Equal(b.at) {
			return a.at.Before(b.at)
		}
		return due[i] < due[j]
	})
	for _, id := range due {
		wt := c.waiters[id]
		delete(c.waiters, id)
		wt.fire() // under mu: a channel send or a context cancel, neither of which reads the clock
	}
}

// at registers fire for d from now (at once when d <= 0); the returned func forgets it.
func (c *vclock) at(d time.Duration, fire func()) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d <= 0 {
		fire()
		return func() {}
	}
	if c.waiters == nil {
		c.waiters = map[int]vwaiter{}
	}
	c.next++
	id := c.next
	c.waiters[id] = vwaiter{at: c.t.Add(d), fire: fire}
	return func() {
		c.mu.Lock()
		delete(c.waiters, id)
		c.mu.Unlock()
	}
}

// Sleep is virtual time passing for whoever sleeps: only the scheduler moves the clock, so a sleep on the bare
// clock returns at once (see procClock.Sleep for the retries the scheduler waits out).
func (c *vclock) Sleep(ctx context.Context, d time.Duration) error { return ctx.Err() }

func (c *vclock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.at(d, func() { ch <- c.t })
	return ch
}

func (c *vclock) WithTimeoutCause(ctx context.Context, d time.Duration, cause error) (context.Context, context.CancelFunc) {
	inner, cancel := context.WithCancelCause(ctx)
	vd := &vdeadline{Context: inner}
	c.mu.Lock()
	vd.at = c.t.Add(d)
	c.mu.Unlock()
	forget := c.at(d, func() {
		if inner.Err() == nil {
			vd.expired.Store(true)
			cancel(cmp.Or(cause, context.DeadlineExceeded))
		}
	})
	return vd, func() { forget(); cancel(context.Canceled) }
}

// vdeadline is a context canceled at a virtual deadline: Err says DeadlineExceeded then, as a real deadline's
// does (a tool that returns its context's error timed out). It shows no Deadline: a store adapter would count
// that in real time.
type vdeadline struct {
	context.Context
	at      time.Time
	expired atomic.Bool
}

func (c *vdeadline) Err() error {
	if err := c.Context.Err(); err != nil && c.expired.Load() {
		return context.DeadlineExceeded
	}
	return c.Context.Err()
}

// procClock is the clock of one process's engine: the virtual clock, with the waits the scheduler orders.
//   - A retry's backoff (Engine.retry) in the process's main goroutine, in time mode, parks the process
//     ("backoff"); granting it moves the clock on to the end of the backoff, and meanwhile the scheduler may do
//     anything else (move the clock past the claim's horizon, reap the run). Any other sleep returns at once (no
//     virtual time passes), and once the schedule is over every sleep ends its retry loop (errDead).
//   - The keeper's ticks (the process's batched heartbeat, lib/engine keeper.go) stay on real time: each batch
//     reaches the store only when the scheduler arms it (world.guardTick), so they order nothing.
type procClock struct {
	*vclock
	p *proc
}

const (
	fnRetry      = "github.com/agentloop/agentloop/lib/engine.(*Engine).retry"
	fnKeeperLoop = "github.com/agentloop/agentloop/lib/engine.(*keeper).loop"
	// The engine's wait for one tool (its goroutine), and where it makes that wait's timers.
	fnExecuteOne   = "github.com/agentloop/agentloop/lib/engine.(*stepper).executeOne"
	fnToolDeadline = "github.com/agentloop/agentloop/lib/engine.(*stepper).toolDeadline"
	simPackage     = "github.com/agentloop/agentloop/internal/sim."
)

func (c procClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.p.w.over() {
		// A dead process's goroutines, let go, get errDead from every call: their retries must end, not spin
		// (a sleep that returns at once would make them a busy loop against the store for good).
		return errDead
	}
	if !c.p.w.timeOn || callerOf(1) != fnRetry || !strings.HasPrefix(goroutineEntry(), simPackage) {
		return nil
	}
	if !c.p.parkUntil("backoff", c.Now().Add(d), nil) {
		return c.p.parkDead()
	}
	return ctx.Err()
}

func (c procClock) After(d time.Duration) <-chan time.Time {
	switch caller := callerOf(1); caller {
	case fnKeeperLoop:
		return time.After(d)
	case fnToolDeadline, fnExecuteOne:
		c.p.toolTimer(caller == fnExecuteOne, d)
	}
	return c.vclock.After(d)
}

// callerOf is the function skip frames above its caller.
func callerOf(skip int) string {
	pc, _, _, ok := runtime.Caller(skip + 1)
	if !ok {
		return ""
	}
	return runtime.FuncForPC(pc).Name()
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
	repParked    repKind = iota + 1 // the main goroutine parked (in the model, or before a claim retry)
	repDone                         // the main goroutine returned
	repDead                         // the process crashed
	repUWParked                     // the user-message goroutine parked at its next store call
	repBatchHeld                    // the keeper's batch is held in flight (shared mode, keeper_test.go)
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
	timeOn bool // time mode: time passes inside retries and tools (timeMode)
	// Shared mode (keeper_test.go): turn processes may share a keeper; shareRng draws who, from its own stream.
	sharedOn bool
	shareRng *rand.Rand

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
	time                   timeStats
	shared                 sharedStats
}

// timeStats counts what time mode exercised: schedules, retries' backoffs the scheduler waited out, slow tools
// started, and of those the ones their engine gave up (past their timeout, or their claim in doubt).
type timeStats struct {
	schedules, backoffs, slowTools, givenUp int
}

func (a *timeStats) add(b timeStats) {
	a.schedules += b.schedules
	a.backoffs += b.backoffs
	a.slowTools += b.slowTools
	a.givenUp += b.givenUp
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
	if method == "FinishRun" && ours {
		// The run's own release is the moment it stops holding the thread, whatever its FinishRun answered. On
		// DynamoDB FinishRun is two writes (infra/DYNAMODB.md, fence C): "thread first: the release ... Then the
		// run: status = running AND epoch = :epoch", and a retry after a lost answer records the outcome "if
		// the thread is idle at the run's own epoch (our own release, applied by an attempt whose answer was
		// lost: every takeover and claim moves the epoch)". So a call may release and still fail (its outcome
		// write lost its answers), and the engine's next FinishRun writes the outcome with no claim naming the
		// run: allowed while the thread is still idle at the run's epoch (afterOwnRelease below). The thread is
		// read again here, while every other process is parked: idle at our epoch now, ours before the call,
		// means this call's release applied.
		if after, ok := w.threadOf(threadID); ok && after.ActiveRun == nil && after.Epoch == f.Epoch {
			w.mu.Lock()
			p.releasedOwn = true
			w.mu.Unlock()
		}
	}
	if err != nil {
		return
	}
	w.mu.Lock()
	noop := method == "PutMessage" && p.noopWrite
	w.mu.Unlock()
	if noop {
		return
	}
	w.checkHorizon(p, method, detail, f)
	if ours {
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

// checkHorizon is invariant "no fenced write lands after its claim's horizon" (DESIGN principle 8, fence E):
// a write a run makes under its own fence takes effect (the store answered ok, and it changed something) at
// most half of staleAfter after the store last confirmed the run's claim, in virtual time. The sim's moment is
// never earlier than the engine's (a claim that took several attempts counts from its first one), so the check
// can miss a write, never blame a good one.
func (w *world) checkHorizon(p *proc, method, detail string, f agent.Fence) {
	w.mu.Lock()
	kept := p.keptAt
	w.mu.Unlock()
	if now := w.clock.Now(); !kept.IsZero() && now.After(kept.Add(w.ecfg.StaleAfter/2)) {
		w.violate("horizon", "%s: %s by run %s@%d took effect at %s, %s after the store last confirmed its claim (horizon %s): %s", p.name,
			method, f.RunID, f.Epoch, now.Format("15:04:05.000"), now.Sub(kept), w.ecfg.StaleAfter/2, detail)
	}
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
	// A run of a keeper whose batch is held may end its loop in this grant, and leaving the keeper waits for the
	// batch (keeper.leave): the batch arrives first.
	if err := w.arriveFirst(p); err != nil {
		return err
	}
	for w.uwPending(p) && p.mayFinish() {
		if err := w.advanceUW(p); err != nil {
			return err
		}
	}
	w.mu.Lock()
	at, wake, over := p.parkedAt, p.wakeAt, p.dead || p.done
	w.mu.Unlock()
	if over {
		// Nothing to grant: it died, or it went on to its end when the clock moved since the caller listed it
		// (its engine gave its slow tool up: goOn awaited it).
		return nil
	}
	switch at {
	case "tool":
		return w.advanceTool(p)
	case "backoff":
		// Time passes inside the retry loop: the clock moves on to the end of the backoff (the scheduler may
		// have moved it further meanwhile, or reaped the run).
		if now := w.clock.Now(); wake.After(now) {
			w.tracef("  %s: backoff %s", p.name, wake.Sub(now))
			if err := w.beforeClock(wake.Sub(now)); err != nil {
				return err
			}
		}
	}
	select {
	case p.resume <- struct{}{}:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("sim: %s does not take its grant (deadlock; parked at %q)", p.name, at)
	}
	_, err := w.await(p, repParked, repDone, repDead)
	return err
}

// advanceTool grants a process whose slow tool runs (time mode): the clock moves on, to the end of the tool's
// time, or first to its timeout or just past its run's horizon when those come sooner. Past either the engine
// gives the tool up (advanceClock waits for the process to go on without it); otherwise the tool is woken, does
// its effect and returns.
func (w *world) advanceTool(p *proc) error {
	for {
		w.mu.Lock()
		still := !p.dead && p.parkedAt == "tool"
		wake, tctx, horizon := p.wakeAt, p.toolCtx, p.lastOK.Add(w.ecfg.StaleAfter/2+time.Millisecond)
		w.mu.Unlock()
		if !still {
			return nil
		}
		now := w.clock.Now()
		if !wake.After(now) {
			break
		}
		target := wake
		if vd, ok := tctx.(*vdeadline); ok && vd.at.Before(target) {
			target = vd.at
		}
		if horizon.Before(target) {
			target = horizon
		}
		if !target.After(now) {
			target = wake
		}
		w.tracef("  %s: its tool runs on %s", p.name, target.Sub(now))
		if err := w.beforeClock(target.Sub(now)); err != nil {
			return err
		}
	}
	w.mu.Lock()
	p.parkedAt = "tool done"
	wake := p.toolCh
	w.mu.Unlock()
	wake <- struct{}{}
	_, err := w.await(p, repParked, repDone, repDead)
	return err
}

// holdTools holds every live process whose slow tool is parked (time mode), before the scheduler moves the clock
// or ticks a guard: either may make its engine give the tool up (its timeout passes, its claim falls in doubt or
// is lost), and the process would then go on at once, beside any other that did too. Held, it waits in the
// engine's log line of the tool (toolLog) until goOn lets it go. A wait woken when its tool started (at the
// claim's horizon to the millisecond) has re-armed its timer first.
func (w *world) holdTools(ps ...*proc) ([]*proc, error) {
	w.mu.Lock()
	var held []*proc
	for _, p := range ps {
		if !p.dead && p.parkedAt == "tool" && p.toolCtx != nil && p.hold == nil {
			p.hold = make(chan struct{})
			p.givenAtHold = p.toolGiven
			held = append(held, p)
		}
	}
	w.mu.Unlock()
	return held, w.awaitReactions(held)
}

// awaitReactions waits until the tool waits of the held processes have reacted to their fired horizon timers
// (proc.toolOwed): each re-armed its timer, or one gave its tool up. Nothing else wakes them while they are held:
// their tool timeout is known (and certain), a stop does not end a wait, and a guard that loses the claim (a tick
// the scheduler armed) cancels the run, which goOn sees.
func (w *world) awaitReactions(held []*proc) error {
	deadline := time.Now().Add(30 * time.Second)
	for spins := 0; ; spins++ {
		w.mu.Lock()
		var late *proc
		for _, p := range held {
			if !p.dead && p.toolOwed > 0 && p.toolGiven == p.givenAtHold {
				late = p
				break
			}
		}
		w.mu.Unlock()
		if late == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sim: the tool waits of %s did not react to their horizon timer within 30s", late.name)
		}
		if spins < 200 {
			runtime.Gosched()
			continue
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// goOn lets the held processes go, one at a time in creation order: one whose engine gave its slow tool up goes
// on to its next report before the next one is let go; the tool itself stays parked and never reaches the store.
// The engine gives a tool up at its timeout (the tool's context's virtual deadline, which its timer shares), or
// once its guard lost the claim or found it in doubt: seen, not predicted (gaveUp). A stop cancels the run too,
// but the engine still waits for the tool.
func (w *world) goOn(held []*proc) error {
	for _, p := range held {
		w.mu.Lock()
		gone := !p.dead && p.parkedAt == "tool" && w.gaveUp(p)
		if gone {
			p.parkedAt = "tool given up"
			w.stats.time.givenUp++
		}
		hold := p.hold
		p.hold = nil
		w.mu.Unlock()
		close(hold)
		if gone {
			// No trace line: the process's writes are traced.
			if _, err := w.await(p, repParked, repDone, repDead); err != nil {
				return err
			}
		}
	}
	return nil
}

// gaveUp is whether p's engine gives up p's parked slow tool now (under w.mu): its timeout has passed (certain:
// the wait's timer and the tool's context share that deadline), or a wait of the step gave its tool up while the
// process was held (its horizon timer fired and the claim was in doubt: awaitReactions waited for that), or the
// guard lost the claim (a tick the scheduler armed was refused, or found the claim gone: the guard closes what
// the waits wait on, then cancels the run with that cause).
func (w *world) gaveUp(p *proc) bool {
	if vd, ok := p.toolCtx.(*vdeadline); ok && !vd.at.After(w.clock.Now()) {
		return true
	}
	if p.toolGiven > p.givenAtHold {
		return true
	}
	if p.toolCtx.Err() == nil {
		return false
	}
	cause := context.Cause(p.toolCtx)
	return cause != nil && (strings.HasPrefix(cause.Error(), engineFenced) || strings.HasPrefix(cause.Error(), engineInDoubt))
}

// The texts of the engine's causes for a run whose guard lost the claim (lib/engine errFenced, errInDoubt).
const (
	engineFenced  = "run fenced:"
	engineInDoubt = "run's claim in doubt:"
)

// toolLog is a process's engine's logger: it drops every record, and holds the engine's log line of a tool call
// while the scheduler holds the process (proc.hold): the engine writes it once the tool is over or given up,
// before it goes on.
type toolLog struct{ p *proc }

func (toolLog) Enabled(context.Context, slog.Level) bool { return true }
func (h toolLog) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h toolLog) WithGroup(string) slog.Handler          { return h }

func (h toolLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "agent.tool" {
		return nil
	}
	w := h.p.w
	if hold := h.p.toolLogged(r, goroutineEntry() == fnExecuteOne); hold != nil {
		select {
		case <-hold:
		case <-w.released:
		}
	}
	return nil
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

// awaitUserWrite waits until the user-message goroutine Begin started reached the store (it parks there), or
// ended without reaching it (its result waits on its channel: nothing takes it before the stream starts).
func (w *world) awaitUserWrite(p *proc) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.uwArrived:
			return
		case <-time.After(50 * time.Microsecond):
		}
		if p.uwOver() {
			w.mu.Lock()
			p.uwDone = true
			w.mu.Unlock()
			w.tracef("  %s: the user message is not written (the claim is in doubt)", p.name)
			return
		}
		if time.Now().After(deadline) {
			w.violate("sim", "%s: the user message write never came", p.name)
			return
		}
	}
}

// guardTick lets one heartbeat (or one cancel poll) of p's guard reach the store, then waits until the guard
// handled the answer: it ticks again (and is refused), or the run's context is canceled. p's heartbeat is its
// keeper's batch: in shared mode (keeper_test.go) its host's, which carries the claims of the whole group.
func (w *world) guardTick(p *proc, k callKind) error {
	if k == callHeartbeat && p.keeperProc().batchHeld() {
		// Its keeper is inside a batch (held in flight): the tick is that batch's arrival.
		return w.batchArrives(p.keeperProc())
	}
	// A heartbeat refused, or a poll that finds the claim gone, makes the engine give up a slow tool.
	held, err := w.holdTools(p.group()...)
	if err != nil {
		return err
	}
	if err := w.guardTickOnce(p, k); err != nil {
		return err
	}
	if kp := p.keeperProc(); k == callHeartbeat && kp.batchHeld() && len(held) == 0 && w.shareRng.IntN(2) == 0 {
		return w.stallBatch(kp)
	}
	return w.goOn(held)
}

func (w *world) guardTickOnce(p *proc, k callKind) error {
	kp := p // the process whose store the tick's call goes through
	if k == callHeartbeat {
		kp = p.keeperProc()
	}
	w.mu.Lock()
	kp.armed[k] = true
	kp.awaitSettle[k] = true
	kp.settled = make(chan struct{})
	kp.guardDone = make(chan error, 1)
	ctx, settled, done := p.runCtx, kp.settled, kp.guardDone
	w.mu.Unlock()
	timeout := time.After(30 * time.Second)
	select {
	case err := <-done:
		w.tracef("  %s: guard %v -> %s", p.name, kindName(k), errStr(err))
	case r := <-w.reports:
		if r.p == kp && r.kind == repBatchHeld {
			w.tracef("  %s: keeper batch of %s held in flight", p.name, kp.name)
			return nil
		}
		if r.p != kp || r.kind != repDead {
			return fmt.Errorf("sim: report %d from %s during a guard tick of %s", r.kind, r.p.name, p.name)
		}
		w.mu.Lock()
		w.stats.crashes++
		w.mu.Unlock()
		return nil
	case <-ctx.Done():
		select {
		case err := <-done:
			// The tick's answer stopped the run (it is handed over before the keeper applies it): the call was
			// made.
			w.tracef("  %s: guard %v -> %s", p.name, kindName(k), errStr(err))
		default:
			// The guard stopped before its next tick reached the store (in doubt): nothing was called.
			w.mu.Lock()
			kp.armed[k], kp.awaitSettle[k] = false, false
			w.mu.Unlock()
			return nil
		}
	case <-timeout:
		return fmt.Errorf("sim: guard of %s never ticked", p.name)
	}
	if k == callHeartbeat && kp.shares() {
		return w.keeperSettled(kp)
	}
	select {
	case <-settled:
	case <-ctx.Done():
		w.mu.Lock()
		kp.awaitSettle[k] = false
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
	// A held batch whose process has a slow tool parked arrives first: the clock may make the engine give the
	// tool up, and the process would go on and perhaps end its loop, which waits for the batch.
	for _, kp := range w.heldBatches() {
		if kp.toolParked() {
			if err := w.batchArrives(kp); err != nil {
				return err
			}
		}
	}
	held, err := w.holdTools(w.procs...)
	if err != nil {
		return err
	}
	var doubt []context.Context
	for _, p := range w.procs {
		w.mu.Lock()
		// A run already stopping (canceled) is in doubt too: its final writes check the claim's age first.
		// A run that has not asked the model yet (a continuation running its approved tool, its draft write held
		// in flight) is in doubt too: its next write asks the gate first (seed 721 on dynalite, -gaps).
		if !p.dead && !p.done && (p.runCtx != nil || p.runID != "") && now.Sub(p.lastOK) > w.ecfg.StaleAfter/2 {
			p.inDoubt = true
			// A run whose keeper is inside a held batch is found in doubt by its next batch, after that one
			// arrives (batchArrives waits for it).
			if p.runCtx != nil && p.runCtx.Err() == nil && !p.loopEnded && p.keeperProc().batchGo == nil {
				doubt = append(doubt, p.runCtx)
			}
		}
		w.mu.Unlock()
	}
	w.tracef("clock +%s -> %s", d, now.Format("15:04:05.000"))
	w.clock.advance(d)
	for _, ctx := range doubt {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return fmt.Errorf("sim: a run did not stop itself in doubt")
		}
	}
	// The held processes' tool waits whose horizon timer fired each react before anything else happens: they read
	// the clock and the claim's age, and either re-arm their timer or give their tool up.
	w.mu.Lock()
	for _, p := range held {
		if p.toolWaits > 0 && !p.toolHorizonAt.After(now) && p.toolTimeoutAt.After(now) {
			p.toolOwed = p.toolWaits
		}
	}
	w.mu.Unlock()
	if err := w.awaitReactions(held); err != nil {
		return err
	}
	return w.goOn(held)
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
