package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/uistream"
)

// The thread's queue (DESIGN "Sub-agent jobs"): steer messages of finished jobs and user messages sent with
// multitask "enqueue" wait in it while a run holds the thread or a person is asked something. A turn that adds
// a user message takes every queued entry: queued user messages go before its own (they were accepted first),
// steers after it (coalescing: the reply answers all of them). A delivery pass (TurnQueued, a wake) takes the
// oldest queued user message, so each gets its own reply in order, and every steer. Continuations and
// regenerates take nothing themselves: a steer placed inside the message a continuation goes on with would show
// the model an order the thread does not. A regenerate's end asks for a delivery pass (pump); a continuation with
// steers waiting ends with its answers and chains that pass in the same request (continuation coalescing, below).
//
// Exactly once: an entry's message keeps its id (steer_<jobId>, or the client's id), a message already in the
// thread is never stored again (its entry is only marked taken), and a taken entry stays, so re-queueing the
// same id is a no-op. Every turn writes the message, then marks the entry taken, then marks the job delivered:
// a crash between leaves an entry that the next turn takes without storing anything twice.

// Continuation coalescing (issue 16 item 6, REVIEW H2). A turn that answers a question while steers wait in the
// queue does not continue the asking message with a model step: that step may ask again, and the steers would
// wait behind every question of the chain. It applies the answers (approved tools run, denied ones get
// output-denied, a client tool its output), stores the message final and ends without a model step (answerOnly);
// then, in the same request, a delivery pass claims the thread, stores the steers after the answered message and
// answers question and result together in a new reply, which is the stream the answering client gets. Its start
// names the new reply's id, and its metadata says the thread gained messages the client has not seen
// (threadChanged, newMessages): the client re-syncs from GET /threads/{id} (README). Each of the two is an
// ordinary run, with the crash recovery of its kind. A steer therefore waits through at most one answering turn.

// steersWait reports whether q holds a steer the thread does not hold yet (one the answering turn coalesces).
func steersWait(msgs []agent.Message, q []agent.QueuedMessage) bool {
	held := heldIDs(msgs)
	return slices.ContainsFunc(q, func(x agent.QueuedMessage) bool { return x.Kind == agent.QueueSteer && !held[x.Message.ID] })
}

// coalesce streams an answer-only turn and chains the delivery pass that answers the waiting steers: the pass's
// stream goes to the client; the answer-only run's own stream (kept in its segments) goes to the client only when
// no pass follows (the run did not complete, or someone else's pass took the steers first).
func (t *Turn) coalesce(ctx context.Context, client io.Writer) agent.Run {
	e := t.e
	var own bytes.Buffer
	t.pumped = true // the pass is chained here, not asked for
	run := t.stream(ctx, &own)
	if run.Status == agent.RunCompleted {
		next, err := e.BeginQueued(context.WithoutCancel(ctx), t.thread.ID)
		if err == nil {
			return next.Stream(ctx, client)
		}
		if !errors.Is(err, ErrNothingQueued) && !errors.Is(err, agent.ErrRunActive) {
			e.log.Warn("coalesce: delivery pass after the answers", "thread_id", t.thread.ID, "run_id", run.ID, "err", err)
			e.wake(ctx, t.thread.ID, "after-"+run.ID)
		}
	} else {
		t.pumped = false
		t.pump(context.WithoutCancel(ctx))
	}
	writeClient(client, own.Bytes())
	return run
}

// writeClient writes an already encoded stream to the client and flushes it (best effort, as the encoder's).
func writeClient(client io.Writer, b []byte) {
	if _, err := client.Write(b); err != nil {
		return
	}
	if w, ok := client.(http.ResponseWriter); ok {
		_ = http.NewResponseController(w).Flush()
	}
}

// newMessages is how many messages the turn stored, besides its user message and its reply, that the client
// did not send: the queue entries it took (steers, queued user messages).
func (p *turnPlan) newMessages() int {
	n := 0
	for _, tk := range p.takes {
		if !tk.present {
			n++
		}
	}
	return n
}

// maxTake bounds how many queued entries one turn takes (the rest wait for the next one); a claim reserves a
// position for each.
const maxTake = 16

