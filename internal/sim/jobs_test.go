package sim

// Sub-agent jobs, delivery passes and the thread's queue in the simulation (jobs mode, half of the seeds).
//
// The model's replies dispatch research jobs (the research job tool, lib/jobs.Dispatcher); posts are sometimes
// sent with multitask enqueue (queued when the thread is busy: 202). The Jobs port is the sim's own (simJobs): it
// runs nothing, it records each Start (a job's execution: the sub-agent task, then delivery) and each Wake (a
// delivery pass), once per name as Step Functions does. The schedule then decides when each recorded execution
// takes its next task, in a new process: the sub-agent (jobs.Tasks.Subagent, or its result stored with FinishJob
// directly), or the delivery (jobs.Tasks.Deliver, whose delivery pass claims the thread and runs a turn that
// takes the queue, one turn per pass: DrainTurns 1), concurrently with everything else, crashing or failing
// through the same fates as every store call (the Jobs port's calls included). The state machine's contract
// decides what follows (infra/jobs.asl.json): a transient error is retried, a sub-agent failure is caught and
// delivered as a failure, a delivery that crashes or fails for good ends the execution undelivered (the reaper
// re-drives it once due); a delivery that succeeded may run again (at least once). A tenth of the executions are
// lost (never run: the reaper fails the job once its execution would have timed out). Some steps let virtual
// time pass the delivery grace before a reaper sweep (its re-drive of due jobs, its sweep of forgotten queues).
//
// After the human phases a settle lets every recorded task run, with processes that neither crash nor fail, and
// while jobs or queue entries still wait, time pass the delivery grace before a reaper sweep, until nothing waits;
// when a sweep finds nothing to do and something still waits (behind a question, or a lost execution), time
// passes beyond the interrupts' age and the executions' timeout, up to three times. The invariants are in
// jobscheck_test.go.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// drawnBeforeJobs are the seeds of regressions and knownBugs that were found before jobs mode existed: they keep
// the schedule they were found with (no jobs), so they still open the windows they name. A seed found since names
// a schedule of the current generator and does not belong here.
var drawnBeforeJobs = []uint64{161, 238, 540, 120, 139, 391, 114, 261, 131, 572, 2355923010105997817, 4226426573621481161,
	22, 1405, 820, 6008, 4, 24, 57, 2745, 721, 3721}

// jobsMode reports whether seed's schedule has jobs: drawn from a stream of its own, so that a schedule without
// jobs draws exactly what it drew before jobs mode existed.
func jobsMode(seed uint64) bool {
	if !*flagJobs || slices.Contains(drawnBeforeJobs, seed) {
		return false
	}
	return rand.New(rand.NewPCG(seed, 0x10b5)).IntN(2) == 0
}

// windowMode reports whether seed's turns read their threads through the smallest window (one seed in two, the
// known bugs' seeds never, so they replay as recorded), and its first page: drawn from a stream of its own, so
// that every other draw of the schedule stays what it was.
func windowMode(seed uint64) (int, bool) {
	for _, kb := range knownBugs {
		if kb.seed == seed {
			return 0, false
		}
	}
	r := rand.New(rand.NewPCG(seed, 0x3d0))
	if r.IntN(2) == 0 {
		return 0, false
	}
	return 1 + r.IntN(3), true
}

// maxJobs bounds the jobs of one schedule: once that many were created, the model's replies dispatch no more (a
// delivery turn may dispatch a job too, so the chain must end).
const maxJobs = 4

// jobStats counts what jobs mode exercised.
type jobStats struct {
	schedules    int            // schedules in jobs mode
	dispatched   int            // jobs created
	starts       int            // executions recorded (Jobs.Start, new names)
	wakes        map[string]int // delivery passes recorded (Jobs.Wake, new names), by who asked
	subagents    int            // sub-agent tasks run
	deliveries   int            // delivery tasks run (a job's, or a pass)
	lost         int            // executions never run
	enqueued     int            // posts answered 202 (queued)
	steers       int            // steer messages in the threads at the end
	queuedStored int            // of the messages queued by 202, those stored at the end
}

func (s *jobStats) add(o jobStats) {
	s.schedules += o.schedules
	s.dispatched += o.dispatched
	s.starts += o.starts
	s.subagents += o.subagents
	s.deliveries += o.deliveries
	s.lost += o.lost
	s.enqueued += o.enqueued
	s.steers += o.steers
	s.queuedStored += o.queuedStored
	for k, n := range o.wakes {
		if s.wakes == nil {
			s.wakes = map[string]int{}
		}
		s.wakes[k] += n
	}
}

