package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/segments"
)

// Turn is a claimed run whose turn is planned, ready to stream.
type Turn struct {
	e      *Engine
	run    agent.Run
	thread agent.Thread
	owner  string
	// userToken is the request's UserToken ("" for a turn no request of the user runs).
	userToken string
	plan      turnPlan
	// claimedAt is the clock time of the claim: the claim is ours for staleAfter from its last heartbeat, and
	// this is the first one.
	claimedAt time.Time
	// keptAt is the newest heartbeat the store accepted (the keeper's batch, or keepClaim's during a long close-out;
	// unix nanoseconds, 0: none): the close-out runs beside the stream, so it is atomic.
	keptAt atomic.Int64
	// userWrite receives the result of storing the request's user message, which runs beside the first model
	// request (the critical path before the model is the claim plus one read). Nil when there is none to store.
	// It is awaited before anything else is written or any tool runs.
	userWrite chan error
	userErr   error
	userDone  bool
	// queued is set instead of a claim when the request was queued (multitask enqueue on a busy thread).
	queued *Queued
	// pumped: a delivery pass runs this turn and looks at the queue after it (the run's end does not ask).
	pumped bool
	// held names queued messages that the thread holds but the turn's window does not show (window.go).
	held map[string]bool
	// meter counts the turn's store requests from its claim on (agent.StoreMeter); began is when the turn began.
	meter *agent.StoreMeter
	began time.Time
	// slot is the user's active-run slot this run holds (limits.go); nil for server-side turns.
	slot *runSlot
	// guardp is the run's guard once it streams (guard.go): the write gate asks it.
	guardp atomic.Pointer[guard]
	// outp is the run's output once it streams: the keeper's answers hurry its segments while readers are attached.
	outp atomic.Pointer[output]
	// ticket is the run's place among the engine's runs (admission.go), given back with its slot.
	ticket *ticket
	// ho is the run's hand-over state (handover.go): when it hands over, and where a continuation goes on from.
	ho handOverState
	// streaming: Stream runs the turn (and delivers its completion signal at its end); signalArmed: the run's
	// outcome was stored with its signal armed, and nobody delivered it yet (signal.go).
	streaming, signalArmed bool
}

// Run returns the claimed run record.
func (t *Turn) Run() agent.Run { return t.run }

// turnPlan is what a turn kind decided, from the messages read after the claim.
type turnPlan struct {
	history []agent.Message // what the model sees before the run's own draft
	user    *agent.Message  // a new (or edited) user message to store at the run's first reserved position
	// edit: user replaces a stored message, and its write hides every message after it (fence D): drop is then
	// the cleanup that follows the write.
	edit     bool
	replaces string // regenerate: the reply being replaced, hidden once the new one is stored

	// A continuation: the stored parts of the message it continues, and the answers to apply to them.
	draft   []agent.Part
	answers []interrupts.Answer
	// noop: every answer of the request was applied already; the turn only reports the stored message.
	noop        bool
	noopMessage agent.Message
	// answerOnly: steers wait in the queue (continuation coalescing, queue.go): the turn applies the answers to
	// the message, stores it final and ends without a model step; a delivery pass chained in the same request
	// takes the steers after it and answers question and result together in a new reply.
	answerOnly bool

	// What the turn closes before its own user message is stored: interrupts it leaves unanswered (canceled,
	// or expired), the newest assistant message with results for its waiting calls, and (an edit) the
	// messages after the edited one, newest first.
	cancel       []agent.ResolveRequest
	settled      *agent.Message
	settledFinal bool
	drop         []string

	// The queue entries the turn takes (queue.go); userSeq is the position of the request's user message.
	takes   []take
	userSeq int64
	// nothing: a delivery pass that found nothing to answer.
	nothing bool
}

