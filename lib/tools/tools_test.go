package tools_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/toolschema"
)

// memValues is an in-memory agent.ValueStore. The tests would rather run on lib/sqlite, the real store, but its
// port is being changed in parallel on another branch and does not compile here yet; this map keeps the
// ValueStore contract the tools rely on (unknown key: KindNotFound; delete of an unknown key: no-op; list
// ordered by key).
type memValues struct {
	mu sync.Mutex
	m  map[string]map[string][]byte
}

func newValues() *memValues { return &memValues{m: map[string]map[string][]byte{}} }

func (s *memValues) PutValue(_ context.Context, ns, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m[ns] == nil {
		s.m[ns] = map[string][]byte{}
	}
	s.m[ns][key] = slices.Clone(value)
	return nil
}

func (s *memValues) GetValue(_ context.Context, ns, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[ns][key]
	if !ok {
		return nil, agent.E(agent.KindNotFound, agent.CodeNotFound, "no value %s/%s", ns, key)
	}
	return slices.Clone(v), nil
}

func (s *memValues) ListValues(_ context.Context, ns string) ([]agent.KV, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []agent.KV
	for _, k := range slices.Sorted(maps.Keys(s.m[ns])) {
		out = append(out, agent.KV{Key: k, Value: slices.Clone(s.m[ns][k])})
	}
	return out, nil
}

func (s *memValues) DeleteValue(_ context.Context, ns, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m[ns], key)
	return nil
}

// crashing fails the first write that fail selects, as a process that dies at that point would leave things:
// every earlier write applied, that one and all later ones not.
type crashing struct {
	agent.ValueStore
	fail    func(op, ns string, value []byte) bool
	crashed bool
}

var errCrash = errors.New("process died")

func (c *crashing) check(op, ns string, value []byte) error {
	if c.crashed || (c.fail != nil && c.fail(op, ns, value)) {
		c.crashed = true
		return errCrash
	}
	return nil
}

func (c *crashing) PutValue(ctx context.Context, ns, key string, value []byte) error {
	if err := c.check("put", ns, value); err != nil {
		return err
	}
	return c.ValueStore.PutValue(ctx, ns, key, value)
}

func (c *crashing) DeleteValue(ctx context.Context, ns, key string) error {
	if err := c.check("delete", ns, nil); err != nil {
		return err
	}
	return c.ValueStore.DeleteValue(ctx, ns, key)
}

type tickClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *tickClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Second)
	return c.t
}

func demo(values agent.ValueStore) map[string]agent.Tool {
	m := map[string]agent.Tool{}
	for _, tl := range tools.Demo(values, &tickClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}) {
		m[tl.Name] = tl
	}
	return m
}

// inv is one tool call of a thread, keyed as the engine keys it.
func inv(owner, thread, callID, input string) agent.ToolInvocation {
	return agent.ToolInvocation{
		ThreadID: thread, Owner: owner, ToolCallID: callID, MessageID: "m1", Input: json.RawMessage(input),
		IdempotencyKey: agent.IdempotencyKey(thread, "m1", callID),
	}
}

func exec(t *testing.T, tl agent.Tool, in agent.ToolInvocation) (string, error) {
	t.Helper()
	out, err := tl.Execute(context.Background(), in)
	return string(out), err
}

func mustExec(t *testing.T, tl agent.Tool, in agent.ToolInvocation) string {
	t.Helper()
	out, err := exec(t, tl, in)
	if err != nil {
		t.Fatalf("%s: %v", tl.Name, err)
	}
	return out
}

func listNotes(t *testing.T, ts map[string]agent.Tool, owner string) []tools.Note {
	t.Helper()
	var got struct{ Notes []tools.Note }
	if err := json.Unmarshal([]byte(mustExec(t, ts["list_notes"], inv(owner, "t", "list", `{}`))), &got); err != nil {
		t.Fatal(err)
	}
	return got.Notes
}

func idOf(t *testing.T, out string) string {
	t.Helper()
	var n tools.Note
	if err := json.Unmarshal([]byte(out), &n); err != nil || n.ID == "" {
		t.Fatalf("not a note: %s (%v)", out, err)
	}
	return n.ID
}