// queuedMsg is a user message a post queued (Begin returned Turn.Queued: 202).
type queuedMsg struct {
	id    string
	seq   int64 // its queue Seq
	gen   int
	at    int // the event of the acceptance: the Enqueue that applied (acceptQueued)
	proc  *proc
	fresh bool // an id never posted before (a re-post of a stored id is queued too, and taken as present)
}

// acceptQueued records a 202 (w.mu held).
func (w *world) acceptQueued(p *proc, th *simThread, gen int, q *engine.Queued) {
	w.stats.jobs.enqueued++
	for _, old := range th.enqueued {
		if old.id == q.MessageID && old.gen == gen {
			return // the same entry again (Enqueue converges on the message id)
		}
	}
	var seq int64 = -1
	at := w.event()
	if p.enqueued != nil && p.enqueued.Message.ID == q.MessageID {
		// The entry exists from the Enqueue that applied, not from the 202: a delivery pass may store and answer
		// it before Begin returns, and an edit committed in between (a request in flight beside the post) may
		// drop it with every message after the edited one, deliberately (seed 4322773277297449639: the 202 came
		// after an edit had hidden the message a pass stored). Such an edit counts as one since the acceptance.
		seq, at = p.enqueued.Seq, p.enqueuedAt
	}
	th.enqueued = append(th.enqueued, queuedMsg{id: q.MessageID, seq: seq, gen: gen, at: at, proc: p, fresh: p.freshID})
}

// jobCreated counts a job a dispatch created.
func (w *world) jobCreated(j agent.Job) {
	defer w.jobCreatedBounded(j)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stats.jobs.dispatched++
}

// execPhase is where a recorded execution stands.
type execPhase int

const (
	execSubagent execPhase = iota // the sub-agent task is next
	execDeliver                   // the delivery task is next
	execEnded
)

// execution is one recorded Start (a job) or Wake (a delivery pass).
type execution struct {
	name     string
	task     agent.JobTask // the next task's input (Failure set once the sub-agent failed)
	wake     bool
	phase    execPhase
	attempts int   // of the task in phase
	proc     *proc // the attempt in progress, until its outcome is taken (collect)
	err      error // the attempt's answer (set by its process)
	fated    bool
	lost     bool
	ran      int // delivery attempts that succeeded
}

// simJobs is the schedule's Jobs port: it records, and the scheduler runs what it recorded.
type simJobs struct{ w *world }

func (j *simJobs) Start(ctx context.Context, job agent.Job) error {
	if job.ID == "" || job.ThreadID == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "a job needs a thread and an id")
	}
	return j.record(ctx, "Jobs.Start", "job\x00"+job.ID, agent.JobTask{ThreadID: job.ThreadID, JobID: job.ID}, false)
}

func (j *simJobs) Wake(ctx context.Context, t agent.JobTask) error {
	if t.ThreadID == "" || t.Wake == "" {
		return agent.E(agent.KindInvalid, agent.CodeInvalidJob, "a wake needs a thread and a key")
	}
	return j.record(ctx, "Jobs.Wake", "wake\x00"+t.ThreadID+"\x00"+t.Wake, t, true)
}

// record is a call of the Jobs port by the calling process: it has a fate like a store write (a crash before or
// after it, a transient failure, a lost answer) and records the execution once per name.
func (j *simJobs) record(ctx context.Context, method, name string, t agent.JobTask, wake bool) error {
	p := procOf(ctx)
	if p == nil {
		j.w.violate("sim", "%s of %s outside a process", method, name)
		return errors.New("sim: no process")
	}
	detail := func() string { return strings.ReplaceAll(name, "\x00", " ") }
	err := p.store.callD(ctx, method, true, false, callPlain, nil, t.ThreadID, detail, func(context.Context) error {
		j.w.recordExec(name, t, wake)
		return nil
	})
	if errors.Is(err, errInjected) {
		return agent.E(agent.KindUnavailable, agent.CodeJobsUnavailable, "sim: injected jobs fault")
	}
	return err
}

func (w *world) recordExec(name string, t agent.JobTask, wake bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.execs {
		if x.name == name {
			return
		}
	}
	x := &execution{name: name, task: t, wake: wake}
	if wake {
		x.phase = execDeliver
		key, _, _ := strings.Cut(t.Wake, "-")
		if w.stats.jobs.wakes == nil {
			w.stats.jobs.wakes = map[string]int{}
		}
		w.stats.jobs.wakes[key]++
	} else {
		w.stats.jobs.starts++
	}
	w.execs = append(w.execs, x)
}

