package sim

// The jobs bounds in jobs mode (issue 16 item 5): tool calls per step and jobs per run are capped, active jobs
// per user are leased, and a chain of delivery turns that keeps dispatching stops at its bound. Jobs-mode
// schedules run with small caps (drawn from a stream of their own), and the model sometimes asks for more than
// them (extra calls drawn from a stream of each process's own, so p.rng draws what it drew before): a step gets
// more calls than MaxToolCallsPerStep, or more research calls than MaxJobsPerRun. Research calls go last in a
// step, so the calls the engine refuses (a step's calls past its cap, a run's jobs past its cap, a chain past its
// bound) are a tail of the step's server calls, and the sim's tool turnstile (proc.modelCalled) never waits for a
// call that does not run.
//
// The invariant jobs-bounds:
//   - at every job created, the owner has at most MaxActivePerUser unfinished jobs whose slot could still be
//     leased (created less than the slot's TTL ago);
//   - after the settle, no run dispatched more than MaxJobsPerRun jobs; no step of a stored reply has more than
//     MaxToolCallsPerStep tool calls that were not refused for the cap; no server-side turn (trigger steer) past
//     MaxJobChain in a row dispatched a job; and a research call refused for a bound has no job.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// jobBounds are the caps of a jobs-mode schedule.
type jobBounds struct {
	activePerUser int           // jobs.Dispatcher.MaxActivePerUser
	slotTTL       time.Duration // how long a job's slot lives (jobs.Dispatcher.lease)
	// runOf: job id → the run that created it (a stored job keeps its writer only while it runs); w.mu guards it.
	runOf map[string]string
}

// drawBounds sets the jobs-mode caps (w.ecfg and w.bounds), from a stream of their own.
func (w *world) drawBounds() {
	r := rand.New(rand.NewPCG(w.seed, 0xb0d5))
	w.ecfg.MaxToolCallsPerStep = 2 + r.IntN(2)
	w.ecfg.MaxJobsPerRun = 1 + r.IntN(2)
	w.ecfg.MaxJobChain = 1 + r.IntN(2)
	c := w.contract
	w.bounds = jobBounds{activePerUser: 2 + r.IntN(2), slotTTL: min(c.ExecutionTimeout+c.DeliveryGrace+c.StartDue, agent.MaxLeaseTTL),
		runOf: map[string]string{}}
	w.tracef("bounds: %d tool calls per step, %d jobs per run, chain %d, %d active jobs per user", w.ecfg.MaxToolCallsPerStep,
		w.ecfg.MaxJobsPerRun, w.ecfg.MaxJobChain, w.bounds.activePerUser)
}

// overCaps adds calls past the caps to some steps of a script (a quarter of the steps that call tools get more
// server calls than a step may run, a quarter one more research call), and puts the research calls last.
func overCaps(p *proc, s []stepScript, research func(*rand.Rand) (string, bool)) []stepScript {
	r := rand.New(rand.NewPCG(p.w.seed^0xb0d5, uint64(p.id)))
	for i := range s {
		st := &s[i]
		if i == len(s)-1 || len(st.calls) == 0 {
			continue
		}
		if r.IntN(4) == 0 {
			for range 1 + r.IntN(2) {
				st.calls = append(st.calls, callScript{"sim_effect", `{}`})
			}
		}
		if r.IntN(4) == 0 {
			if args, ok := research(r); ok {
				st.calls = append(st.calls, callScript{"research", args})
			}
		}
		// A stable sort: the research calls after the others.
		slices.SortStableFunc(st.calls, func(a, b callScript) int {
			return boolInt(a.tool == "research") - boolInt(b.tool == "research")
		})
	}
	return s
}

