package transcript_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

func user(id, text string) agent.Message {
	return agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: text})}}
}

func toolTurn(id, callID, output string) agent.Message {
	out, _ := json.Marshal(output)
	return agent.Message{ID: id, Role: agent.RoleAssistant, Parts: []json.RawMessage{
		agent.EncodePart(agent.Part{Type: "step-start"}),
		agent.EncodePart(agent.Part{Type: "tool-list_notes", ToolCallID: callID, State: agent.StateOutputAvailable, Input: json.RawMessage(`{}`), Output: out}),
		agent.EncodePart(agent.Part{Type: "step-start"}),
		agent.EncodePart(agent.Part{Type: "text", Text: "done"}),
	}}
}

// valid checks the provider's rules: starts with a user message, every tool message answers a call of the
// assistant message before it, and every call is answered.
func valid(t *testing.T, msgs []agent.ModelMessage) {
	t.Helper()
	if len(msgs) == 0 || msgs[0].Role != "user" {
		t.Fatalf("transcript must start with a user message: %+v", msgs)
	}
	open := map[string]bool{}
	for i, m := range msgs {
		switch m.Role {
		case "assistant":
			if len(open) > 0 {
				t.Fatalf("message %d: calls %v unanswered", i, open)
			}
			for _, c := range m.ToolCalls {
				open[c.ID] = true
			}
		case "tool":
			if !open[m.ToolCallID] {
				t.Fatalf("message %d: tool result %s answers no preceding call", i, m.ToolCallID)
			}
			delete(open, m.ToolCallID)
		default:
			if len(open) > 0 {
				t.Fatalf("message %d: calls %v unanswered", i, open)
			}
		}
	}
}

func TestBuild(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 480_000)
	tests := []struct {
		name    string
		history []agent.Message
		draft   []agent.Part
		cfg     transcript.Config
		// wantFirst is the text of the first message; wantUsers the number of user messages kept.
		wantFirst string
		wantUsers int
	}{
		{name: "fits", history: []agent.Message{user("u1", "hi"), toolTurn("a1", "c1", "notes"), user("u2", "again")},
			wantFirst: "hi", wantUsers: 2},
		// REVIEW H2: a huge tool output in the draft used to push the newest user message out, leaving [tool]; now
		// the output is capped for the model, so the whole history fits again.
		{name: "huge draft keeps the newest user message", history: []agent.Message{user("u1", "old"), user("u2", "list them")},
			draft: parts(toolTurn("a2", "c2", big)), wantFirst: "old", wantUsers: 2},
		// REVIEW H2, second scenario: a big newest user message with an empty draft (step 0) was dropped.
		{name: "big user message at step 0", history: []agent.Message{user("u1", "old"), user("u2", big[:300_000])},
			draft: []agent.Part{{Type: "step-start"}},
			cfg:   transcript.Config{BudgetBytes: 200_000}, wantFirst: big[:300_000], wantUsers: 1},
		// Old tool results become stubs before any turn is dropped (tier 2 before tier 4; TestPruneTiers has
		// the tiers one by one).
		{name: "stubs old tool results before dropping turns", history: []agent.Message{user("u1", big[:100]), toolTurn("a1", "c1", big[:5000]), user("u2", "now")},
			draft: []agent.Part{{Type: "step-start"}, {Type: "text", Text: "hm"}},
			cfg:   transcript.Config{BudgetBytes: 1000}, wantFirst: big[:100], wantUsers: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := transcript.NewHistory(tc.history, tc.cfg).Build(tc.draft)
			valid(t, got)
			if got[0].Text != tc.wantFirst {
				t.Errorf("first message %.40q, want %.40q", got[0].Text, tc.wantFirst)
			}
			users := 0
			for _, m := range got {
				if m.Role == "user" {
					users++
				}
				if m.Role == "tool" && len(m.Text) > transcript.DefaultToolOutputBytes {
					t.Errorf("tool result of %d bytes reached the model (cap %d)", len(m.Text), transcript.DefaultToolOutputBytes)
				}
			}
			if users != tc.wantUsers {
				t.Errorf("%d user messages, want %d", users, tc.wantUsers)
			}
		})
	}
}

