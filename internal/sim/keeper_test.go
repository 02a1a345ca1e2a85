package sim

// Shared keepers (issue 18 item 3): the engine's keeper heartbeats every running run of a process in one
// KeepClaims batch, each claim answered on its own. A sim process holds one run, so in the schedules of sharedMode
// a turn process (a post, an answer, a regenerate) may start as the guest of a live turn process on another
// thread, its host: the two are one process as the keeper and a crash see it, and two coroutines as the scheduler
// sees it.
//
//   - The guest's engine keeps its runs with the host's keeper (shareKeeper): its guards join the host's members,
//     so one batch carries both runs' claims, through the host's procStore (the guard tick the scheduler arms is
//     the host's, whichever run it ticks for), and StopLocal of either engine reaches both runs. Everything else
//     of the guest (its store calls and their fates, its parks, its tools, its clock's timers) stays its own: the
//     keeper uses only its engine's store, timers, clock and Heartbeat, which are the same for both.
//   - A crash of either kills both (proc.die): a dead process's calls never return, so a keeper whose process
//     died can keep nobody.
//   - The whole batch fails, crashes its process or loses its answer as one store call (procStore.KeepClaims,
//     the host's fault plan), or is held in flight (holdBatch): the scheduler may then do anything that does not
//     wait for the keeper (move the clock, reap, stop, start others) before it arrives (batchArrives), and
//     sometimes moves the clock past staleAfter and sweeps first (stallBatch). A member's grant, a tick and a
//     drain let it arrive first (leaving the keeper waits for the batches in flight), and so does a clock move
//     while a member's slow tool is parked. Besides, each claim of a batch of two or more may fail alone
//     (keepFaults: not sent, or applied and its answer lost), as one UpdateItem of DynamoDB's batch does; and the
//     store answers each claim on its own (a stop of one thread cancels that run only).
//   - A claim taken over while it is in the batch cannot come back run_fenced: a takeover needs staleAfter, and
//     the batch's deadline is its earliest horizon, half of that, and each claim carries its run's write gate,
//     which refuses it past its own horizon (the run then finds itself in doubt). The schedules reach that: a
//     batch held past a reaper's takeover arrives refused (on SQLite: "keep claims: context deadline
//     exceeded"), changes nothing, and its runs stop.
//
// The invariants are the ones every run is checked against (check_test.go); sharedStats counts what the
// schedules exercised.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// sharedMode reports whether seed's turn processes may share a keeper (one seed in three; never a seed of
// regressions, timeRegressions, gapRegressions or knownBugs, so they replay as recorded): drawn from a stream of
// its own, and the guests from another (world.shareRng), so every other draw of the schedule stays what it was.
func sharedMode(seed uint64) bool {
	if !*flagShared || slices.Contains(regressions, seed) || slices.Contains(timeRegressions, seed) {
		return false
	}
	for _, g := range gapRegressions {
		if g.seed == seed {
			return false
		}
	}
	for _, kb := range knownBugs {
		if kb.seed == seed {
			return false
		}
	}
	return rand.New(rand.NewPCG(seed, 0x5ba4ed)).IntN(3) == 0
}

// sharedStats counts the shared keepers' work: schedules in shared mode, guests started, batches that carried two
// claims or more, those whose claims were answered differently, and claims failed alone.
type sharedStats struct {
	schedules, guests, batches, split, claimFaults int
}

func (a *sharedStats) add(b sharedStats) {
	a.schedules += b.schedules
	a.guests += b.guests
	a.batches += b.batches
	a.split += b.split
	a.claimFaults += b.claimFaults
}

// shareKeeper makes guest's runs members of host's keeper (the engine has one keeper per Engine, unexported: two
// engines' runs in one process share it as one engine's do).
func shareKeeper(guest, host *engine.Engine) {
	field := func(e *engine.Engine) reflect.Value {
		v := reflect.ValueOf(e).Elem().FieldByName("keeper")
		if !v.IsValid() || v.Kind() != reflect.Pointer {
			panic("sim: engine.Engine has no keeper field any more: update shareKeeper")
		}
		return reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem()
	}
	field(guest).Set(field(host))
}

// keeperProc is the process whose keeper keeps p's runs (under w.mu or not: host is set before p starts).
func (p *proc) keeperProc() *proc { return cmp.Or(p.host, p) }

// group is the processes that are one process with p (p's keeper's host and its guests), p among them.
func (p *proc) group() []*proc {
	k := p.keeperProc()
	return append([]*proc{k}, k.guests...)
}