// Begin validates, claims the thread (creating it for a first message), reads the thread and plans the turn.
// Any error is returned before a byte is streamed; a refused request writes nothing, and a failure after the
// claim releases it.
func (e *Engine) Begin(ctx context.Context, req Request) (*Turn, error) {
	if err := e.Validate(req); err != nil {
		return nil, err
	}
	ticket, err := e.admit(req) // before anything is written
	if err != nil {
		return nil, err
	}
	defer ticket.unlessKept()
	meter, began := new(agent.StoreMeter), time.Now()
	ctx = agent.WithStoreMeter(ctx, meter)
	claim, claimedAt, slot, err := e.claim(ctx, req)
	if errors.Is(err, agent.ErrRunActive) && req.Multitask == MultitaskEnqueue && req.Kind == TurnSubmit &&
		req.Message.Role == agent.RoleUser && !req.edits() || errors.Is(err, agent.ErrTooManyRuns) && e.queueAtLimit(ctx, req) {
		return e.enqueue(ctx, req)
	}
	if errors.Is(err, agent.ErrRunActive) && req.Multitask == MultitaskEnqueue && req.continues() {
		// REVIEW H12: only user messages are queued. An answer waits for nothing the queue could give it (the
		// active run may be answering the same request), so it is refused in words the client can act on.
		return nil, agent.Wrap(err, agent.KindConflict, agent.CodeRunActive, "an answer is not queued: send it again once the active run has ended")
	}
	if err != nil {
		return nil, err
	}
	t := &Turn{e: e, run: claim.Run, thread: claim.Thread, owner: req.Owner, userToken: req.UserToken, claimedAt: claimedAt, pumped: req.Kind == TurnQueued,
		meter: meter, began: began, slot: slot, ticket: ticket}
	ticket.keep(t)
	plan, err := t.readAndPlan(ctx, req)
	if err != nil {
		return nil, t.abort(ctx, err)
	}
	t.plan = plan
	if plan.nothing {
		t.releaseSlot(ctx)
		return nil, t.release(ctx)
	}
	// Answers are decided before a byte is streamed: a lost compare-and-set refuses the request like bad input.
	if err := t.resolve(ctx); err != nil {
		return nil, t.abort(ctx, err)
	}
	if t.plan.replaces != "" && (t.plan.settled != nil || len(t.plan.cancel) > 0) {
		// A regenerate of a reply that asked closes it before streaming: a new reply that failed half way must
		// not leave the old one, no longer the newest, still asking (rare, so off the usual critical path).
		if err := t.closeOut(ctx); err != nil {
			return nil, t.abort(ctx, err)
		}
		t.plan.settled, t.plan.cancel = nil, nil
	}
	t.apply(ctx)
	e.log.InfoContext(ctx, "run claimed", "thread_id", t.thread.ID, "run_id", t.run.ID, "epoch", t.run.Epoch, "trigger", t.run.Trigger)
	return t, nil
}

// reservedPositions is how many message positions a claim reserves: the user message, the queued entries it
// may take, and the reply.
const reservedPositions = 2 + maxTake

