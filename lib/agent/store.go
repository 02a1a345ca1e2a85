package agent

import (
	"context"
	"time"
)

// Store is the only truth: every port below, in one value. Each consumer takes the narrowest interface it uses
// (the reaper: RunStore, MessageStore, SegmentStore; tools: ValueStore).
//
// Every method is safe for concurrent use by many processes; every write that decides ownership is a single
// conditional write (or one local transaction in embedded stores).
//
// Error contract: reads of unknown ids return an *Error of KindNotFound; list reads of unknown parents return an
// empty slice. Conditional failures return KindConflict with the codes named below. Both stores refuse the same
// bad input with the same code (the catalog in codes.go).
type Store interface {
	ThreadStore
	RunStore
	MessageStore
	SegmentStore
	ValueStore
	InterruptStore
	JobStore
	QueueStore
	LimitStore
	HandOverStore
	SignalStore
}

// ThreadStore keeps threads. A thread being deleted is tombstoned first: from then on nothing can claim it,
// create it again or write into it, and it reads as not found, until the delete has removed everything under it.
type ThreadStore interface {
	// CreateThread inserts t if no thread with t.ID exists. It returns the stored thread and whether this call
	// created it; an existing thread is returned unchanged. A tombstoned id: KindConflict/CodeThreadDeleting.
	CreateThread(ctx context.Context, t Thread) (Thread, bool, error)
	// GetThread: unknown or tombstoned id is KindNotFound.
	GetThread(ctx context.Context, id string) (Thread, error)
	// ListThreads returns owner's threads, most recently updated first (ties by id descending), at most limit
	// (limit <= 0 means DefaultListLimit). Tombstoned threads are left out.
	ListThreads(ctx context.Context, owner string, limit int) ([]Thread, error)
	// ListThreadsPage returns one page of owner's threads in ListThreads' order, those after p.From (exclusive;
	// the zero cursor: from the most recently updated), at most p.Limit (<= 0: DefaultListLimit), and whether more
	// remain. Tombstoned threads are left out. A thread updated while a client pages moves to the top: a walk
	// already past it does not see it again (an index that lags may show it twice; the adapters say when).
	ListThreadsPage(ctx context.Context, owner string, p ThreadPage) (Page[Thread], error)
	// UpdateThread applies p and bumps UpdatedAt to now. Unknown or tombstoned id: KindNotFound. A patch with a
	// Title (even an empty one) is the owner's choice of title: from then on SetGeneratedTitle leaves the thread
	// alone.
	UpdateThread(ctx context.Context, id string, p ThreadPatch, now time.Time) (Thread, error)
	// SetGeneratedTitle stores a generated title (lib/titles) in one conditional write, only while the thread's
	// title is still the one it was created with, g.Replaces (the engine's provisional title, its first message's
	// text): not one its owner set (UpdateThread with a Title, the same text or an empty one included) and not one
	// generated before. It returns the stored thread and whether this call set its title; a thread whose title it
	// may not replace is returned unchanged, with false and no error. So the owner's title wins whether it lands
	// before or after the generated one, and a generated title never overwrites a title anyone chose or generated.
	// UpdatedAt is left alone: a title is not activity, and the thread keeps its place in ListThreads. An empty
	// title is KindInvalid/CodeInvalidTitle; unknown or tombstoned id: KindNotFound; another incarnation of the id
	// (g.CreatedAt): false, as a title it may not replace.
	SetGeneratedTitle(ctx context.Context, g GeneratedTitle) (Thread, bool, error)
	// AddUsage adds u.Usage to the thread's usage totals: model spend that is no run's (lib/titles' title
	// request), in one conditional write on a live thread of u.CreatedAt's incarnation (else KindNotFound, and
	// nothing changes). u.Key names the spend (a title: its run id): a call whose key is the one the thread
	// recorded last changes nothing and succeeds, so a retried write counts once. UpdatedAt is left alone.
	AddUsage(ctx context.Context, u ThreadUsage) error
	// DeleteThread removes the thread and everything under it (messages, runs, segments, interrupts, jobs, queue): first a tombstone,
	// written only when no claim is held (else KindConflict/CodeRunActive, and nothing changes); then the
	// children; then the tombstone. A delete interrupted half way leaves the tombstone, and calling DeleteThread
	// again finishes it. Unknown id is a no-op.
	DeleteThread(ctx context.Context, id string) error
	// FinishDelete finishes a delete that stopped half way: only when id's thread is tombstoned does it remove
	// everything under it and the tombstone, as DeleteThread would. A live thread, or an unknown id, is left as it
	// is (nil), so a caller that could not check the thread's owner (a tombstone reads as not found) may call it
	// without deleting a thread someone created meanwhile (REVIEW S10).
	FinishDelete(ctx context.Context, id string) error
}

