package sim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// procStore is one process's view of the store: every component of a simulated process (its engine, its
// reaper, its tools, its threads service) talks to the shared underlying store through it. It is where the sim
//
//   - crashes the process at its Nth store call (before or after that call applies): the call and every later one
//     of that process park until the schedule ends, as the calls of a dead Lambda never return; a new process
//     over the same underlying store carries on;
//   - injects transient KindUnavailable errors on writes, sometimes after the write applied (a lost response,
//     which the AWS SDK's own retries turn into a second attempt);
//   - gates the engine's background work (heartbeats, cancel polls) so it reaches the store only when the
//     scheduler says so, and parks every call of the user-message goroutine and claim retries so the scheduler
//     orders them;
//   - checks, on every write a run makes under its own fence, that the run still held the thread's claim when
//     that write took effect (DESIGN principle 8).
type procStore struct {
	agent.Store // the underlying store; only reached through call
	p           *proc
	deleting    string // the thread of the DeleteThread call being made (diedPartWay)
}

type phase int

const (
	phaseOp     phase = iota // a threads-service or reaper call
	phaseBegin               // engine.Begin, and the user-message write it starts
	phaseStream              // Turn.Stream: the run loop, its guard, its segmenter, its tools
	// phaseDeliver is a job task (jobs.Tasks.Deliver): its delivery pass runs BeginQueued and Stream under one
	// context, so what the other phases tell apart by the context is told apart by the goroutine and by whether
	// the run asked the model yet (proc.streaming).
	phaseDeliver
)

type ctxKey struct{}

func withPhase(ctx context.Context, ph phase) context.Context {
	return context.WithValue(ctx, ctxKey{}, ph)
}

func phaseOf(ctx context.Context) phase {
	ph, _ := ctx.Value(ctxKey{}).(phase)
	return ph
}

// errDead is what a dead process's calls return once the schedule is over and its goroutines are let go (they
// never reach the store again).
var errDead = errors.New("sim: process is dead")

// callKind classifies a store call for the gates.
type callKind int

const (
	callPlain     callKind = iota
	callHeartbeat          // the guard's heartbeat (Stream phase)
	callPoll               // the guard's cancel poll (GetThread in the Stream phase)
	callUserWrite          // a call of the goroutine Begin starts beside the first model request (Turn.apply)
	callClaim              // a ClaimRun of Begin after its first (waiting for a run to let go)
)

// The engine makes store calls on goroutines of its own beside a process's main one; the sim tells them apart by
// the function each goroutine started in (the bottom of its stack):
//
//   - Turn.apply's goroutine writes what the turn closes (canceled interrupts, the settled message, an edit's
//     dropped messages) and then the user message, beside the first model request: every one of its calls is
//     parked until the scheduler grants it (callUserWrite);
//   - readAndPlan's (a continuation) and threads.Service.Get's read the thread's interrupts beside its messages:
//     such a read is let through as it comes, with no fate drawn for it (a read changes nothing, and every other
//     process is parked, so what it returns does not depend on which of the two reads goes first; counting it
//     would make the order of fates, and the trace, up to the Go scheduler).
const (
	// apply starts one goroutine or the other: an edit's (commitEdit) or a new message's (closeOut, then the write).
	entryUserWritePrefix = "github.com/agentloop/agentloop/lib/engine.(*Turn).apply.func"
	entryPlanRead        = "github.com/agentloop/agentloop/lib/engine.(*Turn).readAndPlan.func1"
	entryGetRead         = "github.com/agentloop/agentloop/lib/threads.(*Service).Get.func1"
)

// userWriting reports whether the calling goroutine is the turn's user-message goroutine (Turn.apply's).
func userWriting() bool { return strings.HasPrefix(goroutineEntry(), entryUserWritePrefix) }

// goroutineEntry is the function the calling goroutine started in.
func goroutineEntry() string {
	var pcs [256]uintptr
	n := runtime.Callers(2, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	entry := ""
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			entry = f.Function
		}
		if !more {
			return entry
		}
	}
}

// call runs one store call of the process through the gates, the crash point and the fault injector.
// own is the fence of a write the process's run makes under its own claim (nil otherwise).
func (s *procStore) call(ctx context.Context, method string, write bool, kind callKind, own *agent.Fence, threadID string, do func(ctx context.Context) error) error {
	return s.callD(ctx, method, write, false, kind, own, threadID, func() string { return threadID }, do)
}