// readyExecs collects the outcomes of finished attempts and lists the executions whose next task may run.
func (w *world) readyExecs() []*execution {
	w.mu.Lock()
	xs := slices.Clone(w.execs)
	w.mu.Unlock()
	var ready []*execution
	for _, x := range xs {
		if !x.fated {
			x.fated = true
			x.lost = w.rng.IntN(10) == 0
			if x.lost {
				w.stats.jobs.lost++
				w.tracef("execution %s is lost", x.label())
			}
		}
		w.collect(x)
		if x.phase != execEnded && !x.lost && x.proc == nil {
			ready = append(ready, x)
		}
	}
	return ready
}

func (x *execution) label() string { return strings.ReplaceAll(x.name, "\x00", " ") }

// collect takes the outcome of x's last attempt once its process is over, as the state machine does.
func (w *world) collect(x *execution) {
	p := x.proc
	if p == nil {
		return
	}
	w.mu.Lock()
	dead, done, err := p.dead, p.done, x.err
	w.mu.Unlock()
	if !dead && !done {
		return // still running
	}
	x.proc = nil
	c := w.contract
	switch x.phase {
	case execSubagent:
		var fail *agent.TaskFailure
		switch {
		case dead:
			// The Lambda died (Runtime.ExitError): not retried, caught, and delivered as a failure.
			fail = &agent.TaskFailure{Error: "Runtime.ExitError", Cause: `{"errorMessage":"the process exited","errorType":"Runtime.ExitError"}`}
		case err == nil:
		case taskErrorName(err) == "TransientError" && x.attempts <= c.TaskRetries:
			w.tracef("execution %s: the sub-agent is retried (%v)", x.label(), err)
			return
		default:
			fail = &agent.TaskFailure{Error: taskErrorName(err), Cause: lambdaCause(err)}
		}
		x.task.Failure = fail
		x.phase, x.attempts = execDeliver, 0
	case execDeliver:
		switch {
		case dead:
			// Runtime.ExitError is not retried: the execution ends, the job undelivered (the reaper re-drives it).
			x.phase = execEnded
		case err != nil && taskErrorName(err) == "TransientError" && x.attempts <= c.DeliverRetries:
			w.tracef("execution %s: the delivery is retried (%v)", x.label(), err)
			return
		case err != nil:
			x.phase = execEnded
		default:
			x.ran++
			x.phase = execEnded
			if x.ran == 1 && w.rng.IntN(6) == 0 {
				// At least once: the task's answer was lost on its way back and it runs again.
				x.phase, x.attempts = execDeliver, 0
				w.tracef("execution %s: the delivery will run again", x.label())
			}
		}
	}
	if x.phase == execEnded {
		w.tracef("execution %s ended (%s)", x.label(), errStr(err))
	}
}

// taskErrorName is the name Step Functions matches a task error by: its outermost type (localjobs.describe).
func taskErrorName(err error) string {
	t := reflect.TypeOf(err)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

func lambdaCause(err error) string {
	b, _ := json.Marshal(struct {
		Message string `json:"errorMessage"`
		Type    string `json:"errorType"`
	}{err.Error(), taskErrorName(err)})
	return string(b)
}

// runExec runs x's next task in a new process; clean processes neither crash nor fail (the settle).
func (w *world) runExec(x *execution, clean bool) error {
	x.attempts++
	x.err = nil
	task := x.task
	if x.phase == execSubagent {
		p := w.newProc("subagent", !clean)
		if clean {
			p.faultRate = 0
		}
		x.proc = p
		w.stats.jobs.subagents++
		direct := !clean && w.rng.IntN(5) == 0
		w.tracef("%s: sub-agent of %s (attempt %d, direct=%v)", p.name, task.JobID, x.attempts, direct)
		return w.start(p, func() {
			ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
			var err error
			if direct {
				// The result arrives without the task (a sub-agent that reported back on its own): stored once.
				now := w.clock.Now()
				_, _, err = p.store.FinishJob(ctx, agent.JobResult{ThreadID: task.ThreadID, ID: task.JobID,
					Result: json.RawMessage(`{"brief":"reported directly","sources":[]}`), DueAt: now.Add(w.contract.DeliveryGrace), Now: now})
				if agent.IsKind(err, agent.KindUnavailable) {
					err = &agent.TransientError{Err: err}
				}
			} else {
				_, err = p.tasks.Subagent(ctx, task)
			}
			w.mu.Lock()
			x.err = err
			w.mu.Unlock()
			w.tracef("  %s: sub-agent -> %s", p.name, errStr(err))
		})
	}
	kind := "deliver"
	if x.wake {
		kind = "wake"
	}
	p := w.newProc(kind, !clean)
	p.delivers = true
	if !clean && p.crashAt == 0 && w.rng.IntN(3) == 0 {
		// Delivery tasks make few calls: a third of them die at one of their first ones.
		p.crashAt, p.crashAfter = 1+w.rng.IntN(14), w.rng.IntN(2) == 0
		w.tracef("  %s: crashAt=%d after=%v", p.name, p.crashAt, p.crashAfter)
	}
	if clean {
		p.faultRate = 0
		p.script = w.settleScript(p)
	} else {
		p.script = w.script(p)
	}
	x.proc = p
	w.stats.jobs.deliveries++
	fail := ""
	if task.Failure != nil {
		fail = " failure=" + task.Failure.Error
	}
	w.tracef("%s: deliver %s (attempt %d%s) steps=%d", p.name, x.label(), x.attempts, fail, len(p.script))
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseDeliver), procKey{}, p)
		res, err := p.tasks.Deliver(ctx, task)
		w.mu.Lock()
		x.err = err
		w.mu.Unlock()
		w.tracef("  %s: deliver -> %s turns=%d %s", p.name, res.Status, res.Turns, errStr(err))
	})
}