// GeneratedTitle is a title made for a thread (ThreadStore.SetGeneratedTitle).
type GeneratedTitle struct {
	ThreadID string
	// CreatedAt is the thread's creation time, which names its incarnation: a thread created again on the id
	// after a delete is another one, and the write leaves it alone (nothing of an old incarnation writes into a
	// new one).
	CreatedAt time.Time
	// Replaces is the thread's title when the title was asked for; the write happens only if it still is.
	Replaces string
	Title    string
}

// ThreadUsage is spend added to a thread outside its runs (ThreadStore.AddUsage).
type ThreadUsage struct {
	ThreadID string
	// CreatedAt is the thread's creation time, which names its incarnation (as GeneratedTitle.CreatedAt).
	CreatedAt time.Time
	// Key names the spend, for idempotency: the same key twice in a row counts once.
	Key   string
	Usage Usage
}

// DefaultListLimit is what list reads return when the caller passes no limit.
const DefaultListLimit = 100

// ThreadPage asks for the threads after a cursor (exclusive) in ListThreads' order: most recently updated first,
// ties by id descending.
type ThreadPage struct {
	From  ThreadCursor
	Limit int
}

// ThreadCursor is a thread's place in ListThreads' order; the zero value is the top, where a read starts.
type ThreadCursor struct {
	UpdatedAt time.Time
	ID        string
}

// IsZero reports whether c names no thread (a read from the top).
func (c ThreadCursor) IsZero() bool { return c.ID == "" && c.UpdatedAt.IsZero() }

// Cursor is the cursor that reads on past t.
func (t Thread) Cursor() ThreadCursor { return ThreadCursor{UpdatedAt: t.UpdatedAt, ID: t.ID} }

// Fence names the run a write belongs to. Store writes a run makes after its claim carry it, so that once the run
// has lost its claim (reaped, taken over) none of them can change what a reader sees.
type Fence struct {
	RunID string
	Epoch int64
}

// OrphanRunLister is the reaper's work list of claimless running runs (REVIEW D15), a store behaviour beside
// RunStore that a store offers only where it can answer without scanning its table. Such a run is left by a crash
// between FinishRun's release and its outcome, or by a run item written after a reap: no claim names it, so
// ListStaleClaims never does.
type OrphanRunLister interface {
	// ListOrphanRuns returns up to limit (<= 0: DefaultListLimit) runs recorded as running whose UpdatedAt is
	// before before and whose thread's claim does not name them at their epoch, oldest first (then thread id, run
	// id). The answers only nominate: callers finish each through a conditional take of the idle thread
	// (reaper.ReapOrphan), which re-checks everything.
	ListOrphanRuns(ctx context.Context, before time.Time, limit int) ([]Run, error)
}

// RunStubber is a store behaviour beside RunStore, offered by a store whose ClaimRun writes the claim and the run
// item in two writes (DynamoDB): the reaper can take a claim whose run item is not stored yet, and the dead claim's
// run write may still land, leaving a running run that no claim names (REVIEW D15). The reaper stubs the run item
// instead (fence B for the run's own id), so that the late write is refused. A store whose claim and run item are
// one write (SQLite) never leaves the state and does not offer it.
type RunStubber interface {
	// StubRun stores run as given (the reaper's failed record of it) if no run item with its id exists on the
	// thread. It returns the stored run and whether this call stored it; an existing run is returned unchanged.
	// A ClaimRun whose run item finds a stub (any stored run that is not running) is refused with
	// KindConflict/CodeRunFenced.
	StubRun(ctx context.Context, run Run) (Run, bool, error)
}