// callD is call with a description of the call for the trace; final marks a finalizing message write.
func (s *procStore) callD(ctx context.Context, method string, write, final bool, kind callKind, own *agent.Fence, threadID string, detail func() string, do func(ctx context.Context) error) error {
	p, w := s.p, s.p.w
	if p.isDead() {
		return p.parkDead()
	}
	chained := false // a call of the user-message goroutine of a pass chained in the stream (proc.modelCalled)
	if ph := phaseOf(ctx); kind == callPlain && (ph == phaseBegin || ph == phaseDeliver || ph == phaseStream) && userWriting() {
		kind, chained = callUserWrite, ph == phaseStream
	}
	switch kind {
	case callHeartbeat, callPoll:
		if !p.takeArm(kind) {
			// Not armed: the guard's tick is lost on the way, like a heartbeat that times out. It costs nothing
			// and is not a store call.
			return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: guard tick not scheduled")
		}
	case callUserWrite:
		if !p.delivers && !chained && !p.parkUserWrite() {
			return p.parkDead()
		}
	}
	// A run's own writes in the Stream phase may be held: its fenced ones, and its interrupts (insert-if-absent,
	// not fenced: one that lands late names a message its run never finalized as asking, so readers never list it).
	if (own != nil || method == "CreateInterrupt") && p.streaming(ctx, kind) && p.delayed(method, final) {
		// The request is in flight (its arguments, its timestamp, the run's in-doubt check are all behind it)
		// and the scheduler may let time pass, reap the run and start others before it arrives: the store's
		// fences alone must then keep it from taking effect (DESIGN principle 8).
		if !p.parkMain("in flight") {
			return p.parkDead()
		}
	}
	slowAfter := p.slow(ctx, method, kind)
	n, crash, after, fault, lost, reqOK := p.nextCall(method, write, final)
	if crash && !after {
		w.tracef("  %s: CRASH before call %d (%s)", p.name, n, method)
		p.die()
		return p.parkDead()
	}
	ferr := errInjected
	if fault && kind != callHeartbeat && kind != callPoll && p.permanentFault() {
		ferr = errPermanent
	}
	if fault && !lost {
		w.tracef("    %s: %s %s -> injected %s", p.name, method, detail(), faultName(ferr))
		w.countFault(method + permanentNote(ferr))
		p.afterCall(kind, ferr)
		return ferr
	}
	var before agent.Thread
	var beforeOK bool
	if own != nil {
		before, beforeOK = w.threadOf(threadID)
	}
	if reqOK && kind != callHeartbeat && kind != callPoll {
		p.inRequests(method)
	}
	err := do(undeadlined(ctx))
	p.inRequests("")
	if p.isDead() {
		return p.parkDead() // a crash between two requests of the call (requests_test.go)
	}
	if own != nil {
		w.checkOwnWrite(p, method, detail(), *own, threadID, before, beforeOK, err)
	}
	if write && kind != callHeartbeat && kind != callPoll {
		w.tracef("    %s: %s %s -> %s", p.name, method, detail(), errStr(err))
	}
	if crash {
		w.tracef("  %s: CRASH after call %d (%s) applied: %v", p.name, n, method, errStr(err))
		p.die()
		return p.parkDead()
	}
	if fault && lost && err == nil {
		w.tracef("    %s: (the response of that %s is lost: injected %s)", p.name, method, faultName(ferr))
		w.countFault(method + "(lost response)" + permanentNote(ferr))
		p.afterCall(kind, ferr)
		return ferr
	}
	p.afterCall(kind, err)
	if slowAfter && !p.parkMain("slow") {
		return p.parkDead()
	}
	if kind == callClaim && errors.Is(err, agent.ErrRunActive) {
		// Begin found the thread busy. It parks here, after the answer, not before its next attempt: a call
		// is instantaneous in virtual time (the engine stamps it with the clock just before), time passes
		// between calls.
		if !p.parkMain("claim retry") {
			return p.parkDead()
		}
	}
	return err
}

