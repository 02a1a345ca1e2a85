package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
)

// fixture is the whole local stack (lib/devserver): SQLite, the openai-go adapter, the offline endpoint over HTTP.
type fixture struct {
	stack *devserver.Stack
	eng   *engine.Engine
	store agent.Store // as the engine sees it (wrapped when the test asked)
	model *offline.Server
	log   *slog.Logger // the components' logger (Options.Logger)
}

// option adjusts a fixture before it is built.
type option func(*devserver.Options)

func withConfig(mut func(*config.Config)) option {
	return func(o *devserver.Options) { mut(&o.Config) }
}

func withTools(extra ...agent.Tool) option {
	return func(o *devserver.Options) {
		o.Tools = func(agent.ValueStore, agent.Clock) []agent.Tool { return extra }
	}
}

func withStore(wrap func(agent.Store) agent.Store) option {
	return func(o *devserver.Options) { o.Wrap = wrap }
}

// setup builds the stack with fast heartbeats and segment flushes.
func setup(t *testing.T, opts ...option) *fixture {
	t.Helper()
	srv := offline.New(offline.WithWordDelay(5 * time.Millisecond))
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	o := devserver.Options{Data: t.TempDir(), ModelURL: hs.URL + "/v1/",
		Config: config.Config{Heartbeat: 50 * time.Millisecond, StaleAfter: 2 * time.Second, SegmentFlush: 20 * time.Millisecond,
			CancelPoll: 20 * time.Millisecond},
		OpenAI: func(c *openai.Config) { c.BackoffBase = time.Millisecond; c.MaxRetries = 2 }}
	for _, opt := range opts {
		opt(&o)
	}
	stack, err := devserver.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	return &fixture{stack: stack, eng: stack.Engine, store: stack.Store, model: srv, log: o.Logger}
}

// engineWith builds a second engine over the fixture's store, model and tools with an adjusted engine config
// (for settings the environment does not carry).
func engineWith(t *testing.T, f *fixture, mut func(*engine.Config)) *engine.Engine {
	t.Helper()
	cfg := f.eng.Config()
	mut(&cfg)
	return engine.New(engine.Deps{Store: f.store, Model: f.stack.Model, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer}, cfg)
}

func userMsg(id, text string) *agent.Message {
	p, _ := json.Marshal(map[string]string{"type": "text", "text": text})
	return &agent.Message{ID: id, Role: agent.RoleUser, Parts: []json.RawMessage{p}}
}

func submit(thread, msgID, text string) engine.Request {
	return engine.Request{Owner: "alice", ThreadID: thread, Kind: engine.TurnSubmit, Message: userMsg(msgID, text)}
}

// turn runs one submit turn and returns the run and the decoded chunks the client received.
func (f *fixture) turn(t *testing.T, thread, msgID, text string) (agent.Run, []map[string]any) {
	t.Helper()
	run, raw := f.run(t, submit(thread, msgID, text))
	return run, parseSSE(t, raw)
}

// run begins and streams req, returning the run and the raw stream.
func (f *fixture) run(t *testing.T, req engine.Request) (agent.Run, []byte) {
	t.Helper()
	tr, err := f.eng.Begin(context.Background(), req)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	var buf bytes.Buffer
	run := tr.Stream(context.Background(), &buf)
	return run, buf.Bytes()
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
	var s strings.Builder
	for _, c := range chunks {
		if c["type"] == "text-delta" {
			s.WriteString(c["delta"].(string))
		}
	}
	return s.String()
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
	recs, err := f.stack.SQLite.ListMessages(context.Background(), thread)
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
	th, err := f.stack.SQLite.GetThread(context.Background(), thread)
	if err != nil {
		t.Fatal(err)
	}
	if th.ActiveRun != nil {
		t.Fatalf("claim not released: %+v", th.ActiveRun)
	}
}

func (f *fixture) segments(t *testing.T, runID string) []byte {
	t.Helper()
	segs, err := f.stack.SQLite.ListSegments(context.Background(), runID, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	for i, s := range segs {
		if s.Seq != int64(i) {
			t.Fatalf("segment %d has seq %d", i, s.Seq)
		}
		data = append(data, s.Data...)
	}
	return data
}
