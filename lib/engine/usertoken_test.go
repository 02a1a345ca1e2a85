package engine_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

// Issue 19: a tool receives the user's token only in the turn the user's request runs. The submit's call gets the
// request's UserToken; a delivery pass answering a queued message (no request of the user) runs the same tool
// with none.
func TestUserTokenOnlyInTheUsersTurn(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]string{} // tool call id -> token
	whoami := agent.Tool{Name: "whoami", Description: "Who is calling.", InputSchema: json.RawMessage(`{"type":"object"}`),
		Kind: agent.ToolServer, Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			mu.Lock()
			defer mu.Unlock()
			seen[inv.MessageID+"/"+inv.ToolCallID] = inv.UserToken
			return json.RawMessage(`"ok"`), nil
		}}
	f := setup(t, withTools(whoami), withConfig(func(c *config.Config) { c.MaxQueued = 10 }))
	req := submit("th", "u0", "/tool whoami {}")
	req.UserToken = "user.jwt"
	if run, _ := f.run(t, req); run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	mu.Lock()
	if len(seen) != 1 {
		t.Fatalf("calls %v, want 1", seen)
	}
	for _, tok := range seen {
		if tok != "user.jwt" {
			t.Errorf("the user's turn gave the tool %q, want the request's token", tok)
		}
	}
	clear(seen)
	mu.Unlock()

	q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Owner: "alice", Status: agent.QueueQueued, CreatedAt: time.Now().UTC(),
		Message: *userMsg("q1", "/tool whoami {}")}
	if _, _, err := f.store.Enqueue(context.Background(), q, 0); err != nil {
		t.Fatal(err)
	}
	deliverAll(t, f, "th")
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("delivery pass calls %v, want 1", seen)
	}
	for _, tok := range seen {
		if tok != "" {
			t.Errorf("a delivery pass gave the tool %q, want no token", tok)
		}
	}
}