// undeadlined is ctx without its deadline (its values, the write gate among them, and its cancellation kept). The
// engine puts a deadline at the claim's horizon on every fenced attempt, counted in real time from the virtual
// clock; in the sim a call may wait for the scheduler (a write held in flight, the user-message write parked)
// for as long as other processes run, so that deadline would cut calls by how loaded the machine is (seed
// 1000013 on dynalite, under load: the user message's PutMessage "context deadline exceeded"). The virtual
// horizon still gates every attempt: the engine asks the gate before each one, and the DynamoDB adapter before
// each SDK attempt.
func undeadlined(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok || (ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded)) {
		return ctx
	}
	return cancelOnly{ctx}
}

// cancelOnly is a context with its parent's values and cancellation but no deadline: Err reports a cancel of
// the parent that is not its deadline.
type cancelOnly struct{ context.Context }

func (c cancelOnly) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c cancelOnly) Done() <-chan struct{} { return nil }

func (c cancelOnly) Err() error {
	if err := c.Context.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

var errInjected = agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: injected transient fault")

// errPermanent is a store error no retry passes (an access denied, a validation error, a full partition): the
// engine's retry loops end at once, so the paths after them run (persist_failed, an unsaved run, late usage).
var errPermanent = agent.E(agent.KindInternal, agent.CodeInternal, "sim: injected permanent fault")

func faultName(err error) string {
	if err == errPermanent {
		return "permanent fault"
	}
	return "fault"
}

func permanentNote(err error) string {
	if err == errPermanent {
		return "(permanent)"
	}
	return ""
}

// permanentFault decides whether an injected fault is permanent: one in ten.
func (p *proc) permanentFault() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.faultRng.IntN(10) == 0
}

func errStr(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func (s *procStore) ownFence(ctx context.Context, f agent.Fence) *agent.Fence {
	if rid := s.p.ownRun(); rid != "" && f.RunID == rid && phaseOf(ctx) != phaseOp {
		return &f
	}
	return nil
}

// ThreadStore.

func (s *procStore) CreateThread(ctx context.Context, t agent.Thread) (th agent.Thread, created bool, err error) {
	err = s.call(ctx, "CreateThread", true, callPlain, nil, t.ID, func(ctx context.Context) error {
		var e error
		th, created, e = s.Store.CreateThread(ctx, t)
		return e
	})
	return th, created, err
}

func (s *procStore) GetThread(ctx context.Context, id string) (th agent.Thread, err error) {
	err = s.call(ctx, "GetThread", false, callPlain, nil, id, func(ctx context.Context) error {
		var e error
		th, e = s.Store.GetThread(ctx, id)
		return e
	})
	return th, err
}

func (s *procStore) ListThreads(ctx context.Context, owner string, limit int) (ths []agent.Thread, err error) {
	err = s.call(ctx, "ListThreads", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		ths, e = s.Store.ListThreads(ctx, owner, limit)
		return e
	})
	return ths, err
}

func (s *procStore) UpdateThread(ctx context.Context, id string, pt agent.ThreadPatch, now time.Time) (th agent.Thread, err error) {
	err = s.call(ctx, "UpdateThread", true, callPlain, nil, id, func(ctx context.Context) error {
		var e error
		th, e = s.Store.UpdateThread(ctx, id, pt, now)
		return e
	})
	return th, err
}

func (s *procStore) DeleteThread(ctx context.Context, id string) error {
	s.deleting = id
	defer func() { s.deleting = "" }()
	return s.call(ctx, "DeleteThread", true, callPlain, nil, id, func(ctx context.Context) error {
		err := s.Store.DeleteThread(ctx, id)
		if err == nil || s.deleted(id) {
			// Even if the process dies before it hears back. A DeleteThread that failed after its tombstone (a
			// DynamoDB delete is several requests) is committed too: nothing claims or writes the thread any
			// more, and its client, told it failed, sends it again, which finishes it (FinishDelete).
			s.p.w.threadDeleted(id)
		}
		return err
	})
}

// diedPartWay is called when the process dies at a request of a call (requests_test.go): a DeleteThread that dies
// once its tombstone is down is committed (seeds 3506345561019181140 and 7696421994093964655 on dynamo: a crash
// after the tombstone, and after the last request), as a failed one is (DeleteThread).
func (s *procStore) diedPartWay() {
	if id := s.deleting; id != "" && s.deleted(id) {
		s.p.w.threadDeleted(id)
	}
}

