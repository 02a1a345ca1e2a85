// Package threads is a caller's view of their threads: ownership (another user's thread does not exist for the
// caller, it is never forbidden), reads with lazy reaping, patch, delete, stop, runs, and attaching to a live
// stream. The HTTP layer only decodes, calls this and maps errors; the rules live here.
package threads

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
)

// Defaults, written once here.
const (
	DefaultListLimit = 50
	MaxListLimit     = 200
	MaxTitleBytes    = 200
	// DefaultViewJobs is how many finished jobs a thread's view shows, the newest (every unfinished one is
	// shown): the view stays bounded however many jobs the thread ran (REVIEW S7).
	DefaultViewJobs = 20
)

// Store is what the service reads and writes.
type Store interface {
	agent.ThreadStore
	agent.RunStore
	agent.MessageStore
	agent.SegmentStore
	agent.InterruptStore
	agent.JobStore
	agent.QueueStore
	agent.LimitStore
}

// Reaper reaps a stale claim (lib/reaper).
type Reaper interface {
	Reap(ctx context.Context, threadID string, c agent.Claim) (bool, error)
	Orphans(ctx context.Context, threadID, active string, msgs []agent.Message) int
	ReapOrphan(ctx context.Context, threadID, runID string) error
}

// LocalStopper stops a run of this process at once (lib/engine's Engine.StopLocal): the run is canceled without
// waiting for its next heartbeat to read the stop from the store. It reports whether the run was found running
// here; a run of another process (or one that just ended) is not, and learns of the stop from the store.
type LocalStopper interface {
	StopLocal(threadID, runID string) bool
}

// Config bounds the service. Zero values take the defaults.
type Config struct {
	StaleAfter time.Duration // agent.DefaultStaleAfter
	Follow     segments.Follower
	// Stream readers (limits.go); a negative limit means none.
	MaxStreamsPerUser int           // DefaultMaxStreamsPerUser
	MaxStreamsPerRun  int           // DefaultMaxStreamsPerRun
	StreamLeaseTTL    time.Duration // DefaultStreamLeaseTTL
	PageBytes         int           // DefaultPageBytes: a page of messages, encoded (pages.go)
}

// Service serves one caller's threads.
type Service struct {
	store   Store
	hub     *segments.Hub
	reaper  Reaper
	stopper LocalStopper
	clock   agent.Clock
	log     *slog.Logger
	cfg     Config
}

// Deps are the service's ports.
type Deps struct {
	Store  Store
	Reaper Reaper
	// Stopper delivers a stop to a run of the same process (nil: none; a process that runs no turns, such as the
	// API function in AWS, whose runs live in the chat function's processes).
	Stopper LocalStopper
	Clock   agent.Clock
	Logger  *slog.Logger
	// Hub, when set, is the hub the engine of this process publishes its runs' streams to: a reader of such a run
	// is fed from it rather than from the store (segments.Hub).
	Hub *segments.Hub
}

