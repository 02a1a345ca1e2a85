package tools_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/tools"
)

type tickClock struct{ t time.Time }

func (c *tickClock) Now() time.Time { c.t = c.t.Add(time.Second); return c.t }

func setup(t *testing.T) map[string]agent.Tool {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	m := map[string]agent.Tool{}
	for _, tl := range tools.Demo(st, &tickClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}) {
		m[tl.Name] = tl
	}
	return m
}

func call(t *testing.T, tl agent.Tool, owner, callID, input string) (string, error) {
	t.Helper()
	out, err := tl.Execute(context.Background(), agent.ToolInvocation{Owner: owner, ToolCallID: callID, Input: json.RawMessage(input)})
	return string(out), err
}

func TestNotes(t *testing.T) {
	t.Parallel()
	ts := setup(t)
	for _, name := range []string{"add_note", "list_notes", "delete_note", "ask_user_question"} {
		if !json.Valid(ts[name].InputSchema) {
			t.Fatalf("%s: schema is not JSON", name)
		}
	}
	if ts["delete_note"].Approval != agent.ApprovalAlways || ts["ask_user_question"].Kind != agent.ToolClient {
		t.Fatal("delete_note must need approval and ask_user_question must be a client tool")
	}
	first, err := call(t, ts["add_note"], "alice", "c1", `{"text":"  milk "}`)
	if err != nil || !strings.Contains(first, `"text":"milk"`) {
		t.Fatalf("add: %s %v", first, err)
	}
	again, _ := call(t, ts["add_note"], "alice", "c1", `{"text":"milk"}`)
	if again != first {
		t.Fatalf("a retried call must return the same note: %s vs %s", again, first)
	}
	call(t, ts["add_note"], "alice", "c2", `{"text":"eggs"}`)
	call(t, ts["add_note"], "bob", "c3", `{"text":"bob's"}`)
	list, _ := call(t, ts["list_notes"], "alice", "c4", `{}`)
	var got struct{ Notes []tools.Note }
	json.Unmarshal([]byte(list), &got)
	if len(got.Notes) != 2 || got.Notes[0].Text != "milk" || got.Notes[1].Text != "eggs" {
		t.Fatalf("alice's notes = %s", list)
	}
	if _, err := call(t, ts["delete_note"], "alice", "c5", `{"id":"note_c3"}`); err == nil {
		t.Fatal("alice deleted bob's note")
	}
	if _, err := call(t, ts["delete_note"], "alice", "c6", `{"id":"note_c1"}`); err != nil {
		t.Fatal(err)
	}
	list, _ = call(t, ts["list_notes"], "alice", "c7", `{}`)
	if strings.Contains(list, "milk") {
		t.Fatalf("deleted note still listed: %s", list)
	}
}

func TestAddNoteRejectsBadInput(t *testing.T) {
	t.Parallel()
	ts := setup(t)
	for _, in := range []string{`{}`, `{"text":"   "}`, `{"text":1}`, `[]`, `{"text":"` + strings.Repeat("x", tools.MaxNoteBytes+1) + `"}`} {
		if out, err := call(t, ts["add_note"], "alice", "c", in); err == nil {
			t.Fatalf("input %.40s accepted: %s", in, out)
		}
	}
}