func TestCap(t *testing.T) {
	t.Parallel()
	s := strings.Repeat("é", 10_000) // 2 bytes per rune: cuts must land on rune boundaries
	got := transcript.Cap(s, 1000)
	if len(got) > 1000 || !utf8.ValidString(got) || !strings.Contains(got, "bytes cut") {
		t.Fatalf("Cap: %d bytes, valid %v: %.80q", len(got), utf8.ValidString(got), got)
	}
	if transcript.Cap("short", 1000) != "short" {
		t.Fatal("Cap changed a short string")
	}
}

func TestCheckMessage(t *testing.T) {
	t.Parallel()
	if err := transcript.CheckMessage(user("u", strings.Repeat("a", 101)), transcript.Config{BudgetBytes: 100}); agent.KindOf(err) != agent.KindTooLarge {
		t.Fatalf("over-budget message: %v, want too large", err)
	}
	if err := transcript.CheckMessage(user("u", "fine"), transcript.Config{BudgetBytes: 100}); err != nil {
		t.Fatal(err)
	}
	// A system prompt and tool specs that fill the budget are the deployment's fault, not the message's: no 413
	// with a negative budget in its text, but an internal error whose text (for the log) says what to raise.
	err := transcript.CheckMessage(user("u", "fine"), transcript.Config{BudgetTokens: 1000, FixedTokens: 1200})
	if agent.KindOf(err) != agent.KindInternal || !errors.Is(err, agent.E(agent.KindInternal, agent.CodeInvalidConfig, "")) ||
		!strings.Contains(err.Error(), "AGENT_CONTEXT_TOKENS") {
		t.Fatalf("budget filled by the fixed part: %v, want an internal invalid_config error", err)
	}
}

func TestSynthesize(t *testing.T) {
	t.Parallel()
	parts := []agent.Part{
		{Type: "tool-add_note", ToolCallID: "c1", State: agent.StateInputAvailable, Input: json.RawMessage(`{}`)},
		{Type: "tool-list_notes", ToolCallID: "c2", State: agent.StateInputAvailable, Input: json.RawMessage(`{}`)},
		{Type: "tool-list_notes", ToolCallID: "c3", State: agent.StateOutputAvailable, Output: json.RawMessage(`1`)},
	}
	got := transcript.Synthesize(parts, "unknown", func(p agent.Part) (json.RawMessage, bool) {
		return json.RawMessage(`{"recorded":true}`), p.ToolCallID == "c1"
	})
	want := []struct{ state, out, errText string }{
		{agent.StateOutputAvailable, `{"recorded":true}`, ""},
		{agent.StateOutputError, "", "unknown"},
		{agent.StateOutputAvailable, `1`, ""},
	}
	for i, w := range want {
		p := got[i]
		if p.State != w.state || string(p.Output) != w.out || p.ErrorText != w.errText {
			t.Errorf("part %d: %+v, want %+v", i, p, w)
		}
	}
}

func parts(m agent.Message) []agent.Part { return transcript.Decode(m.Parts) }

// A model that repeats a tool call id (a deterministic one, answering a regenerate whose failed first attempt
// stays in the thread) must not make one id stand for two calls: the later calls are renamed, result and all,
// in the history and in the draft.
func TestRepeatedToolCallIDs(t *testing.T) {
	t.Parallel()
	h := transcript.NewHistory([]agent.Message{user("u1", "hi"), toolTurn("a1", "call_1", "first"), toolTurn("a2", "call_1", "second")}, transcript.Config{})
	draft := parts(toolTurn("a3", "call_1", "third"))
	msgs := h.Build(draft)
	valid(t, msgs)
	seen := map[string]string{}
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			if _, dup := seen[c.ID]; dup {
				t.Fatalf("call id %s made twice: %+v", c.ID, msgs)
			}
			seen[c.ID] = ""
		}
		if m.Role == "tool" {
			seen[m.ToolCallID] = m.Text
		}
	}
	want := map[string]string{"call_1": "first", "call_1~2": "second", "call_1~3": "third"}
	for id, text := range want {
		if seen[id] != text {
			t.Fatalf("result of %s = %q, want %q (%v)", id, seen[id], text, seen)
		}
	}
	// Building again (the next step) renames the same way: the history is not changed by a build.
	if again := h.Build(draft); len(again) != len(msgs) || again[len(again)-1].ToolCallID != msgs[len(msgs)-1].ToolCallID {
		t.Fatal("a second build differs")
	}
}
