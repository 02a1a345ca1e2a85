package engine_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
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

// A run's reply keeps the provider's scale (agent.MessageMetadata.ContextScale) and the next run prunes with it
// from its first request: the scripted model counts every request as 1 token (a scale of 1/2, the floor), so the
// second turn's history fits its budget at that scale, where chars/4 alone would drop the first turn.
func TestContextScaleCarriesOver(t *testing.T) {
	t.Parallel()
	f := setup(t)
	model := &scriptedModel{}
	cfg := f.eng.Config()
	cfg.Transcript.BudgetTokens = 1000
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Reaper: f.stack.Reaper, Signer: f.stack.Signer, Clock: f.clock}, cfg)
	long := strings.Repeat("word ", 320) // 1,600 chars: 400 tokens at chars/4 (the fixed tokens are some 300 more)
	for _, id := range []string{"u1", "u2"} {
		tr, err := eng.Begin(context.Background(), submit("th-scale", id, long+id))
		if err != nil {
			t.Fatal(err)
		}
		if run := tr.Stream(context.Background(), io.Discard); run.Status != agent.RunCompleted {
			t.Fatalf("run %s %+v", run.Status, run.Error)
		}
	}
	msgs := f.messages(t, "th-scale")
	var md agent.MessageMetadata
	if err := json.Unmarshal(msgs[1].Metadata, &md); err != nil || md.ContextScale != 0.5 {
		t.Fatalf("first reply's metadata %s: want contextScale 0.5", msgs[1].Metadata)
	}
	reqs := model.requests()
	if first := reqs[1].Messages[0]; first.Role != "user" || !strings.HasSuffix(first.Text, "u1") {
		t.Fatalf("the second turn's request begins with %.40q: the first turn was pruned as if at scale 1", first.Text)
	}
}
