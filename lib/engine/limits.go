package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Per-user limits the engine enforces (DESIGN.md principle 6), through the store's agent.LimitStore so that they
// hold across every instance and Lambda. lib/config maps AGENT_MAX_ACTIVE_RUNS_PER_USER and
// AGENT_THREADS_PER_MINUTE onto Config.
//
//   - Active runs: every run a user's request starts (a new message, tool outputs or approval answers that
//     continue a reply, an edit, a regenerate) holds a slot of "runs/<owner>" from before its claim until it
//     ends, and is refused when none is free. Server-side turns (a delivery pass: steers, queued messages,
//     BeginQueued) are never refused, since they answer something already accepted: they take a slot when one
//     is free (so the user's own requests see them) and run without one otherwise. A multitask enqueue request
//     at the limit whose thread is busy is queued anyway (it starts no run; its answer is a server-side turn); a
//     multitask interrupt request asks for a slot like any request that starts a run.
//   - New threads: the first POST /chat on a new id counts one in "threads/<owner>", a fixed one-minute window,
//     just before the thread is created.
//
// A refused request is refused before anything is written (no thread, no message, no claim): 429 with
// CodeTooManyRuns or CodeThreadRateLimited and a RetryAfter. A slot's lease lives RunLeaseTTL and is renewed
// every quarter of it while the run goes on, so a process that dies frees its slot within RunLeaseTTL; a run that
// ends gives it back at once.
const (
	// DefaultMaxActiveRunsPerUser bounds the runs one user's requests keep going at once.
	DefaultMaxActiveRunsPerUser = 4
	// DefaultThreadsPerMinute bounds the threads one user creates per minute.
	DefaultThreadsPerMinute = 30
	// DefaultRunLeaseTTL is how long a run's slot outlives its last renewal (a crashed process's slot is free
	// after at most this); renewed every quarter of it.
	DefaultRunLeaseTTL = 60 * time.Second
	// RunRetryAfter caps the Retry-After of too_many_runs: the store answers when a slot frees for sure (a
	// crashed holder's lease expiring), but runs usually end, and give their slot back, much sooner.
	RunRetryAfter = 5 * time.Second
	// DefaultMaxToolCallsPerStep bounds the tool calls of one model step that are executed (or asked about);
	// the calls after it get an error result the model reads, and never run.
	DefaultMaxToolCallsPerStep = 16
	// DefaultMaxJobsPerRun bounds the sub-agent jobs one run dispatches; a job tool called after it gets an
	// error result the model reads, and starts nothing.
	DefaultMaxJobsPerRun = 4
	// DefaultMaxJobChain bounds the server-side turns in a row (delivery turns, trigger steer, since the
	// thread's last turn a person started) that may dispatch jobs: a job's result that asks for more jobs, whose
	// results ask for more, stops there until a person writes again.
	DefaultMaxJobChain = 4
)

// runScope and threadScope name a user's limits in the store.
func runScope(owner string) string    { return agent.RunSlotScope(owner) }
func threadScope(owner string) string { return "threads/" + owner }

// countsAsUserRun reports whether req starts a run on a user's behalf (and so takes an active-run slot).
func countsAsUserRun(req Request) bool { return req.Kind == TurnSubmit || req.Kind == TurnRegenerate }

// runSlot is a run's lease in its user's active-run scope, renewed in the background until released.
type runSlot struct {
	e      *Engine
	scope  string
	holder string
	stop   func() // ends the renewals (agent.KeepLeases)
	once   sync.Once
}

// claim takes the user's run slot (when the request counts), then the thread's run claim; the slot is given back
// when the claim fails, and otherwise when the run ends (Turn.releaseSlot).
func (e *Engine) claim(ctx context.Context, req Request) (agent.ClaimResult, time.Time, *runSlot, error) {
	runID := e.ids.New("run")
	slot, err := e.acquireRunSlot(ctx, req, runID)
	if err != nil {
		return agent.ClaimResult{}, time.Time{}, nil, err
	}
	res, at, err := e.claimThread(ctx, req, runID)
	if err != nil {
		slot.release(ctx)
		return res, at, nil, err
	}
	return res, at, slot, nil
}