// RunStore keeps runs and the thread's active-run claim.
type RunStore interface {
	// ClaimRun makes req.RunID the active run of the thread if it has no claim or its claim is stale, in one
	// conditional write, records the run as running with epoch = thread.Epoch+1, and reserves req.Reserve message
	// positions for it (ClaimResult.FirstSeq onwards; no other claim ever gets them). Of concurrent claimers
	// exactly one wins; the others get KindConflict/CodeRunActive. A retry of a claim that already applied (same
	// RunID, a lost response) returns the same result. Unknown thread, or one whose owner is not req.Owner:
	// KindNotFound (one and the same answer); tombstoned thread: KindConflict/CodeThreadDeleting.
	// ClaimResult.Thread is the thread after the claim.
	ClaimRun(ctx context.Context, req ClaimRequest) (ClaimResult, error)
	// Heartbeat refreshes the claim's heartbeat, fenced: the claim must still name f.RunID at f.Epoch and carry no
	// cancel request. Otherwise KindConflict/CodeRunFenced, or KindCanceled/CodeRunCanceled when cancel was
	// requested (the caller must then finish the run as canceled). A heartbeat does not move an index key every
	// time (see the adapters' docs for what it costs).
	Heartbeat(ctx context.Context, threadID string, f Fence, now time.Time) error
	// KeepClaims is Heartbeat for many claims at once: one process's keeper (lib/engine) sends one call per
	// heartbeat period for all its running runs, so the store work for keeping runs alive grows with processes,
	// not runs. It answers one KeepResult per claim, in order, whatever happened: Err is exactly what Heartbeat
	// would have answered for that claim (nil; KindCanceled/CodeRunCanceled, the heartbeat recorded; KindConflict/
	// CodeRunFenced; or a transient error, which a batch that fails as a whole gives every claim), and Claim is
	// the thread's claim as stored after the write (decoded as GetThread decodes it; zero unless the heartbeat was
	// recorded). Each claim's Gate (its run's write gate; nil: none) is asked just before that claim's write, with
	// the store's write lock held where it has one; a refusal writes nothing for that claim and is its Err (as
	// Heartbeat answers a refused gate on its context). An empty batch answers an empty slice. The adapters'
	// docs say what a batch costs: SQLite writes it in one transaction of O(1) statements; DynamoDB, which has no
	// multi-item condition outside transactions (DESIGN principle 2), sends one conditional UpdateItem per claim.
	KeepClaims(ctx context.Context, claims []KeptClaim, now time.Time) []KeepResult
	// RequestCancel marks the thread's active claim as cancel-requested and returns it. runID, when not empty,
	// must name the active run. No claim (or another run's): KindConflict/CodeNoActiveRun.
	RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (Claim, error)
	// MarkReader records that a resumed-stream reader of runID stays attached until until: the thread's claim's
	// ReadersUntil becomes max(ReadersUntil, until), on condition that the claim names runID (any epoch: a reader
	// knows the run, not its epoch). It is the reader's write; the run only reads it back (with its heartbeats)
	// to flush its segments faster, so a run nobody reads costs nothing more. It fences nothing and changes no
	// index. No claim, or another run's: KindConflict/CodeNoActiveRun (the reader's run is over; nothing
	// changes). Unknown thread: KindNotFound.
	MarkReader(ctx context.Context, threadID, runID string, until time.Time) error
	// ReadersOf reads the reader marks of the threads' claims at once: one ReaderMark per thread id, in order,
	// with the run the claim names (empty: no claim, or no such thread) and its ReadersUntil (zero: none). It is
	// the keeper's reader-presence probe (lib/engine), sent every few tens of milliseconds for all of a process's
	// runs, so it is one read of O(1) requests per call (per 100 threads on DynamoDB), may be eventually
	// consistent (a mark a moment late only hurries a run a moment late), and writes nothing. A failed read
	// answers its error and no marks.
	ReadersOf(ctx context.Context, threadIDs []string) ([]ReaderMark, error)
	// FinishRun is the run's own finish (fence C). It first releases the thread's claim, on condition that the
	// claim still names run.ID at run.Epoch, adding run.Usage to the thread's totals in that same write (so usage is
	// added exactly once, by whichever write releases a claim) and setting the thread's UpdatedAt to run.FinishedAt
	// (when set), so a thread moves up in ListThreads when a turn ends. That release is the decision: when it is
	// refused (the claim was taken over, by the reaper or a later run) the run is fenced: KindConflict/CodeRunFenced,
	// and nothing changes. Then it records run's terminal outcome (status, error, usage, steps, model, finishedAt)
	// by compare-and-set from running at run.Epoch. A retry whose release applied earlier (a lost answer, or a crash
	// between the two writes in a store that makes two) finds the thread idle at run.Epoch and records the
	// outcome; a crash between them leaves a claimless running run, which the reaper finishes (ReapOrphan).
	FinishRun(ctx context.Context, run Run) error
	// TakeOver is the reaper's decision (fence A): in one conditional write it takes the thread's claim for the
	// reaper, at epoch+1, under the run id ReapRunID(req.RunID), with a fresh heartbeat at req.Now. The condition
	// is the reap decision: the claim still names req.Fence with a heartbeat before req.StaleBefore (zero: any
	// heartbeat), or, when req.Fence.RunID is empty, the thread has no claim at all (a claimless running run being
	// finished). Everything the dead run (or a dead reaper) may still write is then fenced by the new epoch, and the
	// reaper writes at the returned fence, then gives the claim back with ReleaseClaim. Otherwise
	// KindConflict/CodeRunFenced and nothing changes; a live run keeps its claim.
	TakeOver(ctx context.Context, req TakeRequest) (Fence, error)
	// NoteTakes adds ids, the queued messages run is about to store, to the run's Takes (REVIEW §3 B: queue takes
	// are written to the run item before the take), fenced: only while the run is recorded running at run.Epoch
	// and the reaper has not sealed its takes (RecordOutcome), and, where the store can, while the thread's claim
	// names the run. Otherwise KindConflict/CodeRunFenced, and the run must not store them.
	NoteTakes(ctx context.Context, run Run, ids []string) error
	// RecordOutcome is the reaper's write of a dead run's outcome: a compare-and-set of the run item from running at
	// run.Epoch (else KindConflict/CodeRunFenced; unknown run KindNotFound), adding nothing to the thread and
	// releasing nothing. holder is the reaper's own claim (TakeOver's fence): a store that can (SQLite) checks in
	// the same transaction that the thread's claim still names it; a zero holder checks no claim. It also seals
	// the run's takes: where the store keeps them, the write applies only while the run's Takes are exactly
	// run.Takes (the ids the reaper fenced), else KindConflict/CodeRunFenced and the reaper reads the run again.
	RecordOutcome(ctx context.Context, run Run, holder Fence) error
	// ReleaseClaim releases the thread's claim on condition "still names req.Fence.RunID at req.Fence.Epoch, and
	// the heartbeat is before req.StaleBefore" (zero StaleBefore: any heartbeat), adding req.Usage to the thread's
	// totals in the same write. Otherwise KindConflict/CodeRunFenced and nothing changes; a live run keeps its
	// claim. The reaper gives back its TakeOver claim with it, adding the dead run's usage.
	ReleaseClaim(ctx context.Context, req ReleaseRequest) error
	// ListStaleClaims returns up to limit (<= 0: DefaultListLimit) active claims whose heartbeat may be before
	// before, in no promised order: the reaper's work list. It reads an index of claimed threads, never a scan. The
	// index only nominates: it may lag, so callers re-check in the write that decides.
	ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]StaleClaim, error)
	// RecordLateUsage adds the tokens a run spent after it lost its claim (late.Usage, beyond what the reaper
	// counted from its draft) to the run's usage and the thread's totals, exactly once per run: a repeated call
	// (a retry, a duplicate) changes nothing and succeeds. The caller must have read the run terminal at
	// late.Fence.Epoch (so that FinishRun can no longer overwrite the run's usage). A thread whose claim still names
	// the run at that epoch: KindConflict/CodeRunActive (the run is not late: FinishRun counts its usage); unknown
	// thread or run: KindNotFound. The thread's totals are what counts: the adapters document what a crash between
	// the thread's and the run's halves leaves.
	RecordLateUsage(ctx context.Context, late LateUsage) error
	GetRun(ctx context.Context, threadID, runID string) (Run, error)
	// ListRuns returns the thread's runs, oldest first (ties by id).
	ListRuns(ctx context.Context, threadID string) ([]Run, error)
	// ListRunsPage returns one page of the thread's runs in ListRuns' order (created, then id): newest first,
	// those before p.From (the zero cursor: from the newest), or with p.Oldest oldest first, those after p.From
	// (zero: from the first); at most p.Limit (<= 0: DefaultListLimit), and whether more remain that way.
	// Unknown thread: an empty page.
	ListRunsPage(ctx context.Context, threadID string, p RunPage) (Page[Run], error)
}