// pickHost decides (shared mode) whether the turn process p on thread th starts as a guest, and of whom: a live
// turn process of another thread that is no guest itself. A host's run on the same thread would meet its guest's
// multitask interrupt through StopLocal in memory, outside any grant of the scheduler.
func (w *world) pickHost(p *proc, th *simThread) {
	if !w.sharedOn {
		return
	}
	w.mu.Lock()
	var hosts, streaming []*proc
	for _, h := range w.procs {
		if h != p && !h.dead && !h.done && h.host == nil && h.threadID != "" && h.threadID != th.id && h.eng != nil {
			hosts = append(hosts, h)
			if h.runCtx != nil && h.runCtx.Err() == nil && !h.loopEnded {
				streaming = append(streaming, h)
			}
		}
	}
	w.mu.Unlock()
	if len(streaming) > 0 {
		hosts = streaming // a host whose run streams: the guest's run joins its batches while it does
	}
	if len(hosts) == 0 || w.shareRng.IntN(4) == 0 {
		return
	}
	h := hosts[w.shareRng.IntN(len(hosts))]
	shareKeeper(p.eng, h.eng)
	w.mu.Lock()
	p.host = h
	h.guests = append(h.guests, p)
	h.keepRng = cmp.Or(h.keepRng, rand.New(rand.NewPCG(w.seed^0x6b656570, uint64(h.id))))
	w.stats.shared.guests++
	w.mu.Unlock()
	w.tracef("  %s: a guest of %s (one keeper, one fate)", p.name, h.name)
}

// keepFault is what happens to one claim of a batch on its own (keepFaults).
type keepFault int

const (
	keepSent   keepFault = iota
	keepBefore           // not sent: its write failed (transient)
	keepLost             // sent and applied, its answer lost (transient)
)

// keepFaults draws, for a batch of two claims or more of a faulty host, each claim's own fate (under w.mu).
func (p *proc) keepFaults(n int) []keepFault {
	fs := make([]keepFault, n)
	if n < 2 || p.keepRng == nil {
		return fs
	}
	for i := range fs {
		switch r := p.keepRng.Float64(); {
		case r < 0.12:
			fs[i] = keepBefore
		case r < 0.2:
			fs[i] = keepLost
		}
	}
	return fs
}

// claimProc is the process of the group whose run holds claim c (nil: none known, e.g. one that has just
// ended).
func (p *proc) claimProc(c agent.KeptClaim) *proc {
	for _, q := range p.group() {
		if q.runID == c.Fence.RunID {
			return q
		}
	}
	return nil
}

var errClaimInjected = agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "sim: injected transient fault on one claim")

// answerClass names a claim's answer for the trace and sharedStats.
func answerClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, agent.ErrRunCanceled):
		return "run_canceled"
	case errors.Is(err, agent.ErrRunFenced):
		return "run_fenced"
	}
	return "transient"
}

// sharedTick is a step of shared mode besides the schedule's own (drawn from shareRng): now and then, the batch of
// a keeper that keeps two running runs or more, ticked for one of them that streams.
func (w *world) sharedTick() error {
	if !w.sharedOn || w.shareRng.IntN(3) != 0 {
		return nil
	}
	var ticks []*proc
	w.mu.Lock()
	running := func(q *proc) bool {
		return !q.dead && !q.done && q.runCtx != nil && q.runCtx.Err() == nil && !q.loopEnded
	}
	for _, h := range w.procs {
		if h.host != nil || len(h.guests) == 0 {
			continue
		}
		n := 0
		var live *proc
		for _, q := range h.group() {
			if running(q) {
				n++
				if q.parkedAt == "model" && live == nil {
					live = q
				}
			}
		}
		if n > 1 && live != nil {
			ticks = append(ticks, live)
		}
	}
	w.mu.Unlock()
	if len(ticks) == 0 {
		return nil
	}
	p := ticks[w.shareRng.IntN(len(ticks))]
	if !p.liveStream() {
		return nil
	}
	w.tracef("keeper batch of %s (shared)", p.keeperProc().name)
	return w.guardTick(p, callHeartbeat)
}

// shares reports whether p's keeper keeps another process's runs too (p is a host with guests).
func (p *proc) shares() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return len(p.guests) > 0
}

// batchHeld reports whether p's keeper's batch is held in flight.
func (p *proc) batchHeld() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return p.batchGo != nil
}