// ErrNothingQueued: a delivery pass found nothing to answer (the queue is empty, or the thread waits for a
// person, whose answer's turn takes the queue after it).
var ErrNothingQueued = errors.New("engine: nothing queued to answer")

// Queued is the outcome of a request that was queued instead of run (multitask "enqueue" on a busy thread).
type Queued struct {
	MessageID string `json:"messageId"`
	// Position is the entry's place among the thread's queued entries, from 1 (0: a turn took it already).
	Position int  `json:"position"`
	Created  bool `json:"-"`
}

// Queued returns the queue entry when the request was queued rather than claimed (Stream must not be called).
func (t *Turn) Queued() *Queued { return t.queued }

// take is one queue entry the turn takes: stored at seq unless the thread holds its message already.
type take struct {
	entry   agent.QueuedMessage
	seq     int64
	present bool
}

// planTakes decides which queued entries the turn takes and where they go, and adds them to the history. It
// returns whether the turn has anything to answer from the queue.
func (t *Turn) planTakes(p *turnPlan, msgs []agent.Message, q []agent.QueuedMessage, kind TurnKind) bool {
	have := t.holds(msgs)
	// users holds the queued user messages in queue order; the request's own message goes after them, unless it
	// is itself queued (sent with enqueue, then again without): then it is stored once, as the request's, in its
	// place in the queue's order, and its entry is only taken.
	var users, steers []take
	own := -1 // the request's place among users, when its message is queued
	tookUser := false
	// A delivery pass answers a queued user message that the thread holds already with no reply after it (a
	// submit took it, stored it, then failed before its reply, e.g. on its own message's write: sim seed
	// 3032699439052972066; or that write applied and lost its answer, so the submit's own message is the newest:
	// sim seed 7078298938037414757): the pass's reply goes after the newest message, so after it, and it is the
	// user message the pass answers (it was accepted before any entry still queued). Only its entry is taken.
	answers := kind == TurnQueued && unansweredHeld(msgs, q, have)
	tookUser = answers
	for _, e := range q {
		switch {
		case have[e.Message.ID]:
			p.takes = append(p.takes, take{entry: e, present: true})
			continue
		case p.user != nil && e.Message.ID == p.user.ID:
			p.takes = append(p.takes, take{entry: e, present: true})
			own = len(users)
			users = append(users, take{present: true})
			continue
		case len(users)+len(steers) >= maxTake:
			continue
		}
		switch {
		case e.Kind == agent.QueueSteer:
			steers = append(steers, take{entry: e})
		case kind == TurnSubmit || !tookUser:
			users, tookUser = append(users, take{entry: e}), true
		}
	}
	if p.user != nil && own < 0 {
		own = len(users)
		users = append(users, take{present: true})
	}
	seq := t.run.FirstSeq
	var before, after []agent.Message
	for i := range users {
		users[i].seq, seq = seq, seq+1
		if i == own {
			p.userSeq = users[i].seq
			before = append(before, *p.user)
		} else {
			before = append(before, users[i].entry.Message)
		}
	}
	for i := range steers {
		steers[i].seq, seq = seq, seq+1
		after = append(after, steers[i].entry.Message)
	}
	history := p.history
	if p.user != nil {
		history = history[:len(history)-1] // the request's message, placed again in before
	}
	p.history = slices.Concat(history, before, after)
	added := len(steers)
	for _, u := range users {
		if !u.present {
			p.takes = append(p.takes, u)
			added++
		}
	}
	p.takes = append(p.takes, steers...)
	return added > 0 || answers
}

// unansweredHeld reports whether a queued user entry's message is held by the thread with no assistant message
// after it: in the window after its newest assistant message, or older than a window that holds none.
func unansweredHeld(msgs []agent.Message, q []agent.QueuedMessage, have map[string]bool) bool {
	last := -1
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == agent.RoleAssistant {
			last = i
			break
		}
	}
	return slices.ContainsFunc(q, func(e agent.QueuedMessage) bool {
		if e.Kind != agent.QueueUser || !have[e.Message.ID] {
			return false
		}
		i := slices.IndexFunc(msgs, func(m agent.Message) bool { return m.ID == e.Message.ID })
		return i > last || i < 0 && last < 0
	})
}