// New builds the service.
func New(d Deps, cfg Config) *Service {
	cfg.StaleAfter = cmp.Or(cfg.StaleAfter, agent.DefaultStaleAfter)
	cfg.PageBytes = cmp.Or(cfg.PageBytes, DefaultPageBytes)
	cfg = cfg.withLimits()
	s := &Service{store: d.Store, hub: d.Hub, reaper: d.Reaper, stopper: d.Stopper, clock: d.Clock, log: d.Logger, cfg: cfg}
	if s.clock == nil {
		s.clock = agent.SystemClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s
}

func notFound(id string) error {
	return agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", id)
}

// owned loads a thread owner owns, reaping a stale claim on the way (DESIGN "Reaper": the routine runs lazily
// when a thread is read).
func (s *Service) owned(ctx context.Context, owner, id string) (agent.Thread, error) {
	th, err := s.store.GetThread(ctx, id)
	return s.ownedFrom(ctx, owner, id, th, err)
}

// ownedFrom is owned for a thread the caller has already read.
func (s *Service) ownedFrom(ctx context.Context, owner, id string, th agent.Thread, err error) (agent.Thread, error) {
	if agent.IsKind(err, agent.KindNotFound) || (err == nil && th.Owner != owner) {
		return agent.Thread{}, notFound(id)
	}
	if err != nil {
		return th, err
	}
	if c := th.ActiveRun; c != nil && c.Stale(s.clock.Now(), s.cfg.StaleAfter) && s.reaper != nil {
		if reaped, err := s.reaper.Reap(ctx, th.ID, *c); err != nil {
			s.log.Warn("lazy reap", "thread_id", th.ID, "run_id", c.RunID, "err", err)
		} else if reaped {
			if fresh, err := s.store.GetThread(ctx, id); err == nil {
				th = fresh
			}
		}
	}
	return th, nil
}

// List returns the owner's threads, newest first. limit 0 means DefaultListLimit.
func (s *Service) List(ctx context.Context, owner string, limit int) ([]agent.Thread, error) {
	ths, _, err := s.ListPage(ctx, owner, ListQuery{Limit: limit})
	return ths, err
}

// ListPage returns one page of the owner's threads, most recently updated first, and how to read on.
func (s *Service) ListPage(ctx context.Context, owner string, q ListQuery) ([]agent.Thread, PageInfo, error) {
	p, err := q.threadPage()
	if err != nil {
		return nil, PageInfo{}, err
	}
	page, err := s.store.ListThreadsPage(ctx, owner, p)
	if err != nil {
		return nil, PageInfo{}, err
	}
	ths, info := inThreadOrder(page, false, threadCursor)
	if ths == nil {
		ths = []agent.Thread{}
	}
	return ths, info, nil
}

// View is one thread as its owner sees it.
type View struct {
	Thread     agent.Thread      `json:"thread"`
	Messages   []agent.Message   `json:"messages"`
	ActiveRun  *agent.Run        `json:"activeRun"`
	Interrupts []agent.Interrupt `json:"interrupts"`
	// Jobs are the thread's sub-agent jobs with their status and live activity line, oldest first: every one
	// still running and the newest DefaultViewJobs finished ones.
	Jobs []agent.Job `json:"jobs"`
	// JobsOmitted counts the older finished jobs Jobs leaves out.
	JobsOmitted int `json:"jobsOmitted"`
	// Queued are the messages waiting for the thread to free (multitask enqueue, and steers of finished jobs),
	// in the order they will be taken.
	Queued []QueuedView `json:"queued"`
	// Page tells how to read the messages on (Messages is one page of them: PageQuery).
	Page PageInfo `json:"page"`
}

// QueuedView is one queue entry as its owner sees it.
type QueuedView struct {
	MessageID string          `json:"messageId"`
	Kind      agent.QueueKind `json:"kind"`
	JobID     string          `json:"jobId,omitempty"`
	Position  int             `json:"position"`
	CreatedAt time.Time       `json:"createdAt"`
}

// Get returns the thread with the first page of its messages (PageQuery's defaults) and its active run.
func (s *Service) Get(ctx context.Context, owner, id string) (View, error) {
	return s.GetPage(ctx, owner, id, PageQuery{})
}

// GetPage returns the thread with one page of its messages (in thread order), its active run, the interrupts the
// newest message waits for (read with a small page of the newest messages when q's page is not the newest),
// jobs and queue.
func (s *Service) GetPage(ctx context.Context, owner, id string, q PageQuery) (View, error) {
	mp, newestFirst, err := q.messagePage()
	if err != nil {
		return View{}, err
	}
	th, err := s.owned(ctx, owner, id)
	if err != nil {
		return View{}, err
	}
	var jobs agent.JobsPage
	var queue []agent.QueuedMessage
	side := make(chan error, 2)
	go func() {
		var err error
		jobs, err = s.store.ListJobsPage(ctx, th.ID, DefaultViewJobs) // what the view shows, not every job (S7)
		side <- err
	}()
	go func() {
		var err error
		queue, err = s.store.ListQueued(ctx, th.ID)
		side <- err
	}()
	msgs, info, newest, err := s.messagePage(ctx, th.ID, mp, newestFirst)
	for range 2 {
		if serr := <-side; err == nil && serr != nil {
			err = serr
		}
	}
	if err != nil {
		return View{}, err
	}
	if s.reaper != nil {
		active := ""
		if th.ActiveRun != nil {
			active = th.ActiveRun.RunID
		}
		// Rare: a streaming reply whose run no claim names (a reaper died half way). Finish it, then read again.
		if s.reaper.Orphans(ctx, th.ID, active, slices.Concat(msgs, newest)) > 0 {
			if msgs, info, newest, err = s.messagePage(ctx, th.ID, mp, newestFirst); err != nil {
				return View{}, err
			}
			if fresh, err := s.store.GetThread(ctx, th.ID); err == nil {
				th = fresh
			}
		}
	}
	shown := jobs.Jobs
	if shown == nil {
		shown = []agent.Job{}
	}
	asking, err := s.pending(ctx, th.ID, newest)
	if err != nil {
		return View{}, err
	}
	v := View{Thread: th, Messages: msgs, Interrupts: asking, Jobs: shown, JobsOmitted: jobs.Omitted,
		Queued: []QueuedView{}, Page: info}
	for i, q := range queue {
		v.Queued = append(v.Queued, QueuedView{MessageID: q.Message.ID, Kind: q.Kind, JobID: q.JobID, Position: i + 1, CreatedAt: q.CreatedAt})
	}
	if th.ActiveRun != nil {
		if run, err := s.store.GetRun(ctx, th.ID, th.ActiveRun.RunID); err == nil {
			v.ActiveRun = &run
		}
	}
	return v, nil
}

// pending returns the interrupts that wait for an answer: those of the newest message whose calls wait in it,
// when it is an assistant message that ended interrupted (an interrupt of an older message was left behind by a later turn, which
// cancels it). Only that message's interrupts are read (REVIEW S7), and only then. One past its age is marked
// expired here, lazily, and left out.
func (s *Service) pending(ctx context.Context, threadID string, msgs []agent.Message) ([]agent.Interrupt, error) {
	out := []agent.Interrupt{}
	n := len(msgs)
	if n == 0 || msgs[n-1].Role != agent.RoleAssistant || msgs[n-1].Meta().Status != agent.MessageInterrupted {
		return out, nil
	}
	ins, err := s.store.ListMessageInterrupts(ctx, threadID, msgs[n-1].ID)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	waiting := map[string]bool{}
	for _, raw := range msgs[n-1].Parts {
		if p, err := agent.DecodePart(raw); err == nil && p.Waiting() {
			waiting[p.ToolCallID] = true
		}
	}
	for _, in := range ins {
		// The message decides: a pending interrupt whose call no longer waits was left behind by a turn that
		// settled the message and died before it canceled the interrupt.
		if in.MessageID != msgs[n-1].ID || in.Status != agent.InterruptPending || !waiting[in.ToolCallID] {
			continue
		}
		if !in.Pending(now) {
			_, err := s.store.ResolveInterrupt(ctx, in.Resolve(agent.InterruptExpired, now))
			if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
				s.log.Warn("expire interrupt", "thread_id", in.ThreadID, "interrupt_id", in.ID, "err", err)
			}
			continue
		}
		out = append(out, in)
	}
	return out, nil
}

