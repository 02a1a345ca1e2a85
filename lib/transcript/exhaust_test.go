package transcript_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// longReply is an assistant message of n steps, each calling a tool whose output is 32 KiB (about 8k tokens),
// then a final step of text.
func longReply(id string, n int) agent.Message {
	var parts []agent.Part
	for i := range n {
		parts = append(parts, stepStart(), done("fetch", fmt.Sprintf("%s_c%d", id, i), strings.Repeat("x", 32<<10)))
	}
	parts = append(parts, stepStart(), text("done"))
	return msg(id, agent.RoleAssistant, parts...)
}

// REVIEW S1: the last assistant message was never pruned, so a reply whose tool outputs pass the budget was sent
// over it on every later turn (the provider refuses it: the thread could never answer again). Its older pairs
// are stubbed now, oldest first; its newest step stays.
func TestLastAssistantOlderPairsPruned(t *testing.T) {
	t.Parallel()
	history := []agent.Message{msg("u1", agent.RoleUser, text("read them all")), longReply("a1", 30), msg("u2", agent.RoleUser, text("and now?"))}
	h := transcript.NewHistory(history, transcript.Config{})
	got := h.Build(nil)
	valid(t, got)
	r := h.Last()
	if r.Over || r.EstimatedTokens > r.BudgetTokens || r.PairsStubbed == 0 {
		t.Fatalf("estimated %d tokens, budget %d, over=%v, pairs stubbed=%d", r.EstimatedTokens, r.BudgetTokens, r.Over, r.PairsStubbed)
	}
	res := results(got)
	if !pruned(res["a1_c0"]) || pruned(res["a1_c29"]) {
		t.Fatalf("oldest pair %.30q, newest %.30q: want the oldest stubbed first", res["a1_c0"], res["a1_c29"])
	}

	// The draft in flight: its older pairs go the same way, its newest step (what the model must answer now)
	// and its open calls never.
	var draft []agent.Part
	for i := range 30 {
		draft = append(draft, stepStart(), done("fetch", fmt.Sprintf("d%d", i), strings.Repeat("y", 32<<10)))
	}
	draft = append(draft, stepStart(), done("fetch", "d_last", strings.Repeat("z", 32<<10)), pending("delete_note", "d_open"), stepStart())
	h = transcript.NewHistory(history[:1], transcript.Config{})
	got = h.Build(draft)
	valid(t, got)
	res = results(got)
	if r := h.Last(); r.Over || !pruned(res["d0"]) || pruned(res["d_last"]) || pruned(res["d_open"]) {
		t.Fatalf("over=%v; d0 %.30q, newest step %.30q, open call %.30q", r.Over, res["d0"], res["d_last"], res["d_open"])
	}
}

// What is never pruned alone over the budget: the report says so (the engine ends the turn instead of sending
// it), and a later message in the same thread fits again, as the earlier reply is no longer the draft.
func TestNeverPrunableOverBudget(t *testing.T) {
	t.Parallel()
	var draft []agent.Part
	draft = append(draft, stepStart())
	for i := range 4 {
		draft = append(draft, done("fetch", fmt.Sprintf("d%d", i), strings.Repeat("y", 32<<10)))
	}
	draft = append(draft, stepStart())
	cfg := transcript.Config{BudgetTokens: 20_000}
	h := transcript.NewHistory([]agent.Message{msg("u1", agent.RoleUser, text("go"))}, cfg)
	h.Build(draft)
	if !h.Last().Over {
		t.Fatalf("a newest step of 32k tokens fits a budget of 20k: %+v", h.Last())
	}
	stored := msg("a1", agent.RoleAssistant, draft...)
	h = transcript.NewHistory([]agent.Message{msg("u1", agent.RoleUser, text("go")), stored, msg("u2", agent.RoleUser, text("next"))}, cfg)
	got := h.Build(nil)
	valid(t, got)
	if r := h.Last(); r.Over {
		t.Fatalf("the next message does not fit: %+v", r)
	}
}

// REVIEW S6 (a 75k-token message with an image, a steer after it, over the budget together with an older turn):
// steers stored after the person's message made the steer the "newest user message"; tiers 3 and 4
// then stubbed the person's file and dropped their turn. The protected set is what the turn answers.
func TestProtectedMessagesNotPruned(t *testing.T) {
	t.Parallel()
	img := "data:image/png;base64,iVBORw0KGgo="
	history := []agent.Message{
		msg("u1", agent.RoleUser, text("hi")),
		msg("a1", agent.RoleAssistant, stepStart(), text("hello "+strings.Repeat("h", 40_000))),
		withFile(msg("u2", agent.RoleUser, text("summarize this\n"+strings.Repeat("d", 300_000))), file("image/png", img, "page.png")),
		msg("steer_job1", agent.RoleUser, text("Research complete: "+strings.Repeat("r", 80_000))),
	}
	h := transcript.NewHistory(history, transcript.Config{Protect: []string{"u2", "steer_job1"}})
	got := h.Build(nil)
	valid(t, got)
	var person *agent.ModelMessage
	for i := range got {
		if got[i].Role == "user" && strings.HasPrefix(got[i].Text, "summarize this") {
			person = &got[i]
		}
	}
	if person == nil || len(person.Files) != 1 || person.Files[0].URL != img {
		t.Fatalf("the person's message or file was pruned (report %+v): %+v", h.Last(), person)
	}
}
