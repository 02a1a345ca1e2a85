package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// readMeter counts what the engine reads of a thread's messages.
type readMeter struct {
	agent.Store
	lists, pages, pageItems, gets atomic.Int64
}

func (m *readMeter) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	m.lists.Add(1)
	return m.Store.ListMessages(ctx, threadID)
}

func (m *readMeter) ListMessagesPage(ctx context.Context, threadID string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	m.pages.Add(1)
	page, err := m.Store.ListMessagesPage(ctx, threadID, p)
	m.pageItems.Add(int64(len(page.Items)))
	return page, err
}

func (m *readMeter) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	m.gets.Add(1)
	return m.Store.GetMessage(ctx, threadID, id)
}

func (m *readMeter) reset() {
	m.lists.Store(0)
	m.pages.Store(0)
	m.pageItems.Store(0)
	m.gets.Store(0)
}

// seedThread writes pairs user/assistant turns into thread (created for alice) through the store, the way runs
// write them: one claim reserves the positions, every message is written final under its fence. Each assistant
// reply carries a tool call whose output is outputBytes long. It returns the messages in thread order.
func seedThread(t *testing.T, s agent.Store, thread string, pairs, outputBytes int) []agent.Message {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: thread, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: thread, Owner: "alice", RunID: "run_seed_" + thread, Trigger: agent.TriggerUser,
		AssistantMessageID: "seed", Reserve: 2 * pairs, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	output, _ := json.Marshal(map[string]string{"notes": strings.Repeat("x", outputBytes)})
	var msgs []agent.Message
	for i := range pairs {
		md, _ := json.Marshal(agent.MessageMetadata{RunID: res.Run.ID, Status: agent.MessageCompleted})
		user := *userMsg(fmt.Sprintf("u-%04d", i), fmt.Sprintf("question %d", i))
		reply := agent.Message{ID: fmt.Sprintf("a-%04d", i), Role: agent.RoleAssistant, Metadata: md, Parts: []json.RawMessage{
			agent.EncodePart(agent.Part{Type: "step-start"}),
			agent.EncodePart(agent.Part{Type: "tool-list_notes", ToolCallID: fmt.Sprintf("call-%04d", i), State: agent.StateOutputAvailable,
				Input: json.RawMessage(`{}`), Output: output}),
			agent.EncodePart(agent.Part{Type: "text", Text: fmt.Sprintf("answer %d", i)}),
		}}
		for j, m := range []agent.Message{user, reply} {
			w := agent.MessageWrite{ThreadID: thread, Seq: res.Run.FirstSeq + int64(2*i+j), Message: m, Fence: res.Run.Fence(), Final: true, Now: now}
			if err := s.PutMessage(ctx, w); err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
	}
	run := res.Run
	run.Status, run.FinishedAt, run.UpdatedAt = agent.RunCompleted, now, now
	if err := s.FinishRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// A turn reads a window of its thread bounded by the token budget, never the whole thread: the same pages and
// messages on a thread of 416 messages as on one of 96, and no full read (the two lengths are multiples of
// DefaultWindowAnchor: a window begins on a block of positions, so its reads depend on where the thread's length
// falls in a block, by one page of fewer than DefaultWindowAnchor messages, never on the length). What planning looks up by id (a
// re-post of an old message, an edit far behind the window) still works, and an edit still drops every message
// after the edited one, including those the window never showed.
func TestBoundedReads(t *testing.T) {
	t.Parallel()
	meter := &readMeter{}
	f := setup(t, withStore(func(s agent.Store) agent.Store { meter.Store = s; return meter }))
	// Each seeded reply costs ~1,000 tokens (a 4 KB tool output): the budget is met after some 10 messages.
	eng := engineWith(t, f, func(c *engine.Config) { c.Transcript.BudgetTokens = 5_000 })
	begin := func(t *testing.T, req engine.Request) (agent.Run, error) {
		t.Helper()
		tr, err := eng.Begin(context.Background(), req)
		if err != nil {
			return agent.Run{}, err
		}
		return tr.Stream(context.Background(), &strings.Builder{}), nil
	}
	type reads struct{ lists, pages, items int64 }
	measure := func(t *testing.T, req engine.Request) (reads, error) {
		t.Helper()
		meter.reset()
		run, err := begin(t, req)
		if err == nil && run.Status != agent.RunCompleted {
			t.Fatalf("run %s: %s %+v", run.ID, run.Status, run.Error)
		}
		return reads{meter.lists.Load(), meter.pages.Load(), meter.pageItems.Load()}, err
	}
	// Tests share one meter: run them one after the other.
	short := seedThread(t, f.store, "short", 48, 4_000)
	long := seedThread(t, f.store, "long", 208, 4_000)

	t.Run("new message", func(t *testing.T) {
		a, err := measure(t, submit("short", "new-1", "hello"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := measure(t, submit("long", "new-1", "hello"))
		if err != nil {
			t.Fatal(err)
		}
		if a != b || b.lists != 0 || b.items >= 50 {
			t.Fatalf("reads: 96-message thread %+v, 416-message thread %+v; want equal, no full read, under 50 messages", a, b)
		}
	})
	t.Run("re-post of an old message", func(t *testing.T) {
		for _, c := range []struct{ thread, id string }{
			{"short", short[2].ID},         // an answered user message behind the window
			{"long", long[2].ID},           // the same, further behind
			{"long", long[3].ID},           // an assistant message's id
			{"long", long[len(long)-1].ID}, // one in the window
		} {
			thread, id := c.thread, c.id
			r, err := measure(t, submit(thread, id, "question 1"))
			if !errors.Is(err, agent.ErrDuplicateMessage) {
				t.Fatalf("re-post of %s: %v, want duplicate_message", id, err)
			}
			if r.lists != 0 || r.items >= 50 {
				t.Fatalf("re-post of %s read %+v", id, r)
			}
		}
	})
	t.Run("edit far behind the window", func(t *testing.T) {
		before := f.messages(t, "long")
		edited := long[20] // u-0010: 380 messages and the new turn's after it
		req := submit("long", edited.ID, "question ten, again")
		req.MessageID = edited.ID
		r, err := measure(t, req)
		if err != nil {
			t.Fatal(err)
		}
		after := f.messages(t, "long")
		if len(after) != 22 {
			t.Fatalf("after the edit: %d messages (of %d), want the 20 before the edited one, it, and the reply", len(after), len(before))
		}
		for i := range 20 {
			if after[i].ID != before[i].ID {
				t.Fatalf("message %d is %s, want %s", i, after[i].ID, before[i].ID)
			}
		}
		if after[20].ID != edited.ID || after[21].Role != agent.RoleAssistant || !strings.Contains(string(after[20].Parts[0]), "again") {
			t.Fatalf("after the edit: %s, %s", after[20].ID, after[21].ID)
		}
		if r.lists != 0 {
			t.Fatalf("the edit read the whole thread: %+v", r)
		}
	})
	t.Run("regenerate", func(t *testing.T) {
		r, err := measure(t, engine.Request{Owner: "alice", ThreadID: "short", Kind: engine.TurnRegenerate})
		if err != nil {
			t.Fatal(err)
		}
		if r.lists != 0 || r.items >= 50 {
			t.Fatalf("regenerate read %+v", r)
		}
		msgs := f.messages(t, "short")
		if n := len(msgs); n != 98 || msgs[n-2].ID != "new-1" || msgs[n-1].Role != agent.RoleAssistant {
			t.Fatalf("after the regenerate: %d messages", n)
		}
	})
}

// slowDeletes takes delay of its clock over every message delete, as a loaded store does.
type slowDeletes struct {
	agent.Store
	clock *manualClock
	delay time.Duration
}

func (s *slowDeletes) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	err := s.Store.DeleteMessage(ctx, threadID, id, f)
	s.clock.add(s.delay)
	return err
}

// An edit far back drops every later message, one fenced write each, before the run's heartbeats start: taking
// longer than half of staleAfter, it must hold its claim itself rather than stop as "in doubt" half way (which
// left the thread cut and the edit unanswered).
func TestLongEditKeepsItsClaim(t *testing.T) {
	t.Parallel()
	// The deletes take the time, on the clock: 120 drops of StaleAfter/4 each, so the edit passes its claim's
	// horizon (StaleAfter/2) on its third drop unless it holds the claim itself; the clock stands still otherwise,
	// so no load makes the run doubt its claim.
	clock := newManualClock()
	slow := &slowDeletes{clock: clock, delay: fixtureStaleAfter / 4}
	f := setup(t, withClock(clock), withStore(func(s agent.Store) agent.Store { slow.Store = s; return slow }))
	msgs := seedThread(t, f.store, "cut", 60, 100)
	req := submit("cut", msgs[0].ID, "from the start, again")
	req.MessageID = msgs[0].ID
	tr, err := f.eng.Begin(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if run := tr.Stream(context.Background(), &strings.Builder{}); run.Status != agent.RunCompleted {
		t.Fatalf("run %s: %s %+v", run.ID, run.Status, run.Error)
	}
	if after := f.messages(t, "cut"); len(after) != 2 || after[0].ID != msgs[0].ID {
		t.Fatalf("after the edit: %d messages, want the edited one and its reply", len(after))
	}
}
