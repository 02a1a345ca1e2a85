// Package reaper finishes runs whose process died (DESIGN.md "Reaper", "Closing the last windows"). It finds
// claims whose heartbeat is older than StaleAfter through the store's index of claimed threads, which only
// nominates: every decision is re-checked in the write that makes it. For each nominee, in order, each step
// conditional and idempotent:
//
//  1. take the thread's claim at epoch+1 for the reaper (TakeOver, fence A) on condition "still this run, same
//     epoch, heartbeat before the cutoff". This is the decision: a live run keeps its claim, of two reapers only
//     one takes it, nobody claims the thread while the reaper cleans up, and every write the dead run still makes
//     is fenced by the new epoch (on SQLite each checks the claim in its own transaction, fence F);
//  2. stub (or fence) every id the dead run can still create, its user message and its reply, at the reaper's
//     epoch (FenceMessage, fence B), then read the run and its draft: what they hold can no longer change, and a
//     final reply that landed before is adopted;
//  3. record the run's outcome (RecordOutcome): failed with code stale, or, when its final message was stored
//     but its outcome was not, the status that message records;
//  4. finalize the draft assistant message at the reaper's fence: failed, with the outcome each tool recorded
//     under its idempotency key, or a truthful "result unknown" for a call without one, and the run's error in
//     its metadata (readers show it even when the run said nothing). With no draft, the message is rebuilt from
//     the run's stream segments;
//  5. write a final segment so attached readers end;
//  6. cancel the interrupts the dead run stored but never showed in a final message (their calls now carry a
//     result, so no answer may run them);
//  7. finish an editing run's cleanup (fence D: its edit hid the later messages in one write; deleting them and
//     canceling the interrupts of the reply it dropped came after, and a dead run may not have done it);
//  8. give back the run's slot in its user's active-run scope, and the reaper's claim (ReleaseClaim), adding the
//     usage the draft recorded in that same write.
//
// A run whose claim is gone without its outcome (DynamoDB: a crash between FinishRun's two writes) may have its reply
// continued by a later run before the orphan sweep finds it: the reply is then the later run's and is left alone,
// and the dead run is recorded interrupted with the usage its release kept (overwritten, superseded).
//
// A reaper that dies on the way leaves its own claim, which goes stale and is reaped the same way at the next
// epoch. A claim whose run is missing or already terminal is taken and given back the same way; a missing run
// item that a store may still write late (agent.RunStubber: DynamoDB's ClaimRun is two writes) is stubbed failed
// first, so that it cannot land as a running run that no claim names.
//
// Each sweep also marks pending interrupts past their age expired (compare-and-set, through the store's index
// of pending interrupts); the transcript gets their results from the next turn that claims the thread.
//
// The same routine runs lazily when a claim finds a stale run in its way, and when a thread is read.
//
// A run that handed over and whose continuation never took the claim is continued instead of reaped, within its
// bounds, when the reaper has a launcher (relaunch.go).
package reaper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/transcript"
)

// Defaults, written once here (lib/config maps env names onto Config).
const (
	// DefaultInterval is the sweep period of Run (the dev ticker). In AWS an EventBridge schedule calls Tick
	// every minute instead.
	DefaultInterval = 5 * time.Second
	// DefaultBatch bounds one sweep.
	DefaultBatch = 100
)

// Config is the reaper's own configuration. Zero values take the defaults.
type Config struct {
	StaleAfter time.Duration // agent.DefaultStaleAfter
	Interval   time.Duration
	Batch      int
	// DeliveryGrace is how long a queue entry may wait on an idle thread before the sweep asks for a delivery
	// pass (agent.DefaultJobContract().DeliveryGrace).
	DeliveryGrace time.Duration
	// StartDue and ExecutionTimeout are the job contract's (agent.DefaultJobContract()): a job that never
	// reported is started again every StartDue, and failed once its execution would have ended (jobs.go).
	StartDue         time.Duration
	ExecutionTimeout time.Duration
	// RunTimeout is the whole-run time limit (the engine's, AGENT_RUN_TIMEOUT), counted from a run's creation: a
	// handed-over run past it is reaped, not continued (relaunch.go). Zero: no limit but MaxRelaunches.
	RunTimeout time.Duration
	// MaxRelaunches bounds the relaunches of a handed-over run's continuation without progress (DefaultMaxRelaunches).
	MaxRelaunches int
}

// Store is what the reaper needs: runs and claims, messages, stream segments, and a thread's read (a tool's
// recorded outcome is looked up under the thread's owner). Of threads it only reads one: the function's policy is
// derived from this port, and the whole agent.ThreadStore (DeleteThread) would grant it DeleteItem (REVIEW H11).
type Store interface {
	GetThread(ctx context.Context, id string) (agent.Thread, error)
	agent.RunStore
	agent.MessageStore
	agent.SegmentStore
	agent.InterruptStore
	agent.JobStore
	agent.QueueStore
	agent.LimitStore
	agent.HandOverStore
}

// Deps are the reaper's ports. Tools are looked up for the outcomes they recorded. Jobs, when set, is asked for
// delivery passes (re-driven jobs, forgotten queues); without it the sweep leaves jobs and queues alone.
type Deps struct {
	Store  Store
	Tools  []agent.Tool
	Jobs   agent.Jobs
	Clock  agent.Clock
	Logger *slog.Logger
	// Metrics counts reaped runs (nil: agent.NopMetrics).
	Metrics agent.Metrics
	// Signals announces the end of every run the reaper records (lib/signals), and each sweep delivers the
	// completion signals that are due (nil: none).
	Signals agent.RunSignals
	// Launcher continues handed-over runs whose continuation never started (relaunch.go; nil: they are reaped).
	Launcher agent.RunLauncher
}

