package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Jobs and queues (DESIGN "Sub-agent jobs"): each sweep also re-drives what a died process left behind, through
// two more sparse indexes (cost proportional to what they hold, never to the table):
//
//   - jobs past their due time and still undelivered: a job whose sub-agent task never reported (its Start
//     failed, or never happened) is started again, every StartDue, until its execution's deadline; past it, a job
//     whose execution never reported back gets a failure result; then a finished job whose steer is neither in the thread nor
//     waiting in its queue gets a delivery pass for it (the wake died between "result stored" and "steer
//     delivered");
//   - threads whose queue has held an entry for longer than the delivery grace, idle and waiting for nobody:
//     a delivery pass (the run that should have asked for one died first).
//
// Every pass is named (agent.Jobs.Wake), and the delivery itself is exactly once per job whatever runs twice.

// redrive re-drives due jobs; it returns how many passes it asked for, and the threads they were for (the
// queue sweep of the same tick leaves those alone: a pass is on its way).
func (r *Reaper) redrive(ctx context.Context, woken map[string]bool) (int, error) {
	if r.jobs == nil {
		return 0, nil
	}
	now := r.clock.Now()
	due, err := r.store.ListDueJobs(ctx, now, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reaper: list due jobs: %w", err)
	}
	n := 0
	for _, j := range due {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if !j.Finished() && now.Before(j.CreatedAt.Add(r.cfg.ExecutionTimeout+r.cfg.DeliveryGrace)) {
			r.restart(ctx, j, now)
			continue
		}
		if !j.Finished() {
			fin, _, err := r.store.FinishJob(ctx, agent.JobResult{ThreadID: j.ThreadID, ID: j.ID,
				Error: "it did not report back in time", DueAt: now, Now: now})
			if err != nil {
				r.log.Warn("reaper: fail an overdue job", "thread_id", j.ThreadID, "job_id", j.ID, "err", err)
				continue
			}
			j = fin
			r.log.Info("agent.job.overdue", "thread_id", j.ThreadID, "job_id", j.ID)
		}
		if j.SteerDelivered {
			continue
		}
		q, err := r.store.ListQueued(ctx, j.ThreadID)
		if err != nil {
			r.log.Warn("reaper: list queue", "thread_id", j.ThreadID, "err", err)
			continue
		}
		if slices.ContainsFunc(q, func(x agent.QueuedMessage) bool { return x.JobID == j.ID }) {
			continue // queued behind a busy thread or a question: the queue sweep looks after it
		}
		key := fmt.Sprintf("redrive-%s-%d", j.ID, now.Unix()/60)
		if err := r.jobs.Wake(ctx, agent.JobTask{ThreadID: j.ThreadID, JobID: j.ID, Wake: key}); err != nil {
			r.log.Warn("reaper: re-drive job", "thread_id", j.ThreadID, "job_id", j.ID, "err", err)
			continue
		}
		n++
		woken[j.ThreadID] = true
		r.log.Info("agent.job.redrive", "thread_id", j.ThreadID, "job_id", j.ID)
	}
	return n, nil
}

// restart starts again a job whose sub-agent task never reported (its start failed, or its process died before
// it): its deadline moves to the next start's first, so that the task, once it runs, moves it last (to its
// execution's end), then Start, idempotent by execution name (an execution that exists already is not run twice).
func (r *Reaper) restart(ctx context.Context, j agent.Job, now time.Time) {
	due := now.Add(r.cfg.StartDue)
	if deadline := j.CreatedAt.Add(r.cfg.ExecutionTimeout + r.cfg.DeliveryGrace); deadline.Before(due) {
		due = deadline
	}
	if err := r.store.SetJobDue(ctx, j.ThreadID, j.ID, due, now); err != nil {
		if !errors.Is(err, agent.ErrJobFinished) && !errors.Is(err, agent.ErrJobNotFound) {
			r.log.Warn("reaper: move a job's start deadline", "thread_id", j.ThreadID, "job_id", j.ID, "err", err)
		}
		return // finished meanwhile (the next sweep delivers it if need be), or gone with its thread
	}
	if err := r.jobs.Start(ctx, j); err != nil {
		r.log.Warn("reaper: start a job again", "thread_id", j.ThreadID, "job_id", j.ID, "err", err)
		return
	}
	r.log.Info("agent.job.restart", "thread_id", j.ThreadID, "job_id", j.ID, "age_ms", now.Sub(j.CreatedAt).Milliseconds())
}

// sweepQueues asks for a delivery pass on idle threads whose queue nobody took.
func (r *Reaper) sweepQueues(ctx context.Context, woken map[string]bool) (int, error) {
	if r.jobs == nil {
		return 0, nil
	}
	now := r.clock.Now()
	threads, err := r.store.ListQueuedThreads(ctx, now.Add(-r.cfg.DeliveryGrace), r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reaper: list queued threads: %w", err)
	}
	n := 0
	for _, id := range threads {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if woken[id] {
			continue
		}
		th, err := r.store.GetThread(ctx, id)
		if err != nil || th.ActiveRun != nil {
			continue // gone, or a run holds it (its end asks; a stale one is reaped first)
		}
		q, err := r.store.ListQueued(ctx, id)
		if err != nil || len(q) == 0 {
			continue
		}
		if waits, err := agent.QueueWaitsIn(ctx, r.store, id, q, now); err != nil || waits {
			continue // only steers, and the newest message asks a person: the answer's turn takes them
		}
		if err := r.jobs.Wake(ctx, agent.JobTask{ThreadID: id, Wake: fmt.Sprintf("sweep-%s-%d", id, now.Unix()/60)}); err != nil {
			r.log.Warn("reaper: delivery pass", "thread_id", id, "err", err)
			continue
		}
		n++
		r.log.Info("agent.queue.sweep", "thread_id", id)
	}
	return n, nil
}
