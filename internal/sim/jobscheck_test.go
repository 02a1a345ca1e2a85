package sim

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// The invariants of jobs mode (jobs_test.go). At every steer write (steerStored, takenStored):
//
//   - steer-while-asking: no steer is stored while the newest message waits for a person (an assistant message
//     that ended interrupted, with a pending interrupt for a call that waits in it), nor by a delivery pass that
//     claimed the thread while it waited, unless that pass answers a queued user message: like the same message
//     sent without enqueue, a queued user message closes the question (its calls get results) and is answered,
//     and the steers ride along (queued-while-asking: a pass that claimed while a person was asked stores a
//     steer before, or without, a queued user message);
//   - steer-placed: a steer goes after every message stored so far (after the newest message of the turn that
//     takes it, its own user message included), and a steer is stored once (never again at another position).
//
// After the settle and the quiesce (checkJobs), for each thread:
//
//   - steer-delivered: every job is finished, and its steer steer_<jobId> is in the thread exactly once iff the
//     job is delivered (done, or error for a failure, with SteerDelivered); a steer names a job of the thread and
//     says its status. An edit may drop a delivered steer (it drops every message after the edited one): the job
//     then stays delivered, and its steer is not stored again. A deleted thread keeps no job and no queue entry.
//   - queued-answered: every message a post queued (202) is stored exactly once, followed by an assistant reply,
//     and those sent with new ids are stored in the order of their queue Seq; unless the thread was deleted
//     since, or an edit dropped messages after it since (it may drop the reply, or the message itself);
//   - queue-drained: the thread's queue is empty.
//   - (crash-never-lies, for the research tool) a dispatch that reports its acknowledgement has its job; one
//     marked "not executed" has none.

// waitsForPerson names the newest visible message of recs when it waits for a person (an assistant message that
// ended interrupted, with a pending interrupt for a call that waits in it), and that interrupt.
func waitsForPerson(recs []agent.MessageRecord, ins []agent.Interrupt, now time.Time, except string) (msg, in string) {
	var msgs []agent.Message
	for _, r := range recs {
		if r.Message.ID != except {
			msgs = append(msgs, r.Message)
		}
	}
	visible := agent.Visible(msgs)
	if len(visible) == 0 {
		return "", ""
	}
	last := visible[len(visible)-1]
	if last.Role != agent.RoleAssistant || last.Meta().Status != agent.MessageInterrupted {
		return "", ""
	}
	parts := transcript.Decode(last.Parts)
	for _, x := range ins {
		if x.MessageID == last.ID && x.Pending(now) && slices.ContainsFunc(parts, func(pt agent.Part) bool {
			return pt.ToolCallID == x.ToolCallID && unresolvedPart(pt)
		}) {
			return last.ID, x.ID + " (" + x.ToolName + ")"
		}
	}
	return "", ""
}

// askingAtClaim notes, when a delivery pass claims a thread, whether its newest message waits for a person then:
// such a pass takes nothing from the queue unless it answers a queued user message (which closes the question
// first, as a new message does); steers alone wait for the answer's turn.
func (w *world) askingAtClaim(p *proc, threadID string) {
	ctx := context.Background()
	recs, _ := w.base.ListMessages(ctx, threadID)
	ins, _ := w.base.ListInterrupts(ctx, threadID)
	msg, in := waitsForPerson(recs, ins, w.clock.Now(), "")
	w.mu.Lock()
	defer w.mu.Unlock()
	p.askedAtClaim, p.passUser = "", false
	if msg != "" {
		p.askedAtClaim = "message " + msg + " waited for interrupt " + in + " when the pass claimed the thread"
	}
}

// takenStored checks a delivery pass's write of a queued message (a steer or a user message it took).
func (w *world) takenStored(p *proc, mw agent.MessageWrite) {
	w.mu.Lock()
	asked, noop := p.askedAtClaim, p.noopWrite
	steer := strings.HasPrefix(mw.Message.ID, "steer_")
	if !steer {
		p.passUser = true
	}
	user := p.passUser
	w.mu.Unlock()
	if asked == "" || noop || user {
		return
	}
	w.violate("queued-while-asking", "%s: delivery pass %s stored steer %s without a queued user message although %s", p.name, mw.Fence.RunID, mw.Message.ID, asked)
}

// steerBefore is what the thread held just before a steer write.
type steerBefore struct {
	recs []agent.MessageRecord
	ins  []agent.Interrupt
}

