package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/titles"
)

// Thread titles (issue 20 item 5) through the HTTP handlers over the whole local stack: the offline model titles a
// thread after its first reply, in the background; the owner's title (PATCH) always wins.

// titleModel wraps the title model (devserver.Options.TitleModel): it counts the title requests, and with a gate
// signals asked at the first one and holds its answer until release is closed; fail makes every one fail.
type titleModel struct {
	agent.Model
	requests atomic.Int64
	asked    chan struct{}
	release  chan struct{}
	once     sync.Once
	fail     bool
}

func (m *titleModel) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	if req.System != titles.System { // the engine's own requests go through the stack's model, not this one
		return m.Model.Stream(ctx, req, emit)
	}
	m.requests.Add(1)
	if m.asked != nil {
		m.once.Do(func() { close(m.asked) })
		<-m.release
	}
	if m.fail {
		return agent.ModelResult{}, errors.New("title provider down")
	}
	return m.Model.Stream(ctx, req, emit)
}

// titleSetup is setup with the title model wrapped by m.
func titleSetup(t *testing.T, m *titleModel, adjust ...func(*config.Config)) *fixture {
	t.Helper()
	model := httptest.NewServer(offline.New())
	t.Cleanup(model.Close)
	cfg := config.Config{Secret: string(secret), Heartbeat: 50 * time.Millisecond, SegmentFlush: 20 * time.Millisecond}
	for _, a := range adjust {
		a(&cfg)
	}
	stack, err := devserver.New(context.Background(), devserver.Options{Data: t.TempDir(), ModelURL: model.URL + "/v1/", Config: cfg,
		OpenAI:     func(c *openai.Config) { c.BackoffBase = time.Millisecond },
		TitleModel: func(inner agent.Model) agent.Model { m.Model = inner; return m }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stack.Close)
	srv := httptest.NewServer(stack.Handler)
	t.Cleanup(srv.Close)
	return &fixture{url: srv.URL, store: stack.Store, stack: stack}
}

// chat sends text to thread and returns the stream, which must end with a completed reply and no error chunk.
func (f *fixture) chat(t *testing.T, tok, thread, msgID, text string) string {
	t.Helper()
	resp := f.do(t, "POST", "/chat", tok, chatBody(thread, msgID, text))
	body := string(readAll(t, resp))
	if resp.StatusCode != 200 || strings.Contains(body, `"type":"error"`) || !strings.Contains(body, `"status":"completed"`) ||
		!strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("chat %q: status %d, stream %s", text, resp.StatusCode, body)
	}
	return body
}

// titles reads thread's title from GET /threads and from GET /threads/{id}, which must agree.
func (f *fixture) title(t *testing.T, tok, thread string) string {
	t.Helper()
	var list struct{ Threads []agent.Thread }
	if err := json.Unmarshal(readAll(t, f.do(t, "GET", "/threads", tok, nil)), &list); err != nil {
		t.Fatal(err)
	}
	var view struct{ Thread agent.Thread }
	if err := json.Unmarshal(readAll(t, f.do(t, "GET", "/threads/"+thread, tok, nil)), &view); err != nil {
		t.Fatal(err)
	}
	for _, th := range list.Threads {
		if th.ID == thread {
			if th.Title != view.Thread.Title {
				t.Fatalf("GET /threads says %q, GET /threads/%s %q", th.Title, thread, view.Thread.Title)
			}
			return th.Title
		}
	}
	t.Fatalf("GET /threads does not list %s: %+v", thread, list)
	return ""
}

func (f *fixture) rename(t *testing.T, tok, thread, title string) {
	t.Helper()
	resp := f.do(t, "PATCH", "/threads/"+thread, tok, map[string]any{"title": title})
	var patched struct{ Thread agent.Thread }
	if err := json.Unmarshal(readAll(t, resp), &patched); err != nil || resp.StatusCode != 200 || patched.Thread.Title != title {
		t.Fatalf("PATCH title %q: status %d, %+v, %v", title, resp.StatusCode, patched, err)
	}
}

// The thread's provisional title (its first message) becomes the offline model's title after the first reply;
// a second reply asks for no title.
func TestTitleAfterFirstReply(t *testing.T) {
	t.Parallel()
	m := &titleModel{}
	f := titleSetup(t, m)
	tok := token(t, "alice")
	f.chat(t, tok, "t1", "u1", "plan a trip to lisbon in may please")
	f.stack.Titles.Wait()
	if got, want := f.title(t, tok, "t1"), "Plan a trip to lisbon in"; got != want {
		t.Fatalf("title %q after the first reply, want %q", got, want)
	}
	f.chat(t, tok, "t1", "u2", "and what about june")
	f.stack.Titles.Wait()
	if got, want := f.title(t, tok, "t1"), "Plan a trip to lisbon in"; got != want {
		t.Fatalf("title %q after the second reply, want %q", got, want)
	}
	if n := m.requests.Load(); n != 1 {
		t.Errorf("%d title requests, want 1", n)
	}
}

