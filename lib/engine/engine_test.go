package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
)

func TestTurns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		text       string
		cfg        func(*config.Config)
		wantStatus agent.RunStatus
		wantCode   string
		wantText   string // substring of the streamed text
		wantSteps  int
		check      func(t *testing.T, f *fixture, run agent.Run, chunks []map[string]any, msgs []agent.Message)
	}{
		{name: "plain reply", text: "hello there", wantStatus: agent.RunCompleted, wantText: "You said: hello there", wantSteps: 1},
		{name: "tool round trip", text: `/tool add_note {"text":"buy milk"}`, wantStatus: agent.RunCompleted, wantText: "buy milk", wantSteps: 2,
			check: func(t *testing.T, f *fixture, run agent.Run, chunks []map[string]any, msgs []agent.Message) {
				if count(chunks, "tool-input-available") != 1 || count(chunks, "tool-output-available") != 1 {
					t.Fatalf("want one tool call with output, got %v", types(chunks))
				}
				notes, err := f.stack.SQLite.ListValues(context.Background(), "notes/alice")
				if err != nil || len(notes) != 1 || !strings.Contains(string(notes[0].Value), "buy milk") {
					t.Fatalf("note not stored: %v %v", notes, err)
				}
				var found bool
				for _, raw := range msgs[1].Parts {
					p, _ := agent.DecodePart(raw)
					if p.Type == "tool-add_note" && p.State == agent.StateOutputAvailable && strings.Contains(string(p.Output), "buy milk") {
						found = true
					}
				}
				if !found {
					t.Fatalf("persisted message lacks the tool output: %s", msgs[1].Parts)
				}
			}},
		{name: "step cap", text: `/loop list_notes {}`, cfg: func(c *config.Config) { c.MaxSteps = 3 },
			wantStatus: agent.RunFailed, wantCode: agent.CodeStepLimit, wantSteps: 3,
			check: func(t *testing.T, f *fixture, run agent.Run, chunks []map[string]any, msgs []agent.Message) {
				if n := count(chunks, "tool-output-available"); n != 3 {
					t.Fatalf("want 3 tool outputs, got %d", n)
				}
				if count(chunks, "error") != 1 {
					t.Fatalf("want an in-band error, got %v", types(chunks))
				}
			}},
		{name: "retry then success", text: "/flaky 2 503 hi", wantStatus: agent.RunCompleted, wantText: "You said: hi", wantSteps: 1},
		{name: "retries exhausted", text: "/error 503", wantStatus: agent.RunFailed, wantCode: agent.CodeModelError, wantSteps: 1,
			check: func(t *testing.T, f *fixture, run agent.Run, chunks []map[string]any, msgs []agent.Message) {
				if got := f.model.Requests(); got != 3 {
					t.Fatalf("want 1 request + 2 retries, got %d", got)
				}
				if count(chunks, "error") != 1 || types(chunks)[len(chunks)-1] != "finish" {
					t.Fatalf("want error then finish, got %v", types(chunks))
				}
			}},
		{name: "error mid-stream", text: "/error 500 after 3", wantStatus: agent.RunFailed, wantCode: agent.CodeModelInterrupted, wantText: "word1 word2 word3", wantSteps: 1,
			check: func(t *testing.T, f *fixture, run agent.Run, chunks []map[string]any, msgs []agent.Message) {
				if got := f.model.Requests(); got != 1 {
					t.Fatalf("no retry after the first token: want 1 request, got %d", got)
				}
				if !strings.Contains(msgs[1].Text(), "word3") {
					t.Fatalf("partial text not persisted: %q", msgs[1].Text())
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var opts []option
			if tt.cfg != nil {
				opts = append(opts, withConfig(tt.cfg))
			}
			f := setup(t, opts...)
			run, chunks := f.turn(t, "th1", "u1", tt.text)
			if run.Status != tt.wantStatus {
				t.Fatalf("status = %s (%+v), want %s", run.Status, run.Error, tt.wantStatus)
			}
			if tt.wantCode != "" && (run.Error == nil || run.Error.Code != tt.wantCode) {
				t.Fatalf("error = %+v, want code %s", run.Error, tt.wantCode)
			}
			if !strings.Contains(textOf(chunks), tt.wantText) {
				t.Fatalf("text = %q, want it to contain %q", textOf(chunks), tt.wantText)
			}
			if run.Steps != tt.wantSteps {
				t.Fatalf("steps = %d, want %d", run.Steps, tt.wantSteps)
			}
			ts := types(chunks)
			if ts[0] != "start" || ts[len(ts)-1] != "finish" {
				t.Fatalf("stream must be start … finish, got %v", ts)
			}
			fin := chunks[len(chunks)-1]
			md := fin["messageMetadata"].(map[string]any)
			if md["runId"] != run.ID || md["usage"] == nil {
				t.Fatalf("finish metadata = %v", md)
			}
			msgs := f.messages(t, "th1")
			if len(msgs) != 2 || msgs[0].ID != "u1" || msgs[1].Role != agent.RoleAssistant || msgs[1].ID != chunks[0]["messageId"] {
				t.Fatalf("persisted transcript = %+v", msgs)
			}
			wantMsgStatus := map[agent.RunStatus]agent.MessageStatus{agent.RunCompleted: agent.MessageCompleted, agent.RunFailed: agent.MessageFailed}[tt.wantStatus]
			if got := msgs[1].Meta().Status; got != wantMsgStatus {
				t.Fatalf("message status = %s, want %s", got, wantMsgStatus)
			}
			stored, err := f.stack.SQLite.GetRun(context.Background(), "th1", run.ID)
			if err != nil || stored.Status != tt.wantStatus || stored.Steps != tt.wantSteps {
				t.Fatalf("stored run = %+v, %v", stored, err)
			}
			if tt.wantStatus == agent.RunCompleted && stored.Usage.TotalTokens == 0 {
				t.Fatalf("usage not recorded: %+v", stored.Usage)
			}
			f.idle(t, "th1")
			if tt.check != nil {
				tt.check(t, f, run, chunks, msgs)
			}
		})
	}
}

