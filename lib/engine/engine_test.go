package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/tools"
)

type fixture struct {
	eng   *engine.Engine
	store *sqlite.Store
	model *offline.Server
	llm   agent.Model // the openai adapter over model
}

// setup wires the real stack: SQLite store, the openai-go adapter, the offline endpoint over HTTP.
func setup(t *testing.T, mut func(*engine.Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "agentloop.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := offline.New(offline.WithWordDelay(5 * time.Millisecond))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	model := openai.New(openai.Config{BaseURL: hs.URL + "/v1/", APIKey: "offline", Model: "offline",
		MaxRetries: 2, BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	cfg := engine.Config{Model: "offline", Heartbeat: 50 * time.Millisecond, StaleAfter: 2 * time.Second, SegmentFlush: 20 * time.Millisecond}
	if mut != nil {
		mut(&cfg)
	}
	clock := agent.SystemClock{}
	eng := engine.New(engine.Deps{Store: st, Model: model, Tools: tools.Demo(st, clock), Clock: clock}, cfg)
	return &fixture{eng: eng, store: st, model: srv, llm: model}
}

func userMsg(id, text string) *agent.Message {
	p, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	return &agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{p}}
}

// turn runs one submit-message turn and returns the run and the decoded chunks the client received.
func (f *fixture) turn(t *testing.T, thread, msgID, text string) (agent.Run, []map[string]any) {
	t.Helper()
	tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: thread, Trigger: engine.WireSubmit, Message: userMsg(msgID, text)})
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	return run, parseSSE(t, buf.Bytes())
}

func parseSSE(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	frames := strings.Split(string(b), "\n\n")
	if len(frames) < 2 || frames[len(frames)-2] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]: %q", tail(string(b)))
	}
	for _, f := range frames[:len(frames)-2] {
		data, ok := strings.CutPrefix(f, "data: ")
		if !ok {
			t.Fatalf("frame without data prefix: %q", f)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("frame is not JSON: %q", data)
		}
		out = append(out, m)
	}
	return out
}

func tail(s string) string {
	if len(s) > 300 {
		return s[len(s)-300:]
	}
	return s
}

func types(chunks []map[string]any) []string {
	var ts []string
	for _, c := range chunks {
		ts = append(ts, c["type"].(string))
	}
	return ts
}

func textOf(chunks []map[string]any) string {
	var s string
	for _, c := range chunks {
		if c["type"] == "text-delta" {
			s += c["delta"].(string)
		}
	}
	return s
}

func count(chunks []map[string]any, typ string) int {
	n := 0
	for _, c := range chunks {
		if c["type"] == typ {
			n++
		}
	}
	return n
}

func (f *fixture) messages(t *testing.T, thread string) []agent.Message {
	t.Helper()
	recs, err := f.store.ListMessages(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	var ms []agent.Message
	for _, r := range recs {
		ms = append(ms, r.Message)
	}
	return ms
}

func (f *fixture) idle(t *testing.T, thread string) {
	t.Helper()
	th, err := f.store.GetThread(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil {
		t.Fatalf("claim not released: %+v", th.ActiveRun)
	}
}

func TestTurns(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		text       string
		cfg        func(*engine.Config)
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
				notes, err := f.store.ListValues(context.Background(), "notes/alice")
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
		{name: "step cap", text: `/loop list_notes {}`, cfg: func(c *engine.Config) { c.MaxSteps = 3 },
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
		{name: "error mid-stream", text: "/error 500 after 3", wantStatus: agent.RunFailed, wantCode: agent.CodeModelError, wantText: "word1 word2 word3", wantSteps: 1,
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
			f := setup(t, tt.cfg)
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
			stored, err := f.store.GetRun(context.Background(), "th1", run.ID)
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
	f := setup(t, nil)
	tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "/slow 10")})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	segs, err := f.store.ListSegments(context.Background(), run.ID, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var replay []byte
	for i, s := range segs {
		if s.Seq != int64(i) {
			t.Fatalf("segment %d has seq %d", i, s.Seq)
		}
		replay = append(replay, s.Data...)
	}
	if len(segs) < 2 || !segs[len(segs)-1].Final {
		t.Fatalf("want several segments ending with a final one, got %d", len(segs))
	}
	if !bytes.Equal(replay, buf.Bytes()) {
		t.Fatalf("segments differ from the client stream:\n%s\nvs\n%s", replay, buf.Bytes())
	}
}

// A stop request ends a long reply as canceled within a heartbeat or two, with what was streamed kept.
func TestCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "/slow 400")})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var run agent.Run
	var buf bytes.Buffer
	go func() { defer wg.Done(); run = tr.Stream(context.Background(), &buf) }()
	time.Sleep(150 * time.Millisecond)
	if _, err := f.store.RequestCancel(context.Background(), "th", time.Now()); err != nil {
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
	f := setup(t, nil)
	if run, _ := f.turn(t, "th", "u1", "first"); run.Status != agent.RunCompleted {
		t.Fatalf("first turn: %s", run.Status)
	}
	tests := []struct {
		name string
		req  engine.Request
		code string
	}{
		{"other owner", engine.Request{Owner: "bob", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u2", "x")}, agent.CodeThreadNotFound},
		{"answered message again", engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u1", "first")}, engine.CodeDuplicateMessage},
		{"bad trigger", engine.Request{Owner: "alice", ThreadID: "th", Trigger: "submit", Message: userMsg("u2", "x")}, engine.CodeInvalidTrigger},
		{"assistant message", engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit, Message: &agent.Message{ID: "a", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}}, engine.CodeUserRequired},
		{"bad multitask", engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireSubmit, Message: userMsg("u2", "x"), Multitask: "later"}, engine.CodeInvalidMultitask},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.eng.Begin(context.Background(), tt.req)
			if agent.CodeOf(err) != tt.code {
				t.Fatalf("err = %v, want code %s", err, tt.code)
			}
		})
	}
	if n := len(f.messages(t, "th")); n != 2 {
		t.Fatalf("rejected requests wrote messages: %d", n)
	}
}