// KeptClaim is one claim of a KeepClaims batch: the thread, the run's fence, and the run's write gate.
type KeptClaim struct {
	ThreadID string
	Fence    Fence
	// Gate is the claim's write gate (agent.WithWriteGate's form): nil lets the write go, an error refuses it.
	Gate func() error
}

// ReaderMark is ReadersOf's answer for one thread: the run its claim names (empty when none) and how long
// resumed-stream readers said they stay attached to it (Claim.ReadersUntil; zero when none).
type ReaderMark struct {
	ThreadID string
	RunID    string
	Until    time.Time
}

// KeepResult is KeepClaims' answer for one claim: Heartbeat's error for it, and the claim as stored after the
// write when the heartbeat was recorded.
type KeepResult struct {
	Claim Claim
	Err   error
}

// RunPage asks for the runs on one side of a cursor (exclusive): before it, newest first, or (Oldest) after it,
// oldest first.
type RunPage struct {
	From   RunCursor
	Oldest bool
	Limit  int
}

// RunCursor is a run's place in ListRuns' order; the zero value is the end a read starts from.
type RunCursor struct {
	CreatedAt time.Time
	ID        string
}

// IsZero reports whether c names no run (a read from the newest).
func (c RunCursor) IsZero() bool { return c.ID == "" && c.CreatedAt.IsZero() }

