package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// fullStore refuses every write of a message into the thread the way DynamoDB refuses a partition at its local
// index's 10 GB cap (lib/dynamo maps ItemCollectionSizeLimitExceededException to this error).
type fullStore struct{ agent.Store }

func (fullStore) PutMessage(context.Context, agent.MessageWrite) error {
	return agent.Wrap(errors.New("ItemCollectionSizeLimitExceededException: Item collection size limit exceeded"),
		agent.KindTooLarge, agent.CodeThreadTooLarge, "this thread is full (it holds as much as one thread can); start a new thread")
}

// REVIEW D12: a thread the store can hold no more of ends the turn with thread_too_large and its safe message
// (start a new thread), not persist_failed's "please send it again", which can never pass.
func TestFullThreadSaysSo(t *testing.T) {
	t.Parallel()
	f := setup(t, withStore(func(s agent.Store) agent.Store { return fullStore{s} }))
	run, client := f.run(t, submit("th", "u1", "hello there"))
	if run.Status != agent.RunFailed || run.Error == nil || run.Error.Code != agent.CodeThreadTooLarge {
		t.Fatalf("run %+v (error %+v), want failed with thread_too_large", run, run.Error)
	}
	chunks := parseSSE(t, client)
	found := false
	for _, c := range chunks {
		if c["type"] == "error" {
			found = true
			if text, _ := c["errorText"].(string); text != run.Error.Message || text == "" {
				t.Fatalf("error chunk %v, want the run's message %q", c, run.Error.Message)
			}
		}
	}
	if !found {
		t.Fatalf("no error chunk: %v", types(chunks))
	}
	f.idle(t, "th")
}