// claimThread takes the thread's run claim for runID: creating the thread for a first message (counted against
// the user's threads per minute first), reaping a stale claim in the way, and cancelling the active run first when
// the request says interrupt. It also returns the claim's heartbeat time (the Now of the attempt that won).
func (e *Engine) claimThread(ctx context.Context, req Request, runID string) (agent.ClaimResult, time.Time, error) {
	trigger, assistantID := agent.TriggerUser, "msg_"+strings.TrimPrefix(runID, "run_")
	switch {
	case req.Kind == TurnQueued:
		trigger = req.trigger
	case req.Kind == TurnRegenerate:
		trigger = agent.TriggerRegenerate
	case req.continues():
		trigger, assistantID = agent.TriggerContinuation, req.Message.ID // the same message goes on
	case req.edits():
		trigger = agent.TriggerEdit
	}
	creq := agent.ClaimRequest{ThreadID: req.ThreadID, Owner: req.Owner, RunID: runID, Trigger: trigger,
		AssistantMessageID: assistantID, Reserve: reservedPositions}
	if req.Kind == TurnSubmit && !req.continues() && req.Message != nil {
		creq.UserMessageID = req.Message.ID // the reaper fences it (fence B)
	}
	notFound := agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", req.ThreadID)
	created, canceled, finished, counted, reaped := false, false, false, false, 0
	var stopWaiting <-chan time.Time // InterruptWait, once the request asked the active run to stop
	for {
		// A transient failure is retried with the same run id: a claim that applied and lost its answer is then
		// recognised as ours (REVIEW D9). The claim is counted from the first attempt's time, the earliest it
		// may have applied at.
		var res agent.ClaimResult
		at := e.clock.Now()
		err := e.retry(ctx, func() error {
			var err error
			creq.Now = e.clock.Now()
			res, err = e.store.ClaimRun(ctx, creq)
			return err
		})
		switch {
		case err == nil:
			return res, at, nil
		case agent.IsKind(err, agent.KindNotFound):
			if req.Kind != TurnSubmit || req.continues() || created {
				return res, time.Time{}, notFound
			}
			if !counted { // once per request, though finishing a dead delete may bring it here twice
				if err := e.countThread(ctx, req.Owner); err != nil {
					return res, time.Time{}, err
				}
				counted = true
			}
			now := e.clock.Now()
			th, _, cerr := e.store.CreateThread(ctx, agent.Thread{ID: req.ThreadID, Owner: req.Owner,
				Title: titleOf(req.Message), CreatedAt: now, UpdatedAt: now})
			if errors.Is(cerr, agent.ErrThreadDeleting) && !finished {
				finished = true
				if derr := e.finishDelete(ctx, req.ThreadID); derr != nil {
					return res, time.Time{}, derr
				}
				continue
			}
			if cerr != nil {
				return res, time.Time{}, fmt.Errorf("create thread: %w", cerr)
			}
			if th.Owner != req.Owner {
				return res, time.Time{}, notFound // another user's thread does not exist for this caller
			}
			created = true
			continue
		case errors.Is(err, agent.ErrThreadDeleting) && !finished:
			// A delete that died half way left its tombstone: finish it (that is what its owner asked for), and
			// the id is free again. Only an idle thread can be tombstoned, so no run is cut short.
			finished = true
			if derr := e.finishDelete(ctx, req.ThreadID); derr != nil {
				return res, time.Time{}, derr
			}
			continue
		case !errors.Is(err, agent.ErrRunActive):
			return res, time.Time{}, err
		}
		// A run holds the thread. A stale one is reaped (the reaper's conditional release decides), then we
		// claim again; a live one is waited for only when the request interrupts it.
		th, gerr := e.store.GetThread(ctx, req.ThreadID)
		if gerr == nil && th.ActiveRun != nil && th.ActiveRun.Stale(e.clock.Now(), e.cfg.StaleAfter) && e.reaper != nil && reaped < 3 {
			reaped++
			if _, rerr := e.reaper.Reap(ctx, th.ID, *th.ActiveRun); rerr != nil {
				e.log.Warn("reap stale run in the way", "thread_id", th.ID, "run_id", th.ActiveRun.RunID, "err", rerr)
			}
			continue
		}
		if req.Multitask != MultitaskInterrupt {
			return res, time.Time{}, err
		}
		if !canceled {
			canceled = true
			stopWaiting = e.timers.After(e.cfg.InterruptWait)
			active := "" // cancel the run we saw, never one that took the thread since
			if gerr == nil && th.ActiveRun != nil {
				active = th.ActiveRun.RunID
			}
			c, cerr := e.store.RequestCancel(ctx, req.ThreadID, active, e.clock.Now())
			if cerr != nil && !errors.Is(cerr, agent.ErrNoActiveRun) {
				return res, time.Time{}, cerr
			}
			if cerr == nil {
				e.StopLocal(req.ThreadID, c.RunID) // a run of this process stops at once; another's at its next batch
			}
		}
		if passed(stopWaiting) {
			return res, time.Time{}, agent.Wrap(err, agent.KindConflict, agent.CodeRunActive, "the active run did not stop in time")
		}
		if serr := e.timers.Sleep(ctx, 25*time.Millisecond); serr != nil {
			return res, time.Time{}, agent.Wrap(serr, agent.KindCanceled, agent.CodeCanceled, "request canceled")
		}
	}
}

// finishDelete completes a delete that died half way (its tombstone is in the way of a new thread on that id).
func (e *Engine) finishDelete(ctx context.Context, threadID string) error {
	e.log.Info("finishing an interrupted delete", "thread_id", threadID)
	if err := e.store.FinishDelete(ctx, threadID); err != nil {
		return fmt.Errorf("finish an interrupted delete: %w", err)
	}
	return nil
}