// Page is one page of a read: Items in the read's order (newest first unless it asked for oldest first), and
// More when more remain beyond the last.
type Page[T any] struct {
	Items []T
	More  bool
}

// RunsPage cuts page p from runs in ListRuns' order (oldest first), for stores that read a thread's runs whole.
func RunsPage(runs []Run, p RunPage) Page[Run] {
	limit := p.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	// cut: the runs before it come before the cursor; with a cursor on a run, that run is excluded both ways.
	cut := len(runs)
	if p.Oldest {
		cut = 0
	}
	if !p.From.IsZero() {
		cut = 0
		for cut < len(runs) && runBefore(runs[cut], p.From) {
			cut++
		}
	}
	if p.Oldest {
		start := cut
		if start < len(runs) && !p.From.IsZero() && runs[start].ID == p.From.ID && runs[start].CreatedAt.Equal(p.From.CreatedAt) {
			start++
		}
		end := min(len(runs), start+limit)
		return Page[Run]{Items: append([]Run{}, runs[start:end]...), More: end < len(runs)}
	}
	start := max(0, cut-limit)
	out := make([]Run, 0, cut-start)
	for i := cut - 1; i >= start; i-- {
		out = append(out, runs[i])
	}
	return Page[Run]{Items: out, More: start > 0}
}

// runBefore reports whether r comes before cursor c in ListRuns' order.
func runBefore(r Run, c RunCursor) bool {
	if !r.CreatedAt.Equal(c.CreatedAt) {
		return r.CreatedAt.Before(c.CreatedAt)
	}
	return r.ID < c.ID
}

// Cursor is the cursor that reads on past r.
func (r Run) Cursor() RunCursor { return RunCursor{CreatedAt: r.CreatedAt, ID: r.ID} }

// ReleaseRequest is the reaper's conditional release of a claim.
type ReleaseRequest struct {
	ThreadID    string
	Fence       Fence
	StaleBefore time.Time
	Usage       Usage
	Now         time.Time
}

// TakeRequest is the reaper's takeover of a stale claim (RunStore.TakeOver).
type TakeRequest struct {
	ThreadID string
	// Fence is the claim to take; an empty RunID asks for a thread with no claim.
	Fence       Fence
	StaleBefore time.Time
	// RunID is the dead run the reaper finishes (the claim is named after it: ReapRunID).
	RunID string
	Now   time.Time
}