func TestNotes(t *testing.T) {
	t.Parallel()
	ts := demo(newValues())
	for _, name := range []string{"add_note", "list_notes", "delete_note", "ask_user_question"} {
		if !json.Valid(ts[name].InputSchema) {
			t.Fatalf("%s: schema is not JSON", name)
		}
	}
	if ts["delete_note"].Approval != agent.ApprovalAlways || ts["ask_user_question"].Kind != agent.ToolClient {
		t.Fatal("delete_note must need approval and ask_user_question must be a client tool")
	}
	if ts["add_note"].Recorded == nil || ts["delete_note"].Recorded == nil || ts["list_notes"].Recorded != nil {
		t.Fatal("exactly the tools with side effects report recorded outcomes")
	}
	milk := mustExec(t, ts["add_note"], inv("alice", "t1", "c1", `{"text":"  milk "}`))
	if !strings.Contains(milk, `"text":"milk"`) {
		t.Fatalf("add: %s", milk)
	}
	mustExec(t, ts["add_note"], inv("alice", "t1", "c2", `{"text":"eggs"}`))
	bobs := mustExec(t, ts["add_note"], inv("bob", "t2", "c3", `{"text":"bob's"}`))
	if got := listNotes(t, ts, "alice"); len(got) != 2 || got[0].Text != "milk" || got[1].Text != "eggs" {
		t.Fatalf("alice's notes = %+v", got)
	}
	if _, err := exec(t, ts["delete_note"], inv("alice", "t1", "c5", `{"id":"`+idOf(t, bobs)+`"}`)); err == nil {
		t.Fatal("alice deleted bob's note")
	}
	if out := mustExec(t, ts["delete_note"], inv("alice", "t1", "c6", `{"id":"`+idOf(t, milk)+`"}`)); out != `{"deleted":"`+idOf(t, milk)+`"}` {
		t.Fatalf("delete: %s", out)
	}
	if got := listNotes(t, ts, "alice"); len(got) != 1 || got[0].Text != "eggs" {
		t.Fatalf("after the delete: %+v", got)
	}
}

// list_notes is the demo of a server tool's progress (issue 19 item 6): its stages reach inv.Progress, in order,
// and a call without Progress (recovery, a test) still works.
func TestListNotesReportsProgress(t *testing.T) {
	t.Parallel()
	ts := demo(newValues())
	mustExec(t, ts["add_note"], inv("alice", "t1", "c1", `{"text":"milk"}`))
	var got []string
	call := inv("alice", "t1", "c2", `{}`)
	call.Progress = func(stage, message string) { got = append(got, stage+": "+message) }
	mustExec(t, ts["list_notes"], call)
	if want := []string{"reading: Reading your notes", "found: Found 1 note"}; !slices.Equal(got, want) {
		t.Fatalf("progress = %q, want %q", got, want)
	}
	if got := listNotes(t, ts, "alice"); len(got) != 1 {
		t.Fatalf("without Progress: %+v", got)
	}
}