// jobOp is a step of jobs mode: a recorded task runs, or time passes the delivery grace before a reaper sweep,
// or a message is sent with multitask enqueue to a busy thread.
func (w *world) jobOp() error {
	ready := w.readyExecs()
	switch c := w.rng.IntN(100); {
	case c < 60 && len(ready) > 0:
		return w.runExec(ready[w.rng.IntN(len(ready))], false)
	case c%6 == 0:
		w.tracef("time passes the delivery grace")
		if err := w.beforeClock(w.contract.DeliveryGrace + w.smallAdvance()); err != nil {
			return err
		}
		return w.reap(false)
	default:
		var busy []*simThread
		for _, th := range w.threads {
			if c, ok := w.claimOf(th.id); ok && c != nil {
				busy = append(busy, th)
			}
		}
		if len(busy) == 0 {
			return nil // posts with enqueue to an idle thread are among the ops already
		}
		return w.postMT(busy[w.rng.IntN(len(busy))], true)
	}
}

// script draws the model's reply of p (research calls in jobs mode).
func (w *world) script(p *proc) []stepScript {
	if !w.jobsOn {
		return newScript(p.rng, w.ecfg.MaxSteps, nil)
	}
	return overCaps(p, newScript(p.rng, w.ecfg.MaxSteps, w.research), w.research)
}

// research draws a research call's input; false once the schedule's budget of jobs is spent.
func (w *world) research(r *rand.Rand) (string, bool) {
	w.mu.Lock()
	spent := w.stats.jobs.dispatched >= maxJobs
	w.mu.Unlock()
	if spent {
		return "", false
	}
	n := r.IntN(1000)
	switch r.IntN(10) {
	case 0:
		return fmt.Sprintf(`{"question":"fail %d"}`, n), true // the researcher fails: a failure steer
	case 1:
		return fmt.Sprintf(`{"question":"flaky %d"}`, n), true // transient every time: retried, then a failure
	case 2:
		return `{"question":" "}`, true // refused by the kind's check: no job
	case 3:
		return fmt.Sprintf(`{"question":"sources for %d"}`, n), true // the researcher notes a source first
	}
	return fmt.Sprintf(`{"question":"q%d"}`, n), true
}

// settle lets every recorded task run (clean), and while jobs or queue entries still wait, lets time pass the
// delivery grace before a reaper sweep (which re-drives and sweeps), until nothing waits; when a sweep finds
// nothing to do and something still waits (behind a question, or a lost execution), time passes beyond the
// interrupts' age and the executions' timeout, up to three times.
func (w *world) settle() error {
	w.tracef("settle")
	far := 0
	for round := 0; round < 24; round++ {
		if err := w.runReady(); err != nil {
			return err
		}
		if !w.waiting() {
			return nil
		}
		if err := w.advanceClock(max(w.ecfg.StaleAfter, w.contract.DeliveryGrace) + time.Second); err != nil {
			return err
		}
		st, err := w.cleanTick("settle-reaper")
		if err != nil {
			return err
		}
		if len(w.readyExecs()) > 0 || st.Nominated+st.Redriven+st.Swept+st.Expired > 0 {
			continue
		}
		if far >= 3 {
			return nil
		}
		far++
		d := max(w.ecfg.InterruptTTL, w.contract.ExecutionTimeout+w.contract.DeliveryGrace) + time.Second
		w.tracef("settle: jobs or queue entries wait; time passes %s", d)
		if err := w.advanceClock(d); err != nil {
			return err
		}
	}
	return nil
}