// messagePage reads one page of the thread's messages, visible ones in thread order, with its info, and the
// thread's newest visible messages (the page itself when it holds the newest; else a small page of them).
func (s *Service) messagePage(ctx context.Context, id string, p agent.MessagePage, newestFirst bool) ([]agent.Message, PageInfo, []agent.Message, error) {
	page, err := s.readMessages(ctx, id, p)
	if err != nil {
		return nil, PageInfo{}, nil, err
	}
	recs, info := inThreadOrder(page, newestFirst, messageCursor)
	msgs := visible(recs)
	if newestFirst && p.From.IsZero() || !newestFirst && !page.More {
		return msgs, info, msgs, nil
	}
	// A few: the newest visible message is the newest one but for failed replies that say nothing.
	tail, err := s.store.ListMessagesPage(ctx, id, agent.MessagePage{Limit: newestLook})
	if err != nil {
		return nil, PageInfo{}, nil, err
	}
	recs, _ = inThreadOrder(tail, true, messageCursor)
	return msgs, info, visible(recs), nil
}

// newestLook is how many of the newest messages a page that is not the newest reads to find the newest visible
// one (for the interrupts it waits for).
const newestLook = 4

// visible is the records' messages that a reader sees, in order (agent.Shown: a dead run's failed reply included).
func visible(recs []agent.MessageRecord) []agent.Message {
	msgs := make([]agent.Message, 0, len(recs))
	for _, rec := range recs {
		msgs = append(msgs, rec.Message)
	}
	return agent.Shown(msgs)
}