// TestReexecution: executing one tool call again (a retry, a resumed run, recovery) changes nothing more and
// answers as the first execution did.
func TestReexecution(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		steps func(t *testing.T, ts map[string]agent.Tool)
	}{
		{"add_note twice adds one note", func(t *testing.T, ts map[string]agent.Tool) {
			call := inv("alice", "t1", "c1", `{"text":"milk"}`)
			first, again := mustExec(t, ts["add_note"], call), mustExec(t, ts["add_note"], call)
			if again != first || len(listNotes(t, ts, "alice")) != 1 {
				t.Fatalf("first %s, again %s, notes %+v", first, again, listNotes(t, ts, "alice"))
			}
		}},
		{"the same call id in another thread is another call (REVIEW L22)", func(t *testing.T, ts map[string]agent.Tool) {
			// Provider call ids are not unique across threads (the offline model's are a hash of the request).
			a := mustExec(t, ts["add_note"], inv("alice", "t1", "call_0", `{"text":"milk"}`))
			b := mustExec(t, ts["add_note"], inv("alice", "t2", "call_0", `{"text":"eggs"}`))
			if idOf(t, a) == idOf(t, b) || len(listNotes(t, ts, "alice")) != 2 {
				t.Fatalf("%s and %s, notes %+v", a, b, listNotes(t, ts, "alice"))
			}
		}},
		{"a re-executed add_note does not bring back a deleted note", func(t *testing.T, ts map[string]agent.Tool) {
			add := inv("alice", "t1", "c1", `{"text":"milk"}`)
			out := mustExec(t, ts["add_note"], add)
			mustExec(t, ts["delete_note"], inv("alice", "t1", "c2", `{"id":"`+idOf(t, out)+`"}`))
			if again := mustExec(t, ts["add_note"], add); again != out || len(listNotes(t, ts, "alice")) != 0 {
				t.Fatalf("again %s, notes %+v", again, listNotes(t, ts, "alice"))
			}
		}},
		{"delete_note twice reports the delete both times", func(t *testing.T, ts map[string]agent.Tool) {
			id := idOf(t, mustExec(t, ts["add_note"], inv("alice", "t1", "c1", `{"text":"milk"}`)))
			del := inv("alice", "t1", "c2", `{"id":"`+id+`"}`)
			first, again := mustExec(t, ts["delete_note"], del), mustExec(t, ts["delete_note"], del)
			if again != first {
				t.Fatalf("first %s, again %s", first, again)
			}
		}},
		{"a key derived from thread and call when the invocation has none", func(t *testing.T, ts map[string]agent.Tool) {
			keyed := inv("alice", "t1", "c1", `{"text":"milk"}`)
			bare := keyed
			bare.IdempotencyKey = ""
			if a, b := mustExec(t, ts["add_note"], keyed), mustExec(t, ts["add_note"], bare); a != b {
				t.Fatalf("%s vs %s", a, b)
			}
			if _, err := exec(t, ts["add_note"], agent.ToolInvocation{Owner: "alice", Input: json.RawMessage(`{"text":"x"}`)}); err == nil {
				t.Fatal("a side effect without any key ran")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.steps(t, demo(newValues()))
		})
	}
}

func TestRecorded(t *testing.T) {
	t.Parallel()
	values := newValues()
	ts := demo(values)
	ctx := context.Background()
	id := idOf(t, mustExec(t, ts["add_note"], inv("alice", "t0", "setup", `{"text":"old"}`)))
	tests := []struct {
		tool string
		call agent.ToolInvocation
	}{
		{"add_note", inv("alice", "t1", "c1", `{"text":"milk"}`)},
		{"delete_note", inv("alice", "t1", "c2", `{"id":"`+id+`"}`)},
	}
	for _, tt := range tests {
		tl := ts[tt.tool]
		if out, ok, err := tl.Recorded(ctx, tt.call); err != nil || ok || out != nil {
			t.Fatalf("%s before executing: %s %v %v", tt.tool, out, ok, err)
		}
		want := mustExec(t, tl, tt.call)
		if out, ok, err := tl.Recorded(ctx, tt.call); err != nil || !ok || string(out) != want {
			t.Fatalf("%s after executing: %s %v %v, want %s", tt.tool, out, ok, err, want)
		}
		// Another call of the same thread recorded nothing.
		other := tt.call
		other.ToolCallID, other.IdempotencyKey = "other", agent.IdempotencyKey(tt.call.ThreadID, "m1", "other")
		if _, ok, err := tl.Recorded(ctx, other); err != nil || ok {
			t.Fatalf("%s: another call reports %v %v", tt.tool, ok, err)
		}
	}
}