// runReady runs every recorded task that may run, clean, each to its end, and what they record in turn.
func (w *world) runReady() error {
	for range 40 {
		ready := w.readyExecs()
		if len(ready) == 0 {
			return nil
		}
		for _, x := range ready {
			if err := w.runExec(x, true); err != nil {
				return err
			}
			if err := w.drain(); err != nil {
				return err
			}
		}
	}
	return nil
}

// cleanTick is a reaper sweep that neither crashes nor fails.
func (w *world) cleanTick(name string) (stats reaperStats, err error) {
	p := w.newProc(name, false)
	p.faultRate = 0
	err = w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		s, terr := p.reaper.Tick(ctx)
		stats = reaperStats{Nominated: s.Nominated, Redriven: s.Redriven, Swept: s.Swept, Expired: s.Expired}
		w.tracef("  %s: tick -> %+v %s", p.name, s, errStr(terr))
	})
	return stats, err
}

type reaperStats struct{ Nominated, Redriven, Swept, Expired int }

// waiting reports whether one of the schedule's threads still has a queue entry or an undelivered job.
func (w *world) waiting() bool {
	ctx := context.Background()
	for _, th := range w.threads {
		if q, err := w.base.ListQueued(ctx, th.id); err == nil && len(q) > 0 {
			return true
		}
		js, _ := w.base.ListJobs(ctx, th.id)
		for _, j := range js {
			if !j.SteerDelivered {
				return true
			}
		}
	}
	return false
}

// closeJobs finishes, on the underlying store, what the schedule leaves undelivered or queued: schedules share a
// store, and the reaper's lists of due jobs and queued threads are bounded and in no promised order (as for
// closeInterrupts).
func (w *world) closeJobs(ctx context.Context) {
	now := w.clock.Now()
	for _, th := range w.threads {
		js, _ := w.base.ListJobs(ctx, th.id)
		for _, j := range js {
			if !j.Finished() {
				_, _, _ = w.base.FinishJob(ctx, agent.JobResult{ThreadID: th.id, ID: j.ID, Error: "sim: schedule over", Now: now})
			}
			if !j.SteerDelivered {
				_, _ = w.base.MarkJobDelivered(ctx, th.id, j.ID, now)
			}
		}
		q, _ := w.base.ListQueued(ctx, th.id)
		for _, e := range q {
			_ = w.base.TakeQueued(ctx, th.id, e.Message.ID, now)
		}
	}
}

// subagentModel is the researcher's model: deterministic from the question, with no handoffs (the sub-agent task
// runs within one grant). "fail …" fails for good, "flaky …" fails transiently, "sources …" notes a source
// first; anything else writes a brief that cites one.
type subagentModel struct{}

func (subagentModel) Stream(_ context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	q := ""
	for _, m := range req.Messages {
		if m.Role == "user" {
			q = m.Text
		}
	}
	switch {
	case strings.HasPrefix(q, "fail"):
		return agent.ModelResult{}, agent.E(agent.KindInvalid, agent.CodeModelError, "the researcher found nothing on %q", q)
	case strings.HasPrefix(q, "flaky"):
		return agent.ModelResult{}, agent.E(agent.KindUnavailable, agent.CodeModelError, "the model is overloaded")
	}
	usage := agent.Usage{InputTokens: 10, OutputTokens: 5, TotalTokens: 15}
	if strings.HasPrefix(q, "sources") && len(req.Messages) == 1 {
		args := fmt.Sprintf(`{"title":"Source on %s","url":"https://example.com/%d"}`, q, len(q))
		if err := emit(agent.ModelEvent{Type: agent.EventToolCall, ToolCallID: "note_1", ToolName: "note_source", Arguments: args}); err != nil {
			return agent.ModelResult{}, err
		}
		return agent.ModelResult{FinishReason: agent.FinishToolCalls, Usage: usage, Model: "sim-researcher"}, nil
	}
	brief := fmt.Sprintf("A brief on %s; see [Example](https://example.org/%d).", q, len(q))
	if err := emit(agent.ModelEvent{Type: agent.EventTextDelta, Delta: brief}); err != nil {
		return agent.ModelResult{}, err
	}
	return agent.ModelResult{FinishReason: agent.FinishStop, Usage: usage, Model: "sim-researcher"}, nil
}
