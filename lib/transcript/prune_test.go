package transcript_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// msg builds a stored message from parts.
func msg(id string, role agent.Role, parts ...agent.Part) agent.Message {
	m := agent.Message{ID: id, Role: role}
	for _, p := range parts {
		m.Parts = append(m.Parts, agent.EncodePart(p))
	}
	return m
}

func text(s string) agent.Part      { return agent.Part{Type: "text", Text: s} }
func reasoning(s string) agent.Part { return agent.Part{Type: "reasoning", Text: s, State: "done"} }
func stepStart() agent.Part         { return agent.Part{Type: "step-start"} }

// done is a tool part with its output.
func done(tool, callID, output string) agent.Part {
	out, _ := json.Marshal(output)
	return agent.Part{Type: "tool-" + tool, ToolCallID: callID, State: agent.StateOutputAvailable, Input: json.RawMessage(`{}`), Output: out}
}

// pending is a tool part that waits for a decision (an approval or a client's output).
func pending(tool, callID string) agent.Part {
	return agent.Part{Type: "tool-" + tool, ToolCallID: callID, State: agent.StateApprovalRequested, Input: json.RawMessage(`{"id":"n1"}`),
		Approval: &agent.PartApproval{ID: "ap_" + callID}}
}

// file is a user attachment part as the AI SDK client sends it.
func file(mediaType, url, name string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"type": "file", "mediaType": mediaType, "url": url, "filename": name})
	return b
}

func withFile(m agent.Message, raw json.RawMessage) agent.Message {
	m.Parts = append(m.Parts, raw)
	return m
}

// results maps each tool call id of the transcript to the result the model sees.
func results(msgs []agent.ModelMessage) map[string]string {
	out := map[string]string{}
	for _, m := range msgs {
		if m.Role == "tool" {
			out[m.ToolCallID] = m.Text
		}
	}
	return out
}

func pruned(s string) bool {
	return strings.HasPrefix(s, "[pruned") || strings.HasPrefix(s, "[superseded")
}