// readAndPlan reads the thread's window (window.go), now that the claim is ours, and plans the turn from it:
// duplicates and regenerate targets are judged against what the store holds after every earlier run let go
// (REVIEW H1). A submit looks its own message id up by one point read beside the first page. The thread's
// interrupts are read beside the messages for a continuation, and after them only when the newest assistant
// message waits for answers that the turn leaves behind.
func (t *Turn) readAndPlan(ctx context.Context, req Request) (turnPlan, error) {
	var ins []agent.Interrupt
	var queue []agent.QueuedMessage
	var own *agent.MessageRecord
	insErr, queueErr, ownErr := make(chan error, 1), make(chan error, 1), make(chan error, 1)
	takesQueue := req.Kind == TurnQueued || req.Kind == TurnSubmit && !req.continues()
	readsQueue := takesQueue || req.continues() // a continuation looks for steers to coalesce (queue.go)
	looksUp := req.Kind == TurnSubmit && !req.continues()
	if req.continues() {
		go func() {
			var err error
			ins, err = t.e.store.ListMessageInterrupts(ctx, t.thread.ID, req.Message.ID)
			insErr <- err
		}()
	}
	if readsQueue {
		go func() {
			var err error
			queue, err = t.e.store.ListQueued(ctx, t.thread.ID)
			queueErr <- err
		}()
	}
	if looksUp {
		go func() {
			r, err := t.e.store.GetMessage(ctx, t.thread.ID, req.Message.ID)
			switch {
			case err == nil:
				own = &r
			case agent.IsKind(err, agent.KindNotFound):
				err = nil
			}
			ownErr <- err
		}()
	}
	// The first page goes beside those reads; an edit of an older message reads on once the lookup has found it.
	w := &window{first: t.e.cfg.WindowPage}
	err := w.readOn(ctx, t.e.store, t.thread.ID)
	if req.continues() {
		if ierr := <-insErr; err == nil && ierr != nil {
			err = fmt.Errorf("list interrupts: %w", ierr)
		}
	}
	if readsQueue {
		if qerr := <-queueErr; err == nil && qerr != nil {
			err = fmt.Errorf("list queue: %w", qerr)
		}
	}
	if looksUp {
		if oerr := <-ownErr; err == nil && oerr != nil {
			err = fmt.Errorf("get message: %w", oerr)
		}
	}
	if err != nil {
		return turnPlan{}, err
	}
	enough := budgetMet(t.e.budget())
	if own != nil && req.edits() {
		// Everything after the edited message is dropped (so read, however much it is: all of it is newer than
		// the edited message, so the read ends there), and the budget's worth before it is the history.
		reach := own.Cursor()
		enough = func(w *window) bool {
			i := w.index(own.Message.ID)
			// Read past it without meeting it: an earlier edit hid it (a store may still find it by id).
			passed := i < 0 && len(w.recs) > 0 && w.recs[0].Seq < reach.Seq
			return passed || i >= 0 && w.tokensBefore(i) >= t.e.budget()
		}
		w.reach = &reach
	}
	if err := w.fill(ctx, t.e.store, t.thread.ID, t.e.budget(), enough); err != nil {
		return turnPlan{}, err
	}
	if w.reach == nil { // an edit's window ends at the edited message: it is not the next turn's prefix
		if err := w.anchor(ctx, t.e.store, t.thread.ID, t.e.budget()); err != nil {
			return turnPlan{}, err
		}
	}
	if own != nil && req.edits() && w.index(own.Message.ID) < 0 {
		own = nil // hidden by an earlier edit: not a message to edit
	}
	msgs := w.messages()
	if t.e.reaper != nil {
		// Rare: a streaming message whose run lost its claim without being finished. Finish it now, so the thread
		// does not keep a "streaming" reply forever (the transcript is provider-valid either way).
		t.e.reaper.Orphans(ctx, t.thread.ID, t.run.ID, msgs)
	}
	if takesQueue && len(queue) > 0 {
		if t.held, err = t.heldElsewhere(ctx, msgs, queue); err != nil {
			return turnPlan{}, err
		}
	}
	if req.continues() {
		if !slices.ContainsFunc(msgs, func(m agent.Message) bool { return m.ID == req.Message.ID }) {
			// Older than the window: not the newest message, so the plan only tells a repeat from a stale answer.
			r, err := t.e.store.GetMessage(ctx, t.thread.ID, req.Message.ID)
			if err != nil && !agent.IsKind(err, agent.KindNotFound) {
				return turnPlan{}, fmt.Errorf("get message: %w", err)
			}
			if err == nil {
				msgs = append([]agent.Message{r.Message}, msgs...)
			}
		}
		plan, err := t.planContinue(ctx, msgs, ins, *req.Message)
		if err == nil && !plan.noop {
			plan.answerOnly = steersWait(msgs, queue)
		}
		return plan, err
	}
	if req.Kind == TurnQueued {
		return t.planQueued(ctx, msgs, queue)
	}
	var plan turnPlan
	if req.Kind == TurnRegenerate {
		plan, err = planRegenerate(msgs, req.MessageID, w.shownFailure())
	} else {
		seen := msgs
		if own != nil && !slices.ContainsFunc(msgs, func(m agent.Message) bool { return m.ID == own.Message.ID }) {
			// Stored, older than the window, and not edited (an edit read down to it): the plan refuses it as
			// it would any older message; it goes first so it stands older than all the window shows.
			seen = append([]agent.Message{own.Message}, msgs...)
		}
		plan, err = planSubmit(seen, *req.Message, req.edits())
	}
	if err != nil {
		return plan, err
	}
	// The newest assistant message may wait for answers this turn leaves behind: close them.
	if last := newestAssistant(msgs); last != nil && last.Meta().Status == agent.MessageInterrupted {
		ins, err := t.e.store.ListMessageInterrupts(ctx, t.thread.ID, last.ID)
		if err != nil {
			return plan, fmt.Errorf("list interrupts: %w", err)
		}
		why := settleNewMessage
		switch {
		case slices.Contains(plan.drop, last.ID):
			why = settleDropped
		case plan.replaces == last.ID:
			why = settleRegenerate
		}
		t.settle(ctx, &plan, *last, ins, why)
	}
	if takesQueue {
		t.planTakes(&plan, msgs, queue, TurnSubmit)
	}
	return plan, nil
}