// holds is the set of the messages the thread is known to hold: the window's, and those read by id.
func (t *Turn) holds(msgs []agent.Message) map[string]bool {
	held := heldIDs(msgs)
	for id := range t.held {
		held[id] = true
	}
	return held
}

// heldIDs is the set of the messages' ids.
func heldIDs(msgs []agent.Message) map[string]bool {
	held := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		held[m.ID] = true
	}
	return held
}

// writeTakes stores the taken messages (fenced, finalized, at the claim's reserved positions), then marks their
// entries taken and their jobs delivered. Only the message writes can fail the turn: an entry left queued is
// taken by a later turn without a second copy. own, when not nil, is the request's user message: it is written
// in its place among the taken messages, so the writes go in position order and a turn that stops part way has
// stored a prefix (queued user messages go before its own: were its own stored and an earlier one not, a later
// turn would store that one after it, out of the order they were accepted in; sim seed 1329).
func (t *Turn) writeTakes(ctx context.Context, own *agent.MessageWrite) error {
	e := t.e
	// The ids are noted on the run first (fence B's queue takes): a reaper that finds the run dead fences them at
	// its epoch before it reads anything, so a message write of this run that lands late is refused instead of
	// showing after the reap; a note refused means the run was reaped, and it stores none of them.
	var ids []string
	for _, tk := range t.plan.takes {
		if !tk.present {
			ids = append(ids, tk.entry.Message.ID)
		}
	}
	noted := false
	note := func() error {
		noted = true
		if err := t.fenced(ctx, func(ctx context.Context) error { return e.store.NoteTakes(ctx, t.run, ids) }); err != nil {
			return fmt.Errorf("note queued messages taken: %w", err)
		}
		return nil
	}
	for _, tk := range t.plan.takes {
		if tk.present {
			continue
		}
		if own != nil && own.Seq < tk.seq {
			if err := t.putFinal(ctx, *own); err != nil {
				return err
			}
			own = nil
		}
		if !noted {
			if err := note(); err != nil {
				return err
			}
		}
		if !t.fresh() {
			return errInDoubt
		}
		w := agent.MessageWrite{ThreadID: t.thread.ID, Seq: tk.seq, Message: tk.entry.Message, Fence: t.run.Fence(), Final: true}
		if err := t.putFinal(ctx, w); err != nil {
			return fmt.Errorf("store queued message %s: %w", tk.entry.Message.ID, err)
		}
	}
	if own != nil {
		if err := t.putFinal(ctx, *own); err != nil {
			return err
		}
	}
	if !noted {
		if err := note(); err != nil {
			return err
		}
	}
	for _, tk := range t.plan.takes {
		id := tk.entry.Message.ID
		// Gated at the claim's horizon like every write after the claim (fence E): an entry left unmarked is
		// present in the thread, and a later turn takes it without a second copy.
		if err := t.fenced(ctx, func(ctx context.Context) error { return e.store.TakeQueued(ctx, t.thread.ID, id, e.clock.Now()) }); err != nil {
			e.log.Warn("mark queue entry taken", "thread_id", t.thread.ID, "run_id", t.run.ID, "message_id", id, "err", err)
			continue
		}
		if tk.entry.JobID == "" {
			continue
		}
		err := t.fenced(ctx, func(ctx context.Context) error {
			_, err := e.store.MarkJobDelivered(ctx, t.thread.ID, tk.entry.JobID, e.clock.Now())
			return err
		})
		if err != nil {
			e.log.Warn("mark job delivered", "thread_id", t.thread.ID, "run_id", t.run.ID, "job_id", tk.entry.JobID, "err", err)
		} else {
			e.log.Info("job delivered", "thread_id", t.thread.ID, "run_id", t.run.ID, "job_id", tk.entry.JobID)
		}
	}
	return nil
}

