package agent

import (
	"context"
	"slices"
	"time"
)

// QueueKind says who queued a message.
type QueueKind string

const (
	QueueUser  QueueKind = "user"  // a user message sent with multitask "enqueue" while a run was active
	QueueSteer QueueKind = "steer" // a finished job's steer message, waiting for the thread to free
)

// QueueStatus: queued → taken.
type QueueStatus string

const (
	QueueQueued QueueStatus = "queued"
	QueueTaken  QueueStatus = "taken" // a turn stored the message in the thread; kept (until ExpiresAt, without the message's parts) so a late re-queue of the same id is a no-op
)

// DefaultMaxQueued bounds a thread's queue: an enqueue beyond it is refused (409 queue_full).
const DefaultMaxQueued = 32

// DefaultQueueKeep is how long a taken entry is kept, so that a late duplicate (a retried enqueue, a second wake
// of one job) finds it and does nothing.
const DefaultQueueKeep = 7 * 24 * time.Hour

// QueuedMessage is one entry of a thread's queue: a message that the next turn to claim the thread stores and
// answers. Keyed by (ThreadID, Message.ID): enqueueing the same message id twice converges.
type QueuedMessage struct {
	ThreadID string
	// Seq is the order of acceptance, assigned by Enqueue (increasing per thread, with gaps).
	Seq     int64
	Kind    QueueKind
	Message Message
	// Owner is who sent a user message (the thread's owner).
	Owner string
	// JobID names the job a steer delivers.
	JobID     string
	Status    QueueStatus
	CreatedAt time.Time
	TakenAt   time.Time
	// ExpiresAt: a taken entry is removed after it (store TTL); zero while queued.
	ExpiresAt time.Time
	// Epoch is the thread incarnation the enqueuer saw: the epoch of a run of the thread (the run whose claim
	// refused the request, the thread's epoch when a job's delivery read it). Enqueue refuses the entry when
	// the thread was deleted, or deleted and created again on its id, since that epoch (issue 16 item 2).
	// Zero: the enqueuer saw no run, and the entry goes to the incarnation the store finds. Written only: a read
	// entry has it zero.
	Epoch int64
}

// QueueStore keeps each thread's queue. DeleteThread removes a thread's queue.
type QueueStore interface {
	// Enqueue inserts q (Status queued; Seq is assigned) unless an entry with (q.ThreadID, q.Message.ID) exists,
	// queued or taken. It returns the stored entry and whether this call created it. A thread with max queued
	// entries already is KindConflict/CodeQueueFull (max <= 0: DefaultMaxQueued), nothing changes. Unknown or
	// tombstoned thread: KindNotFound.
	//
	// The message round-trips byte for byte (parts and metadata; a part or metadata that is not JSON is
	// KindInvalid/CodeInvalidMessage). q.Seq, q.TakenAt and q.ExpiresAt are ignored (the store assigns the first
	// and Take sets the others). An existing entry wins over the bound: enqueueing an id that is stored already
	// returns it (created false) even when the queue is full, so a retry converges. A taken entry whose ExpiresAt
	// is before q.CreatedAt counts as gone (its TTL may not have removed it yet): the id is queued afresh.
	// Taken entries never count toward max. Stores that cannot count and insert in one transaction may overshoot
	// max by the number of concurrent senders (see the adapters' docs).
	//
	// Incarnations: a q.Epoch (non-zero) must be of the thread's current incarnation, above the epochs of every
	// thread deleted before on its id and not above the thread's own epoch; otherwise the enqueue is refused as
	// KindNotFound/CodeThreadNotFound and nothing is written, so a late enqueue of a deleted thread's process
	// never lands in a thread created again on the id. An entry of an earlier incarnation that a store could not
	// keep out (an enqueue racing the delete) is never read: ListQueued and Enqueue's look-up of the id leave
	// it out (an enqueue of its id is a new entry), and TakeQueued's callers take only ids ListQueued returned.
	Enqueue(ctx context.Context, q QueuedMessage, max int) (QueuedMessage, bool, error)
	// ListQueued returns the thread's queued (not taken) entries in Seq order.
	ListQueued(ctx context.Context, threadID string) ([]QueuedMessage, error)
	// TakeQueued marks the entry taken by compare-and-set from queued, with TakenAt = now and ExpiresAt = now +
	// DefaultQueueKeep; taking a taken entry is a no-op (it keeps its first TakenAt). A taken entry keeps its id,
	// kind, job and times but drops its message's parts and metadata (the turn stored the message; the entry only
	// turns a late duplicate away, and must not make reads of the queue dearer). Unknown id: KindNotFound.
	TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error
	// ListQueuedThreads returns up to limit (<= 0: DefaultListLimit) distinct threads with an entry queued
	// (CreatedAt) before before, in no promised order: the reaper's work list (a turn that died between a run's
	// end and its delivery pass). It reads an index of queued entries, never a scan; the index only nominates (it
	// may name a thread whose entries were taken a moment ago: callers read ListQueued).
	ListQueuedThreads(ctx context.Context, before time.Time, limit int) ([]string, error)
}