// newestUser is the index of the newest user message (-1: none).
func newestUser(msgs []agent.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == agent.RoleUser {
			return i
		}
	}
	return -1
}

// newestAssistant returns the newest message when it is an assistant message (nil otherwise).
func newestAssistant(msgs []agent.Message) *agent.Message {
	if n := len(msgs); n > 0 && msgs[n-1].Role == agent.RoleAssistant {
		return &msgs[n-1]
	}
	return nil
}

// planSubmit answers a new user message. A re-post of the newest, unanswered message (its first attempt crashed
// before the reply) runs again without storing it twice. A message that replaces a stored one (the AI SDK's
// sendMessage with a messageId, or the newest user message sent again with other content) is an edit: the
// stored message takes the new content and everything after it is dropped.
func planSubmit(msgs []agent.Message, m agent.Message, edit bool) (turnPlan, error) {
	user := sanitizeUser(m)
	for i, old := range msgs {
		if old.ID != user.ID {
			continue
		}
		if old.Role != agent.RoleUser {
			return turnPlan{}, agent.E(agent.KindConflict, agent.CodeDuplicateMessage, "message id %q is taken by an assistant message", m.ID)
		}
		same := sameParts(old.Parts, user.Parts)
		switch {
		case same && i == len(msgs)-1:
			return turnPlan{history: msgs}, nil
		case same && !edit:
			return turnPlan{}, agent.E(agent.KindConflict, agent.CodeDuplicateMessage, "message %q was already answered", m.ID)
		case !edit && i != newestUser(msgs):
			// Only the newest user message may change without the edit being named (its reply may not have
			// reached the client); an older one needs messageId, so a stale tab cannot drop a conversation.
			return turnPlan{}, agent.E(agent.KindConflict, agent.CodeDuplicateMessage, "message %q was already sent with other content; edit it with messageId", m.ID)
		}
		var drop []string
		for j := len(msgs) - 1; j > i; j-- {
			drop = append(drop, msgs[j].ID)
		}
		history := append(slices.Clone(msgs[:i]), user)
		return turnPlan{history: history, user: &user, drop: drop, edit: true}, nil
	}
	if edit {
		return turnPlan{}, agent.E(agent.KindNotFound, agent.CodeMessageNotFound, "message %q (to edit) not found", m.ID)
	}
	return turnPlan{history: append(msgs, user), user: &user}, nil
}