// deleted reports whether the thread reads as missing on the underlying store (a tombstone does).
func (s *procStore) deleted(id string) bool {
	_, err := s.p.w.base.GetThread(context.Background(), id)
	return agent.IsKind(err, agent.KindNotFound)
}

// FinishDelete finishes a delete that stopped half way (a process that met its tombstone): the thread is gone
// then, as after a DeleteThread that applied. Not a counted call (it was never one: schedules keep their fates).
func (s *procStore) FinishDelete(ctx context.Context, id string) error {
	if s.p.isDead() {
		return s.p.parkDead()
	}
	err := s.Store.FinishDelete(ctx, id)
	if _, gerr := s.p.w.base.GetThread(context.WithoutCancel(ctx), id); err == nil && agent.IsKind(gerr, agent.KindNotFound) {
		s.p.w.threadDeleted(id)
	}
	return err
}

// RunStore.

func (s *procStore) ClaimRun(ctx context.Context, req agent.ClaimRequest) (res agent.ClaimResult, err error) {
	kind := callPlain
	if ph := phaseOf(ctx); ph == phaseBegin || ph == phaseDeliver {
		kind = callClaim
	}
	detail := func() string { return fmt.Sprintf("%s run=%s -> epoch %d", req.ThreadID, req.RunID, res.Run.Epoch) }
	s.p.w.mu.Lock()
	if s.p.claimFrom.IsZero() {
		s.p.claimFrom = s.p.w.clock.Now()
	}
	s.p.w.mu.Unlock()
	defer func() {
		if !agent.IsKind(err, agent.KindUnavailable) {
			s.p.w.mu.Lock()
			s.p.claimFrom = time.Time{}
			s.p.w.mu.Unlock()
		}
	}()
	err = s.callD(ctx, "ClaimRun", true, false, kind, nil, req.ThreadID, detail, func(ctx context.Context) error {
		var e error
		res, e = s.Store.ClaimRun(ctx, req)
		if e == nil {
			s.p.claimed(res.Run)
			if s.p.delivers {
				s.p.w.askingAtClaim(s.p, req.ThreadID)
			}
		}
		return e
	})
	return res, err
}

func (s *procStore) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	// The run's keeper heartbeats through KeepClaims; a Heartbeat is keepClaim's, in a long close-out before the
	// run streams. It is gated as a guard tick, as it always was here (unarmed: lost on the way).
	if !now.Equal(s.p.w.clock.Now()) {
		return agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: stale guard tick")
	}
	err := s.call(ctx, "Heartbeat", true, callHeartbeat, nil, threadID, func(ctx context.Context) error {
		return s.Store.Heartbeat(ctx, threadID, f, now)
	})
	if err == nil {
		s.p.heartbeatOK(now)
	} else if errors.Is(err, agent.ErrRunCanceled) {
		s.p.heartbeatKept(now)
	}
	return err
}