// The owner's title wins in both orders: set while the title model is answering (the owner's write lands
// first), and set after the generated title was stored (then later replies change nothing either).
func TestOwnerTitleWinsTheRace(t *testing.T) {
	t.Parallel()
	t.Run("owner first", func(t *testing.T) {
		t.Parallel()
		m := &titleModel{asked: make(chan struct{}), release: make(chan struct{})}
		f := titleSetup(t, m)
		tok := token(t, "alice")
		f.chat(t, tok, "t1", "u1", "plan a trip to lisbon") // the reply is whole while its title waits
		<-m.asked
		f.rename(t, tok, "t1", "Mine")
		close(m.release)
		f.stack.Titles.Wait()
		if got := f.title(t, tok, "t1"); got != "Mine" {
			t.Fatalf("title %q, want the owner's", got)
		}
	})
	t.Run("generated first", func(t *testing.T) {
		t.Parallel()
		m := &titleModel{}
		f := titleSetup(t, m)
		tok := token(t, "alice")
		f.chat(t, tok, "t1", "u1", "plan a trip to lisbon")
		f.stack.Titles.Wait()
		if got := f.title(t, tok, "t1"); got != "Plan a trip to lisbon" {
			t.Fatalf("generated title %q", got)
		}
		f.rename(t, tok, "t1", "Mine")
		f.chat(t, tok, "t1", "u2", "more please")
		f.stack.Titles.Wait()
		if got := f.title(t, tok, "t1"); got != "Mine" {
			t.Fatalf("title %q, want the owner's", got)
		}
	})
}

// A failing title model changes nothing the client sees: the reply streams and is stored as without titles, and
// the thread keeps its provisional title.
func TestFailingTitleModel(t *testing.T) {
	t.Parallel()
	m := &titleModel{fail: true}
	f := titleSetup(t, m)
	tok := token(t, "alice")
	body := f.chat(t, tok, "t1", "u1", "hello world")
	f.stack.Titles.Wait()
	if n := m.requests.Load(); n != 1 {
		t.Fatalf("%d title requests, want 1", n)
	}
	if strings.Contains(body, "title") {
		t.Errorf("the stream mentions a title: %s", body)
	}
	if got := f.title(t, tok, "t1"); got != "hello world" {
		t.Errorf("title %q, want the provisional %q", got, "hello world")
	}
	var view struct {
		Messages []agent.Message
	}
	json.Unmarshal(readAll(t, f.do(t, "GET", "/threads/t1", tok, nil)), &view)
	if len(view.Messages) != 2 || view.Messages[1].Text() != "You said: hello world" || view.Messages[1].Meta().Status != agent.MessageCompleted {
		t.Fatalf("messages %+v", view.Messages)
	}
}

// AGENT_TITLES=off: no title model is asked, and the thread keeps its first message as title.
func TestTitlesOff(t *testing.T) {
	t.Parallel()
	m := &titleModel{}
	f := titleSetup(t, m, func(c *config.Config) { c.TitlesOff = true })
	tok := token(t, "alice")
	f.chat(t, tok, "t1", "u1", "hello world")
	f.stack.Titles.Wait() // nil: returns at once
	if f.stack.Titles != nil || m.requests.Load() != 0 {
		t.Fatalf("titles %v, %d title requests; want none", f.stack.Titles, m.requests.Load())
	}
	if got := f.title(t, tok, "t1"); got != "hello world" {
		t.Errorf("title %q, want the first message", got)
	}
}

// A regenerated first reply of a thread that has its title asks for no other: the engine sees the title is no
// longer the first message's.
func TestNoTitleForARegeneratedFirstReply(t *testing.T) {
	t.Parallel()
	m := &titleModel{}
	f := titleSetup(t, m)
	tok := token(t, "alice")
	f.chat(t, tok, "t1", "u1", "plan a trip to lisbon")
	f.stack.Titles.Wait()
	var view struct{ Messages []agent.Message }
	if err := json.Unmarshal(readAll(t, f.do(t, "GET", "/threads/t1", tok, nil)), &view); err != nil || len(view.Messages) != 2 {
		t.Fatalf("thread view %+v, %v", view, err)
	}
	resp := f.do(t, "POST", "/chat", tok, map[string]any{"id": "t1", "trigger": "regenerate-message",
		"messageId": view.Messages[1].ID, "messages": []any{view.Messages[0]}})
	if body := string(readAll(t, resp)); resp.StatusCode != 200 || !strings.Contains(body, `"status":"completed"`) {
		t.Fatalf("regenerate: %d %s", resp.StatusCode, body)
	}
	f.stack.Titles.Wait()
	if n := m.requests.Load(); n != 1 {
		t.Errorf("%d title requests after a regenerate, want 1", n)
	}
	if got := f.title(t, tok, "t1"); got != "Plan a trip to lisbon" {
		t.Errorf("title %q", got)
	}
}
