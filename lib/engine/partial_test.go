package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// Issue 20 item 4: a model that fails after its reply began (the connection cut, the provider's error event)
// leaves the partial reply stored, marked failed, and ends the run with agent.CodeModelInterrupted, in the
// stream's error chunk, its data-run-error part, the stored reply's metadata and the run; the model is not
// asked again within the run. A regenerate then answers the message anew.
func TestPartialReplyInterrupted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, text string }{
		{"connection cut after text", "/drop 3"},
		{"provider error event after text", "/error 500 after 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			run, chunks := f.turn(t, "th", "u1", c.text)
			if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeModelInterrupted {
				t.Fatalf("run = %s %+v, want failed with %s", run.Status, run.Error, agent.CodeModelInterrupted)
			}
			if got := f.model.Requests(); got != 1 {
				t.Errorf("model requests = %d, want 1 (no retry once text began)", got)
			}
			if got := textOf(chunks); got != "word1 word2 word3" {
				t.Errorf("streamed text = %q", got)
			}
			var errText, partCode string
			for _, ch := range chunks {
				switch ch["type"] {
				case "error":
					errText, _ = ch["errorText"].(string)
				case agent.RunErrorPart:
					data, _ := ch["data"].(map[string]any)
					partCode, _ = data["code"].(string)
				}
			}
			if errText == "" || partCode != agent.CodeModelInterrupted {
				t.Errorf("stream: error chunk %q, %s part code %q; want an error and %s", errText, agent.RunErrorPart, partCode, agent.CodeModelInterrupted)
			}
			if ts := types(chunks); ts[len(ts)-1] != "finish" {
				t.Errorf("stream must end with finish: %v", ts)
			}
			f.idle(t, "th")
			msgs := f.messages(t, "th")
			if len(msgs) != 2 {
				t.Fatalf("stored %d messages, want 2", len(msgs))
			}
			reply := msgs[1]
			md := reply.Meta()
			if reply.Text() != "word1 word2 word3" || md.Status != agent.MessageFailed || md.Error == nil || md.Error.Code != agent.CodeModelInterrupted {
				raw, _ := json.Marshal(reply)
				t.Fatalf("stored reply = %s; want the partial text, failed, with %s", raw, agent.CodeModelInterrupted)
			}
			stored, err := f.stack.SQLite.GetRun(context.Background(), "th", run.ID)
			if err != nil || stored.Error == nil || stored.Error.Code != agent.CodeModelInterrupted {
				t.Fatalf("stored run = %+v, %v", stored, err)
			}

			// The client regenerates: the model is asked again and a new reply answers the message.
			tr, err := f.eng.Begin(context.Background(), engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnRegenerate, MessageID: reply.ID})
			if err != nil {
				t.Fatalf("regenerate: %v", err)
			}
			again := tr.Stream(context.Background(), discard{})
			if again.Error != nil && again.Error.Code == agent.CodeNothingToRegen {
				t.Fatalf("regenerate refused: %+v", again.Error)
			}
			if f.model.Requests() != 2 {
				t.Errorf("model requests after the regenerate = %d, want 2", f.model.Requests())
			}
			shown := agent.Shown(f.messages(t, "th"))
			if last := shown[len(shown)-1]; last.ID != again.AssistantMessageID || !strings.Contains(last.Text(), "word1") {
				t.Errorf("after the regenerate readers see %s last (%q), want the new reply %s", last.ID, last.Text(), again.AssistantMessageID)
			}
		})
	}
}