// KeepClaims is the process's keeper's batch (lib/engine keeper.go): the guard tick the scheduler arms. It is
// one store call, so a fault, a lost answer or a crash hits the batch as a whole (every claim answers the
// injected error); the store's own answers differ per claim. A host's keeper (shared mode, keeper_test.go)
// carries its guests' claims too: each answer is its own run's, and in a batch of two claims or more each claim
// may also fail alone (keepFaults).
func (s *procStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	all := func(err error) []agent.KeepResult {
		out := make([]agent.KeepResult, len(claims))
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	if !now.Equal(s.p.w.clock.Now()) {
		// A tick that read the clock before the scheduler moved it: lost on the way, like an unarmed one, so
		// that an armed heartbeat always carries the current virtual time.
		return all(agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: stale guard tick"))
	}
	var (
		res   []agent.KeepResult
		first error // the answer the scheduler sees: the first claim's that failed, else nil
		fates []keepFault
	)
	thread := ""
	if len(claims) > 0 {
		thread = claims[0].ThreadID
	}
	w := s.p.w
	err := s.call(ctx, "KeepClaims", true, callHeartbeat, nil, thread, func(ctx context.Context) error {
		if s.p.holdBatch() && !s.p.parkBatch() {
			return errDead
		}
		w.mu.Lock()
		fates = s.p.keepFaults(len(claims))
		w.mu.Unlock()
		var sent []agent.KeptClaim
		var before []agent.Thread
		for i, c := range claims {
			if fates[i] != keepBefore {
				sent = append(sent, c)
				th, _ := w.threadOf(c.ThreadID)
				before = append(before, th)
			}
		}
		got := s.Store.KeepClaims(ctx, sent, now)
		w.checkKept(s.p, sent, before, got)
		res = make([]agent.KeepResult, len(claims))
		j := 0
		for i := range claims {
			switch fates[i] {
			case keepBefore:
				res[i].Err = errClaimInjected
				continue
			case keepLost:
				res[i].Err = errClaimInjected
			default:
				if j < len(got) {
					res[i] = got[j]
				} else {
					res[i].Err = agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: the store answered no result for this claim")
				}
			}
			j++
		}
		for _, r := range res {
			if r.Err != nil {
				first = r.Err
				break
			}
		}
		return first
	})
	if res == nil || err != first {
		return all(err) // not sent, injected, crashed, or its answer lost
	}
	for i := range res {
		// The claim's readers mark (agent.Claim.ReadersUntil) would make the engine hurry the run's segments
		// (segments.Segmenter.Hurry): flushes on a real-time 50 ms ticker, store calls outside the schedule
		// (seed 18 broke that way: "report 3 from post#1 while advancing reader#100004", an AppendSegment of
		// post#1's run while a reader was advanced). The sim's segments flush at step ends and at the end of
		// the stream only (simConfig), so the answers the keeper reads carry no readers mark.
		res[i].Claim.ReadersUntil = time.Time{}
	}
	w.mu.Lock()
	var (
		classes []string
		faults  int
	)
	for i, r := range res {
		q := s.p.claimProc(claims[i])
		if q == nil && len(s.p.guests) == 0 {
			q = s.p // a process's own keeper keeps only its own run
		}
		if fates[i] != keepSent {
			faults++
		}
		switch {
		case q == nil:
		case r.Err == nil:
			q.lastOK, q.keptAt = now, now // heartbeatOK
		case errors.Is(r.Err, agent.ErrRunCanceled):
			q.keptAt = now // heartbeatKept
		}
		classes = append(classes, answerClass(r.Err))
	}
	if len(claims) > 1 {
		w.stats.shared.batches++
		w.stats.shared.claimFaults += faults
		if slices.ContainsFunc(classes, func(c string) bool { return c != classes[0] }) {
			w.stats.shared.split++
		}
	}
	w.mu.Unlock()
	if len(claims) > 1 {
		var b strings.Builder
		for i, c := range claims {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s/%s -> %s", c.ThreadID, c.Fence.RunID, classes[i])
			switch fates[i] {
			case keepBefore:
				b.WriteString(" (injected on this claim)")
			case keepLost:
				b.WriteString(" (applied, answer lost: injected on this claim)")
			}
		}
		w.tracef("    %s: keeper batch of %d: %s", s.p.name, len(claims), b.String())
	}
	return res
}

func (s *procStore) RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (c agent.Claim, err error) {
	err = s.call(ctx, "RequestCancel", true, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		c, e = s.Store.RequestCancel(ctx, threadID, runID, now)
		return e
	})
	return c, err
}

func (s *procStore) FinishRun(ctx context.Context, run agent.Run) error {
	detail := func() string { return fmt.Sprintf("%s %s@%d %s", run.ThreadID, run.ID, run.Epoch, run.Status) }
	return s.callD(ctx, "FinishRun", true, false, callPlain, s.ownFence(ctx, run.Fence()), run.ThreadID, detail, func(ctx context.Context) error {
		return s.Store.FinishRun(ctx, run)
	})
}

func (s *procStore) FenceMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return s.call(ctx, "FenceMessage", true, callPlain, nil, threadID, func(ctx context.Context) error {
		return s.Store.FenceMessage(ctx, threadID, id, f)
	})
}

