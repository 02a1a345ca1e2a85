package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// Bounded reads (issue 10, item 2). A turn never reads the whole thread: it reads its newest messages a page at a
// time (ListMessagesPage), newest first, until what it read meets the model's token budget (transcript.MessageTokens
// summed, against Config.Transcript.BudgetTokens), and on past that only for what must stay: the newest user
// message. What the planning of a turn looks up by id is read by id instead of found in a full list: the
// request's own message id (a re-post, an edit), the message a continuation answers when it is older than the
// window, and queued entries the window does not show. An edit of a message older than the window reads on down
// to it: every message after it is dropped, and they are all newer than it, so the read ends at it (then goes on
// for the budget of what stays before it). So the reads and the memory of a turn follow the budget, never the
// thread's length (internal/benchmarks BenchmarkLongThread).
//
// What a turn does not see, older than its window: the model does not either (pruning would drop it first), a
// regenerate only looks at the newest reply, and a streaming reply orphaned long ago was finished by the first
// turn after it (the reaper's Orphans pass runs on the window).

// DefaultWindowPage is the size of a turn's first page (Config.WindowPage). A further page is sized from what
// the pages so far cost: the messages the budget still needs at their average and a quarter more, but never more
// than twice the messages read so far (the newest messages may be small and the older ones large: an estimate
// from the small ones must not read a thousand large ones), and at most MaxWindowPage. So a read overshoots the
// budget by at most its last page. A thread that fits the first page is one read.
const (
	DefaultWindowPage = 32
	MaxWindowPage     = 1000
)

// DefaultWindowAnchor is the size, in positions, of the blocks a window that does not begin with the thread
// begins on (anchor). A window begun where the budget's worth of newest messages began would begin one turn
// later at every turn, and so would the transcript the model is sent: its cached prefix would last one turn
// (issue 20 item 3). Anchored, it moves once per block of positions, and pruning (which moves its own cutoff in
// blocks, package transcript) sees the same start in between.
const DefaultWindowAnchor = 32

// window is the newest part of a thread that a turn read.
type window struct {
	recs     []agent.MessageRecord // oldest first
	tokens   []int                 // transcript.MessageTokens of each of recs
	complete bool                  // recs begin with the thread's first message
	pages    int
	first    int // the size of the first page (Config.WindowPage)
	// reach, when set, is a message the window must reach (an edit's): pages are sized to get there.
	reach *agent.MessageCursor
	next  int // the size of the next page
}

// readOn reads the page before the window's oldest message.
func (w *window) readOn(ctx context.Context, store agent.MessageStore, threadID string) error {
	var before agent.MessageCursor
	if len(w.recs) > 0 {
		before = w.recs[0].Cursor()
	}
	if w.pages == 0 {
		w.next = cmp.Or(w.first, DefaultWindowPage)
	}
	p, err := store.ListMessagesPage(ctx, threadID, agent.MessagePage{From: before, Limit: w.next})
	if err != nil {
		return fmt.Errorf("list messages: %w", err)
	}
	w.pages++
	older := make([]agent.MessageRecord, len(p.Items))
	tokens := make([]int, len(p.Items))
	for i, r := range p.Items { // the page is newest first
		older[len(p.Items)-1-i] = r
		tokens[len(p.Items)-1-i] = transcript.MessageTokens(r.Message)
	}
	w.recs, w.tokens = slices.Concat(older, w.recs), slices.Concat(tokens, w.tokens)
	w.complete = !p.More
	return nil
}

// fill reads on until enough(w) or the window holds the whole thread, sizing each page for budget.
func (w *window) fill(ctx context.Context, store agent.MessageStore, threadID string, budget int, enough func(*window) bool) error {
	for !w.complete && (w.pages == 0 || !enough(w)) {
		if w.pages > 0 {
			w.next = w.nextPage(budget)
		}
		if err := w.readOn(ctx, store, threadID); err != nil {
			return err
		}
	}
	return nil
}

// anchor makes the window begin at the first message of the block of positions (Seq / DefaultWindowAnchor) that
// holds the budget's point (the newest message from which the window meets budget): it leaves out what the read
// brought beyond that block, and reads the rest of the block when the read stopped inside it (at most
// DefaultWindowAnchor-1 messages more: positions are unique). A window holding the whole thread stays whole.
func (w *window) anchor(ctx context.Context, store agent.MessageStore, threadID string, budget int) error {
	if w.complete || len(w.recs) == 0 {
		return nil
	}
	p, have := len(w.recs)-1, 0
	for ; p > 0; p-- {
		if have += w.tokens[p]; have >= budget {
			break
		}
	}
	block := w.recs[p].Seq / DefaultWindowAnchor
	if p == 0 || w.recs[0].Seq/DefaultWindowAnchor == block {
		if n := int(w.recs[0].Seq % DefaultWindowAnchor); n > 0 {
			w.next = n
			if err := w.readOn(ctx, store, threadID); err != nil {
				return err
			}
		}
	}
	start := 0
	for start < len(w.recs) && w.recs[start].Seq/DefaultWindowAnchor != block {
		start++
	}
	if start > 0 {
		w.recs, w.tokens, w.complete = w.recs[start:], w.tokens[start:], false
	}
	return nil
}