// Reaper reaps stale runs.
type Reaper struct {
	store   Store
	tools   map[string]agent.Tool
	jobs    agent.Jobs
	clock   agent.Clock
	log     *slog.Logger
	metrics agent.Metrics
	signals agent.RunSignals
	cfg     Config
	// launcher continues handed-over runs; held: a draining replica leaves them to the others (Hold).
	launcher agent.RunLauncher
	held     atomic.Bool
}

// New builds a reaper.
func New(d Deps, cfg Config) *Reaper {
	cfg.StaleAfter = cmp.Or(cfg.StaleAfter, agent.DefaultStaleAfter)
	cfg.Interval = cmp.Or(cfg.Interval, DefaultInterval)
	cfg.Batch = cmp.Or(cfg.Batch, DefaultBatch)
	cfg.DeliveryGrace = cmp.Or(cfg.DeliveryGrace, agent.DefaultJobContract().DeliveryGrace)
	cfg.StartDue = cmp.Or(cfg.StartDue, agent.DefaultJobContract().StartDue)
	cfg.ExecutionTimeout = cmp.Or(cfg.ExecutionTimeout, agent.DefaultJobContract().ExecutionTimeout)
	cfg.MaxRelaunches = cmp.Or(cfg.MaxRelaunches, DefaultMaxRelaunches)
	if cfg.RunTimeout <= 0 {
		cfg.RunTimeout = everyHeartbeat
	}
	r := &Reaper{store: d.Store, jobs: d.Jobs, clock: d.Clock, log: d.Logger, metrics: d.Metrics, signals: d.Signals, cfg: cfg,
		tools: map[string]agent.Tool{}, launcher: d.Launcher}
	if r.metrics == nil {
		r.metrics = agent.NopMetrics{}
	}
	if r.clock == nil {
		r.clock = agent.SystemClock{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	for _, t := range d.Tools {
		r.tools[t.Name] = t
	}
	return r
}

// Config returns the effective configuration.
func (r *Reaper) Config() Config { return r.cfg }

// Stats counts one sweep.
type Stats struct {
	Nominated int // claims the index named
	Reaped    int // claims this sweep released
	Continued int // handed-over runs whose continuation this sweep launched again (relaunch.go)
	Orphans   int // claimless running runs the store named (REVIEW D15), each finished through ReapOrphan
	Expired   int // pending interrupts this sweep marked expired
	Redriven  int // undelivered jobs this sweep asked a delivery pass for
	Swept     int // idle threads with a forgotten queue this sweep asked a delivery pass for
	Signaled  int // completion signals this sweep delivered (retries, and the ones a dead process left)
}

// Tick runs one sweep (the scheduled function calls it). A failure on one claim is logged and the others go on.
func (r *Reaper) Tick(ctx context.Context) (Stats, error) {
	var st Stats
	// The sweep's store requests are metered so that its throttled ones reach the metrics (a run's are counted
	// by the engine).
	meter := new(agent.StoreMeter)
	// One sweep: its lists may share their reads (DynamoDB: the orphan list reuses the stale claims' reads of the
	// running index, so an idle tick queries its shards once).
	ctx = agent.WithSweep(agent.WithStoreMeter(ctx, meter))
	defer func() {
		if n := meter.Snapshot().Throttled; n > 0 {
			r.metrics.StoreThrottled(int(n))
		}
	}()
	claims, err := r.store.ListStaleClaims(ctx, r.clock.Now().Add(-r.cfg.StaleAfter), r.cfg.Batch)
	if err != nil {
		return st, fmt.Errorf("reaper: list stale claims: %w", err)
	}
	st.Nominated = len(claims)
	for _, sc := range claims {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		if did, err := r.relaunch(ctx, sc.ThreadID, sc.Claim); did != notHandedOver || err != nil {
			switch {
			case err != nil:
				r.log.Warn("agent.relaunch", "thread_id", sc.ThreadID, "run_id", sc.Claim.RunID, "err", err)
			case did == reapedNow:
				st.Reaped++
			case did == continued:
				st.Continued++
			}
			continue
		}
		now := r.clock.Now()
		reaped, err := r.reap(ctx, sc.ThreadID, sc.Claim, now.Add(-r.cfg.StaleAfter), now)
		if err != nil {
			r.log.Warn("agent.reap", "thread_id", sc.ThreadID, "run_id", sc.Claim.RunID, "err", err)
			continue
		}
		if reaped {
			st.Reaped++
		}
	}
	st.Orphans, err = r.orphans(ctx)
	if err != nil {
		return st, err
	}
	n, err := r.expire(ctx)
	st.Expired = n
	if err != nil {
		return st, err
	}
	woken := map[string]bool{}
	if st.Redriven, err = r.redrive(ctx, woken); err != nil {
		return st, err
	}
	if st.Swept, err = r.sweepQueues(ctx, woken); err != nil {
		return st, err
	}
	if r.signals != nil {
		if st.Signaled, err = r.signals.Sweep(ctx); err != nil {
			return st, err
		}
	}
	return st, nil
}

// orphans finishes the runs still recorded as running that no claim names and that have not changed for
// StaleAfter (REVIEW D15: a crash between FinishRun's release and its outcome, or a run item written after a reap),
// each through ReapOrphan, which re-checks everything in its conditional writes. Only a store that can list them
// without a scan offers the list (agent.OrphanRunLister); without it readers still finish them (ReapOrphan). The
// list may reuse what the tick's stale-claims list read (agent.WithSweep; DynamoDB then skips its 16 Queries), so a
// run that qualified between the two reads is finished by the next tick: at most one tick after it qualified.
func (r *Reaper) orphans(ctx context.Context) (int, error) {
	lister, ok := r.store.(agent.OrphanRunLister)
	if !ok {
		return 0, nil
	}
	runs, err := lister.ListOrphanRuns(ctx, r.clock.Now().Add(-r.cfg.StaleAfter), r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reaper: list orphan runs: %w", err)
	}
	for _, run := range runs {
		if err := ctx.Err(); err != nil {
			return len(runs), err
		}
		if err := r.ReapOrphan(ctx, run.ThreadID, run.ID); err != nil {
			r.log.Warn("agent.reap", "thread_id", run.ThreadID, "run_id", run.ID, "outcome", "orphan", "err", err)
		}
	}
	return len(runs), nil
}

// expire marks pending interrupts past their age expired, by compare-and-set (an answer racing it wins or
// loses whole).
func (r *Reaper) expire(ctx context.Context) (int, error) {
	now := r.clock.Now()
	ins, err := r.store.ListExpiredInterrupts(ctx, now, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reaper: list expired interrupts: %w", err)
	}
	n := 0
	for _, in := range ins {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		_, err := r.store.ResolveInterrupt(ctx, in.Resolve(agent.InterruptExpired, now))
		switch {
		case err == nil:
			n++
			r.log.Info("agent.interrupt.expired", "thread_id", in.ThreadID, "interrupt_id", in.ID, "run_id", in.RunID)
		case errors.Is(err, agent.ErrAlreadyResolved), agent.IsKind(err, agent.KindNotFound):
		default:
			r.log.Warn("reaper: expire interrupt", "thread_id", in.ThreadID, "interrupt_id", in.ID, "err", err)
		}
	}
	return n, nil
}

// cancelAsked cancels the pending interrupts a dead run stored (all asked by its message): its message was
// finalized without them.
func (r *Reaper) cancelAsked(ctx context.Context, run agent.Run) error {
	ins, err := r.store.ListMessageInterrupts(ctx, run.ThreadID, run.AssistantMessageID)
	if err != nil {
		return fmt.Errorf("reaper: list interrupts: %w", err)
	}
	for _, in := range ins {
		if in.RunID != run.ID || in.Status != agent.InterruptPending {
			continue
		}
		err := retry(ctx, func() error {
			_, err := r.store.ResolveInterrupt(ctx, in.Resolve(agent.InterruptCanceled, r.clock.Now()))
			return err
		})
		if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
			return fmt.Errorf("reaper: cancel interrupt: %w", err)
		}
	}
	return nil
}

// Run sweeps every Interval until ctx ends (the dev ticker).
func (r *Reaper) Run(ctx context.Context) {
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := r.Tick(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("reaper tick", "err", err)
			}
		}
	}
}

