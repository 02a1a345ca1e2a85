package reaper_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// Issue 16 item 11: the failed reply the reaper stores for a run that died before its first word has a part a
// useChat app renders, not only metadata.error: a data part (agent.RunErrorPart) with the run's stable code and
// safe message. It is a UIMessage part the AI SDK itself builds from its chunk (every supported version), the
// engine still reads past the reply (agent.Visible: re-posting the message runs again) and the transcript sends
// the model nothing of it.
func TestEmptyReapHasAVisiblePart(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	run, user := reapEmptyRun(t, f)
	rec, err := f.store.GetMessage(ctx, "th", run.AssistantMessageID)
	if err != nil {
		t.Fatal(err)
	}
	reply := rec.Message
	if len(reply.Parts) != 1 {
		t.Fatalf("failed reply parts = %s, want one part that shows the error", reply.Parts)
	}
	var part struct {
		Type string         `json:"type"`
		ID   string         `json:"id"`
		Data agent.RunError `json:"data"`
	}
	if err := json.Unmarshal(reply.Parts[0], &part); err != nil {
		t.Fatal(err)
	}
	md := reply.Meta()
	if part.Type != agent.RunErrorPart || part.ID != run.ID || md.Error == nil || part.Data != *md.Error || part.Data.Code != agent.CodeStale ||
		part.Data.Message == "" {
		t.Fatalf("failed reply part = %s, want %s of %s with the metadata's error %+v", reply.Parts[0], agent.RunErrorPart, run.ID, md.Error)
	}
	if v := agent.Visible([]agent.Message{user, reply}); len(v) != 1 {
		t.Fatalf("the engine's view = %d messages, want the user message alone (a re-post runs again)", len(v))
	}
	if s := agent.Shown([]agent.Message{user, reply}); len(s) != 2 {
		t.Fatalf("readers see %d messages, want the user message and its failed reply", len(s))
	}

	// The AI SDK's own client builds exactly this part from the data chunk of the same type, id and data.
	body, err := uistream.Frames(uistream.Start{MessageID: reply.ID},
		uistream.Data{Type: part.Type, ID: part.ID, Data: mustJSON(t, part.Data)},
		uistream.Finish{FinishReason: agent.FinishError, Metadata: reply.Metadata})
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range aisdktest.CheckStreams(t, uistream.AppendDone(body)) {
		if len(got.Message.Parts) != 1 || !sameJSON(t, got.Message.Parts[0], reply.Parts[0]) {
			t.Errorf("ai@%s (%s) builds parts %s, the store holds %s", got.SDK, got.SDKVersion, got.Message.Parts, reply.Parts)
		}
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}