// The stream segments hold exactly what the client received.
func TestSegmentsMatchClientStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	run, client := f.run(t, submit("th", "u1", "/slow 10"))
	segs, err := f.store.ListSegments(context.Background(), run.ID, 0, time.Now())
	if err != nil || len(segs) < 2 || !segs[len(segs)-1].Final {
		t.Fatalf("want several segments ending with a final one, got %d (%v)", len(segs), err)
	}
	if replay := f.segments(t, run.ID); !bytes.Equal(replay, client) {
		t.Fatalf("segments differ from the client stream:\n%s\nvs\n%s", replay, client)
	}
}

// A stop request ends a long reply as canceled within a heartbeat or two, with what was streamed kept.
// seenWriter keeps what is written and closes seen once it holds want.
type seenWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newSeenWriter(want string) *seenWriter {
	return &seenWriter{want: want, seen: make(chan struct{})}
}

func (w *seenWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// At least 50 s of reply (10,000 words, 5 ms apart): the cancel comes once word1 has streamed (a signal, not
	// a sleep), and only the cancel ends the run.
	tr, err := f.eng.Begin(context.Background(), submit("th", "u1", "/slow 10000"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var run agent.Run
	buf := newSeenWriter(`"word1"`)
	go func() { defer wg.Done(); run = tr.Stream(context.Background(), buf) }()
	<-buf.seen
	if _, err := f.store.RequestCancel(context.Background(), "th", "", time.Now()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if run.Status != agent.RunCanceled {
		t.Fatalf("status = %s", run.Status)
	}
	msgs := f.messages(t, "th")
	if msgs[1].Meta().Status != agent.MessageCanceled || !strings.Contains(msgs[1].Text(), "word1") {
		t.Fatalf("canceled message = %+v", msgs[1])
	}
	f.idle(t, "th")
}

func TestBeginErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for i, text := range []string{"first", "second"} {
		if run, _ := f.turn(t, "th", fmt.Sprintf("u%d", i+1), text); run.Status != agent.RunCompleted {
			t.Fatalf("turn %d: %s", i, run.Status)
		}
	}
	tests := []struct {
		name string
		req  engine.Request
		code string
	}{
		{"other owner", engine.Request{Owner: "bob", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u3", "x")}, agent.CodeThreadNotFound},
		{"answered message again", submit("th", "u1", "first"), agent.CodeDuplicateMessage},
		// REVIEW L/M13: the same id with other content used to be answered with the old text. An older message
		// sent again with other content and no messageId is refused; the newest one is an edit (hitl tests).
		{"older id, new text", submit("th", "u1", "edited"), agent.CodeDuplicateMessage},
		{"edit of an unknown message", engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u9", "x"), MessageID: "u9"}, agent.CodeMessageNotFound},
		{"edit names another message", engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u1", "x"), MessageID: "u2"}, agent.CodeInvalidMessage},
		{"no kind", engine.Request{Owner: "alice", ThreadID: "th", Message: userMsg("u2", "x")}, agent.CodeInvalidTrigger},
		{"assistant message", engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: &agent.Message{ID: "a", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}, agent.CodeMessageNotFound},
		{"answers for a message that waits for none", engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: &agent.Message{ID: "u2", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}, agent.CodeNotInterrupted},
		{"system message", engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: &agent.Message{ID: "s", Role: agent.RoleSystem, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}, agent.CodeUserRequired},
		// REVIEW L22: ids the AI SDK cannot put in the resume URL, or that carry control characters.
		{"dot id", submit(".", "u2", "x"), agent.CodeInvalidThreadID},
		{"dot dot id", submit("..", "u2", "x"), agent.CodeInvalidThreadID},
		{"control character id", submit("th\x00x", "u2", "x"), agent.CodeInvalidThreadID},
		{"DEL in id", submit("th\x7f", "u2", "x"), agent.CodeInvalidThreadID},
		{"regenerate unknown thread", engine.Request{Owner: "alice", ThreadID: "nope", Kind: engine.TurnRegenerate}, agent.CodeThreadNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.eng.Begin(context.Background(), tt.req)
			if agent.CodeOf(err) != tt.code || !errors.Is(err, &agent.Error{Code: tt.code}) {
				t.Fatalf("err = %v, want code %s", err, tt.code)
			}
		})
	}
	if n := len(f.messages(t, "th")); n != 4 {
		t.Fatalf("rejected requests wrote messages: %d", n)
	}
}

// Regenerate replaces the newest assistant message.
func TestRegenerate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, _ := f.turn(t, "th", "u1", "hello")
	tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate, MessageID: first.AssistantMessageID})
	if err != nil {
		t.Fatal(err)
	}
	run := tr.Stream(context.Background(), &bytes.Buffer{})
	msgs := f.messages(t, "th")
	if run.Status != agent.RunCompleted || len(msgs) != 2 || msgs[1].ID != run.AssistantMessageID || msgs[1].ID == first.AssistantMessageID {
		t.Fatalf("regenerate: %s, %+v", run.Status, msgs)
	}
}

// A regenerate that fails keeps the reply it was meant to replace (REVIEW: the old reply used to be deleted
// before the new run produced anything).
func TestRegenerateFailureKeepsOldReply(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, _ := f.turn(t, "th", "u1", "/error 500 after 2")
	if first.Status != agent.RunFailed {
		t.Fatalf("first run %s", first.Status)
	}
	// The offline model answers the newest user text, so the regenerate fails the same way mid-stream.
	run, _ := f.run(t, engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate})
	msgs := f.messages(t, "th")
	if run.Status != agent.RunFailed || len(msgs) != 3 || msgs[1].ID != first.AssistantMessageID {
		t.Fatalf("regenerate: %s, messages %v", run.Status, ids(msgs))
	}
}

func ids(msgs []agent.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID+"/"+string(m.Role)+"/"+string(m.Meta().Status))
	}
	return out
}