// enqueue queues the request's user message on a busy thread (multitask "enqueue"). A run that ended between
// the refused claim and this write may have looked at the queue before it: so after the write the thread is
// read again, and a free thread gets a delivery pass (two passes are harmless: the claim decides).
func (e *Engine) enqueue(ctx context.Context, req Request) (*Turn, error) {
	// A message the thread holds already was answered (or is being answered) by the run in the way: refused like
	// a re-post of an answered message, never queued to wait for an answer it will not get.
	if _, err := e.store.GetMessage(ctx, req.ThreadID, req.Message.ID); err == nil {
		return nil, agent.E(agent.KindConflict, agent.CodeDuplicateMessage, "message %q is already in the thread", req.Message.ID)
	} else if !agent.IsKind(err, agent.KindNotFound) {
		return nil, err
	}
	// The queue is the incarnation's whose run refused the claim (issue 16 item 2): a thread deleted and created
	// again on the id since refuses the entry (not found), and another user's thread on it is not found either.
	th, err := e.store.GetThread(ctx, req.ThreadID)
	if err != nil {
		return nil, err
	}
	if th.Owner != req.Owner {
		return nil, agent.E(agent.KindNotFound, agent.CodeThreadNotFound, "thread %q not found", req.ThreadID)
	}
	var epoch int64
	if th.ActiveRun != nil {
		epoch = th.ActiveRun.Epoch
	}
	now := e.clock.Now()
	q := agent.QueuedMessage{ThreadID: req.ThreadID, Kind: agent.QueueUser, Message: sanitizeUser(*req.Message), Owner: req.Owner,
		Status: agent.QueueQueued, CreatedAt: now, Epoch: epoch}
	stored, created, err := e.store.Enqueue(ctx, q, e.cfg.MaxQueued)
	if err != nil {
		return nil, err
	}
	out := &Queued{MessageID: stored.Message.ID, Created: created}
	if list, err := e.store.ListQueued(ctx, req.ThreadID); err == nil {
		for i, x := range list {
			if x.Message.ID == stored.Message.ID {
				out.Position = i + 1
			}
		}
	}
	if th, err := e.store.GetThread(ctx, req.ThreadID); err == nil && th.ActiveRun == nil {
		e.wake(ctx, req.ThreadID, "enqueue-"+stored.Message.ID)
	}
	e.log.Info("message queued", "thread_id", req.ThreadID, "message_id", stored.Message.ID, "position", out.Position, "created", created)
	return &Turn{e: e, queued: out}, nil
}

// BeginQueued claims an idle thread to answer what its queue holds (a delivery pass: the wake task, or the pump
// after a run). ErrNothingQueued when there is nothing to answer; KindConflict/CodeRunActive when a run holds
// the thread (its end asks for the next pass).
func (e *Engine) BeginQueued(ctx context.Context, threadID string) (*Turn, error) {
	th, err := e.store.GetThread(ctx, threadID)
	if err != nil {
		return nil, err
	}
	q, err := e.store.ListQueued(ctx, threadID)
	if err != nil {
		return nil, fmt.Errorf("list queue: %w", err)
	}
	if len(q) == 0 {
		return nil, ErrNothingQueued
	}
	// Whether steers wait for a person is asked of an idle thread only: a run that holds it refuses the claim
	// below anyway (or, stale, is taken over, and the pass decides under its own claim, planQueued).
	if th.ActiveRun == nil {
		waits, err := agent.QueueWaitsIn(ctx, e.store, threadID, q, e.clock.Now())
		if err != nil {
			return nil, fmt.Errorf("read the newest message: %w", err)
		}
		if waits {
			return nil, ErrNothingQueued // steers wait for the person's answer
		}
	}
	trigger := agent.TriggerSteer
	if agent.HoldsUser(q) {
		trigger = agent.TriggerQueued
	}
	return e.Begin(ctx, Request{Owner: th.Owner, ThreadID: threadID, Kind: TurnQueued, trigger: trigger})
}