// heldBatches lists the hosts whose keeper's batch is held in flight, in creation order.
func (w *world) heldBatches() []*proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	var ks []*proc
	for _, p := range w.procs {
		if p.batchGo != nil {
			ks = append(ks, p)
		}
	}
	return ks
}

// toolParked reports whether a process of kp's group has a slow tool parked.
func (kp *proc) toolParked() bool {
	kp.w.mu.Lock()
	defer kp.w.mu.Unlock()
	for _, q := range kp.group() {
		if !q.dead && q.parkedAt == "tool" {
			return true
		}
	}
	return false
}

// holdBatch decides (a host's armed batch, drawn from keepRng) whether the batch is held in flight: the scheduler
// may then move the clock, reap, stop and start others before it reaches the store (world.batchArrives), as a
// request of a loaded store or network arrives late. The batch is stamped with the time it was sent.
func (p *proc) holdBatch() bool {
	p.w.mu.Lock()
	defer p.w.mu.Unlock()
	return !p.dead && len(p.guests) > 0 && p.keepRng != nil && p.keepRng.IntN(5) == 0
}

// parkBatch holds the keeper's batch until the scheduler lets it arrive; false when the schedule ended first.
func (p *proc) parkBatch() bool {
	w := p.w
	w.mu.Lock()
	if p.dead {
		w.mu.Unlock()
		return false
	}
	ch := make(chan struct{})
	p.batchGo = ch
	w.mu.Unlock()
	w.reports <- report{p, repBatchHeld}
	select {
	case <-ch:
		return true
	case <-w.released:
		return false
	}
}

// arriveFirst lets p's keeper's held batch arrive before p is granted.
func (w *world) arriveFirst(p *proc) error {
	if kp := p.keeperProc(); kp.batchHeld() {
		return w.batchArrives(kp)
	}
	return nil
}

// batchArrives lets kp's held batch reach the store, and waits until the keeper handled its answers.
func (w *world) batchArrives(kp *proc) error {
	held, err := w.holdTools(kp.group()...)
	if err != nil {
		return err
	}
	w.mu.Lock()
	ch, done, dead := kp.batchGo, kp.guardDone, kp.dead
	kp.batchGo = nil
	w.mu.Unlock()
	if dead {
		// Its process died meanwhile (a call of a run's user-message goroutine): the batch never arrives.
		return w.goOn(held)
	}
	w.tracef("keeper batch of %s arrives", kp.name)
	close(ch)
	select {
	case err := <-done:
		w.tracef("  %s: keeper batch -> %s", kp.name, errStr(err))
	case r := <-w.reports:
		if r.p != kp || r.kind != repDead {
			return fmt.Errorf("sim: report %d from %s during the arrival of %s's batch", r.kind, r.p.name, kp.name)
		}
		w.mu.Lock()
		w.stats.crashes++
		w.mu.Unlock()
		return w.goOn(held)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("sim: the held batch of %s never arrived", kp.name)
	}
	if err := w.keeperSettled(kp); err != nil {
		return err
	}
	return w.goOn(held)
}

// keeperSettled waits, after a batch of kp's keeper answered, until the keeper applied every answer (each run's
// batches in flight: inflightOf), then until every run of the group whose claim is now in doubt was stopped by the
// keeper's next look (a batch held in flight kept the keeper from looking meanwhile).
func (w *world) keeperSettled(kp *proc) error {
	w.mu.Lock()
	var wgs []*sync.WaitGroup
	for _, q := range kp.group() {
		if q.turn != nil {
			if wg := inflightOf(q.turn); wg != nil {
				wgs = append(wgs, wg)
			}
		}
	}
	kp.awaitSettle[callHeartbeat] = false
	w.mu.Unlock()
	applied := make(chan struct{})
	go func() {
		for _, wg := range wgs {
			wg.Wait()
		}
		close(applied)
	}()
	select {
	case <-applied:
	case <-time.After(30 * time.Second):
		return fmt.Errorf("sim: the keeper of %s did not apply its batch's answers", kp.name)
	}
	now := w.clock.Now()
	var doubt []context.Context
	w.mu.Lock()
	for _, q := range kp.group() {
		if !q.dead && !q.done && q.runCtx != nil && q.runCtx.Err() == nil && !q.loopEnded && now.Sub(q.lastOK) > w.ecfg.StaleAfter/2 {
			q.inDoubt = true
			doubt = append(doubt, q.runCtx)
		}
	}
	w.mu.Unlock()
	for _, ctx := range doubt {
		select {
		case <-ctx.Done():
		case <-time.After(30 * time.Second):
			return fmt.Errorf("sim: a run of %s's keeper did not stop itself in doubt", kp.name)
		}
	}
	return nil
}