func (s *procStore) TakeOver(ctx context.Context, req agent.TakeRequest) (f agent.Fence, err error) {
	err = s.call(ctx, "TakeOver", true, callPlain, nil, req.ThreadID, func(ctx context.Context) error {
		var e error
		f, e = s.Store.TakeOver(ctx, req)
		return e
	})
	return f, err
}

func (s *procStore) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	return s.call(ctx, "RecordOutcome", true, callPlain, nil, run.ThreadID, func(ctx context.Context) error {
		return s.Store.RecordOutcome(ctx, run, holder)
	})
}

func (s *procStore) ReleaseClaim(ctx context.Context, req agent.ReleaseRequest) error {
	return s.call(ctx, "ReleaseClaim", true, callPlain, nil, req.ThreadID, func(ctx context.Context) error {
		return s.Store.ReleaseClaim(ctx, req)
	})
}

func (s *procStore) ListStaleClaims(ctx context.Context, before time.Time, limit int) (cs []agent.StaleClaim, err error) {
	err = s.call(ctx, "ListStaleClaims", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		cs, e = s.Store.ListStaleClaims(ctx, before, limit)
		return e
	})
	// Other batches' schedules share the store: the reaper of this schedule only sees this schedule's threads
	// (a failed schedule may leave claims behind, which must not leak into the next one).
	kept := cs[:0:0]
	for _, c := range cs {
		if s.p.w.ours(c.ThreadID) {
			kept = append(kept, c)
		}
	}
	return kept, err
}

func (s *procStore) GetRun(ctx context.Context, threadID, runID string) (r agent.Run, err error) {
	err = s.call(ctx, "GetRun", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		r, e = s.Store.GetRun(ctx, threadID, runID)
		return e
	})
	return r, err
}

func (s *procStore) ListRuns(ctx context.Context, threadID string) (rs []agent.Run, err error) {
	err = s.call(ctx, "ListRuns", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		rs, e = s.Store.ListRuns(ctx, threadID)
		return e
	})
	return rs, err
}

// MessageStore.

func (s *procStore) PutMessage(ctx context.Context, mw agent.MessageWrite) error {
	if phaseOf(ctx) == phaseBegin && mw.Message.Role == agent.RoleUser && mw.Fence.RunID == s.p.ownRun() && !userWriting() {
		// The user message is written beside the first model request; if the engine moved that write, the
		// scheduler no longer knows when it comes.
		s.p.w.violate("sim", "%s: the user message %s is written outside %s (goroutine %s): the sim's model of the engine is out of date",
			s.p.name, mw.Message.ID, entryUserWritePrefix, goroutineEntry())
	}
	detail := func() string {
		return fmt.Sprintf("%s/%s %s seq=%d fence=%s@%d final=%v %s", mw.ThreadID, mw.Message.ID, mw.Message.Role, mw.Seq,
			mw.Fence.RunID, mw.Fence.Epoch, mw.Final, mw.Message.Meta().Status)
	}
	// A retry that rewrites exactly what is stored (its first attempt applied and lost its answer) changes
	// nothing, whoever holds the claim by then: the one-writer check does not count it.
	prev, perr := s.p.w.base.GetMessage(context.WithoutCancel(ctx), mw.ThreadID, mw.Message.ID)
	s.p.w.mu.Lock()
	s.p.noopWrite = perr == nil && samePutMessage(prev.Message, mw.Message)
	s.p.w.mu.Unlock()
	var before *steerBefore
	if strings.HasPrefix(mw.Message.ID, "steer_") {
		before = s.p.w.beforeSteer(mw)
	}
	// An edit commits in this one write (fence D): it hides every message after the edited one, up to
	// HideBefore, and the DeleteMessage calls after it are cleanup that may fail for good or never come.
	var hides []string
	// The edited message keeps its stored position (prev), whatever mw.Seq says.
	if mw.HideBefore > 0 && perr == nil && phaseOf(ctx) == phaseBegin && mw.Fence.RunID == s.p.ownRun() {
		if rs, err := s.p.w.base.ListMessages(context.WithoutCancel(ctx), mw.ThreadID); err == nil {
			for _, r := range rs {
				if r.Seq > prev.Seq && r.Seq < mw.HideBefore {
					hides = append(hides, r.Message.ID)
				}
			}
		}
	}
	return s.callD(ctx, "PutMessage", true, mw.Final, callPlain, s.ownFence(ctx, mw.Fence), mw.ThreadID, detail, func(ctx context.Context) error {
		err := s.Store.PutMessage(ctx, mw)
		if err == nil {
			for _, id := range hides {
				s.p.w.messageDropped(mw.ThreadID, id) // even if the process dies before it hears back
			}
		}
		if err == nil && before != nil {
			s.p.w.steerStored(s.p, mw, before)
		}
		if err == nil && mw.Message.Role == agent.RoleUser && mw.Fence.RunID == s.p.ownRun() && phaseOf(ctx) == phaseBegin {
			s.p.w.mu.Lock()
			if mw.Message.ID == s.p.ownMsg {
				s.p.uwApplied = true // the store answered ok: the message must be kept (mustKeep)
			}
			s.p.w.mu.Unlock()
		}
		if err == nil && s.p.delivers && mw.Message.Role == agent.RoleUser && mw.Fence.RunID == s.p.ownRun() {
			s.p.w.takenStored(s.p, mw) // a delivery pass's turn stores user messages only from the queue
		}
		return err
	})
}

