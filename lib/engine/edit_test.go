package engine_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// editWriteFails fails, for good, every write of the edited user message (the process died as it was sent, or
// the store refuses it), and counts the drops of the messages after it.
type editWriteFails struct {
	agent.Store
	id string
}

func (s editWriteFails) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if w.Message.ID == s.id && w.Message.Role == agent.RoleUser {
		return agent.E(agent.KindInternal, agent.CodeInternal, "injected: the edited message's write failed for good")
	}
	return s.Store.PutMessage(ctx, w)
}

// visibleTexts is what a reader of the thread sees: each visible message's id and text.
func (f *fixture) visibleTexts(t *testing.T, thread string) []string {
	t.Helper()
	v, err := f.stack.Threads.Get(context.Background(), "alice", thread)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range v.Messages {
		out = append(out, m.ID+":"+m.Text())
	}
	return out
}

// An edit commits in one write on the edited message (fence D, REVIEW D14): dropping the messages after it is
// cleanup. An edit whose write fails for good changes nothing a reader sees (before: the later messages were
// dropped first, so the thread lost its tail and kept the old text: sim seed 721's root); an edit whose write
// landed while its cleanup failed for good shows the edited message and nothing of the old tail, to a reader
// of the thread and to the next turn's model.
func TestEditCommitsInOneWrite(t *testing.T) {
	t.Parallel()
	t.Run("edit write fails", func(t *testing.T) {
		t.Parallel()
		var failing atomic.Bool
		f := setup(t, withStore(func(s agent.Store) agent.Store {
			return storeSwitch{Store: s, alt: editWriteFails{Store: s, id: "u1"}, on: &failing}
		}))
		f.turn(t, "th", "u1", "first")
		f.turn(t, "th", "u2", "second")
		before := f.visibleTexts(t, "th")
		failing.Store(true)
		edit := engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u1", "edited"), MessageID: "u1"}
		if tr, err := f.eng.Begin(context.Background(), edit); err == nil {
			var sb strings.Builder
			tr.Stream(context.Background(), &sb)
		}
		failing.Store(false)
		if got := f.visibleTexts(t, "th"); !slices.Equal(got, before) {
			t.Fatalf("after a failed edit the thread shows %q, want it unchanged: %q", got, before)
		}
		f.idle(t, "th")
	})
	t.Run("cleanup fails", func(t *testing.T) {
		t.Parallel()
		fs := newFaulty(func(string, int, bool) bool { return false })
		var failing atomic.Bool
		f := setup(t, withStore(func(s agent.Store) agent.Store {
			fs.Store = s
			return storeSwitch{Store: s, alt: deleteFails{fs}, on: &failing}
		}))
		f.turn(t, "th", "u1", "first")
		f.turn(t, "th", "u2", "second")
		failing.Store(true)
		edit := engine.Request{Owner: "alice", ThreadID: "th", Kind: engine.TurnSubmit, Message: userMsg("u1", "edited"), MessageID: "u1"}
		run, _ := f.run(t, edit)
		failing.Store(false)
		if run.Status != agent.RunCompleted {
			t.Fatalf("edit run %s %+v", run.Status, run.Error)
		}
		got := f.visibleTexts(t, "th")
		if len(got) != 2 || got[0] != "u1:edited" || !strings.Contains(got[1], "edited") {
			t.Fatalf("after an edit whose cleanup failed the thread shows %q, want the edited message and its reply", got)
		}
		// The next turn's model sees the edited thread only (the offline model answers the newest text; the
		// transcript it got is checked by its validation, and the reader above shows the stored order).
		next, chunks := f.turn(t, "th", "u3", "third")
		if next.Status != agent.RunCompleted || !strings.Contains(textOf(chunks), "third") {
			t.Fatalf("next turn %s: %q", next.Status, textOf(chunks))
		}
		got = f.visibleTexts(t, "th")
		if len(got) != 4 || got[0] != "u1:edited" || got[2] != "u3:third" {
			t.Fatalf("after the next turn the thread shows %q", got)
		}
		f.idle(t, "th")
	})
}

// storeSwitch sends every call to alt while *on is set, else to Store (the set-up turns run unfaulted).
type storeSwitch struct {
	agent.Store
	alt agent.Store
	on  *atomic.Bool
}

func (s storeSwitch) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	if s.on.Load() {
		return s.alt.PutMessage(ctx, w)
	}
	return s.Store.PutMessage(ctx, w)
}

func (s storeSwitch) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	if s.on.Load() {
		return s.alt.DeleteMessage(ctx, threadID, id, f)
	}
	return s.Store.DeleteMessage(ctx, threadID, id, f)
}