func TestPruneTiers(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("n", 8000) // 2,000 tokens
	think := strings.Repeat("r", 8000)
	image := "data:image/png;base64,iVBORw0KGgoA" + strings.Repeat("A", 3988)
	snap := map[string]bool{"list_notes": true}
	tests := []struct {
		name    string
		history []agent.Message
		draft   []agent.Part
		cfg     transcript.Config
		// check inspects the transcript the model would get.
		check func(t *testing.T, got []agent.ModelMessage)
	}{
		{
			// Tier 0 runs even far under the budget: a stale snapshot misleads the model.
			name: "tier 0: only the newest snapshot survives",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("list")),
				msg("a1", agent.RoleAssistant, stepStart(), done("list_notes", "c1", "one"), done("add_note", "c2", "added")),
				msg("u2", agent.RoleUser, text("again")),
				msg("a2", agent.RoleAssistant, stepStart(), done("list_notes", "c3", "one, two"), stepStart(), text("two notes")),
				msg("u3", agent.RoleUser, text("and now")),
			},
			draft: []agent.Part{stepStart(), done("list_notes", "c4", "one, two, three")},
			cfg:   transcript.Config{Snapshots: snap},
			check: func(t *testing.T, got []agent.ModelMessage) {
				r := results(got)
				if !strings.HasPrefix(r["c1"], "[superseded") || !strings.HasPrefix(r["c3"], "[superseded") {
					t.Errorf("older snapshots reached the model: %q, %q", r["c1"], r["c3"])
				}
				if r["c4"] != "one, two, three" || r["c2"] != "added" {
					t.Errorf("newest snapshot %q / other tool %q changed", r["c4"], r["c2"])
				}
			},
		},
		{
			name: "under budget nothing else is pruned",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("q")),
				msg("a1", agent.RoleAssistant, stepStart(), reasoning(think), done("search", "c1", big), stepStart(), text("ok")),
				msg("u2", agent.RoleUser, text("q2")),
			},
			check: func(t *testing.T, got []agent.ModelMessage) {
				if got[1].Reasoning != think || results(got)["c1"] != big {
					t.Errorf("pruned under budget: %+v", got[1])
				}
			},
		},
		{
			// 2 × 2,000 tokens of reasoning and ~60 more: dropping the older reasoning is enough for 3,000.
			name: "tier 1: reasoning dropped from all but the last assistant message",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("q")),
				msg("a1", agent.RoleAssistant, stepStart(), reasoning(think), done("search", "c1", "small"), stepStart(), text("ok")),
				msg("u2", agent.RoleUser, text("q2")),
				msg("a2", agent.RoleAssistant, stepStart(), reasoning(think), text("fine")),
				msg("u3", agent.RoleUser, text("q3")),
			},
			cfg: transcript.Config{BudgetTokens: 3000},
			check: func(t *testing.T, got []agent.ModelMessage) {
				var kept []string
				for _, m := range got {
					if m.Reasoning != "" {
						kept = append(kept, m.Text)
					}
				}
				if len(kept) != 1 || kept[0] != "fine" {
					t.Errorf("reasoning kept on %q, want only the last assistant message", kept)
				}
				if results(got)["c1"] != "small" {
					t.Error("tier 2 ran although tier 1 was enough")
				}
			},
		},
		{
			// Three 2,000-token results before the last assistant message; 3,000 tokens fit one: the two oldest
			// pairs become stubs, the last assistant message and the pending approval stay whole.
			name: "tier 2: oldest pairs become stubs, never the last assistant message or a pending call",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("q")),
				msg("a1", agent.RoleAssistant, stepStart(), done("search", "c1", big), done("search", "c2", big)),
				msg("u2", agent.RoleUser, text("q2")),
				msg("a2", agent.RoleAssistant, stepStart(), done("search", "c3", big), stepStart(), pending("delete_note", "c4")),
				msg("u3", agent.RoleUser, text("q3")),
			},
			draft: []agent.Part{stepStart(), done("search", "c5", big[:4000])},
			cfg:   transcript.Config{BudgetTokens: 3500},
			check: func(t *testing.T, got []agent.ModelMessage) {
				r := results(got)
				if !pruned(r["c1"]) || !pruned(r["c2"]) {
					t.Errorf("oldest pairs not stubbed: %.40q %.40q", r["c1"], r["c2"])
				}
				if r["c3"] != big || r["c5"] != big[:4000] || pruned(r["c4"]) {
					t.Errorf("kept pairs changed: c3 %d bytes, c5 %d bytes, c4 %q", len(r["c3"]), len(r["c5"]), r["c4"])
				}
				if strings.Count(r["c1"], "\n") > 0 {
					t.Errorf("stub is not one line: %q", r["c1"])
				}
			},
		},
		{
			name: "tier 3: attachments of older user messages become stubs",
			history: []agent.Message{
				withFile(msg("u1", agent.RoleUser, text("look")), file("image/png", image, "old.png")),
				msg("a1", agent.RoleAssistant, stepStart(), text("seen")),
				withFile(msg("u2", agent.RoleUser, text("and this")), file("image/png", image, "new.png")),
			},
			cfg: transcript.Config{BudgetTokens: 1500},
			check: func(t *testing.T, got []agent.ModelMessage) {
				if len(got[0].Files) != 0 || !strings.Contains(got[0].Text, "old.png") {
					t.Errorf("old attachment reached the model: %+v", got[0])
				}
				if last := got[len(got)-1]; len(last.Files) != 1 || last.Files[0].URL != image || last.Files[0].MediaType != "image/png" {
					t.Errorf("newest user message lost its attachment: %+v", last.Files)
				}
			},
		},
		{
			name: "tier 4: whole old turns dropped when stubs are not enough",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text(big)),
				msg("a1", agent.RoleAssistant, stepStart(), text("ok")),
				msg("u2", agent.RoleUser, text("now")),
				msg("a2", agent.RoleAssistant, stepStart(), text("ok2")),
				msg("u3", agent.RoleUser, text("then")),
			},
			cfg: transcript.Config{BudgetTokens: 500},
			check: func(t *testing.T, got []agent.ModelMessage) {
				if got[0].Text != "now" || got[len(got)-1].Text != "then" {
					t.Errorf("got %d messages starting %.20q", len(got), got[0].Text)
				}
			},
		},
		{
			// An old snapshot keeps its own turn, not every turn after it.
			name: "tier 4: a protected old turn does not stop later turns from going",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("list")),
				msg("a1", agent.RoleAssistant, stepStart(), done("list_notes", "c1", "one")),
				msg("u2", agent.RoleUser, text(big)),
				msg("a2", agent.RoleAssistant, stepStart(), text("ok")),
				msg("u3", agent.RoleUser, text(big)),
				msg("a3", agent.RoleAssistant, stepStart(), text("ok")),
				msg("u4", agent.RoleUser, text("now")),
			},
			draft: []agent.Part{stepStart(), text("so")},
			cfg:   transcript.Config{BudgetTokens: 500, Snapshots: snap},
			check: func(t *testing.T, got []agent.ModelMessage) {
				var texts []string
				for _, m := range got {
					if m.Role == "user" {
						texts = append(texts, m.Text)
					}
				}
				if !slices.Equal(texts, []string{"list", "now"}) || results(got)["c1"] != "one" {
					t.Errorf("user messages %.20q, snapshot %q", texts, results(got)["c1"])
				}
			},
		},
		{
			// The system prompt and tool specs count: with 2,000 of 3,000 tokens taken by them, the older pair goes.
			name: "fixed tokens count against the budget",
			history: []agent.Message{
				msg("u1", agent.RoleUser, text("q")),
				msg("a1", agent.RoleAssistant, stepStart(), done("search", "c1", big[:6000])),
				msg("u2", agent.RoleUser, text("q2")),
			},
			draft: []agent.Part{stepStart(), text("thinking")},
			cfg:   transcript.Config{BudgetTokens: 3000, FixedTokens: 2000},
			check: func(t *testing.T, got []agent.ModelMessage) {
				if !pruned(results(got)["c1"]) {
					t.Error("the fixed tokens were not counted")
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before := encodeAll(tc.history)
			got := transcript.NewHistory(tc.history, tc.cfg).Build(tc.draft)
			valid(t, got)
			tc.check(t, got)
			if !bytes.Equal(before, encodeAll(tc.history)) {
				t.Error("pruning changed the stored messages")
			}
		})
	}
}