func (w *world) beforeSteer(mw agent.MessageWrite) *steerBefore {
	ctx := context.Background()
	recs, _ := w.base.ListMessages(ctx, mw.ThreadID)
	ins, _ := w.base.ListInterrupts(ctx, mw.ThreadID)
	return &steerBefore{recs: recs, ins: ins}
}

// steerStored checks a steer write that took effect (every other process is parked: before is what it landed on).
func (w *world) steerStored(p *proc, mw agent.MessageWrite, before *steerBefore) {
	w.mu.Lock()
	noop := p.noopWrite
	w.mu.Unlock()
	if noop {
		return
	}
	for _, r := range before.recs {
		if r.Message.ID == mw.Message.ID {
			if r.Seq != mw.Seq {
				w.violate("steer-placed", "%s: steer %s stored again at seq %d (it is at seq %d)", p.name, mw.Message.ID, mw.Seq, r.Seq)
			}
			continue
		}
		if r.Seq > mw.Seq {
			w.violate("steer-placed", "%s: steer %s stored at seq %d, before message %s (%s) at seq %d", p.name, mw.Message.ID, mw.Seq,
				r.Message.ID, r.Message.Role, r.Seq)
		}
	}
	if msg, in := waitsForPerson(before.recs, before.ins, w.clock.Now(), mw.Message.ID); msg != "" {
		w.violate("steer-while-asking", "%s: steer %s stored while message %s waits for interrupt %s, pending", p.name, mw.Message.ID, msg, in)
	}
}

// checkJobs checks a thread's jobs, steers and queue after the quiesce.
func (w *world) checkJobs(ctx context.Context, th *simThread, exists bool, recs []agent.MessageRecord) {
	js, err := w.base.ListJobs(ctx, th.id)
	if err != nil {
		w.violate("sim", "list jobs %s: %v", th.id, err)
		return
	}
	queue, err := w.base.ListQueued(ctx, th.id)
	if err != nil {
		w.violate("sim", "list queue %s: %v", th.id, err)
		return
	}
	if !exists {
		if len(js) > 0 || len(queue) > 0 {
			w.violate("deleted-is-gone", "thread %s does not exist but keeps %d jobs and %d queue entries", th.id, len(js), len(queue))
		}
		return
	}
	seqOf := map[string]int64{}
	count := map[string]int{}
	for _, r := range recs {
		seqOf[r.Message.ID] = r.Seq
		count[r.Message.ID]++
	}
	byID := map[string]agent.Job{}
	for _, j := range js {
		byID[j.ID] = j
	}
	// Every steer names a job of this thread, and says its outcome.
	for _, r := range recs {
		id, ok := strings.CutPrefix(r.Message.ID, "steer_")
		if !ok {
			continue
		}
		w.mu.Lock()
		w.stats.jobs.steers++
		w.mu.Unlock()
		j, known := byID[id]
		var md struct {
			SubagentResult *struct{ JobID, Status string } `json:"subagentResult"`
		}
		_ = json.Unmarshal(r.Message.Metadata, &md)
		switch {
		case !known:
			w.violate("steer-delivered", "thread %s: steer %s at seq %d names no job of the thread", th.id, r.Message.ID, r.Seq)
		case md.SubagentResult == nil || md.SubagentResult.JobID != id || r.Message.Role != agent.RoleUser:
			w.violate("steer-delivered", "thread %s: steer %s is not a sub-agent result (%s, %s)", th.id, r.Message.ID, r.Message.Role, r.Message.Metadata)
		case md.SubagentResult.Status != map[bool]string{true: "error", false: "done"}[j.Failed()]:
			w.violate("steer-delivered", "thread %s: steer %s says %s, its job failed=%v (%q)", th.id, r.Message.ID, md.SubagentResult.Status, j.Failed(), j.Error)
		}
	}
	for _, j := range js {
		steer := agent.SteerMessageID(j.ID)
		n := count[steer]
		dropped := th.dropped[steer] > 0
		want := agent.JobDone
		if j.Failed() {
			want = agent.JobError
		}
		switch {
		case !j.Finished():
			w.violate("steer-delivered", "thread %s: job %s (call %s) is still %s with no result after the settle", th.id, j.ID, j.ToolCallID, j.Status)
		case n > 1:
			w.violate("steer-delivered", "thread %s: steer of job %s stored %d times", th.id, j.ID, n)
		case n == 1 && !j.SteerDelivered:
			w.violate("steer-delivered", "thread %s: steer of job %s is stored but the job is %s, not delivered", th.id, j.ID, j.Status)
		case n == 0 && j.SteerDelivered && !dropped:
			w.violate("steer-delivered", "thread %s: job %s is marked delivered (%s) but its steer is not in the thread", th.id, j.ID, j.Status)
		case n == 0 && !j.SteerDelivered && dropped:
			w.violate("steer-delivered", "thread %s: an edit dropped the steer of job %s, which is not marked delivered (%s)", th.id, j.ID, j.Status)
		case n == 0 && !j.SteerDelivered:
			w.violate("steer-delivered", "thread %s: job %s finished (error=%q) but its steer was never delivered (%s)", th.id, j.ID, j.Error, j.Status)
		case j.Status != want:
			w.violate("steer-delivered", "thread %s: job %s is delivered with status %s, want %s", th.id, j.ID, j.Status, want)
		}
	}
	if len(queue) > 0 {
		var ids []string
		for _, q := range queue {
			ids = append(ids, q.Message.ID+"("+string(q.Kind)+")")
		}
		w.violate("queue-drained", "thread %s: %d entries still queued after the settle: %s", th.id, len(queue), strings.Join(ids, " "))
	}
	w.checkQueued(th, recs, seqOf, count)
	w.checkBounds(ctx, th, js, recs)
}