// reapPrefix names the claims the reaper holds while it finishes a dead run.
const reapPrefix = "reap:"

// ReapRunID is the run id of the claim the reaper holds while it finishes runID.
func ReapRunID(runID string) string { return reapPrefix + ReapedRunID(runID) }

// ReapedRunID is the run a claim's run id belongs to: the dead run for a reaper's claim, else runID itself.
func ReapedRunID(runID string) string {
	for len(runID) > len(reapPrefix) && runID[:len(reapPrefix)] == reapPrefix {
		runID = runID[len(reapPrefix):]
	}
	return runID
}

// IsReapClaim reports whether a claim's run id is a reaper's.
func IsReapClaim(runID string) bool {
	return len(runID) > len(reapPrefix) && runID[:len(reapPrefix)] == reapPrefix
}

// LateUsage is a fenced run's unrecorded spend.
type LateUsage struct {
	ThreadID string
	// ThreadCreatedAt, when set, must be the thread's CreatedAt: a thread deleted and created again under the same
	// id since the run is another thread, and the write is refused as not found.
	ThreadCreatedAt time.Time
	Fence           Fence
	Usage           Usage
}

// MessageStore keeps a thread's messages. Each stored message remembers the fence of its last writer and whether
// that writer finalized it, so a fenced run's late write can neither overwrite a newer writer's message, nor
// change a message finalized at its own epoch (by itself or by the reaper), nor re-create a deleted one.
type MessageStore interface {
	// PutMessage upserts w.Message by id. A new id is stored at position w.Seq; an existing id keeps its position
	// and creation time and takes the new content. The write applies only when the stored message (if any, a
	// deleted one included) was last written at an epoch below w.Fence.Epoch, or at the same epoch and not
	// finalized; otherwise KindConflict/CodeRunFenced and nothing changes. w.Final finalizes the message at that
	// epoch.
	PutMessage(ctx context.Context, w MessageWrite) error
	GetMessage(ctx context.Context, threadID, id string) (MessageRecord, error)
	// ListMessages returns the thread's messages ordered by seq (ties by id), deleted ones left out. It reads the
	// whole thread: a turn reads pages (ListMessagesPage) instead; deletes, the reaper and tests read it all.
	ListMessages(ctx context.Context, threadID string) ([]MessageRecord, error)
	// ListMessagesPage returns one page of the thread's messages in ListMessages' order (seq, then id): newest
	// first, those before p.From (the zero cursor: from the newest), or with p.Oldest oldest first, those after
	// p.From (zero: from the first); at most p.Limit (<= 0: DefaultListLimit), deleted ones left out, and whether
	// more remain that way. Its cost is the page's, never the thread's: the stores read an index ordered by
	// position. Unknown thread: an empty page.
	ListMessagesPage(ctx context.Context, threadID string, p MessagePage) (Page[MessageRecord], error)
	// FenceMessage is the reaper's stub (fence B): it makes sure no writer below f.Epoch can write message id any
	// more, whether or not that writer's first write has landed. An unknown id gets a hidden stub (read as absent:
	// GetMessage is not found, lists leave it out; a later writer above f.Epoch brings it back as a new message at
	// its own seq); a stored one (hidden or not) keeps its content and position and takes f as its writer, not
	// finalized, when its writer's epoch is below f.Epoch. A message written at f.Epoch or above is left as it is;
	// neither case is an error. SQLite checks f against the thread's claim like any message write.
	FenceMessage(ctx context.Context, threadID, id string, f Fence) error
	// DeleteMessage hides one message, fenced like PutMessage (the hidden message keeps its fence so a late
	// writer cannot bring it back). Unknown ids are a no-op.
	DeleteMessage(ctx context.Context, threadID, id string, f Fence) error
}

// MessagePage asks for the messages on one side of a cursor (exclusive): before it, newest first, or (Oldest)
// after it, oldest first.
type MessagePage struct {
	From   MessageCursor
	Oldest bool
	Limit  int
}

// MessageCursor is a message's place in ListMessages' order; the zero value is the end a read starts from.
type MessageCursor struct {
	Seq int64
	ID  string
}