// Check refuses an entry no store keeps.
func (q QueuedMessage) Check() error {
	switch {
	case q.ThreadID == "":
		return E(KindInvalid, CodeInvalidThreadID, "queued message needs a thread id")
	case q.Message.ID == "" || q.Message.Role != RoleUser:
		return E(KindInvalid, CodeInvalidMessage, "a queued message is a user message with an id")
	case q.Kind != QueueUser && q.Kind != QueueSteer:
		return E(KindInvalid, CodeInvalidMessage, "queued message %s: unknown kind %q", q.Message.ID, q.Kind)
	case q.Kind == QueueSteer && q.JobID == "":
		return E(KindInvalid, CodeInvalidJob, "queued steer %s names no job", q.Message.ID)
	case q.Status != QueueQueued:
		return E(KindInvalid, CodeInvalidStatus, "queued message %s is created queued, not %q", q.Message.ID, q.Status)
	}
	return nil
}

// HoldsUser reports whether q holds a queued user message.
func HoldsUser(q []QueuedMessage) bool {
	return slices.ContainsFunc(q, func(x QueuedMessage) bool { return x.Kind == QueueUser })
}

// QueueWaits reports whether a thread's queue waits for a person: it holds steers only (a queued user message goes
// ahead, and closes the question as a new message does) and the thread's newest message asks (Asks). The engine's
// delivery pass and the reaper's sweep both ask it (through QueueWaitsIn) before they claim or wake a thread; the
// pass decides again once it has the thread's messages.
func QueueWaits(q []QueuedMessage, newest *Message, ins []Interrupt, now time.Time) bool {
	return !HoldsUser(q) && Asks(newest, ins, now)
}

// Asks reports whether newest, the thread's newest message (nil: none), waits for a person: an assistant message
// that ended interrupted with a call still waiting in it whose interrupt (one of ins) is pending at now. An
// interrupt of an older message holds nothing (REVIEW H8): it was left behind by a later turn that settled its
// message and died before it canceled the interrupt.
func Asks(newest *Message, ins []Interrupt, now time.Time) bool {
	if newest == nil || newest.Role != RoleAssistant || newest.Meta().Status != MessageInterrupted {
		return false
	}
	waiting := map[string]bool{}
	for _, raw := range newest.Parts {
		if p, err := DecodePart(raw); err == nil && p.Waiting() {
			waiting[p.ToolCallID] = true
		}
	}
	return slices.ContainsFunc(ins, func(in Interrupt) bool {
		return in.MessageID == newest.ID && waiting[in.ToolCallID] && in.Pending(now)
	})
}

// QueueWaitsIn is QueueWaits for a thread of s. It reads only when that can matter: the newest message (one
// message) when q holds no user message, and that message's interrupts (not the thread's, REVIEW S7) when it
// ended interrupted.
func QueueWaitsIn(ctx context.Context, s interface {
	MessageStore
	InterruptStore
}, threadID string, q []QueuedMessage, now time.Time) (bool, error) {
	if HoldsUser(q) {
		return false, nil
	}
	page, err := s.ListMessagesPage(ctx, threadID, MessagePage{Limit: 1})
	if err != nil || len(page.Items) == 0 {
		return false, err
	}
	newest := &page.Items[0].Message
	if newest.Role != RoleAssistant || newest.Meta().Status != MessageInterrupted {
		return false, nil
	}
	ins, err := s.ListMessageInterrupts(ctx, threadID, newest.ID)
	if err != nil {
		return false, err
	}
	return QueueWaits(q, newest, ins, now), nil
}