// Reap finishes the run that claim c names on thread threadID, if the claim is still there and stale. It
// reports whether this call took the claim (false: the run is alive, or someone else reaped it).
//
// The decision is TakeOver (fence A): the reaper takes the claim at epoch+1 rather than only removing it, so
// nobody claims the thread while it cleans up, and everything the dead run may still write is fenced by the new
// epoch (on SQLite every write of the run checks the claim in its own transaction). It then reads the run and
// its draft (after the decision, so what it reads can no longer change under it: D16), records the outcome,
// finalizes the message at its own fence, ends the stream, and gives the claim back, adding the dead run's usage
// in that same write. A claim of a reaper that died on the way is reaped the same way: the claim names the dead
// run (agent.ReapedRunID), and the next reaper takes it at the next epoch and does the same steps, each
// idempotent.
//
// A run that handed over and whose continuation never took the claim is continued instead (relaunch.go), when
// the reaper has a launcher: Reap then reports false, as for a live run.
func (r *Reaper) Reap(ctx context.Context, threadID string, c agent.Claim) (bool, error) {
	if did, err := r.relaunch(ctx, threadID, c); did != notHandedOver || err != nil {
		return did == reapedNow && err == nil, err
	}
	now := r.clock.Now()
	return r.reap(ctx, threadID, c, now.Add(-r.cfg.StaleAfter), now)
}

// everyHeartbeat is far enough ahead that every heartbeat a store holds is before now plus it (ReapAllClaims).
const everyHeartbeat = 100 * 365 * 24 * time.Hour

// ReapAllClaims reaps every claim the store holds, whatever its heartbeat, and returns how many it took. Only a
// caller that knows every writer of the store is dead may call it: the local stack at start, holding its data
// directory's lock (a flock the kernel gave back when the last holder died). Each claim goes through Reap's own
// takeover (fence A) with a cutoff after every heartbeat, then the same clean-up: the run recorded failed
// (stale), its reply finalized, its run slot and readers given back. It lists in batches until a list comes back
// short or reaps nothing (a claim that fails is logged and left to the ticker).
func (r *Reaper) ReapAllClaims(ctx context.Context) (int, error) {
	n := 0
	for {
		now := r.clock.Now()
		cutoff := now.Add(everyHeartbeat)
		claims, err := r.store.ListStaleClaims(ctx, cutoff, r.cfg.Batch)
		if err != nil {
			return n, fmt.Errorf("reaper: list claims: %w", err)
		}
		reaped := 0
		for _, sc := range claims {
			ok, err := r.reap(ctx, sc.ThreadID, sc.Claim, cutoff, now)
			if err != nil {
				r.log.Warn("agent.reap", "thread_id", sc.ThreadID, "run_id", sc.Claim.RunID, "err", err)
				continue
			}
			if ok {
				reaped++
			}
		}
		n += reaped
		if len(claims) < r.cfg.Batch || reaped == 0 {
			return n, ctx.Err()
		}
	}
}

