package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

type accepted struct {
	ThreadID  string `json:"threadId"`
	RunID     string `json:"runId"`
	MessageID string `json:"messageId"`
	Status    string `json:"status"`
}

func backgroundBody(thread, msgID, text string) map[string]any {
	b := chatBody(thread, msgID, text)
	b["background"] = true
	return b
}

func postBackground(t *testing.T, f *fixture, tok, thread, msgID, text string) accepted {
	t.Helper()
	resp := f.do(t, "POST", "/chat", tok, backgroundBody(thread, msgID, text))
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("background POST: %d %s, want 202 JSON", resp.StatusCode, body)
	}
	var a accepted
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	if a.ThreadID != thread || a.RunID == "" || a.MessageID == "" || a.Status != string(agent.RunRunning) {
		t.Fatalf("background POST answered %s, want the thread, run and reply ids, running", body)
	}
	return a
}

// A background run (POST /chat with background: true) on both stores: 202 at once with its ids; admitted as any
// run (the user's run limit, the thread's claim); attached to with GET /chat/{id}/stream (the replay from its
// start, through the AI SDK's parsers), stopped with the stop route, and read like any run.
func TestBackgroundRunAttachedAndStopped(t *testing.T) {
	t.Parallel()
	for _, store := range limitBackends() {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{}) // the model holds its reply: the run stays live until stopped
			f := limitStackWith(t, store, func(c *config.Config) { c.MaxActiveRunsPerUser = 2 },
				func(_ *devserver.Options, m *http.Handler) { *m = heldModel(*m, release) })
			t.Cleanup(func() { close(release) }) // first: the held runs end before the stack closes
			tok := token(t, "alice")
			a := postBackground(t, f, tok, "bg-stop", "u1", "hello background")

			// Admitted as any run: the thread is claimed, and the user's runs count (two at most here).
			if resp := f.do(t, "POST", "/chat", tok, chatBody("bg-stop", "u2", "again")); resp.StatusCode != http.StatusConflict {
				t.Fatalf("a second run on the thread: %d %s, want 409", resp.StatusCode, readAll(t, resp))
			}
			postBackground(t, f, tok, "bg-other", "u1", "another")
			resp := f.do(t, "POST", "/chat", tok, backgroundBody("bg-third", "u1", "a third"))
			if resp.StatusCode != http.StatusTooManyRequests || errorCode(t, resp) != agent.CodeTooManyRuns {
				t.Fatalf("a second background run of the user: %d, want 429 too_many_runs", resp.StatusCode)
			}

			// Attach, then stop: the attached stream ends with the run, canceled.
			stream := f.do(t, "GET", "/chat/bg-stop/stream", tok, nil)
			if stream.StatusCode != http.StatusOK {
				t.Fatalf("attach: %d %s", stream.StatusCode, readAll(t, stream))
			}
			if resp := f.do(t, "POST", "/threads/bg-stop/stop", tok, nil); resp.StatusCode != http.StatusAccepted {
				t.Fatalf("stop: %d %s", resp.StatusCode, readAll(t, resp))
			}
			body := readAll(t, stream)
			parsed := aisdktest.CheckStreams(t, body)
			for _, p := range parsed {
				if p.Message.ID != a.MessageID || p.FinishReason == "" {
					t.Fatalf("ai@%s read message %s finishing %q, want %s with a finish", p.SDK, p.Message.ID, p.FinishReason, a.MessageID)
				}
			}
			var runs struct {
				Runs []agent.Run `json:"runs"`
			}
			if err := json.Unmarshal(readAll(t, f.do(t, "GET", "/threads/bg-stop/runs", tok, nil)), &runs); err != nil {
				t.Fatal(err)
			}
			if len(runs.Runs) != 1 || runs.Runs[0].ID != a.RunID || runs.Runs[0].Status != agent.RunCanceled {
				t.Fatalf("runs = %+v, want run %s canceled", runs.Runs, a.RunID)
			}
		})
	}
}

// A background run that nobody attaches to runs to its end; the thread holds its reply, and a late attach
// answers 204 (nothing to resume).
func TestBackgroundRunCompletes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tok := token(t, "alice")
	a := postBackground(t, f, tok, "bg-done", "u1", "hello background")
	f.stack.Launcher.Wait()
	msg, err := f.store.GetMessage(t.Context(), "bg-done", a.MessageID)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Message.Meta().Status != agent.MessageCompleted || msg.Message.Text() != "You said: hello background" {
		t.Fatalf("reply = %s %q, want completed", msg.Message.Meta().Status, msg.Message.Text())
	}
	if resp := f.do(t, "GET", "/chat/bg-done/stream", tok, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("attach after the end: %d, want 204", resp.StatusCode)
	}
}