// planRegenerate answers the newest user message again. The reply it replaces stays stored until the new one
// is (REVIEW: a failed regenerate must not lose the old reply); the model just does not see it.
// shown is the failed reply that readers show after the newest message although the engine reads past it
// (window.shownFailure): a regenerate may name it, as useChat's regenerate({messageId}) from that reply does.
func planRegenerate(msgs []agent.Message, replaceID, shown string) (turnPlan, error) {
	last := len(msgs) - 1
	if last < 0 {
		return turnPlan{}, agent.E(agent.KindInvalid, agent.CodeNothingToRegen, "the thread has no messages")
	}
	if replaceID != "" && replaceID == shown && msgs[last].Role == agent.RoleUser {
		return turnPlan{history: msgs, replaces: replaceID}, nil
	}
	if msgs[last].Role == agent.RoleAssistant {
		if replaceID != "" && replaceID != msgs[last].ID {
			return turnPlan{}, agent.E(agent.KindInvalid, agent.CodeNothingToRegen, "only the newest assistant message can be regenerated")
		}
		return turnPlan{history: msgs[:last], replaces: msgs[last].ID}, nil
	}
	if replaceID != "" {
		return turnPlan{}, agent.E(agent.KindInvalid, agent.CodeNothingToRegen, "message %q is not the newest assistant message", replaceID)
	}
	return turnPlan{history: msgs}, nil
}

// apply starts the plan's writes beside the first model request: what the turn closes (closeOut), then the user
// message at the run's first reserved position (an edited one keeps its own).
func (t *Turn) apply(ctx context.Context) {
	p := t.plan
	if p.user == nil && len(p.cancel) == 0 && p.settled == nil && len(p.drop) == 0 && len(p.takes) == 0 {
		return
	}
	t.userWrite = make(chan error, 1)
	ctx = context.WithoutCancel(ctx)
	if p.edit {
		go func() {
			if err := t.commitEdit(ctx); err != nil {
				t.userWrite <- err
				return
			}
			t.userWrite <- t.writeTakes(ctx, nil)
		}()
		return
	}
	go func() {
		if err := t.closeOut(ctx); err != nil {
			t.userWrite <- err
			return
		}
		var own *agent.MessageWrite
		if p.user != nil {
			// A write of a new message id passes the store's message-level fence, so the claim's horizon is
			// checked before every attempt (putFinal): a process that paused, or retried, for half of staleAfter
			// since the claim was last known good must not write (a reaper may own the thread by now, or a delete
			// may have emptied it: REVIEW D1). It goes in its place among the queued messages the turn takes.
			seq := p.userSeq
			if seq == 0 {
				seq = t.run.FirstSeq
			}
			own = &agent.MessageWrite{ThreadID: t.thread.ID, Seq: seq, Message: *p.user, Fence: t.run.Fence(), Final: true}
		}
		t.userWrite <- t.writeTakes(ctx, own)
	}()
}

// commitEdit stores an edit (fence D): one write of the edited message, which keeps its position and hides every
// message after it at once (MessageWrite.HideBefore: the run's first reserved position, where its own messages
// begin). Only then is the rest of the close-out done, as cleanup that changes nothing a reader sees: the later
// messages deleted (newest first), the store's edit record settled, the dropped reply's interrupts canceled.
// Cleanup that fails is logged and left: the edit stands either way. An edit whose write fails changed nothing.
func (t *Turn) commitEdit(ctx context.Context) error {
	e, p := t.e, t.plan
	seq := p.userSeq
	if seq == 0 {
		seq = t.run.FirstSeq
	}
	w := agent.MessageWrite{ThreadID: t.thread.ID, Seq: seq, Message: *p.user, Fence: t.run.Fence(), Final: true,
		HideBefore: t.run.FirstSeq}
	if err := t.putFinal(ctx, w); err != nil {
		return err
	}
	log := e.log.With("thread_id", t.thread.ID, "run_id", t.run.ID, "message_id", p.user.ID)
	cleaned := true
	for _, id := range p.drop {
		err := t.keepClaim(ctx)
		if err == nil {
			err = t.fenced(ctx, func(ctx context.Context) error { return e.store.DeleteMessage(ctx, t.thread.ID, id, t.run.Fence()) })
		}
		if err != nil {
			log.Warn("edit cleanup: delete a hidden message (it stays hidden)", "hidden_id", id, "err", err)
			cleaned = false
			break
		}
	}
	if st, ok := e.store.(agent.EditSettler); ok && cleaned {
		if err := t.fenced(ctx, func(ctx context.Context) error { return st.SettleEdit(ctx, t.thread.ID, p.user.ID, t.run.Fence()) }); err != nil {
			log.Warn("edit cleanup: settle the edit record", "err", err)
		}
	}
	for _, r := range p.cancel {
		err := t.fenced(ctx, func(ctx context.Context) error {
			_, err := e.store.ResolveInterrupt(ctx, r)
			return err
		})
		if err != nil && !errors.Is(err, agent.ErrAlreadyResolved) {
			// Readers honour a pending interrupt only while its call waits in the newest message: the edit hid it.
			log.Warn("edit cleanup: cancel an interrupt of a hidden message", "interrupt_id", r.ID, "err", err)
		}
	}
	return nil
}