func (s *procStore) GetMessage(ctx context.Context, threadID, id string) (r agent.MessageRecord, err error) {
	err = s.call(ctx, "GetMessage", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		r, e = s.Store.GetMessage(ctx, threadID, id)
		return e
	})
	return r, err
}

func (s *procStore) ListMessages(ctx context.Context, threadID string) (rs []agent.MessageRecord, err error) {
	err = s.call(ctx, "ListMessages", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		rs, e = s.Store.ListMessages(ctx, threadID)
		return e
	})
	if err == nil && phaseOf(ctx) == phaseBegin {
		s.p.listed(rs)
	}
	return rs, err
}

func (s *procStore) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	edit := phaseOf(ctx) == phaseBegin && f.RunID == s.p.ownRun() // an edit drops the messages after the edited one
	detail := func() string { return fmt.Sprintf("%s/%s fence=%s@%d", threadID, id, f.RunID, f.Epoch) }
	return s.callD(ctx, "DeleteMessage", true, false, callPlain, s.ownFence(ctx, f), threadID, detail, func(ctx context.Context) error {
		err := s.Store.DeleteMessage(ctx, threadID, id, f)
		if err == nil && edit {
			s.p.w.messageDropped(threadID, id) // even if the process dies before it hears back
		}
		return err
	})
}

// InterruptStore.

func (s *procStore) CreateInterrupt(ctx context.Context, in agent.Interrupt) (got agent.Interrupt, created bool, err error) {
	detail := func() string {
		return fmt.Sprintf("%s/%s %s %s call=%s message=%s run=%s@%d -> created=%v", in.ThreadID, in.ID, in.Kind, in.ToolName,
			in.ToolCallID, in.MessageID, in.RunID, in.Epoch, created)
	}
	err = s.callD(ctx, "CreateInterrupt", true, false, callPlain, nil, in.ThreadID, detail, func(ctx context.Context) error {
		var e error
		got, created, e = s.Store.CreateInterrupt(ctx, in)
		if e == nil && created {
			s.p.w.mu.Lock()
			s.p.w.stats.asked++
			s.p.w.mu.Unlock()
		}
		return e
	})
	return got, created, err
}

func (s *procStore) GetInterrupt(ctx context.Context, threadID, messageID, id string) (in agent.Interrupt, err error) {
	err = s.call(ctx, "GetInterrupt", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		in, e = s.Store.GetInterrupt(ctx, threadID, messageID, id)
		return e
	})
	return in, err
}

func (s *procStore) ListMessageInterrupts(ctx context.Context, threadID, messageID string) (ins []agent.Interrupt, err error) {
	if e := goroutineEntry(); e == entryPlanRead || e == entryGetRead {
		// Beside a read of the messages (see goroutineEntry): no fate.
		if s.p.isDead() {
			return nil, s.p.parkDead()
		}
		return s.Store.ListMessageInterrupts(ctx, threadID, messageID)
	}
	err = s.call(ctx, "ListMessageInterrupts", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		ins, e = s.Store.ListMessageInterrupts(ctx, threadID, messageID)
		return e
	})
	return ins, err
}

