package threads_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/threads"
)

// readLimits records the limit of every message page the service asks the store for.
type readLimits struct {
	*sqlite.Store
	mu     sync.Mutex
	limits []int
}

func (r *readLimits) ListMessagesPage(ctx context.Context, id string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	r.mu.Lock()
	r.limits = append(r.limits, p.Limit)
	r.mu.Unlock()
	return r.Store.ListMessagesPage(ctx, id, p)
}

// putMessages writes one message per size (a text part of that many bytes), ids prefix-0, prefix-1, ..., at the
// end of alice's thread th, the way a run does.
func putMessages(t *testing.T, s agent.Store, th, prefix string, sizes ...int) []string {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: th, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: th, Owner: "alice", RunID: "run_" + prefix, Trigger: agent.TriggerUser,
		AssistantMessageID: prefix + "-reply", Reserve: len(sizes), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, n := range sizes {
		m := agent.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Role: agent.RoleUser,
			Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: strings.Repeat("x", n)})}}
		if err := s.PutMessage(ctx, agent.MessageWrite{ThreadID: th, Seq: res.Run.FirstSeq + int64(i), Message: m,
			Fence: res.Run.Fence(), Final: true, Now: now}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
	}
	run := res.Run
	run.Status, run.FinishedAt, run.UpdatedAt = agent.RunCompleted, now, now
	if err := s.FinishRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	return ids
}

func encodedBytes(msgs []agent.Message) int {
	b, _ := json.Marshal(msgs)
	return len(b)
}

// REVIEW S12: a page of messages is bounded by bytes as well as by count. With 300 KB messages the default page
// (100 messages) ends early, with hasMore, once it holds DefaultPageBytes; a single message over the budget is a
// page alone; walking on reads every message once; and the store is read in bounded reads, so a page of large
// messages never holds a whole page's count of them in memory.
func TestMessagePagesBoundedByBytes(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	store := &readLimits{Store: st}
	svc := threads.New(threads.Deps{Store: store, Clock: agent.SystemClock{}}, threads.Config{})
	ctx := context.Background()

	sizes := make([]int, 30)
	for i := range sizes {
		sizes[i] = 300_000
	}
	sizes[20] = threads.DefaultPageBytes + 1000 // one message over the budget on its own
	all := putMessages(t, st, "th", "m", sizes...)

	for _, newest := range []bool{false, true} {
		var pages [][]string
		q := threads.PageQuery{Newest: newest}
		for range 100 {
			v, err := svc.GetPage(ctx, "alice", "th", q)
			if err != nil {
				t.Fatal(err)
			}
			if n := encodedBytes(v.Messages); len(v.Messages) > 1 && n > threads.DefaultPageBytes {
				t.Fatalf("newest %v: a page of %d messages, %d bytes: over the budget of %d", newest, len(v.Messages), n, threads.DefaultPageBytes)
			}
			var ids []string
			for _, m := range v.Messages {
				ids = append(ids, m.ID)
			}
			if slices.Contains(ids, "m-20") && len(ids) != 1 {
				t.Fatalf("newest %v: the message over the budget shares a page: %v", newest, ids)
			}
			if len(ids) == 0 {
				t.Fatalf("newest %v: an empty page, page %+v", newest, v.Page)
			}
			pages = append(pages, ids)
			if !v.Page.HasMore {
				break
			}
			q = threads.PageQuery{Cursor: v.Page.NextCursor}
		}
		if len(pages) < 3 {
			t.Fatalf("newest %v: %d pages, want the byte budget to end pages early", newest, len(pages))
		}
		if newest {
			slices.Reverse(pages)
		}
		if got := slices.Concat(pages...); !slices.Equal(got, all) {
			t.Fatalf("newest %v: walked %v, want %v", newest, got, all)
		}
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	for _, n := range store.limits {
		if n > threads.PageRead {
			t.Fatalf("the store was asked for %d messages in one read (reads %v), want at most %d", n, store.limits, threads.PageRead)
		}
	}
}
