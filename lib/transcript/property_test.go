package transcript_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/transcript"
)

// genCase is one random thread: its stored messages (turns of a user message and one reply, ending with the
// newest user message), the run's draft and a budget.
type genCase struct {
	history []agent.Message
	draft   []agent.Part
	cfg     transcript.Config
}

var genTools = []string{"list_notes", "search", "add_note"} // list_notes is the snapshot tool

func words(r *rand.Rand, maxBytes int) string {
	n := 1 + r.IntN(maxBytes)
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString([]string{"note", "milk", "lambda", "ok", "thread", "dynamo"}[r.IntN(6)])
	}
	return b.String()
}

// genSteps makes 1–3 steps; open says whether the last call may still wait for a decision.
func genSteps(r *rand.Rand, ids *int, open bool) []agent.Part {
	var parts []agent.Part
	for range 1 + r.IntN(3) {
		parts = append(parts, stepStart())
		if r.IntN(3) == 0 {
			parts = append(parts, reasoning(words(r, 3000)))
		}
		if r.IntN(2) == 0 {
			parts = append(parts, text(words(r, 500)))
		}
		for range r.IntN(3) {
			*ids++
			id := fmt.Sprintf("call_%d", *ids)
			if r.IntN(15) == 0 && *ids > 1 {
				id = fmt.Sprintf("call_%d", r.IntN(*ids-1)+1) // a model that repeats an id
			}
			p := done(genTools[r.IntN(len(genTools))], id, words(r, 6000))
			switch r.IntN(8) {
			case 0:
				p.State, p.Output, p.ErrorText = agent.StateOutputError, nil, "boom"
			case 1:
				p.State, p.Output = agent.StateOutputDenied, nil
			}
			parts = append(parts, p)
		}
	}
	if open && r.IntN(3) == 0 {
		*ids++
		parts = append(parts, pending("add_note", fmt.Sprintf("call_%d", *ids)))
	}
	return parts
}

func genThread(r *rand.Rand) genCase {
	var c genCase
	ids := 0
	userMsg := func(i int) agent.Message {
		m := msg(fmt.Sprintf("u%d", i), agent.RoleUser, text(words(r, 2000)))
		if r.IntN(5) == 0 {
			m = withFile(m, file("image/png", "data:image/png;base64,iVBORw0KGgoA"+strings.Repeat("AAAA", 25+r.IntN(500)), fmt.Sprintf("f%d.png", i)))
		}
		return m
	}
	turns := 1 + r.IntN(25)
	for i := range turns {
		c.history = append(c.history, userMsg(i))
		// Only the newest reply may hold a call still waiting (older ones were answered or expired).
		c.history = append(c.history, msg(fmt.Sprintf("a%d", i), agent.RoleAssistant, genSteps(r, &ids, i == turns-1)...))
	}
	c.history = append(c.history, userMsg(turns))
	if r.IntN(2) == 0 {
		c.draft = genSteps(r, &ids, false)
	}
	c.cfg = transcript.Config{BudgetTokens: 200 + r.IntN(20_000), FixedTokens: r.IntN(300),
		Snapshots: map[string]bool{"list_notes": true}}
	return c
}

// split finds, in a transcript built from a genCase, the newest user message and the newest step of the draft
// (its assistant message and its tool results; none without a draft): what must reach the model as it is.
func split(msgs []agent.ModelMessage, draft bool) (newestUser int, newest []agent.ModelMessage) {
	nu := 0
	for i, m := range msgs {
		if m.Role == "user" {
			nu = i
		}
	}
	if !draft {
		return nu, nil
	}
	for j := len(msgs) - 1; j > nu; j-- {
		if msgs[j].Role == "assistant" {
			return nu, msgs[j:]
		}
	}
	return nu, nil
}