// checkQueued: the messages posts queued (202).
func (w *world) checkQueued(th *simThread, recs []agent.MessageRecord, seqOf map[string]int64, count map[string]int) {
	type placed struct {
		q   queuedMsg
		seq int64
	}
	var order []placed
	for _, q := range th.enqueued {
		if q.gen != th.gen || w.droppedSince(th, q.at) {
			continue
		}
		seq, ok := seqOf[q.id]
		switch {
		case !ok:
			w.violate("queued-answered", "thread %s: message %s queued at seq %d (by %s, 202) is not stored", th.id, q.id, q.seq, q.proc.name)
			continue
		case count[q.id] > 1:
			w.violate("queued-answered", "thread %s: queued message %s stored %d times", th.id, q.id, count[q.id])
		}
		w.mu.Lock()
		w.stats.jobs.queuedStored++
		w.mu.Unlock()
		if !slices.ContainsFunc(recs, func(r agent.MessageRecord) bool { return r.Seq > seq && r.Message.Role == agent.RoleAssistant }) {
			w.violate("queued-answered", "thread %s: queued message %s (seq %d) has no reply after it", th.id, q.id, seq)
		}
		// The same id sent at once without enqueue too, by a post whose turn began before this entry existed:
		// that turn stored it as its own message, in its own place (two sends in flight at once have no order).
		direct := slices.ContainsFunc(th.accepted, func(a acceptedMsg) bool { return a.id == q.id && a.gen == q.gen && a.at < q.at })
		if q.fresh && !direct {
			order = append(order, placed{q, seq})
		}
	}
	slices.SortFunc(order, func(a, b placed) int { return int(a.q.seq - b.q.seq) })
	for i := 1; i < len(order); i++ {
		if order[i].seq < order[i-1].seq {
			w.violate("queued-answered", "thread %s: queued messages %s (queue seq %d) and %s (queue seq %d) are stored in the other order (seq %d, %d)",
				th.id, order[i-1].q.id, order[i-1].q.seq, order[i].q.id, order[i].q.seq, order[i-1].seq, order[i].seq)
		}
	}
}

// droppedSince reports whether an edit dropped messages of the thread after event at.
func (w *world) droppedSince(th *simThread, at int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range th.dropped {
		if ev > at {
			return true
		}
	}
	return false
}

// checkDispatch: a research call's result tells the truth about its job (principle 9).
func (w *world) checkDispatch(ctx context.Context, threadID string, p agent.Part) {
	// A job's id names its dispatching run too (agent.JobID), which the part does not record: the call's job is
	// the thread's job of that tool call id (the simulated model's ids are unique).
	jobs, err := w.base.ListJobs(ctx, threadID)
	has := err == nil && slices.ContainsFunc(jobs, func(j agent.Job) bool { return j.ToolCallID == p.ToolCallID })
	switch {
	case p.State == agent.StateOutputAvailable && !has:
		w.violate("crash-never-lies", "thread %s: research call %s reports %s but it has no job", threadID, p.ToolCallID, p.Output)
	case p.State == agent.StateOutputError && strings.HasPrefix(p.ErrorText, "Not executed") && has:
		w.violate("crash-never-lies", "thread %s: research call %s is marked %q but its job exists", threadID, p.ToolCallID, p.ErrorText)
	}
}