// Regenerate replaces the newest assistant message.
func TestRegenerate(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	first, _ := f.turn(t, "th", "u1", "hello")
	tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Trigger: engine.WireRegenerate, MessageID: first.AssistantMessageID})
	if err != nil {
		t.Fatal(err)
	}
	run := tr.Stream(context.Background(), &bytes.Buffer{})
	msgs := f.messages(t, "th")
	if run.Status != agent.RunCompleted || len(msgs) != 2 || msgs[1].ID != run.AssistantMessageID || msgs[1].ID == first.AssistantMessageID {
		t.Fatalf("regenerate: %s, %+v", run.Status, msgs)
	}
}

// A claim whose heartbeat went stale is taken over, and the dead run is reaped: failed/stale, its draft
// finalized with a synthesized result, and a final segment written.
func TestStaleTakeover(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *engine.Config) { c.StaleAfter = time.Second })
	ctx := context.Background()
	f.turn(t, "th", "u1", "hello")
	old := time.Now().Add(-time.Minute)
	dead, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "th", RunID: "run_dead", Trigger: agent.TriggerUser, AssistantMessageID: "msg_dead", Now: old, StaleAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	draft := agent.Message{ID: "msg_dead", Role: agent.RoleAssistant, Parts: []json.RawMessage{
		json.RawMessage(`{"type":"tool-add_note","toolCallId":"c1","state":"input-available","input":{"text":"x"}}`)},
		Metadata: json.RawMessage(`{"status":"streaming"}`)}
	if err := f.store.PutMessage(ctx, "th", 10, draft, old); err != nil {
		t.Fatal(err)
	}
	run, _ := f.turn(t, "th", "u2", "again")
	if run.Status != agent.RunCompleted || run.Epoch != dead.Run.Epoch+1 {
		t.Fatalf("takeover run = %+v", run)
	}
	got, err := f.store.GetRun(ctx, "th", "run_dead")
	if err != nil || got.Status != agent.RunFailed || got.Error == nil || got.Error.Code != agent.CodeStale {
		t.Fatalf("dead run = %+v %v", got, err)
	}
	rec, err := f.store.GetMessage(ctx, "th", "msg_dead")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := agent.DecodePart(rec.Message.Parts[0])
	if rec.Message.Meta().Status != agent.MessageFailed || p.State != agent.StateOutputError {
		t.Fatalf("dead draft not finalized: %s %s", rec.Message.Metadata, rec.Message.Parts[0])
	}
	segs, _ := f.store.ListSegments(ctx, "run_dead", 0, time.Now())
	if len(segs) != 1 || !segs[0].Final || !bytes.Contains(segs[0].Data, []byte(`"type":"finish"`)) {
		t.Fatalf("final segment of the dead run = %+v", segs)
	}
}

// The reaper tick finds a dead run through the store's index and reaps it; a live run is left alone.
func TestReapStale(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *engine.Config) { c.StaleAfter = time.Second })
	ctx := context.Background()
	for _, id := range []string{"dead", "live"} {
		if _, _, err := f.store.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: time.Now(), UpdatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "dead", RunID: "run_dead", AssistantMessageID: "msg_dead", Now: time.Now().Add(-time.Minute), StaleAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "live", RunID: "run_live", AssistantMessageID: "msg_live", Now: time.Now(), StaleAfter: time.Second}); err != nil {
		t.Fatal(err)
	}
	n, err := f.eng.ReapStale(ctx, 10)
	if err != nil || n != 1 {
		t.Fatalf("ReapStale = %d, %v; want 1 claim", n, err)
	}
	if run, _ := f.store.GetRun(ctx, "dead", "run_dead"); run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeStale {
		t.Fatalf("dead run = %+v", run)
	}
	f.idle(t, "dead")
	if th, _ := f.store.GetThread(ctx, "live"); th.ActiveRun == nil {
		t.Fatal("the live run was reaped")
	}
	if segs, _ := f.store.ListSegments(ctx, "run_dead", 0, time.Now()); len(segs) != 1 || !segs[0].Final {
		t.Fatalf("final segment = %+v", segs)
	}
}
