package sim

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The job and queue half of procStore: every write gets a fate (crash before or after, transient fault, lost
// answer) like any other, a dead process's calls park, and the reads that the engine and the threads service make
// on goroutines of their own beside another read (readAndPlan's ListQueued, Get's ListJobs and ListQueued) pass
// with no fate, like their ListInterrupts (see goroutineEntry).

// sideRead reports whether the calling goroutine is one that reads beside another read.
func sideRead() bool {
	e := goroutineEntry()
	return strings.HasPrefix(e, entryPlanReadPrefix) || strings.HasPrefix(e, entryGetReadPrefix)
}

const (
	entryPlanReadPrefix = "github.com/agentloop/agentloop/lib/engine.(*Turn).readAndPlan.func"
	entryGetReadPrefix  = "github.com/agentloop/agentloop/lib/threads.(*Service).Get.func"
)

// JobStore.

func (s *procStore) CreateJob(ctx context.Context, j agent.Job) (got agent.Job, created bool, err error) {
	detail := func() string {
		return fmt.Sprintf("%s/%s call=%s -> created=%v", j.ThreadID, j.ID, j.ToolCallID, created)
	}
	err = s.callD(ctx, "CreateJob", true, false, callPlain, nil, j.ThreadID, detail, func(ctx context.Context) error {
		var e error
		got, created, e = s.Store.CreateJob(ctx, j)
		if e == nil && created {
			s.p.w.jobCreated(j) // as sent: the stored job may not echo its writer
		}
		return e
	})
	return got, created, err
}

func (s *procStore) GetJob(ctx context.Context, threadID, id string) (j agent.Job, err error) {
	err = s.call(ctx, "GetJob", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		j, e = s.Store.GetJob(ctx, threadID, id)
		return e
	})
	return j, err
}

func (s *procStore) ListJobs(ctx context.Context, threadID string) (js []agent.Job, err error) {
	if sideRead() {
		if s.p.isDead() {
			return nil, s.p.parkDead()
		}
		return s.Store.ListJobs(ctx, threadID)
	}
	err = s.call(ctx, "ListJobs", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		js, e = s.Store.ListJobs(ctx, threadID)
		return e
	})
	return js, err
}

func (s *procStore) SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error {
	return s.call(ctx, "SetJobActivity", true, callPlain, nil, threadID, func(ctx context.Context) error {
		return s.Store.SetJobActivity(ctx, threadID, id, activity, now)
	})
}

func (s *procStore) SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error {
	return s.call(ctx, "SetJobDue", true, callPlain, nil, threadID, func(ctx context.Context) error {
		return s.Store.SetJobDue(ctx, threadID, id, due, now)
	})
}

func (s *procStore) FinishJob(ctx context.Context, r agent.JobResult) (j agent.Job, stored bool, err error) {
	detail := func() string {
		what := "result"
		if r.Error != "" {
			what = "error " + r.Error
		}
		return fmt.Sprintf("%s/%s %s -> stored=%v", r.ThreadID, r.ID, what, stored)
	}
	err = s.callD(ctx, "FinishJob", true, false, callPlain, nil, r.ThreadID, detail, func(ctx context.Context) error {
		var e error
		j, stored, e = s.Store.FinishJob(ctx, r)
		return e
	})
	return j, stored, err
}

func (s *procStore) MarkJobDelivered(ctx context.Context, threadID, id string, now time.Time) (j agent.Job, err error) {
	detail := func() string { return threadID + "/" + id }
	err = s.callD(ctx, "MarkJobDelivered", true, false, callPlain, nil, threadID, detail, func(ctx context.Context) error {
		var e error
		j, e = s.Store.MarkJobDelivered(ctx, threadID, id, now)
		return e
	})
	return j, err
}

func (s *procStore) ListDueJobs(ctx context.Context, before time.Time, limit int) (js []agent.Job, err error) {
	err = s.call(ctx, "ListDueJobs", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		js, e = s.Store.ListDueJobs(ctx, before, limit)
		return e
	})
	// As for stale claims: only this schedule's threads (other schedules share the store).
	kept := js[:0:0]
	for _, j := range js {
		if s.p.w.ours(j.ThreadID) {
			kept = append(kept, j)
		}
	}
	return kept, err
}

// QueueStore.

func (s *procStore) Enqueue(ctx context.Context, q agent.QueuedMessage, max int) (got agent.QueuedMessage, created bool, err error) {
	detail := func() string {
		return fmt.Sprintf("%s/%s %s -> seq=%d created=%v", q.ThreadID, q.Message.ID, q.Kind, got.Seq, created)
	}
	err = s.callD(ctx, "Enqueue", true, false, callPlain, nil, q.ThreadID, detail, func(ctx context.Context) error {
		var e error
		got, created, e = s.Store.Enqueue(ctx, q, max)
		if e == nil {
			s.p.w.mu.Lock()
			if s.p.enqueued == nil || s.p.enqueued.Message.ID != got.Message.ID {
				s.p.enqueuedAt = s.p.w.event() // even if the process dies before it hears back
			}
			s.p.enqueued = &got
			s.p.w.mu.Unlock()
		}
		return e
	})
	return got, created, err
}

func (s *procStore) ListQueued(ctx context.Context, threadID string) (qs []agent.QueuedMessage, err error) {
	if sideRead() {
		if s.p.isDead() {
			return nil, s.p.parkDead()
		}
		return s.Store.ListQueued(ctx, threadID)
	}
	err = s.call(ctx, "ListQueued", false, callPlain, nil, threadID, func(ctx context.Context) error {
		var e error
		qs, e = s.Store.ListQueued(ctx, threadID)
		return e
	})
	return qs, err
}

func (s *procStore) TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error {
	detail := func() string { return threadID + "/" + messageID }
	return s.callD(ctx, "TakeQueued", true, false, callPlain, nil, threadID, detail, func(ctx context.Context) error {
		return s.Store.TakeQueued(ctx, threadID, messageID, now)
	})
}

func (s *procStore) ListQueuedThreads(ctx context.Context, before time.Time, limit int) (ids []string, err error) {
	err = s.call(ctx, "ListQueuedThreads", false, callPlain, nil, "", func(ctx context.Context) error {
		var e error
		ids, e = s.Store.ListQueuedThreads(ctx, before, limit)
		return e
	})
	kept := ids[:0:0]
	for _, id := range ids {
		if s.p.w.ours(id) {
			kept = append(kept, id)
		}
	}
	return kept, err
}
