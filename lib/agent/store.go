package agent

import (
	"context"
	"time"
)

// Store is the only truth. Every method is safe for concurrent use by many processes; every write that decides
// ownership is a single conditional write (or one local transaction in embedded stores).
//
// Error contract: reads of unknown ids return an *Error of KindNotFound; list reads of unknown parents return an
// empty slice. Conditional failures return KindConflict with the codes named below.
type Store interface {
	// CreateThread inserts t if no thread with t.ID exists. It returns the stored thread and whether this call
	// created it; an existing thread is returned unchanged.
	CreateThread(ctx context.Context, t Thread) (Thread, bool, error)
	GetThread(ctx context.Context, id string) (Thread, error)
	// ListThreads returns owner's threads, most recently updated first (ties by id descending), at most limit
	// (limit <= 0 means a store default of 100).
	ListThreads(ctx context.Context, owner string, limit int) ([]Thread, error)
	// UpdateThread applies p and bumps UpdatedAt to now. Unknown id: KindNotFound.
	UpdateThread(ctx context.Context, id string, p ThreadPatch, now time.Time) (Thread, error)
	// DeleteThread removes the thread and everything under it (messages, runs, segments). Unknown id is a no-op.
	DeleteThread(ctx context.Context, id string) error

	// ClaimRun makes req.RunID the active run of the thread if it has no claim or its claim is stale, in one
	// conditional write, and records the run as running with epoch = thread.Epoch+1. Of concurrent claimers
	// exactly one wins; the others get KindConflict/CodeRunActive. Unknown thread: KindNotFound.
	ClaimRun(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Heartbeat refreshes the claim's heartbeat, fenced: the claim must still name runID at epoch and carry no
	// cancel request. Otherwise KindConflict/CodeRunFenced, or KindCanceled/CodeRunCanceled when cancel was
	// requested (the caller must then finish the run as canceled).
	Heartbeat(ctx context.Context, threadID, runID string, epoch int64, now time.Time) error
	// RequestCancel marks the thread's active claim as cancel-requested and returns it. No claim:
	// KindConflict/CodeNoActiveRun.
	RequestCancel(ctx context.Context, threadID string, now time.Time) (Claim, error)
	// FinishRun records run's terminal outcome (status, error, usage, steps, model, finishedAt) by compare-and-set:
	// the stored run must still be running at run.Epoch, else KindConflict/CodeRunFenced and nothing changes. It
	// then adds run.Usage to the thread's totals and releases the thread claim if (and only if) the claim still
	// names run.ID at run.Epoch; that release also sets the thread's UpdatedAt to run.FinishedAt (when set),
	// so a thread moves up in ListThreads when a turn ends.
	FinishRun(ctx context.Context, run Run) error
	// ListStaleClaims returns up to limit (<= 0: a store default of 100) active claims whose heartbeat is before
	// before, in no promised order: the reaper's work list. It reads an index of claimed threads, never a scan.
	ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]StaleClaim, error)
	GetRun(ctx context.Context, threadID, runID string) (Run, error)
	// ListRuns returns the thread's runs, oldest first (ties by id).
	ListRuns(ctx context.Context, threadID string) ([]Run, error)

	// PutMessage upserts m by id. A new id is stored at position seq; an existing id keeps its position and
	// creation time and takes m's content.
	PutMessage(ctx context.Context, threadID string, seq int64, m Message, now time.Time) error
	GetMessage(ctx context.Context, threadID, id string) (MessageRecord, error)
	// ListMessages returns the thread's messages ordered by seq (ties by id).
	ListMessages(ctx context.Context, threadID string) ([]MessageRecord, error)
	// DeleteMessage removes one message; unknown ids are a no-op.
	DeleteMessage(ctx context.Context, threadID, id string) error

	// AppendSegment stores s insert-if-absent on (RunID, Seq): a repeated append of an existing seq is a no-op.
	AppendSegment(ctx context.Context, s Segment) error
	// ListSegments returns the run's segments with Seq >= from in order, skipping expired ones (ExpiresAt < now).
	ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]Segment, error)

	// Key/value area for tool state (the demo notes), scoped by namespace (e.g. "notes/<owner>").
	PutValue(ctx context.Context, ns, key string, value []byte) error
	// GetValue: unknown key is KindNotFound.
	GetValue(ctx context.Context, ns, key string) ([]byte, error)
	// ListValues returns the namespace's entries ordered by key.
	ListValues(ctx context.Context, ns string) ([]KV, error)
	DeleteValue(ctx context.Context, ns, key string) error
}

// KV is one key/value entry.
type KV struct {
	Key   string
	Value []byte
}