// reap is Reap with the takeover's cutoff given.
func (r *Reaper) reap(ctx context.Context, threadID string, c agent.Claim, staleBefore, now time.Time) (bool, error) {
	dead := agent.ReapedRunID(c.RunID)
	hold, err := r.store.TakeOver(ctx, agent.TakeRequest{ThreadID: threadID, Fence: agent.Fence{RunID: c.RunID, Epoch: c.Epoch},
		StaleBefore: staleBefore, RunID: dead, Now: now})
	if errors.Is(err, agent.ErrRunFenced) {
		// A live run, or another reaper decided first, or our own takeover applied and only its answer was lost
		// (the SDK's retry then finds the claim moved): the last one is ours to finish.
		want := agent.Fence{RunID: agent.ReapRunID(dead), Epoch: c.Epoch + 1}
		th, gerr := r.store.GetThread(ctx, threadID)
		if gerr != nil || th.ActiveRun == nil || th.ActiveRun.RunID != want.RunID || th.ActiveRun.Epoch != want.Epoch {
			return false, nil
		}
		// Not counted as this call's reap: a concurrent reaper may be the one whose take applied. An outcome
		// recorded under this takeover is not on the thread yet (the release counts it, and only one release of
		// the takeover applies), so this cleanUp counts it like a dead reaper's.
		return false, r.cleanUp(ctx, threadID, dead, want, true, false)
	} else if err != nil {
		return false, fmt.Errorf("reaper: take over claim: %w", err)
	}
	return true, r.cleanUp(ctx, threadID, dead, hold, agent.IsReapClaim(c.RunID), false)
}

// cleanUp finishes run runID while the reaper holds the thread at hold, then gives the claim back. reaperDied:
// an outcome a reaper recorded under a takeover that was never released is not on the thread yet (the takeover's
// release adds it): the claim taken was a reaper's, or this reaper adopts a takeover it found applied.
// orphan: the run's claim was released by the run itself (FinishRun's first half), which added its usage.
func (r *Reaper) cleanUp(ctx context.Context, threadID, runID string, hold agent.Fence, reaperDied, orphan bool) error {
	log := r.log.With("thread_id", threadID, "run_id", runID, "epoch", hold.Epoch-1)
	run, err := r.store.GetRun(ctx, threadID, runID)
	missing := agent.IsKind(err, agent.KindNotFound)
	if err != nil && !missing {
		return fmt.Errorf("reaper: get run: %w", err)
	}
	if s, ok := r.store.(agent.RunStubber); ok && missing {
		// The run item may still land (ClaimRun's second write, late): stub it, failed, so that it cannot
		// (REVIEW D15); or, landed meanwhile, finish it as any.
		now := r.clock.Now()
		stub := agent.Run{ID: runID, ThreadID: threadID, Trigger: agent.TriggerUnknown, Status: agent.RunFailed, Epoch: hold.Epoch - 1,
			Error:     &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."},
			CreatedAt: now, UpdatedAt: now, FinishedAt: now}
		r.armSignal(ctx, &stub) // the stub is the run's outcome: its end is signaled like any
		var created bool
		if err := retry(ctx, func() error { run, created, err = s.StubRun(ctx, stub); return err }); err != nil {
			return fmt.Errorf("reaper: stub missing run: %w", err)
		}
		missing = created
		if created && r.signals != nil {
			r.signals.Deliver(ctx, stub)
		}
	}
	if !missing && run.Status == agent.RunRunning {
		// Fence B: every id the dead run can still create is stubbed (or, stored, fenced) at the reaper's epoch
		// before anything is read, so what the reads below see can no longer change, and a first write still in
		// flight (its user message, its reply, a queued message it took) is refused instead of landing after the
		// reap.
		if err := r.fence(ctx, threadID, slices.Concat([]string{run.UserMessageID, run.AssistantMessageID}, run.Takes), hold); errors.Is(err, agent.ErrRunFenced) {
			// The hold is gone: a concurrent reaper that adopted the same takeover finished and released it.
			return nil
		} else if err != nil {
			return err
		}
		r.adoptTakes(ctx, threadID)
	}
	var usage agent.Usage
	switch {
	case missing:
		log.Info("agent.reap", "outcome", "released", "run_missing", true)
	case run.Status == agent.RunRunning:
		draft, u, err := r.draftOf(ctx, run)
		if err != nil {
			return err
		}
		later, err := r.overwritten(ctx, run, draft)
		if err != nil {
			return err
		}
		if later {
			// A later run continued the dead run's reply (an answer after a crash inside FinishRun): the reply
			// is that run's now, and the dead run's draft is gone. Its usage is what its release added.
			if run.Released != nil {
				usage = *run.Released
			}
			if err := r.superseded(ctx, run, usage, hold); err != nil {
				return err
			}
			r.logReaped(log, "superseded", run, usage)
			break
		}
		usage = u
		if orphan && run.Released != nil {
			usage = *run.Released // exactly what the run's own release added to the thread
		}
		if err := r.finishRun(ctx, run, draft, usage, hold); err != nil {
			return err
		}
		r.logReaped(log, "reaped", run, usage)
	default:
		// Recorded under a takeover whose release has not counted it yet: by a reaper that died before its
		// release, or by a concurrent reaper that adopted this same takeover (no release of the run itself can
		// have applied, or no claim would name it: an orphan's own release counted it, and orphan clears usage
		// below). The run's late usage, if it recorded some since, reached the thread by itself
		// (RecordLateUsage).
		usage = run.Usage
		if run.LateUsage != nil {
			usage = usage.Sub(*run.LateUsage)
		}
		if run.Released != nil {
			// Its own release counted it: an orphan whose reaper died after recording the outcome.
			usage = agent.Usage{}
		}
		if draft, ok := r.unfinalized(ctx, run); ok {
			// A reaper recorded the outcome and died before the message.
			if err := r.finalizeMessage(ctx, run, draft, run.Usage, hold); err != nil {
				return err
			}
			if err := r.cancelAsked(ctx, run); err != nil {
				return err
			}
		}
		// Its outcome is stored but its stream may lack its end (a crash after the outcome was due).
		r.endStream(ctx, run)
		log.Info("agent.reap", "outcome", "released", "run_missing", false)
	}
	if !missing {
		r.finishEdit(ctx, run, hold) // an editing run's cleanup, which a dead one left undone (fence D)
	}
	if orphan {
		usage = agent.Usage{}
	}
	r.giveBackSlot(ctx, threadID, runID)
	err = retry(ctx, func() error {
		return r.store.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: threadID, Fence: hold, Usage: usage, Now: r.clock.Now()})
	})
	if err != nil && !errors.Is(err, agent.ErrRunFenced) {
		return fmt.Errorf("reaper: release claim: %w", err)
	}
	return nil
}