func (e *Engine) acquireRunSlot(ctx context.Context, req Request, runID string) (*runSlot, error) {
	if e.cfg.MaxActiveRunsPerUser < 0 {
		return nil, nil
	}
	r := agent.LeaseRequest{Scope: runScope(req.Owner), Holder: runID, Limit: e.cfg.MaxActiveRunsPerUser,
		TTL: e.cfg.RunLeaseTTL, Now: e.clock.Now()}
	retry, err := e.store.AcquireLease(ctx, r)
	if !countsAsUserRun(req) && (err != nil || retry > 0) {
		// A server-side turn runs whatever the count says.
		if err != nil {
			e.log.Warn("take a run slot for a server-side turn", "thread_id", req.ThreadID, "err", err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if retry > 0 {
		return nil, agent.Limited(agent.CodeTooManyRuns, min(retry, RunRetryAfter),
			"you have %d runs going, the most allowed at once; wait for one to finish", e.cfg.MaxActiveRunsPerUser)
	}
	// Renewed every quarter of its TTL, and no longer than a run can live (its wall clock, its final writes'
	// retries and a stale window), so a slot whose turn was dropped unreleased still expires.
	cfg := e.cfg
	stop := agent.KeepLeases(context.WithoutCancel(ctx), e.store, e.clock, []agent.LeaseRequest{r}, r.TTL/4,
		cfg.RunTimeout+cfg.FinishRetry+cfg.StaleAfter, func(r agent.LeaseRequest, err error) {
			if errors.Is(err, agent.ErrLeaseLost) {
				e.log.Warn("run slot outlived any run; no longer renewed", "scope", r.Scope, "run_id", r.Holder)
				return
			}
			e.log.Warn("renew run slot", "scope", r.Scope, "run_id", r.Holder, "err", err)
		})
	return &runSlot{e: e, scope: r.Scope, holder: runID, stop: stop}, nil
}

// release stops the renewals and gives the slot back (idempotent; nil-safe). A failed release leaves the lease
// to expire.
func (s *runSlot) release(ctx context.Context) {
	if s == nil {
		return
	}
	s.once.Do(func() {
		s.stop()
		ctx := context.WithoutCancel(ctx)
		if err := s.e.retry(ctx, func() error { return s.e.store.ReleaseLease(ctx, s.scope, s.holder) }); err != nil {
			s.e.log.Warn("release run slot", "scope", s.scope, "run_id", s.holder, "err", err)
		}
	})
}

// queueAtLimit reports whether a request refused for the user's run limit may be queued instead: a multitask
// enqueue of a user message to a thread of the caller that a live run holds (one read; the enqueue itself
// re-checks that the thread is busy and wakes a delivery pass otherwise).
func (e *Engine) queueAtLimit(ctx context.Context, req Request) bool {
	if req.Multitask != MultitaskEnqueue || req.Kind != TurnSubmit || req.Message.Role != agent.RoleUser || req.edits() {
		return false
	}
	th, err := e.store.GetThread(ctx, req.ThreadID)
	return err == nil && th.Owner == req.Owner && th.ActiveRun != nil && !th.ActiveRun.Stale(e.clock.Now(), e.cfg.StaleAfter)
}

// releaseSlot gives the turn's run slot back: the run has ended (or never started).
func (t *Turn) releaseSlot(ctx context.Context) { t.slot.release(ctx); t.ticket.leave() }

// countThread counts a new thread of owner against the per-minute limit, before it is created.
func (e *Engine) countThread(ctx context.Context, owner string) error {
	if e.cfg.ThreadsPerMinute < 0 {
		return nil
	}
	retry, err := e.store.Count(ctx, agent.CountRequest{Scope: threadScope(owner), Window: time.Minute,
		Limit: e.cfg.ThreadsPerMinute, Now: e.clock.Now()})
	if err != nil {
		return err
	}
	if retry > 0 {
		return agent.Limited(agent.CodeThreadRateLimited, retry,
			"you created %d threads in the last minute, the most allowed; try again shortly", e.cfg.ThreadsPerMinute)
	}
	return nil
}

// overStepCap reports whether the step's k-th tool call (from 0) is past MaxToolCallsPerStep.
func (s *stepper) overStepCap(k int) bool {
	limit := s.turn.e.cfg.MaxToolCallsPerStep
	return limit >= 0 && k >= limit
}

// takeJob counts one job the run dispatches; false when the run has dispatched MaxJobsPerRun already.
func (s *stepper) takeJob() bool {
	if limit := s.turn.e.cfg.MaxJobsPerRun; limit >= 0 && s.jobs >= limit {
		return false
	}
	s.jobs++
	return true
}

// tooManyCalls and tooManyJobs are the results of the calls past a bound: the model reads them (and may call
// again in a later step, or a later turn), the client sees them on the tool part.
func (e *Engine) tooManyCalls(tool string) error {
	return agent.E(agent.KindLimited, agent.CodeTooManyToolCalls,
		"%s was not executed: one step may call at most %d tools. Call it again in a later step if it is still needed.",
		tool, e.cfg.MaxToolCallsPerStep)
}

func (e *Engine) tooManyJobs(tool string) error {
	return agent.E(agent.KindLimited, agent.CodeTooManyJobs,
		"%s was not dispatched: one turn may start at most %d background jobs. Work with the jobs already started.",
		tool, e.cfg.MaxJobsPerRun)
}

// chainTooLong reports whether the run is a server-side turn (trigger steer) that ends a chain of more than
// MaxJobChain of them in a row since the thread's last turn a person started (a new message, an answer, a
// regenerate, an edit, a queued message). It reads the thread's newest runs once per run, and only for a
// server-side turn that calls a job tool; a failed read refuses (the bound holds when the store is unsure).
func (s *stepper) chainTooLong(ctx context.Context) bool {
	t, e := s.turn, s.turn.e
	limit := e.cfg.MaxJobChain
	if limit < 0 || t.run.Trigger != agent.TriggerSteer {
		return false
	}
	if s.chain == nil {
		n, err := e.steerChain(ctx, t.thread.ID, t.run.ID, limit+1)
		if err != nil {
			s.log.Warn("read the thread's runs for the job chain bound", "err", err)
			n = limit + 1
		}
		s.chain = &n
	}
	return *s.chain > limit
}

// steerChain counts the server-side turns in a row that end the thread's runs, the run runID included, up to
// most (it reads no further).
func (e *Engine) steerChain(ctx context.Context, threadID, runID string, most int) (int, error) {
	n := 1 // the run itself
	from := agent.RunCursor{}
	for n < most {
		page, err := e.store.ListRunsPage(ctx, threadID, agent.RunPage{From: from, Limit: most})
		if err != nil {
			return 0, err
		}
		for _, r := range page.Items {
			if r.ID == runID {
				continue
			}
			if r.Trigger != agent.TriggerSteer || n >= most {
				return n, nil
			}
			n++
		}
		if !page.More || len(page.Items) == 0 {
			return n, nil
		}
		last := page.Items[len(page.Items)-1]
		from = agent.RunCursor{CreatedAt: last.CreatedAt, ID: last.ID}
	}
	return n, nil
}

func (e *Engine) jobChainTooLong(tool string) error {
	return agent.E(agent.KindLimited, agent.CodeJobChainTooDeep,
		"%s was not dispatched: this turn answers a background job's result, and only %d such turns in a row may "+
			"start jobs. Tell the user what you found; they can ask for more.", tool, e.cfg.MaxJobChain)
}