// inflightOf is the count of the keeper's batches in flight that carry t's claim (its guard's, lib/engine
// guard.inflight; nil before the run streams): keeper.beat marks each answer applied there.
func inflightOf(t *engine.Turn) *sync.WaitGroup {
	gp := reflect.ValueOf(t).Elem().FieldByName("guardp")
	if !gp.IsValid() {
		panic("sim: engine.Turn has no guardp any more: update inflightOf")
	}
	g := reflect.NewAt(gp.Type(), unsafe.Pointer(gp.UnsafeAddr())).MethodByName("Load").Call(nil)[0]
	if g.IsNil() {
		return nil
	}
	f := g.Elem().FieldByName("inflight")
	if !f.IsValid() || f.Type() != reflect.TypeOf(sync.WaitGroup{}) {
		panic("sim: engine's guard has no inflight WaitGroup any more: update inflightOf")
	}
	return (*sync.WaitGroup)(unsafe.Pointer(f.UnsafeAddr()))
}

// checkKept holds each claim of a batch that reached the store to DESIGN principle 8 (invariant one-writer): an
// accepted claim was its run's at its epoch when the batch arrived, and a fenced one changed nothing (the
// thread's claim and epoch are what they were). It runs in the keeper's call, while every other process is
// parked.
func (w *world) checkKept(p *proc, sent []agent.KeptClaim, before []agent.Thread, got []agent.KeepResult) {
	for i, c := range sent {
		if i >= len(got) {
			return
		}
		b := before[i]
		switch err := got[i].Err; {
		case err == nil:
			if a := b.ActiveRun; a == nil || a.RunID != c.Fence.RunID || a.Epoch != c.Fence.Epoch {
				w.violate("one-writer", "%s: the keeper's batch kept run %s@%d of thread %s while the claim was %s", p.name,
					c.Fence.RunID, c.Fence.Epoch, c.ThreadID, claimName(b))
			}
		case errors.Is(err, agent.ErrRunFenced):
			after, _ := w.threadOf(c.ThreadID)
			if after.Epoch != b.Epoch || !reflect.DeepEqual(after.ActiveRun, b.ActiveRun) {
				w.violate("one-writer", "%s: the keeper's batch for fenced run %s@%d changed thread %s's claim: %s, then %s", p.name,
					c.Fence.RunID, c.Fence.Epoch, c.ThreadID, claimName(b), claimName(after))
			}
		}
	}
}

func claimName(th agent.Thread) string {
	if c := th.ActiveRun; c != nil {
		return fmt.Sprintf("%s@%d (thread epoch %d)", c.RunID, c.Epoch, th.Epoch)
	}
	return fmt.Sprintf("none (thread epoch %d)", th.Epoch)
}

// stallBatch lets kp's held batch arrive after the clock passed staleAfter and a reaper swept, as stall does for a
// run's write: the reaper takes over the claims gone stale meanwhile, and the batch must change none of them. The
// clock moves just past the oldest claim's staleness when the batch's runs were last confirmed at different
// times, so that a sweep may take one claim and leave another. No slow tool of kp's group is parked (the clock
// would make its engine give it up, and the process go on while its keeper is inside the batch).
func (w *world) stallBatch(kp *proc) error {
	now := w.clock.Now()
	d := w.ecfg.StaleAfter + time.Duration(100+w.shareRng.IntN(4900))*time.Millisecond
	var oldest, newest time.Time
	w.mu.Lock()
	for _, q := range kp.group() {
		if q.dead || q.keptAt.IsZero() || q.runCtx == nil || q.loopEnded {
			continue
		}
		if oldest.IsZero() || q.keptAt.Before(oldest) {
			oldest = q.keptAt
		}
		if q.keptAt.After(newest) {
			newest = q.keptAt
		}
	}
	w.mu.Unlock()
	if alt := oldest.Add(w.ecfg.StaleAfter + time.Second).Sub(now); newest.After(oldest) && alt > 0 && alt < d {
		d = alt
	}
	w.tracef("stall %s's keeper batch past staleAfter", kp.name)
	if err := w.beforeClock(d); err != nil {
		return err
	}
	if err := w.reap(false); err != nil {
		return err
	}
	if !kp.batchHeld() {
		return nil
	}
	return w.batchArrives(kp)
}