// fence stubs (or, stored, fences) each of ids at hold (FenceMessage).
func (r *Reaper) fence(ctx context.Context, threadID string, ids []string, hold agent.Fence) error {
	for _, id := range ids {
		if id == "" {
			continue
		}
		if err := retry(ctx, func() error { return r.store.FenceMessage(ctx, threadID, id, hold) }); err != nil {
			return fmt.Errorf("reaper: fence message: %w", err)
		}
	}
	return nil
}

// adoptTakes marks taken the queue entries whose message the thread holds: a dead run stored them and died before
// it marked them (the ids it noted are fenced, so no more can land). An entry whose message never landed stays
// queued for the next turn, which stores it at its own position (FenceMessage's stub is read as absent). Best
// effort: a turn that finds an entry's message in the thread takes it without storing it again.
func (r *Reaper) adoptTakes(ctx context.Context, threadID string) {
	q, err := r.store.ListQueued(ctx, threadID)
	if err != nil {
		r.log.Warn("reaper: list queue", "thread_id", threadID, "err", err)
		return
	}
	for _, e := range q {
		if _, err := r.store.GetMessage(ctx, threadID, e.Message.ID); err != nil {
			continue
		}
		if err := retry(ctx, func() error { return r.store.TakeQueued(ctx, threadID, e.Message.ID, r.clock.Now()) }); err != nil {
			r.log.Warn("reaper: adopt a stored queue take", "thread_id", threadID, "message_id", e.Message.ID, "err", err)
		}
	}
}

// giveBackSlot releases the dead run's slot in its user's active-run scope, and the stream leases of its readers,
// in the run's scope and in the user's (issue 16 item 11: at once, not after the leases' TTL). A reader whose
// process died with the run would never give its own back; its holder id names the run (agent.ReaderHolder). A
// live reader of the run ends with the final segment; until then its renewal takes a lease again when there is
// room (agent.KeepLeases).
func (r *Reaper) giveBackSlot(ctx context.Context, threadID, runID string) {
	th, err := r.store.GetThread(ctx, threadID)
	if err != nil {
		return
	}
	if err := retry(ctx, func() error { return r.store.ReleaseLease(ctx, agent.RunSlotScope(th.Owner), runID) }); err != nil {
		r.log.Warn("reaper: give back the run slot", "thread_id", threadID, "run_id", runID, "err", err)
	}
	for _, scope := range []string{agent.StreamRunScope(runID), agent.StreamUserScope(th.Owner)} {
		if err := retry(ctx, func() error { return r.store.ReleaseLeases(ctx, scope, agent.ReadersOf(runID)) }); err != nil {
			r.log.Warn("reaper: give back the readers' stream leases", "thread_id", threadID, "run_id", runID, "scope", scope, "err", err)
		}
	}
}

// ReapOrphan finishes a run that is still recorded as running although no claim names it any more: a FinishRun
// that died between its release (the decision) and the run's outcome (DynamoDB makes them two writes), or a run
// item written after the reaper took its claim, leaves exactly that, and no sweep can find it through the index
// of claims. Readers that meet such a run call this. It takes the idle thread (TakeOver with no fence) so that
// its writes are fenced like any reap, and does nothing for a run that is finished, missing, or still holds its
// claim, nor on a thread someone else holds (a later reader retries).
func (r *Reaper) ReapOrphan(ctx context.Context, threadID, runID string) error {
	run, err := r.store.GetRun(ctx, threadID, runID)
	if agent.IsKind(err, agent.KindNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reaper: get run: %w", err)
	}
	if run.Status != agent.RunRunning {
		if _, ok := r.unfinalized(ctx, run); !ok {
			return nil
		}
	}
	if !r.released(ctx, threadID, run.Fence()) {
		return nil
	}
	hold, err := r.store.TakeOver(ctx, agent.TakeRequest{ThreadID: threadID, RunID: runID, Now: r.clock.Now()})
	if errors.Is(err, agent.ErrRunFenced) || agent.IsKind(err, agent.KindNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reaper: take over idle thread: %w", err)
	}
	return r.cleanUp(ctx, threadID, runID, hold, false, true)
}

// Orphans finishes the runs of msgs' streaming assistant messages that hold no claim (see ReapOrphan); active
// names the run that holds the thread's claim now, if any. It reports how many such messages it looked at.
func (r *Reaper) Orphans(ctx context.Context, threadID, active string, msgs []agent.Message) int {
	n := 0
	for _, m := range msgs {
		md := m.Meta()
		if m.Role != agent.RoleAssistant || md.Status != agent.MessageStreaming || md.RunID == "" || md.RunID == active {
			continue
		}
		n++
		if err := r.ReapOrphan(ctx, threadID, md.RunID); err != nil {
			r.log.Warn("agent.reap", "thread_id", threadID, "run_id", md.RunID, "outcome", "orphan", "err", err)
		}
	}
	return n
}

// unfinalized returns the draft of a run the reaper recorded failed (stale) whose message still reads streaming,
// or is still the message it continued: a reaper died between the outcome and the message.
func (r *Reaper) unfinalized(ctx context.Context, run agent.Run) (*agent.MessageRecord, bool) {
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale {
		return nil, false
	}
	draft, _, err := r.draftOf(ctx, run)
	if err != nil {
		return nil, false
	}
	if draft == nil {
		return nil, true // no message at all: the reap writes the failed one
	}
	md := draft.Message.Meta()
	if md.RunID != "" && md.RunID != run.ID {
		// The message the run continued, as an earlier run left it (the run died before its first write): the
		// reaper finishes it with the answers the run took (finalizeMessage), unless a later run wrote it since.
		later, err := r.overwritten(ctx, run, draft)
		return draft, err == nil && !later
	}
	return draft, md.Status == agent.MessageStreaming
}

