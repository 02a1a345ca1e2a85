package engine_test

import (
	"context"
	"io"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// Every request of a thread carries the thread id as its cache key (OpenAI's prompt_cache_key), across turns.
func TestCacheKeyIsTheThread(t *testing.T) {
	t.Parallel()
	f := setup(t)
	model := &scriptedModel{}
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, f.eng.Config())
	for _, id := range []string{"u1", "u2"} {
		tr, err := eng.Begin(context.Background(), submit("th-cache", id, "hello"))
		if err != nil {
			t.Fatal(err)
		}
		if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
			t.Fatalf("run %s %+v", run.Status, run.Error)
		}
	}
	reqs := model.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	for i, r := range reqs {
		if r.CacheKey != "th-cache" {
			t.Errorf("request %d: cache key %q, want the thread id", i, r.CacheKey)
		}
	}
}