func encodeAll(msgs []agent.Message) []byte {
	b, err := json.Marshal(msgs)
	if err != nil {
		panic(err)
	}
	return b
}

// The provider's count replaces the chars/4 guess: a provider reporting twice the estimate halves what fits.
func TestReportedTokens(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("n", 4000)
	history := []agent.Message{
		msg("u1", agent.RoleUser, text("q")),
		msg("a1", agent.RoleAssistant, stepStart(), done("search", "c1", big)),
		msg("u2", agent.RoleUser, text("q2")),
	}
	draft := []agent.Part{stepStart(), text("hm")} // so that a1 is not the last assistant message
	h := transcript.NewHistory(history, transcript.Config{BudgetTokens: 1500})
	if r := results(h.Build(draft))["c1"]; r != big {
		t.Fatalf("pruned within the estimated budget: %.40q", r)
	}
	est := h.Last().EstimatedTokens
	h.Reported(est * 2)
	if r := results(h.Build(draft))["c1"]; !pruned(r) {
		t.Fatalf("the provider's count was ignored: %d bytes kept", len(r))
	}
}

// The scale follows a higher count at once and a lower one only past scaleSlack (1/8), in 32nds: requests of
// different kinds count a little differently, and the cutoff must not move back and forth with them. A run
// starts from Config.Scale (the previous run's).
func TestScaleSteps(t *testing.T) {
	t.Parallel()
	history := []agent.Message{msg("u1", agent.RoleUser, text(strings.Repeat("n", 4000)))}
	h := transcript.NewHistory(history, transcript.Config{Scale: 1.5})
	if h.Scale() != 1.5 {
		t.Fatalf("initial scale %v, want the configured 1.5", h.Scale())
	}
	for _, step := range []struct {
		ratio float64 // the provider's count over the raw estimate
		want  float64
	}{
		{1.45, 1.5},    // lower by less than 1/8: kept
		{1.6, 1.625},   // higher: taken at once, rounded up to a 32nd
		{1.4, 1.40625}, // lower by more than 1/8: taken
		{9, 4},         // within [1/2, 4]
	} {
		h.Build(nil)
		raw := float64(h.Last().EstimatedTokens) / h.Scale()
		h.Reported(int(raw * step.ratio))
		if h.Scale() != step.want {
			t.Fatalf("reported %v of the estimate: scale %v, want %v", step.ratio, h.Scale(), step.want)
		}
	}
}