// IsZero reports whether c names no message (a read from the newest).
func (c MessageCursor) IsZero() bool { return c.ID == "" && c.Seq == 0 }

// Cursor is the cursor that reads on past r.
func (r MessageRecord) Cursor() MessageCursor { return MessageCursor{Seq: r.Seq, ID: r.Message.ID} }

// MessageWrite is one fenced message upsert.
type MessageWrite struct {
	ThreadID string
	Seq      int64
	Message  Message
	Fence    Fence
	Final    bool
	Now      time.Time
	// HideBefore, when above zero, makes the write an edit (fence D): the message must be stored and not deleted
	// (else KindNotFound/CodeMessageNotFound), keeps its position, and the same write hides every message
	// positioned after it and before HideBefore (the editing run's first reserved position) from ListMessages and
	// ListMessagesPage, at once. So the edit commits in one write; deleting those messages afterwards
	// (DeleteMessage) is cleanup, which may fail or never happen without changing what a list shows. GetMessage
	// may still find a message so hidden until it is deleted. A later edit of the same message hides up to its
	// own HideBefore, which includes what the earlier one hid.
	HideBefore int64
}

// EditSettler is a store behaviour beside MessageStore: a store that keeps a record of an edit for its readers
// (DynamoDB: readers cannot otherwise find an edit older than what they read) drops it once the messages the
// edit hid are deleted. Nothing a reader sees changes; it only saves the readers' look-up.
type EditSettler interface {
	// SettleEdit drops the reader record of the edit of message id, fenced like DeleteMessage.
	SettleEdit(ctx context.Context, threadID, id string, f Fence) error
}

// EditCleaner is a store behaviour beside MessageStore: a store whose edit leaves the messages it hid stored until
// they are deleted (DynamoDB) names them, so that the reaper can finish the cleanup of an editing run that died
// after its edit's write (fence D). A store whose edit deletes them in its own write (SQLite) has none to name and
// does not offer it.
type EditCleaner interface {
	// HiddenByEdit returns the ids of the messages that the edit of message id hides (MessageWrite.HideBefore)
	// and that are still stored, newest first: DeleteMessage of each is the edit's cleanup. A message never
	// edited (or whose edit never landed), an unknown message and an unknown thread hide none.
	HiddenByEdit(ctx context.Context, threadID, id string) ([]string, error)
}

// SegmentStore keeps a run's stream segments.
type SegmentStore interface {
	// AppendSegment stores s insert-if-absent on (RunID, Seq): a repeated append of an existing seq is a no-op.
	AppendSegment(ctx context.Context, s Segment) error
	// ListSegments returns the run's segments with Seq >= from in order, up to and including the first final
	// one (so nothing a fenced writer appends after the reaper's final segment is ever read), skipping expired
	// ones (ExpiresAt < now).
	ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]Segment, error)
}

// ValueStore is the key/value area for tool state (the demo notes, tools' recorded effects), scoped by namespace
// (e.g. "notes/<owner>").
type ValueStore interface {
	ValueReader
	PutValue(ctx context.Context, ns, key string, value []byte) error
	DeleteValue(ctx context.Context, ns, key string) error
}

// ValueReader is ValueStore's read half: all a tool's Recorded needs, and so all that a component which only
// asks tools what a call recorded (the reaper) holds of tool state.
type ValueReader interface {
	// GetValue: unknown key is KindNotFound.
	GetValue(ctx context.Context, ns, key string) ([]byte, error)
	// ListValues returns the namespace's entries ordered by key.
	ListValues(ctx context.Context, ns string) ([]KV, error)
}

// ReadOnlyValues is a ValueStore over a ValueReader whose writes are refused (KindInternal: a tool executed
// where only its recorded outcome may be read is a bug), for the tools of a function that runs no turn.
type ReadOnlyValues struct{ ValueReader }

func (ReadOnlyValues) PutValue(context.Context, string, string, []byte) error {
	return E(KindInternal, CodeInternal, "tool state is read-only here")
}

func (ReadOnlyValues) DeleteValue(context.Context, string, string) error {
	return E(KindInternal, CodeInternal, "tool state is read-only here")
}

// KV is one key/value entry.
type KV struct {
	Key   string
	Value []byte
}