// nextPage sizes the next page: the messages down to the one the window must reach, or those the budget still
// needs at the average cost of those read and a quarter more, at most twice what was read (the first page's size
// when the budget is met and the read goes on for a user message).
func (w *window) nextPage(budget int) int {
	if w.reach != nil && len(w.recs) > 0 && w.index(w.reach.ID) < 0 {
		// Positions are unique, so no more messages lie between than positions.
		return min(MaxWindowPage, max(1, int(w.recs[0].Seq-w.reach.Seq)+1))
	}
	have := w.tokensBefore(len(w.recs))
	if have >= budget || len(w.recs) == 0 {
		return cmp.Or(w.first, DefaultWindowPage)
	}
	avg := max(1, have/len(w.recs))
	return min(MaxWindowPage, 2*len(w.recs), max(1, (budget-have)/avg*5/4+1))
}

// tokensBefore sums the tokens of the messages before index i.
func (w *window) tokensBefore(i int) int {
	n := 0
	for _, x := range w.tokens[:i] {
		n += x
	}
	return n
}

// index is the position of message id in the window (-1: not in it).
func (w *window) index(id string) int {
	return slices.IndexFunc(w.recs, func(r agent.MessageRecord) bool { return r.Message.ID == id })
}

// budgetMet is the usual rule: the window meets the budget and holds a user message (the newest one).
func budgetMet(budget int) func(*window) bool {
	return func(w *window) bool {
		return w.tokensBefore(len(w.recs)) >= budget &&
			slices.ContainsFunc(w.recs, func(r agent.MessageRecord) bool { return r.Message.Role == agent.RoleUser })
	}
}

// messages is the window as the planning reads it: visible messages only, and, when the window does not begin
// with the thread, starting at a user message (a transcript never starts in the middle of a turn's replies).
func (w *window) messages() []agent.Message {
	msgs := make([]agent.Message, len(w.recs))
	for i, r := range w.recs {
		msgs[i] = r.Message
	}
	msgs = agent.Visible(msgs)
	if !w.complete {
		if first := slices.IndexFunc(msgs, func(m agent.Message) bool { return m.Role == agent.RoleUser }); first > 0 {
			msgs = msgs[first:]
		}
	}
	return msgs
}

// shownFailure is the id of the failed reply that readers show after the window's newest message although the
// engine reads past it (agent.Shown over agent.Visible: a run that died before its first word), or "".
func (w *window) shownFailure() string {
	msgs := make([]agent.Message, len(w.recs))
	for i, r := range w.recs {
		msgs[i] = r.Message
	}
	shown, visible := agent.Shown(msgs), agent.Visible(msgs)
	if len(shown) == 0 || (len(visible) > 0 && visible[len(visible)-1].ID == shown[len(shown)-1].ID) {
		return ""
	}
	return shown[len(shown)-1].ID
}

// budget is the engine's token budget for the window.
func (e *Engine) budget() int {
	return cmp.Or(e.cfg.WindowTokens, e.cfg.Transcript.BudgetTokens, transcript.DefaultBudgetTokens)
}

// heldElsewhere point-reads the queued entries' messages that the window does not show: a turn that stored one
// and died before taking its entry left it in the thread, and it must not be stored twice.
func (t *Turn) heldElsewhere(ctx context.Context, msgs []agent.Message, q []agent.QueuedMessage) (map[string]bool, error) {
	held := heldIDs(msgs)
	out := map[string]bool{}
	type found struct {
		id  string
		err error
	}
	ch := make(chan found, len(q))
	n := 0
	for _, e := range q {
		if held[e.Message.ID] {
			continue
		}
		n++
		go func(id string) {
			_, err := t.e.store.GetMessage(ctx, t.thread.ID, id)
			ch <- found{id, err}
		}(e.Message.ID)
	}
	var first error
	for range n {
		f := <-ch
		switch {
		case f.err == nil:
			out[f.id] = true
		case !agent.IsKind(f.err, agent.KindNotFound) && first == nil:
			first = fmt.Errorf("get queued message: %w", f.err)
		}
	}
	return out, first
}