func TestSnapshotNamesAreExact(t *testing.T) {
	t.Parallel()
	history := []agent.Message{
		msg("u1", agent.RoleUser, text("q")),
		msg("a1", agent.RoleAssistant, stepStart(), done("list_notes", "c1", "a"), done("list_notes_v2", "c2", "b"), done("list_notes", "c3", "c")),
	}
	got := results(transcript.NewHistory(history, transcript.Config{Snapshots: map[string]bool{"list_notes": true}}).Build(nil))
	want := map[string]string{"c2": "b", "c3": "c"}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("%s: %q, want %q", id, got[id], w)
		}
	}
	if !strings.HasPrefix(got["c1"], "[superseded") {
		t.Errorf("c1: %q", got["c1"])
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		raw  json.RawMessage
		want int // files reaching the model
	}{
		{"png data URL", file("image/png", "data:image/png;base64,iVBORw0KGgoA", "a.png"), 1},
		{"pdf https", file("application/pdf", "https://example.com/a.pdf", "a.pdf"), 1},
		// The boundary refuses these; rows written before it did are skipped, never a failed request.
		{"plain http", file("image/png", "http://example.com/a.png", "a.png"), 0},
		{"other type", file("text/csv", "data:text/csv;base64,AAAA", "a.csv"), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := transcript.NewHistory([]agent.Message{withFile(msg("u1", agent.RoleUser, text("see")), tc.raw)}, transcript.Config{}).Build(nil)
			if len(got) != 1 || len(got[0].Files) != tc.want {
				t.Fatalf("%+v, want %d files", got, tc.want)
			}
		})
	}
}

func ExampleHistory_Build() {
	h := transcript.NewHistory([]agent.Message{
		msg("u1", agent.RoleUser, text("list my notes")),
		msg("a1", agent.RoleAssistant, stepStart(), done("list_notes", "c1", "milk"), stepStart(), text("You have one note.")),
		msg("u2", agent.RoleUser, text("and now?")),
	}, transcript.Config{Snapshots: map[string]bool{"list_notes": true}})
	for _, m := range h.Build([]agent.Part{stepStart(), done("list_notes", "c2", "milk, eggs")}) {
		fmt.Printf("%s %s%s\n", m.Role, m.Text, calls(m))
	}
	// Output:
	// user list my notes
	// assistant list_notes(c1)
	// tool [superseded: a later list_notes result replaces this one]
	// assistant You have one note.
	// user and now?
	// assistant list_notes(c2)
	// tool milk, eggs
}

func calls(m agent.ModelMessage) string {
	var s string
	for _, c := range m.ToolCalls {
		s += fmt.Sprintf("%s(%s)", c.Name, c.ID)
	}
	return s
}

func TestStubLength(t *testing.T) {
	t.Parallel()
	// The pruner counts stubs by length without building them; the count must match what is sent.
	for _, n := range []int{0, 9, 10, 99, 100, 12345} {
		h := transcript.NewHistory([]agent.Message{
			msg("u1", agent.RoleUser, text("q")),
			msg("a1", agent.RoleAssistant, stepStart(), done("search", "c1", strings.Repeat("x", n))),
			msg("u2", agent.RoleUser, text("q2")),
		}, transcript.Config{BudgetTokens: 1})
		got := h.Build([]agent.Part{stepStart(), text("hm")})
		if est := transcript.Estimate(got); h.Last().EstimatedTokens != est {
			t.Errorf("result of %d bytes: report %d tokens, transcript %d", n, h.Last().EstimatedTokens, est)
		}
	}
}

// The byte budget (AGENT_CONTEXT_BYTES) caps the token budget only when it is set: a deployment that raises
// AGENT_CONTEXT_TOKENS alone gets the whole raise.
func TestBudget(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("n", 600_000) // 150,000 tokens
	history := []agent.Message{
		msg("u1", agent.RoleUser, text("q")),
		msg("a1", agent.RoleAssistant, stepStart(), done("search", "c1", big)),
		msg("u2", agent.RoleUser, text("q2")),
	}
	draft := []agent.Part{stepStart(), text("hm")}
	tests := []struct {
		name   string
		cfg    transcript.Config
		budget int
	}{
		{"default", transcript.Config{ToolOutputBytes: 1 << 20}, transcript.DefaultBudgetTokens},
		{"tokens alone", transcript.Config{BudgetTokens: 200_000, ToolOutputBytes: 1 << 20}, 200_000},
		{"bytes cap tokens", transcript.Config{BudgetTokens: 200_000, BudgetBytes: 400_000, ToolOutputBytes: 1 << 20}, 100_000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := transcript.NewHistory(history, tc.cfg)
			stubbed := pruned(results(h.Build(draft))["c1"])
			if r := h.Last(); r.BudgetTokens != tc.budget || stubbed != (tc.budget < 150_000) {
				t.Fatalf("budget %d (want %d), result stubbed %v", r.BudgetTokens, tc.budget, stubbed)
			}
		})
	}
}