func TestPruneProperties(t *testing.T) {
	t.Parallel()
	base, stop, err := offline.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	model := openai.New(openai.Config{BaseURL: base, Model: "offline", Logger: slog.New(slog.DiscardHandler)})
	var specs []agent.ToolSpec
	for _, name := range append(genTools, "delete_note") {
		specs = append(specs, agent.ToolSpec{Name: name, Description: name, Parameters: json.RawMessage(`{"type":"object"}`)})
	}
	const cases = 200
	var overs, tiers [5]int
	for seed := range uint64(cases) {
		r := rand.New(rand.NewPCG(seed, 10))
		c := genThread(r)
		before := encodeAll(c.history)
		h := transcript.NewHistory(c.history, c.cfg)
		got := h.Build(c.draft)
		rep := h.Last()
		draft := len(c.draft) > 0 && len(transcript.NewHistory(nil, transcript.Config{}).Build(c.draft)) > 0
		full := transcript.NewHistory(c.history, transcript.Config{BudgetTokens: 1 << 40, BudgetBytes: 1 << 42, Snapshots: c.cfg.Snapshots}).Build(c.draft)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d: %s (report %+v)", seed, fmt.Sprintf(format, args...), rep)
		}

		valid(t, got)
		if !bytes.Equal(before, encodeAll(c.history)) {
			fail("the stored messages changed")
		}
		seen := map[string]bool{}
		for _, m := range got {
			for _, call := range m.ToolCalls {
				if seen[call.ID] {
					fail("call id %s made twice", call.ID)
				}
				seen[call.ID] = true
			}
		}

		// What must stay, read off the unpruned transcript.
		nuFull, lastFull := split(full, draft)
		nuGot, lastGot := split(got, draft)
		if !reflect.DeepEqual(full[nuFull], got[nuGot]) {
			fail("newest user message changed: %.60q", got[nuGot].Text)
		}
		if !reflect.DeepEqual(lastFull, lastGot) {
			fail("the draft's newest step changed (%d vs %d model messages)", len(lastGot), len(lastFull))
		}
		keep := map[string]bool{}
		for _, m := range lastFull {
			for _, call := range m.ToolCalls {
				keep[call.ID] = true
			}
		}
		fullResults, gotResults := results(full), results(got)
		var newestSnapshot string
		for _, m := range full {
			for _, call := range m.ToolCalls {
				if strings.HasPrefix(fullResults[call.ID], "No result") {
					keep[call.ID] = true // waiting for a decision
				}
				if call.Name == "list_notes" && !strings.HasPrefix(fullResults[call.ID], "[superseded") &&
					!strings.HasPrefix(fullResults[call.ID], "Error") && !strings.HasPrefix(fullResults[call.ID], "The user denied") {
					newestSnapshot = call.ID
				}
			}
		}
		if newestSnapshot != "" {
			keep[newestSnapshot] = true
		}
		for id := range keep {
			if gotResults[id] != fullResults[id] {
				fail("protected call %s: result %.60q, want %.60q", id, gotResults[id], fullResults[id])
			}
		}

		// Within budget when possible; when not, nothing prunable is left.
		est := transcript.Estimate(got) + c.cfg.FixedTokens
		if est != rep.EstimatedTokens {
			fail("the report says %d tokens, the transcript is %d", rep.EstimatedTokens, est)
		}
		if !rep.Over && est > c.cfg.BudgetTokens {
			fail("%d tokens over a budget of %d without saying so", est, c.cfg.BudgetTokens)
		}
		if rep.Over {
			overs[0]++
			for i, m := range got[:nuGot] {
				if m.Reasoning != "" && !contains(lastGot, m) {
					fail("over budget with reasoning left at %d", i)
				}
				if m.Role == "user" && len(m.Files) > 0 {
					fail("over budget with an older attachment left at %d", i)
				}
				// A result no longer than a stub (about 110 bytes and the tool's name) is its own stub.
				if m.Role == "tool" && !keep[m.ToolCallID] && !pruned(m.Text) && len(m.Text) > 160 {
					fail("over budget with a whole result left: %s", m.ToolCallID)
				}
			}
			if i, ok := allTurnsProtected(got, keep, lastGot); !ok {
				fail("over budget with a droppable turn at %d", i)
			}
		}
		for i, n := range []int{rep.Superseded, rep.ReasoningDropped, rep.PairsStubbed, rep.FilesStubbed, rep.MessagesDropped} {
			if n > 0 {
				tiers[i]++
			}
		}

		// The provider (its stand-in, which validates as OpenAI does) accepts it.
		if _, err := model.Stream(context.Background(), agent.ModelRequest{Model: "offline", Messages: got, Tools: specs, MaxOutputTokens: 1},
			func(agent.ModelEvent) error { return nil }); err != nil {
			fail("the offline model refused the pruned transcript: %v", err)
		}
	}
	// The generator must reach every tier, or the properties above prove little.
	for i, n := range tiers {
		if n == 0 {
			t.Errorf("no case reached tier %d", i)
		}
	}
	t.Logf("%d cases, %d over budget (protected set alone too big), cases per tier %v", cases, overs[0], tiers)
}

func contains(msgs []agent.ModelMessage, m agent.ModelMessage) bool {
	for _, x := range msgs {
		if reflect.DeepEqual(x, m) {
			return true
		}
	}
	return false
}

// allTurnsProtected: every turn but the newest (a user message up to the next one) holds the draft's newest
// step, a waiting call or the surviving snapshot, which is why tier 4 kept it; else it returns the turn's
// first index.
func allTurnsProtected(msgs []agent.ModelMessage, keep map[string]bool, last []agent.ModelMessage) (int, bool) {
	start, protected := 0, false
	for i, m := range msgs {
		if i > 0 && m.Role == "user" {
			if !protected {
				return start, false
			}
			start, protected = i, false
		}
		if m.Role == "assistant" && contains(last, m) {
			protected = true
		}
		for _, c := range m.ToolCalls {
			if keep[c.ID] {
				protected = true
			}
		}
	}
	return 0, true
}