// REVIEW H1: of messages sent with multitask interrupt while a reply streams, each is stored after the reply it
// interrupted (u1, a1 canceled, u2, a2), whatever the ids: here user ids sort before the server's "msg_" ids, which
// is what exposed the bug (the interrupting message took the interrupted reply's position).
func TestInterruptKeepsOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tr, err := f.eng.Begin(ctx, submit("th", "Z1", "/slow 10000"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan agent.Run, 1)
	w := newSeenWriter(`"word1"`)
	go func() { done <- tr.Stream(ctx, w) }()
	<-w.seen // the reply has begun; it lasts at least 50 s unless interrupted
	req := submit("th", "Z2", "after the interrupt")
	req.Multitask = engine.MultitaskInterrupt
	second, _ := f.run(t, req)
	first := <-done
	if first.Status != agent.RunCanceled || second.Status != agent.RunCompleted {
		t.Fatalf("first %s, second %s", first.Status, second.Status)
	}
	got := ids(f.messages(t, "th"))
	want := []string{"Z1/user/", first.AssistantMessageID + "/assistant/canceled", "Z2/user/", second.AssistantMessageID + "/assistant/completed"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stored order\n got %v\nwant %v", got, want)
	}
}

// Text and reasoning part ids carry the run id, so runs that continue one message never reuse an id.
func TestPartIDsCarryTheRun(t *testing.T) {
	t.Parallel()
	f := setup(t)
	run, chunks := f.turn(t, "th", "u1", "hello")
	for _, c := range chunks {
		if c["type"] == "text-start" && !strings.HasPrefix(c["id"].(string), run.ID) {
			t.Fatalf("text part id %v does not carry run %s", c["id"], run.ID)
		}
	}
}

// REVIEW L18 and M11: the client stops reading at an error chunk, so a message-metadata chunk (status, run id)
// precedes it; and the error text is the safe message, never the provider's body.
func TestErrorChunkIsPrecededByMetadata(t *testing.T) {
	t.Parallel()
	f := setup(t)
	run, chunks := f.turn(t, "th", "u1", "/error 401")
	ts := types(chunks)
	i := slicesIndex(ts, "error")
	if i < 1 || ts[i-1] != "message-metadata" {
		t.Fatalf("chunks %v: want message-metadata right before error", ts)
	}
	md := chunks[i-1]["messageMetadata"].(map[string]any)
	if md["runId"] != run.ID || md["status"] != "failed" {
		t.Fatalf("metadata before the error = %v", md)
	}
	text := chunks[i]["errorText"].(string)
	if strings.Contains(text, "http") || strings.Contains(text, "{") {
		t.Fatalf("error text leaks internals: %q", text)
	}
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

var _ = sync.Mutex{}