// Patch changes the title and settings. A title is the owner's (a generated title never replaces it): trimmed,
// at most MaxTitleBytes, one line of valid UTF-8 with no control characters (else 400 invalid_title).
func (s *Service) Patch(ctx context.Context, owner, id string, p agent.ThreadPatch) (agent.Thread, error) {
	if p.Title != nil {
		t := strings.TrimSpace(*p.Title)
		if len(t) > MaxTitleBytes {
			return agent.Thread{}, agent.E(agent.KindInvalid, agent.CodeInvalidTitle, "title must be at most %d bytes", MaxTitleBytes)
		}
		if !utf8.ValidString(t) || strings.IndexFunc(t, unicode.IsControl) >= 0 {
			return agent.Thread{}, agent.E(agent.KindInvalid, agent.CodeInvalidTitle, "title must be one line of text, with no control characters")
		}
		p.Title = &t
	}
	th, err := s.owned(ctx, owner, id)
	if err != nil {
		return th, err
	}
	th, err = s.store.UpdateThread(ctx, th.ID, p, s.clock.Now())
	if agent.IsKind(err, agent.KindNotFound) {
		return th, notFound(id)
	}
	return th, err
}

// Delete removes the thread and everything under it. A thread with an active run is refused (409 run_active):
// the store's tombstone write decides that, so a claim racing the delete cannot leave anything behind.
func (s *Service) Delete(ctx context.Context, owner, id string) error {
	th, err := s.store.GetThread(ctx, id)
	if agent.IsKind(err, agent.KindNotFound) {
		// Missing, or a delete that died half way (a tombstone reads as not found): finishing it is safe for any
		// caller, and a no-op for an id that has no tombstone, or whose thread was created after our read (by
		// another user, maybe: REVIEW S10).
		if derr := s.store.FinishDelete(ctx, id); derr != nil {
			s.log.Warn("finish an interrupted delete", "thread_id", id, "err", derr)
		}
		return notFound(id)
	}
	if th, err = s.ownedFrom(ctx, owner, id, th, err); err != nil {
		return err
	}
	err = s.store.DeleteThread(ctx, th.ID)
	if errors.Is(err, agent.ErrRunActive) {
		return agent.E(agent.KindConflict, agent.CodeRunActive, "stop the active run before deleting the thread")
	}
	return err
}

// Stop asks the active run to stop (it finishes as canceled within a moment). runID, when set, must name the
// active run, so a stop meant for one run never cancels the next. The stop is stored first (the claim's cancel
// request: the truth every process reads, and what the run's outcome is decided by); then, when the run runs in
// this process, it is told at once (Deps.Stopper) instead of learning it from the store at its next heartbeat.
func (s *Service) Stop(ctx context.Context, owner, id, runID string) (string, error) {
	th, err := s.owned(ctx, owner, id)
	if err != nil {
		return "", err
	}
	c, err := s.store.RequestCancel(ctx, th.ID, runID, s.clock.Now())
	if errors.Is(err, agent.ErrNoActiveRun) {
		if runID != "" {
			return "", agent.E(agent.KindConflict, agent.CodeNoActiveRun, "run %q is not the thread's active run", runID)
		}
		return "", agent.E(agent.KindConflict, agent.CodeNoActiveRun, "the thread has no active run")
	}
	if err == nil && s.stopper != nil {
		s.stopper.StopLocal(th.ID, c.RunID)
	}
	return c.RunID, err
}

// Runs lists the first page of the thread's runs (PageQuery's defaults), oldest first.
func (s *Service) Runs(ctx context.Context, owner, id string) ([]agent.Run, error) {
	runs, _, err := s.RunsPage(ctx, owner, id, PageQuery{})
	return runs, err
}