// TestCrash: a process that dies between two writes of a tool leaves records from which Recorded reports the
// truth, and from which a re-execution completes the call without doing it twice.
func TestCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	effects := func(op string) func(string, string, []byte) bool {
		return func(o, ns string, v []byte) bool { return o == op && strings.HasPrefix(ns, "effects/") }
	}
	tests := []struct {
		name     string
		tool     string
		crash    func(op, ns string, value []byte) bool
		recorded bool // what Recorded must say after the crash
	}{
		// The note is written, its effect record is not: the note itself shows the call ran.
		{"add_note before its record", "add_note", effects("put"), true},
		// The intent is recorded, the delete never happened: the note is still there, so "not executed" is true.
		{"delete_note before the delete", "delete_note", func(op, _ string, _ []byte) bool { return op == "delete" }, false},
		// The note is deleted, "done" is not recorded: the pending intent and the note's absence show it ran.
		{"delete_note after the delete", "delete_note", func(op, ns string, v []byte) bool {
			return op == "put" && strings.HasPrefix(ns, "effects/") && strings.Contains(string(v), `"done"`)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			values := newValues()
			healthy := demo(values)
			id := idOf(t, mustExec(t, healthy["add_note"], inv("alice", "t0", "setup", `{"text":"old"}`)))
			call := inv("alice", "t1", "c1", `{"text":"milk"}`)
			if tt.tool == "delete_note" {
				call = inv("alice", "t1", "c1", `{"id":"`+id+`"}`)
			}

			dying := demo(&crashing{ValueStore: values, fail: tt.crash})
			if _, err := exec(t, dying[tt.tool], call); !errors.Is(err, errCrash) {
				t.Fatalf("the crash did not happen: %v", err)
			}

			// Recovery, in a new process over the same store.
			restarted := demo(values)
			out, ok, err := restarted[tt.tool].Recorded(ctx, call)
			if err != nil || ok != tt.recorded {
				t.Fatalf("Recorded = %s %v %v, want ok %v", out, ok, err, tt.recorded)
			}
			again := mustExec(t, restarted[tt.tool], call)
			if ok && string(out) != again {
				t.Fatalf("Recorded said %s, the re-execution answered %s", out, again)
			}
			notes := listNotes(t, restarted, "alice")
			switch tt.tool {
			case "add_note":
				if len(notes) != 2 || idOf(t, again) == id {
					t.Fatalf("notes %+v after %s", notes, again)
				}
			case "delete_note":
				if len(notes) != 0 || again != `{"deleted":"`+id+`"}` {
					t.Fatalf("notes %+v after %s", notes, again)
				}
			}
			if out, ok, err := restarted[tt.tool].Recorded(ctx, call); err != nil || !ok || string(out) != again {
				t.Fatalf("after the re-execution Recorded = %s %v %v", out, ok, err)
			}
		})
	}
}

func TestAddNoteRejectsBadInput(t *testing.T) {
	t.Parallel()
	ts := demo(newValues())
	for _, in := range []string{`{}`, `{"text":"   "}`, `{"text":1}`, `[]`, `{"text":"` + strings.Repeat("x", tools.MaxNoteBytes+1) + `"}`} {
		if out, err := exec(t, ts["add_note"], inv("alice", "t", "c", in)); err == nil {
			t.Fatalf("input %.40s accepted: %s", in, out)
		}
	}
	if got := listNotes(t, ts, "alice"); len(got) != 0 {
		t.Fatalf("a refused input left notes %+v", got)
	}
}

// Issue 19 item 4: every demo tool's input schema is a JSON Schema the input check compiles (a bad one would fail
// every cold start), and the inputs the demo's own examples send pass it.
func TestDemoSchemasCompile(t *testing.T) {
	t.Parallel()
	demo := tools.Demo(nil, agent.SystemClock{})
	c, err := toolschema.New(demo...)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]agent.Tool{}
	for _, tool := range demo {
		byName[tool.Name] = tool
	}
	for _, tc := range []struct{ tool, args string }{
		{"add_note", `{"text":"buy milk"}`},
		{"list_notes", `{}`},
		{"list_notes", ``},
		{"delete_note", `{"id":"note_1"}`},
		{"ask_user_question", `{"question":"Which one?","options":["a","b"]}`},
	} {
		if _, err := c.CheckInput(byName[tc.tool], tc.args); err != nil {
			t.Errorf("%s %s: %v", tc.tool, tc.args, err)
		}
	}
}