// logReaped writes the one agent.reap line of a run this reaper finished, with the usage it counted for it (the
// draft's; what the run spent after that it records itself, engine "late usage"), and counts it for metrics.
func (r *Reaper) logReaped(log *slog.Logger, outcome string, run agent.Run, usage agent.Usage) {
	log.Info("agent.reap", "outcome", outcome, "trigger", run.Trigger, "model", run.Model, "input_tokens", usage.InputTokens,
		"output_tokens", usage.OutputTokens, "cached_input_tokens", usage.CachedInputTokens,
		"reasoning_tokens", usage.ReasoningTokens, "total_tokens", usage.TotalTokens, "cost_micro_usd", usage.CostMicroUSD,
		"age_ms", r.clock.Now().Sub(run.CreatedAt).Milliseconds())
	r.metrics.Reaped(1)
}

// draftOf reads the run's assistant message (nil when there is none) and the usage to count for the run: the
// draft's while the run is recorded as running (the run item has none yet), the run's own once it is finished.
func (r *Reaper) draftOf(ctx context.Context, run agent.Run) (*agent.MessageRecord, agent.Usage, error) {
	usage := run.Usage
	rec, err := r.store.GetMessage(ctx, run.ThreadID, run.AssistantMessageID)
	switch {
	case agent.IsKind(err, agent.KindNotFound):
		return nil, usage, nil
	case err != nil:
		return nil, usage, fmt.Errorf("reaper: get draft: %w", err)
	}
	if md := rec.Message.Meta(); md.RunID != "" && md.RunID != run.ID {
		// The message was last written by an earlier run (this one continued it and died before its first
		// write): what it holds is that run's, not this one's.
		return &rec, usage, nil
	}
	if u := rec.Message.Meta().Usage; u != nil && run.Status == agent.RunRunning {
		usage = *u
	}
	return &rec, usage, nil
}