// RunsPage lists one page of the thread's runs, oldest first within the page.
func (s *Service) RunsPage(ctx context.Context, owner, id string, q PageQuery) ([]agent.Run, PageInfo, error) {
	rp, newestFirst, err := q.runPage()
	if err != nil {
		return nil, PageInfo{}, err
	}
	th, err := s.owned(ctx, owner, id)
	if err != nil {
		return nil, PageInfo{}, err
	}
	page, err := s.store.ListRunsPage(ctx, th.ID, rp)
	if err != nil {
		return nil, PageInfo{}, err
	}
	if s.reaper != nil && s.repairRuns(ctx, th, page.Items) {
		if page, err = s.store.ListRunsPage(ctx, th.ID, rp); err != nil {
			return nil, PageInfo{}, err
		}
	}
	runs, info := inThreadOrder(page, newestFirst, runCursor)
	return runs, info, nil
}

// repairRuns finishes runs still recorded as running that no claim names (a reaper died half way); it reports
// whether it found any.
func (s *Service) repairRuns(ctx context.Context, th agent.Thread, runs []agent.Run) bool {
	found := false
	for _, r := range runs {
		if r.Status != agent.RunRunning || (th.ActiveRun != nil && th.ActiveRun.RunID == r.ID) {
			continue
		}
		found = true
		if err := s.reaper.ReapOrphan(ctx, th.ID, r.ID); err != nil {
			s.log.Warn("repair run", "thread_id", th.ID, "run_id", r.ID, "err", err)
		}
	}
	return found
}

// Attach replays the active run's stream to w and follows it until it ends. begin is called once, as soon as
// there is an active run to follow and before anything of its stream is read, then flush: the status and headers
// go out at once, not with the stream's first byte, which a run that has written nothing yet (its writer died
// before its first segment save, or it waits for its first model token) may not write before the reaper ends it,
// past a client's response-header timeout. A thread with no active run, one that does not exist yet, or another user's
// (indistinguishable from not existing), has nothing to attach to: Attach returns false and writes nothing
// (HTTP 204, which is what the AI SDK client expects of a resume with nothing to resume). A reader over a stream
// limit (limits.go) gets false and a KindLimited error, before anything is written.
func (s *Service) Attach(ctx context.Context, owner, id string, begin func(), w io.Writer, flush func()) (bool, error) {
	th, err := s.owned(ctx, owner, id)
	if agent.IsKind(err, agent.KindNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if th.ActiveRun == nil {
		return false, nil
	}
	claim := *th.ActiveRun
	release, err := s.holdStream(ctx, owner, claim.RunID)
	if err != nil {
		return false, err
	}
	defer release()
	f := s.cfg.Follow
	f.Segments, f.Clock, f.Hub, f.Logger = s.store, s.clock, s.hub, s.log
	f.Ended = func(ctx context.Context) (bool, error) { return s.runEnded(ctx, th.ID, claim) }
	// The reader's presence on the claim makes the run flush faster while it reads (segments.Follower).
	f.MarkReader = func(ctx context.Context, until time.Time) error {
		return s.store.MarkReader(ctx, th.ID, claim.RunID, until)
	}
	begin()
	flush()
	_, err = f.Follow(ctx, claim.RunID, w, flush)
	return true, err
}

// runEnded reports whether the followed run is over; a stale claim is reaped on the way, which writes the final
// segment the follower then reads.
func (s *Service) runEnded(ctx context.Context, threadID string, c agent.Claim) (bool, error) {
	th, err := s.store.GetThread(ctx, threadID)
	if agent.IsKind(err, agent.KindNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	cur := th.ActiveRun
	// A claim naming the run at a later epoch is the run continued after a hand-over (lib/engine handover.go):
	// no other claim ever takes a run id again, so only the run id says whether the followed run is over.
	if cur == nil || cur.RunID != c.RunID {
		return true, nil
	}
	if cur.Stale(s.clock.Now(), s.cfg.StaleAfter) && s.reaper != nil {
		if _, err := s.reaper.Reap(ctx, threadID, *cur); err != nil {
			s.log.Warn("lazy reap (resume)", "thread_id", threadID, "run_id", c.RunID, "err", err)
		}
	}
	return false, nil
}