// settleScript is the reply of a delivery turn in the settle (clean): a note, and in half of them (drawn from
// the process's own stream) a research call first, so that the settle's delivery turns, one after another with
// no person between them, make chains of server-side turns that keep dispatching (MaxJobChain).
func (w *world) settleScript(p *proc) []stepScript {
	r := rand.New(rand.NewPCG(w.seed^0xb0d5, uint64(p.id)))
	if r.IntN(2) == 0 {
		if args, ok := w.research(r); ok {
			return []stepScript{{deltas: []string{"more "}, calls: []callScript{{"research", args}}}, {deltas: []string{"noted "}}}
		}
	}
	return []stepScript{{deltas: []string{"noted "}}}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// jobCreatedBounded checks the active jobs of j's owner when j was created (w.mu not held): a dispatch leases a
// slot before it creates a job, and gives it back once the job's result is delivered.
func (w *world) jobCreatedBounded(j agent.Job) {
	if w.bounds.activePerUser == 0 {
		return
	}
	w.mu.Lock()
	w.bounds.runOf[j.ID] = j.Writer.RunID
	w.mu.Unlock()
	ctx := context.Background()
	now := w.clock.Now()
	var running []string
	for _, th := range w.threads {
		js, err := w.base.ListJobs(ctx, th.id)
		if err != nil {
			continue
		}
		for _, x := range js {
			if x.Owner == j.Owner && !x.Finished() && x.CreatedAt.Add(w.bounds.slotTTL).After(now) {
				running = append(running, x.ID)
			}
		}
	}
	if len(running) > w.bounds.activePerUser {
		w.violate("jobs-bounds", "job %s created while its user has %d running jobs, more than the %d leased: %s", j.ID,
			len(running), w.bounds.activePerUser, strings.Join(running, " "))
	}
}

// checkBounds is the end-of-schedule part of jobs-bounds for one thread (its runs, jobs and stored messages).
func (w *world) checkBounds(ctx context.Context, th *simThread, js []agent.Job, recs []agent.MessageRecord) {
	if w.bounds.activePerUser == 0 {
		return
	}
	byRun := map[string][]string{}
	byCall := map[string]bool{}
	w.mu.Lock()
	for _, j := range js {
		run := w.bounds.runOf[j.ID]
		byRun[run] = append(byRun[run], j.ID)
		byCall[j.ToolCallID] = true
	}
	w.mu.Unlock()
	for run, ids := range byRun {
		if len(ids) > w.ecfg.MaxJobsPerRun {
			w.violate("jobs-bounds", "thread %s: run %s dispatched %d jobs, more than %d: %s", th.id, run, len(ids),
				w.ecfg.MaxJobsPerRun, strings.Join(ids, " "))
		}
	}
	runs, err := w.base.ListRuns(ctx, th.id)
	if err != nil {
		w.violate("sim", "list runs %s: %v", th.id, err)
		return
	}
	chain := 0
	for _, r := range runs {
		if r.Trigger != agent.TriggerSteer {
			chain = 0
			continue
		}
		chain++
		if chain > w.ecfg.MaxJobChain && len(byRun[r.ID]) > 0 {
			w.violate("jobs-bounds", "thread %s: run %s is server-side turn %d in a row (bound %d) and dispatched %s", th.id, r.ID,
				chain, w.ecfg.MaxJobChain, strings.Join(byRun[r.ID], " "))
		}
	}
	for _, rec := range recs {
		m := rec.Message
		if m.Role != agent.RoleAssistant {
			continue
		}
		step, calls := 0, 0
		for _, p := range transcript.Decode(m.Parts) {
			if p.Type == "step-start" {
				step, calls = step+1, 0
				continue
			}
			if p.ToolCallID == "" {
				continue
			}
			if p.State == agent.StateOutputError && strings.Contains(p.ErrorText, "was not dispatched:") && byCall[p.ToolCallID] {
				w.violate("jobs-bounds", "thread %s: research call %s was refused (%q) but its job exists", th.id, p.ToolCallID, p.ErrorText)
			}
			if p.State == agent.StateOutputError && strings.Contains(p.ErrorText, "one step may call at most") {
				continue
			}
			if calls++; calls == w.ecfg.MaxToolCallsPerStep+1 {
				w.violate("jobs-bounds", "thread %s: step %d of reply %s has more than %d tool calls not refused for the cap (%s)",
					th.id, step, m.ID, w.ecfg.MaxToolCallsPerStep, fmt.Sprint(p.ToolCallID))
			}
		}
	}
}