// overwritten reports whether draft, the dead run's assistant message, was last written by a run that claimed the
// thread after it (a later epoch). Only a run whose claim is gone without its outcome can be in that state: a crash
// between the two writes of DynamoDB's FinishRun leaves its reply asking and the thread idle, and an answer then
// continues the reply under a new claim. A message written by an earlier run is this run's continuation base (it
// died before its first write), and is the reaper's to finish (finalizeMessage).
func (r *Reaper) overwritten(ctx context.Context, run agent.Run, draft *agent.MessageRecord) (bool, error) {
	if draft == nil {
		return false, nil
	}
	id := draft.Message.Meta().RunID
	if id == "" || id == run.ID {
		return false, nil
	}
	by, err := r.store.GetRun(ctx, run.ThreadID, id)
	switch {
	case agent.IsKind(err, agent.KindNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reaper: get the run that wrote the draft: %w", err)
	}
	return by.Epoch > run.Epoch, nil
}

// superseded records the outcome of a dead run whose reply a later run continued (overwritten), and ends its
// stream; the reply, and the interrupts it asked (the later run answered them), are the later run's and stay as
// they are. The run is recorded interrupted: only an asking reply is continued, so that is what it ended as, and
// usage is what its release added to the thread (Run.Released).
func (r *Reaper) superseded(ctx context.Context, run agent.Run, usage agent.Usage, hold agent.Fence) error {
	now := r.clock.Now()
	run.Status, run.Error = agent.RunInterrupted, nil
	run.Usage, run.FinishedAt, run.UpdatedAt = usage, now, now
	if err := r.recordOutcome(ctx, run, hold); err != nil {
		return err
	}
	r.endStream(ctx, run)
	return nil
}

// released reports whether the thread's claim has moved past fence (released, or held by a later run).
func (r *Reaper) released(ctx context.Context, threadID string, f agent.Fence) bool {
	th, err := r.store.GetThread(ctx, threadID)
	if agent.IsKind(err, agent.KindNotFound) {
		return true
	}
	return err == nil && (th.ActiveRun == nil || th.ActiveRun.RunID != f.RunID || th.ActiveRun.Epoch != f.Epoch)
}

// finishRun records the dead run's outcome, finalizes its message and ends its stream, writing at hold (the
// reaper's claim).
func (r *Reaper) finishRun(ctx context.Context, run agent.Run, draft *agent.MessageRecord, usage agent.Usage, hold agent.Fence) error {
	now := r.clock.Now()
	run.Status, run.Error = agent.RunFailed, &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."}
	md := agent.MessageMetadata{}
	if draft != nil {
		md = draft.Message.Meta()
	}
	// The run's own final message: another run's (the one this run continued) does not count.
	finalMsg := draft != nil && (md.RunID == "" || md.RunID == run.ID) && md.Status != agent.MessageStreaming && md.Status != ""
	if finalMsg {
		// The final message is stored; only the outcome was lost. The run ended as its message says.
		if st := draft.Message.Meta().Status.RunStatus(); st != "" && st != agent.RunFailed {
			run.Status, run.Error = st, nil
		}
	}
	run.Usage, run.FinishedAt, run.UpdatedAt = usage, now, now
	if err := r.recordOutcome(ctx, run, hold); err != nil {
		return err
	}
	if !finalMsg {
		if err := r.finalizeMessage(ctx, run, draft, usage, hold); err != nil {
			return err
		}
		if err := r.cancelAsked(ctx, run); err != nil {
			return err
		}
	}
	r.endStream(ctx, run)
	return nil
}

// recordOutcome records the dead run's outcome, sealing its takes: where the store keeps them, the write applies
// only to the takes the reaper fenced, so a take the dead run noted since (after the reaper read its run) fails it;
// the reaper then fences the new ids, adopts what landed, and records again. A run recorded by someone else is
// left as it is.
func (r *Reaper) recordOutcome(ctx context.Context, run agent.Run, hold agent.Fence) error {
	r.armSignal(ctx, &run)
	for attempt := 0; ; attempt++ {
		err := retry(ctx, func() error { return r.store.RecordOutcome(ctx, run, hold) })
		if err == nil {
			if r.signals != nil {
				r.signals.Deliver(ctx, run) // recorded with it: whatever happens to this attempt, the sweep has it
			}
			return nil
		}
		if !errors.Is(err, agent.ErrRunFenced) {
			return fmt.Errorf("reaper: finish run: %w", err)
		}
		now, gerr := r.store.GetRun(ctx, run.ThreadID, run.ID)
		if gerr != nil || now.Status != agent.RunRunning || now.Epoch != run.Epoch || slices.Equal(sorted(now.Takes), sorted(run.Takes)) || attempt == 3 {
			return nil // recorded by someone else (or, after a few rounds, left to the next sweep: ReapOrphan)
		}
		if err := r.fence(ctx, run.ThreadID, now.Takes, hold); err != nil {
			return err
		}
		r.adoptTakes(ctx, run.ThreadID)
		run.Takes = now.Takes
	}
}

func sorted(ids []string) []string { return slices.Sorted(slices.Values(ids)) }

// armSignal arms the completion signal of the dead run, which RecordOutcome stores pending with its outcome (the
// run item does not name the thread's owner: one read of the thread, for reaped runs only).
func (r *Reaper) armSignal(ctx context.Context, run *agent.Run) {
	if r.signals == nil {
		return
	}
	owner := ""
	if th, err := r.store.GetThread(ctx, run.ThreadID); err == nil {
		owner = th.Owner
	}
	run.Signal = r.signals.Arm(owner, run.FinishedAt)
}

// finalizeMessage stores the dead run's assistant message as failed, fenced at the run's epoch and finalized, so
// nothing the dead run might still write can change it.
func (r *Reaper) finalizeMessage(ctx context.Context, run agent.Run, draft *agent.MessageRecord, usage agent.Usage, hold agent.Fence) error {
	var parts, base []agent.Part
	var cancel []agent.ResolveRequest
	seq := run.AssistantSeq()
	if draft != nil {
		parts, seq = transcript.Decode(draft.Message.Parts), draft.Seq
		if id := draft.Message.Meta().RunID; id != "" && id != run.ID {
			base = parts // a continuation's stream goes on from the message it continued
		}
	}
	from := base // the parts the run's stream goes on from
	if draft != nil && base == nil && run.Trigger == agent.TriggerContinuation {
		// A continuation that wrote its own draft: its stream still goes on from the message as it was before.
		var err error
		if from, err = r.continuedFrom(ctx, run, parts); err != nil {
			return err
		}
	}
	if data, err := r.streamData(ctx, run.ID); err == nil {
		// The segments may hold more than the draft (the step in flight, or a whole reply whose write failed).
		if rebuilt := segments.Rebuild(from, data); len(rebuilt) > len(parts) || (base != nil && len(rebuilt) > 0) {
			parts = rebuilt
		}
	} else {
		r.log.Warn("reaper: read segments", "thread_id", run.ThreadID, "run_id", run.ID, "err", err)
	}
	if base != nil {
		continued, untouched, err := r.continued(ctx, run, base, parts, &cancel)
		if err != nil {
			return err
		}
		if untouched {
			// The run died before it took any answer: the message still asks, and its interrupts stay
			// answerable. It is written back unchanged, finalized at the dead run's epoch, so that nothing the
			// dead run may still write can land.
			w := agent.MessageWrite{ThreadID: run.ThreadID, Seq: seq, Fence: hold, Final: true, Message: draft.Message}
			err := retry(ctx, func() error { w.Now = r.clock.Now(); return r.store.PutMessage(ctx, w) })
			if err != nil && !errors.Is(err, agent.ErrRunFenced) {
				return fmt.Errorf("reaper: fence continued message: %w", err)
			}
			return nil
		}
		parts = continued
	}
	owner := ""
	// With nothing recovered the message is still written, finalized, with only its error (agent.ErrorPart): the
	// engine reads past such a reply (agent.Visible), readers show it (agent.Shown), and it fences the dead run's
	// id, so a write of that run still in flight cannot land later.
	parts = transcript.Synthesize(parts, "Result unknown: the run stopped before this tool's result was stored.",
		func(p agent.Part) (json.RawMessage, bool) {
			if owner == "" {
				if th, err := r.store.GetThread(ctx, run.ThreadID); err == nil {
					owner = th.Owner
				}
			}
			return r.recorded(ctx, run, owner, p)
		})
	raw := make([]json.RawMessage, len(parts))
	for i, p := range parts {
		raw[i] = agent.EncodePart(p)
	}
	if len(raw) == 0 && run.Error != nil {
		// A reply with no part shows nothing where an app renders parts: it gets one that shows its error.
		raw = append(raw, agent.ErrorPart(run.ID, *run.Error))
	}
	md, _ := json.Marshal(agent.MessageMetadata{Status: agent.MessageFailed, RunID: run.ID, Model: run.Model, Usage: &usage,
		Error: run.Error})
	w := agent.MessageWrite{ThreadID: run.ThreadID, Seq: seq, Fence: hold, Final: true,
		Message: agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: raw, Metadata: md}}
	err := retry(ctx, func() error { w.Now = r.clock.Now(); return r.store.PutMessage(ctx, w) })
	if err != nil && !errors.Is(err, agent.ErrRunFenced) {
		return fmt.Errorf("reaper: finalize message: %w", err)
	}
	for _, c := range cancel {
		c.Now = r.clock.Now()
		err := retry(ctx, func() error { _, err := r.store.ResolveInterrupt(ctx, c); return err })
		if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
			return fmt.Errorf("reaper: cancel interrupt: %w", err)
		}
	}
	return nil
}