// planQueued plans a delivery pass: nothing when the queue holds nothing new, or only steers while the newest
// assistant message still waits for a person (the answer's turn comes first). A queued user message does not
// wait behind a question: like the same message sent without queueing, it settles what waited (the calls get
// "a new message was sent instead of an answer") and is answered.
func (t *Turn) planQueued(ctx context.Context, msgs []agent.Message, q []agent.QueuedMessage) (turnPlan, error) {
	plan := turnPlan{history: msgs}
	// Only a user message the thread does not hold yet may close a question: an entry whose message a turn stored
	// already (queued while that turn's own write was in flight) answers nothing new, and is only taken.
	held := t.holds(msgs)
	users := slices.ContainsFunc(q, func(x agent.QueuedMessage) bool { return x.Kind == agent.QueueUser && !held[x.Message.ID] })
	if last := newestAssistant(msgs); last != nil && last.Meta().Status == agent.MessageInterrupted {
		ins, err := t.e.store.ListMessageInterrupts(ctx, t.thread.ID, last.ID)
		if err != nil {
			return plan, fmt.Errorf("list interrupts: %w", err)
		}
		now := t.e.clock.Now()
		if !users && slices.ContainsFunc(ins, func(in agent.Interrupt) bool {
			return in.MessageID == last.ID && in.Pending(now) && callWaits(transcript.Decode(last.Parts), in.ToolCallID)
		}) {
			for _, x := range q {
				if held[x.Message.ID] {
					plan.takes = append(plan.takes, take{entry: x, present: true})
				}
			}
			plan.nothing = true
			return plan, nil
		}
		t.settle(ctx, &plan, *last, ins, settleNewMessage)
	}
	if !t.planTakes(&plan, msgs, q, TurnQueued) {
		plan.nothing = true
	}
	return plan, nil
}

// release ends a claimed delivery pass that found nothing to answer: it marks what it found already delivered,
// records the run completed with no steps, releases the claim and ends its stream (a reader attached meanwhile
// ends too).
func (t *Turn) release(ctx context.Context) error {
	e := t.e
	ctx = context.WithoutCancel(ctx)
	if err := t.writeTakes(ctx, nil); err != nil {
		e.log.Warn("mark delivered entries", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
	}
	if ferr := t.finishEmpty(ctx); ferr != nil { // no end of its own then (finishEmpty's rule)
		e.log.Warn("release a delivery pass with nothing to do", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", ferr)
		return ErrNothingQueued
	}
	md := metadataJSON(agent.MessageMetadata{RunID: t.run.ID, Status: agent.MessageCompleted})
	end, err := uistream.Frames(uistream.Start{MessageID: t.run.AssistantMessageID, Metadata: md}, uistream.Finish{FinishReason: agent.FinishStop, Metadata: md})
	if err == nil {
		err = segments.AppendFinal(ctx, t.endSegments(true), e.clock, t.thread.ID, t.run.ID, uistream.AppendDone(end))
	}
	if err != nil {
		e.log.Warn("final segment of an empty delivery pass", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
	}
	return ErrNothingQueued
}

// pump asks for a delivery pass after a run let the thread go, when its queue holds something (a steer or a
// queued message that arrived while the run held the thread). A run that ends asking a person leaves queued
// steers to the answer's turn (a queued user message goes ahead); a delivery pass's own turns are followed by
// the pass itself.
func (t *Turn) pump(ctx context.Context) {
	e := t.e
	if e.jobs == nil || t.pumped || !t.run.Status.Terminal() {
		return
	}
	q, err := e.store.ListQueued(ctx, t.thread.ID)
	if err != nil {
		e.log.Warn("look at the queue after a run", "thread_id", t.thread.ID, "run_id", t.run.ID, "err", err)
		return
	}
	if len(q) > 0 && (t.run.Status != agent.RunInterrupted || agent.HoldsUser(q)) {
		e.wake(ctx, t.thread.ID, "after-"+t.run.ID)
	}
}

// wake asks the Jobs port for a delivery pass (best effort: the reaper sweeps queues nobody delivered).
func (e *Engine) wake(ctx context.Context, threadID, key string) {
	if e.jobs == nil {
		return
	}
	if err := e.jobs.Wake(context.WithoutCancel(ctx), agent.JobTask{ThreadID: threadID, Wake: key}); err != nil {
		e.log.Warn("ask for a delivery pass", "thread_id", threadID, "key", key, "err", err)
	}
}