// awaitUser waits for the user message's write (once); every later write and every tool waits for it, so nothing
// the run does can outlive a user message that was never stored.
func (t *Turn) awaitUser() error {
	if t.userWrite != nil && !t.userDone {
		t.userErr, t.userDone = <-t.userWrite, true
	}
	return t.userErr
}

// putFinal writes a finalized message, fenced (gated at the claim's horizon before every attempt) and retried on
// transient errors. The stores accept a retry that rewrites exactly what the same run finalized (its first attempt
// applied and lost its answer), so retries converge.
func (t *Turn) putFinal(ctx context.Context, w agent.MessageWrite) error {
	w.Now = t.e.clock.Now() // every attempt carries the same write
	return t.fenced(ctx, func(ctx context.Context) error { return t.e.store.PutMessage(ctx, w) })
}

// abort ends a claimed run that failed before streaming: record it failed, release the claim, and write a final
// segment so a reader attached meanwhile ends too. It returns err for the caller.
func (t *Turn) abort(ctx context.Context, err error) error {
	e := t.e
	ctx = context.WithoutCancel(ctx)
	defer t.releaseSlot(ctx)
	code, msg := agent.Public(err)
	now := e.clock.Now()
	t.run.Status, t.run.Error, t.run.FinishedAt, t.run.UpdatedAt = agent.RunFailed, &agent.RunError{Code: code, Message: msg}, now, now
	// Fenced like every write after the claim: past the horizon the claim is left to go stale (the reaper ends it).
	ferr := t.finishRun(ctx)
	if ferr != nil {
		e.log.Error("release claim after failed begin", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", ferr)
	}
	end := segments.ErrorEnd(agent.MessageMetadata{RunID: t.run.ID, Status: agent.MessageFailed}, msg)
	if serr := segments.AppendFinal(ctx, t.endSegments(ferr == nil), e.clock, t.thread.ID, t.run.ID, end); serr != nil {
		e.log.Warn("final segment after failed begin", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", serr)
	}
	if agent.KindOf(err) == agent.KindInternal {
		e.log.ErrorContext(ctx, "begin failed", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
	}
	// A run refused after its claim is a run like any other for operators: its agent.run line and metric (S9).
	(&stepper{turn: t, log: e.log.With("thread_id", t.thread.ID, "run_id", t.run.ID), logCtx: ctx}).report(t.run)
	return err
}

// sanitizeUser keeps only what a client may author on a user message: id, role, parts. Metadata is dropped
// because the server authors it.
func sanitizeUser(m agent.Message) agent.Message {
	parts := make([]json.RawMessage, len(m.Parts))
	copy(parts, m.Parts)
	return agent.Message{ID: m.ID, Role: agent.RoleUser, Parts: parts}
}

func sameParts(a, b []json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(compact(a[i]), compact(b[i])) {
			return false
		}
	}
	return true
}

func compact(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

// retry runs op until it succeeds, fails for good, or FinishRetry has passed: only transient store errors
// (KindUnavailable) are retried, with capped backoff. Both the backoff and FinishRetry are on the engine's timers
// (so a virtual clock moves them). mayWrite, when set, is asked before every attempt, the
// first included: a run whose claim is in doubt sends nothing more (errInDoubt). A write that carries the run's
// fence goes through Turn.fenced instead, which also puts a deadline at the horizon on each attempt.
func (e *Engine) retry(ctx context.Context, op func() error, mayWrite ...func() bool) error {
	deadline := e.timers.After(e.cfg.FinishRetry)
	wait := 20 * time.Millisecond
	for {
		for _, ok := range mayWrite {
			if ok != nil && !ok() {
				return errInDoubt
			}
		}
		err := op()
		if err == nil || agent.KindOf(err) != agent.KindUnavailable || passed(deadline) {
			return err
		}
		if e.timers.Sleep(ctx, wait) != nil {
			return err
		}
		wait = min(2*wait, time.Second)
	}
}

// passed reports whether the timer has fired (false for none).
func passed(timer <-chan time.Time) bool {
	select {
	case <-timer:
		return true
	default:
		return false
	}
}