// continuedFrom returns the part of a dead continuation's own draft that the message held before the run
// continued it (with the answers the run put on it): the parts up to the run's first step. A continuation's stream
// goes on from there (its segments hold the answers' results and its steps, not the message it continued), so the
// reaper rebuilds the segments on top of it, whether the draft is behind the segments (the step in flight, or a
// reply whose final write failed: seed 688 of the simulation) or ahead of them. The run's first step is the first
// step-start after the last call an earlier run asked about (an interrupt of the message not asked by this run):
// the continued message ends with the step that asked, and the run appends its steps after it, each opening with
// a step-start. Nil (rebuild from the segments alone) when no such call is found.
func (r *Reaper) continuedFrom(ctx context.Context, run agent.Run, parts []agent.Part) ([]agent.Part, error) {
	all, err := r.store.ListMessageInterrupts(ctx, run.ThreadID, run.AssistantMessageID)
	if err != nil {
		return nil, fmt.Errorf("reaper: list interrupts: %w", err)
	}
	earlier := map[string]bool{}
	for _, in := range all {
		if in.MessageID == run.AssistantMessageID && in.RunID != run.ID {
			earlier[in.ToolCallID] = true
		}
	}
	last := -1
	for i, p := range parts {
		if p.ToolCallID != "" && earlier[p.ToolCallID] {
			last = i
		}
	}
	if last < 0 {
		return nil, nil
	}
	end := len(parts)
	for i := last + 1; i < len(parts); i++ {
		if parts[i].Type == "step-start" {
			end = i
			break
		}
	}
	return slices.Clone(parts[:end]), nil
}

// continued puts on a dead continuation's parts what its message's interrupts say: a denial or a client's
// output the run took (resolved, so they are facts), and for an approval it took, nothing (Synthesize then
// reports the tool's recorded outcome, or that it is unknown). untouched: the run took no answer and streamed
// nothing new, so the message is left asking. Otherwise an interrupt still pending (the run died half way
// through taking the answers) is added to cancel, and its call was not executed.
func (r *Reaper) continued(ctx context.Context, run agent.Run, base, parts []agent.Part, cancel *[]agent.ResolveRequest) ([]agent.Part, bool, error) {
	all, err := r.store.ListMessageInterrupts(ctx, run.ThreadID, run.AssistantMessageID)
	if err != nil {
		return nil, false, fmt.Errorf("reaper: list interrupts: %w", err)
	}
	byCall := map[string]agent.Interrupt{}
	for _, in := range all {
		if in.MessageID == run.AssistantMessageID {
			byCall[in.ToolCallID] = in
		}
	}
	untouched := len(parts) == len(base)
	for i := range parts {
		if untouched && string(agent.EncodePart(parts[i])) != string(agent.EncodePart(base[i])) {
			untouched = false
		}
		if in, ok := byCall[parts[i].ToolCallID]; ok && parts[i].Waiting() && in.Status != agent.InterruptPending {
			untouched = false
		}
	}
	if untouched {
		return base, true, nil
	}
	for i, p := range parts {
		in, ok := byCall[p.ToolCallID]
		if !ok || !p.Waiting() {
			continue
		}
		switch in.Status {
		case agent.InterruptPending:
			// Canceled once the message that gives the call its result is stored (the message decides).
			*cancel = append(*cancel, in.Resolve(agent.InterruptCanceled, time.Time{})) // Now: set at the write
			p.State, p.Approval, p.ErrorText = agent.StateOutputError, nil, "Not executed: the run stopped before it took the answer."
		case agent.InterruptDenied:
			no := false
			p.State, p.Approval = agent.StateOutputDenied, &agent.PartApproval{ID: in.ID, Approved: &no}
		case agent.InterruptAnswered:
			if a := interrupts.Resolution(in); a.Failed() {
				p.State, p.ErrorText = agent.StateOutputError, a.ErrorText
			} else {
				p.State, p.Output = agent.StateOutputAvailable, a.Output
			}
		}
		parts[i] = p
	}
	return parts, false, nil
}

// retry runs op again on transient store errors, a few times with a short backoff: a reap half done is finished
// by a later reader, but most transient errors pass within a second.
func retry(ctx context.Context, op func() error) error {
	wait := 20 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := op()
		if err == nil || agent.KindOf(err) != agent.KindUnavailable || attempt == 4 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait *= 2
	}
}

// recorded asks the tool for the outcome it recorded under the call's idempotency key.
func (r *Reaper) recorded(ctx context.Context, run agent.Run, owner string, p agent.Part) (json.RawMessage, bool) {
	t, ok := r.tools[p.ToolNameOf()]
	if !ok || t.Recorded == nil {
		return nil, false
	}
	out, ok, err := t.Recorded(ctx, agent.ToolInvocation{ThreadID: run.ThreadID, Owner: owner, RunID: run.ID, ToolCallID: p.ToolCallID,
		MessageID: run.AssistantMessageID, Input: p.Input, IdempotencyKey: agent.IdempotencyKey(run.ThreadID, run.AssistantMessageID, p.ToolCallID)})
	if err != nil {
		r.log.Warn("reaper: tool outcome", "tool", t.Name, "tool_call_id", p.ToolCallID, "err", err)
		return nil, false
	}
	return out, ok
}

func (r *Reaper) streamData(ctx context.Context, runID string) ([]byte, error) {
	segs, err := r.store.ListSegments(ctx, runID, 0, r.clock.Now())
	if err != nil {
		return nil, err
	}
	var data []byte
	for _, s := range segs {
		data = append(data, s.Data...)
	}
	return data, nil
}

// endStream appends a final segment matching the run's outcome, unless one exists.
func (r *Reaper) endStream(ctx context.Context, run agent.Run) {
	if err := segments.AppendFinal(ctx, r.store, r.clock, run.ThreadID, run.ID, segments.EndOf(run)); err != nil {
		r.log.Warn("reaper: final segment", "thread_id", run.ThreadID, "run_id", run.ID, "err", err)
	}
}