func (s *procStore) ListInterrupts(ctx context.Context, threadID string) (ins []agent.Interrupt, err error) {
	if e := goroutineEntry(); e == entryPlanRead || e == entryGetRead {
		// Beside a read of the messages (see goroutineEntry): no fate.
		if s.p.isDead() {
			return nil, s.p.parkDead()
		}
		return s.Store.ListInterrupts(ctx, threadID)
	}
	err = s.call(ctx, "ListInterrupts", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		ins, e = s.Store.ListInterrupts(ctx, threadID)
		return e
	})
	return ins, err
}

func (s *procStore) ResolveInterrupt(ctx context.Context, req agent.ResolveRequest) (got agent.Interrupt, err error) {
	detail := func() string { return fmt.Sprintf("%s/%s -> %s", req.ThreadID, req.ID, req.Status) }
	err = s.callD(ctx, "ResolveInterrupt", true, false, callPlain, nil, req.ThreadID, detail, func(ctx context.Context) error {
		var e error
		got, e = s.Store.ResolveInterrupt(ctx, req)
		if e == nil {
			s.p.w.interruptResolved(s.p, got)
		}
		return e
	})
	return got, err
}

func (s *procStore) ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) (ins []agent.Interrupt, err error) {
	err = s.call(ctx, "ListExpiredInterrupts", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		ins, e = s.Store.ListExpiredInterrupts(ctx, before, limit)
		return e
	})
	// As for stale claims: only this schedule's threads (other schedules share a DynamoDB table).
	kept := ins[:0:0]
	for _, in := range ins {
		if s.p.w.ours(in.ThreadID) {
			kept = append(kept, in)
		}
	}
	return kept, err
}

// SegmentStore.

func (s *procStore) AppendSegment(ctx context.Context, seg agent.Segment) error {
	// Faults on segments hit only a segment's first attempt, and never the final one: the segmenter retries a
	// failed segment at its next wake only (its interval timer is switched off here), so a fault on the retry
	// inside Close would hold the run for segments.DefaultCloseTimeout of real time.
	key := fmt.Sprintf("%s/%d", seg.RunID, seg.Seq)
	first := s.p.w.firstSegmentAttempt(key)
	return s.call(ctx, "AppendSegment", first && !seg.Final, callPlain, nil, seg.ThreadID, func(ctx context.Context) error {
		return s.Store.AppendSegment(ctx, seg)
	})
}

func (s *procStore) ListSegments(ctx context.Context, runID string, from int64, now time.Time) (ss []agent.Segment, err error) {
	if !s.p.readerPoll(runID, from) {
		return nil, errDead
	}
	err = s.call(ctx, "ListSegments", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		ss, e = s.Store.ListSegments(ctx, runID, from, now)
		return e
	})
	return ss, err
}

// ValueStore.

func (s *procStore) PutValue(ctx context.Context, ns, key string, value []byte) error {
	return s.call(ctx, "PutValue", true, callPlain, nil, "", func(ctx context.Context) error {
		err := s.Store.PutValue(ctx, ns, key, value)
		if err == nil {
			s.p.w.valuePut(ns, key)
		}
		return err
	})
}

func (s *procStore) GetValue(ctx context.Context, ns, key string) (b []byte, err error) {
	err = s.call(ctx, "GetValue", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		b, e = s.Store.GetValue(ctx, ns, key)
		return e
	})
	return b, err
}

func (s *procStore) ListValues(ctx context.Context, ns string) (kv []agent.KV, err error) {
	err = s.call(ctx, "ListValues", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		kv, e = s.Store.ListValues(ctx, ns)
		return e
	})
	return kv, err
}

func (s *procStore) DeleteValue(ctx context.Context, ns, key string) error {
	return s.call(ctx, "DeleteValue", true, callPlain, nil, "", func(ctx context.Context) error { return s.Store.DeleteValue(ctx, ns, key) })
}

func samePutMessage(a, b agent.Message) bool {
	if a.Role != b.Role || len(a.Parts) != len(b.Parts) || !bytes.Equal(a.Metadata, b.Metadata) {
		return false
	}
	for i := range a.Parts {
		if !bytes.Equal(a.Parts[i], b.Parts[i]) {
			return false
		}
	}
	return true
}
