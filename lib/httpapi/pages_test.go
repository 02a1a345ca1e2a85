package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// appendMessages writes n user/assistant messages at the end of thread (alice's; created when missing) the way
// a run does: one claim reserves the positions, each message is written final under its fence. The ids are
// prefix-0, prefix-1, ...
func appendMessages(t *testing.T, s agent.Store, thread, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: thread, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimRun(ctx, agent.ClaimRequest{ThreadID: thread, Owner: "alice", RunID: "run_" + prefix, Trigger: agent.TriggerUser,
		AssistantMessageID: prefix + "-reply", Reserve: n, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		role := agent.RoleUser
		if i%2 == 1 {
			role = agent.RoleAssistant
		}
		m := agent.Message{ID: fmt.Sprintf("%s-%d", prefix, i), Role: role,
			Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: fmt.Sprintf("%s %d", prefix, i)})}}
		w := agent.MessageWrite{ThreadID: thread, Seq: res.Run.FirstSeq + int64(i), Message: m, Fence: res.Run.Fence(), Final: true, Now: now}
		if err := s.PutMessage(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	run := res.Run
	run.Status, run.FinishedAt, run.UpdatedAt = agent.RunCompleted, now, now
	if err := s.FinishRun(ctx, run); err != nil {
		t.Fatal(err)
	}
}

// pageView is the part of GET /threads/{id} and /runs that paging reads.
type pageView struct {
	Messages []agent.Message
	Runs     []agent.Run
	Page     struct {
		NextCursor string
		HasMore    bool
	}
}

func (h *hitlStack) page(path string, q url.Values) (int, pageView, string) {
	h.t.Helper()
	resp := h.f.do(h.t, "GET", path+"?"+q.Encode(), token(h.t, "alice"), nil)
	body := readAll(h.t, resp)
	var v pageView
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &v); err != nil {
			h.t.Fatal(err)
		}
	}
	return resp.StatusCode, v, string(body)
}

// walk reads every page of path (messages or runs) and returns the ids in thread order. between runs after
// each page.
func (h *hitlStack) walk(path string, limit int, newest bool, between func()) []string {
	h.t.Helper()
	var pages [][]string
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	if newest {
		q.Set("newest", "true")
	}
	for range 1000 {
		code, v, body := h.page(path, q)
		if code != 200 {
			h.t.Fatalf("GET %s?%s: %d %s", path, q.Encode(), code, body)
		}
		var ids []string
		for _, m := range v.Messages {
			ids = append(ids, m.ID)
		}
		for _, r := range v.Runs {
			ids = append(ids, r.ID)
		}
		if len(ids) > limit || v.Page.HasMore != (v.Page.NextCursor != "") {
			h.t.Fatalf("a page of %d (limit %d), page %+v", len(ids), limit, v.Page)
		}
		pages = append(pages, ids)
		if !v.Page.HasMore {
			break
		}
		if between != nil {
			between()
		}
		q = url.Values{"limit": {fmt.Sprint(limit)}, "cursor": {v.Page.NextCursor}}
	}
	if newest {
		slices.Reverse(pages)
	}
	return slices.Concat(pages...)
}

func (h *hitlStack) storedIDs(thread string) []string {
	h.t.Helper()
	recs, err := h.f.store.ListMessages(context.Background(), thread)
	if err != nil {
		h.t.Fatal(err)
	}
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.Message.ID)
	}
	return ids
}

// GET /threads/{id} and /runs in pages, over HTTP, on both stores: walking every page (from the start, or from
// the newest) returns every message exactly once in thread order, also while messages are appended and after
// some are deleted; runs page the same way; another user's thread is 404 whatever the cursor; a cursor no page
// gave, or a bad limit, is 400 with a stable code.
func TestThreadPages(t *testing.T) {
	t.Parallel()
	for name, store := range storeKinds(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			path := "/threads/paged"
			appendMessages(t, h.f.store, "paged", "a", 23)
			all := h.storedIDs("paged")

			for _, limit := range []int{1, 5, 23, 100} {
				for _, newest := range []bool{false, true} {
					if got := h.walk(path, limit, newest, nil); !slices.Equal(got, all) {
						t.Fatalf("limit %d, newest %v: walked %v, want %v", limit, newest, got, all)
					}
				}
			}
			// A thread that fits one page reads as it always did: every message, and no cursor.
			code, v, _ := h.page(path, nil)
			if code != 200 || len(v.Messages) != 23 || v.Page.HasMore || v.Page.NextCursor != "" {
				t.Fatalf("default page: %d, %d messages, %+v", code, len(v.Messages), v.Page)
			}

			// Appends while paging: from the start, the walk reads them too, once each, in order; from the newest,
			// it reads exactly what was there when it began.
			round := 0
			appendSome := func() { round++; appendMessages(t, h.f.store, "paged", fmt.Sprintf("b%d", round), 3) }
			got := h.walk(path, 6, false, appendSome)
			if want := h.storedIDs("paged"); !slices.Equal(got, want) {
				t.Fatalf("walk from the start while appending: %v, want %v", got, want)
			}
			before := h.storedIDs("paged")
			got = h.walk(path, 6, true, appendSome)
			if !slices.Equal(got, before) {
				t.Fatalf("walk from the newest while appending: %v, want %v", got, before)
			}

			// Deleted messages are left out, a page's worth in a row included.
			ctx := context.Background()
			// Only the claim holder deletes (SQLite checks the claim in the write's own transaction).
			now := time.Now().UTC().Truncate(time.Millisecond)
			claim, err := h.f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: "paged", Owner: "alice", RunID: "deleter",
				Trigger: agent.TriggerUser, AssistantMessageID: "deleter-reply", Now: now})
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range all[3:11] {
				if err := h.f.store.DeleteMessage(ctx, "paged", id, claim.Run.Fence()); err != nil {
					t.Fatal(err)
				}
			}
			done := claim.Run
			done.Status, done.FinishedAt, done.UpdatedAt = agent.RunCompleted, now, now
			if err := h.f.store.FinishRun(ctx, done); err != nil {
				t.Fatal(err)
			}
			want := h.storedIDs("paged")
			for _, newest := range []bool{false, true} {
				if got := h.walk(path, 4, newest, nil); !slices.Equal(got, want) {
					t.Fatalf("after deletes, newest %v: %v, want %v", newest, got, want)
				}
			}

			// Runs: one per append above, and the seeding run.
			runs, err := h.f.store.ListRuns(ctx, "paged")
			if err != nil {
				t.Fatal(err)
			}
			var runIDs []string
			for _, r := range runs {
				runIDs = append(runIDs, r.ID)
			}
			for _, newest := range []bool{false, true} {
				if got := h.walk(path+"/runs", 2, newest, nil); !slices.Equal(got, runIDs) {
					t.Fatalf("runs, newest %v: %v, want %v", newest, got, runIDs)
				}
			}

			// Refusals.
			_, first, _ := h.page(path, url.Values{"limit": {"2"}})
			_, firstRuns, _ := h.page(path+"/runs", url.Values{"limit": {"2"}})
			for _, c := range []struct {
				path string
				q    url.Values
				code string
			}{
				{path, url.Values{"cursor": {"not-a-cursor"}}, agent.CodeInvalidCursor},
				{path, url.Values{"cursor": {firstRuns.Page.NextCursor}}, agent.CodeInvalidCursor}, // a runs cursor
				{path + "/runs", url.Values{"cursor": {first.Page.NextCursor}}, agent.CodeInvalidCursor},
				{path, url.Values{"newest": {"maybe"}}, agent.CodeInvalidCursor},
				{path, url.Values{"limit": {"0"}}, agent.CodeInvalidLimit},
				{path, url.Values{"limit": {"501"}}, agent.CodeInvalidLimit},
				{path + "/runs", url.Values{"limit": {"x"}}, agent.CodeInvalidLimit},
			} {
				resp := h.f.do(t, "GET", c.path+"?"+c.q.Encode(), token(t, "alice"), nil)
				if resp.StatusCode != 400 {
					t.Fatalf("GET %s?%s: %d, want 400", c.path, c.q.Encode(), resp.StatusCode)
				}
				if got := errorCode(t, resp); got != c.code {
					t.Fatalf("GET %s?%s: code %s, want %s", c.path, c.q.Encode(), got, c.code)
				}
			}
			for p, cur := range map[string]string{path: first.Page.NextCursor, path + "/runs": firstRuns.Page.NextCursor} {
				for _, q := range []url.Values{nil, {"cursor": {cur}}, {"newest": {"true"}}} {
					resp := h.f.do(t, "GET", p+"?"+q.Encode(), token(t, "mallory"), nil)
					if resp.StatusCode != 404 {
						t.Fatalf("mallory GET %s?%s: %d, want 404", p, q.Encode(), resp.StatusCode)
					}
					readAll(t, resp)
				}
			}
		})
	}
}

// GET /threads in pages (REVIEW S24), over HTTP, on both stores: a walk by cursor lists every thread of the
// caller once, newest first (ties by id), never another user's; a short list has "page": {"hasMore": false}; a
// cursor no /threads page gave is 400 invalid_cursor.
func TestThreadListPages(t *testing.T) {
	t.Parallel()
	for name, store := range storeKinds(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := startHITL(t, store)
			ctx := context.Background()
			now := time.Now().UTC().Truncate(time.Millisecond)
			var want []string
			for i := range 7 {
				id := fmt.Sprintf("listed-%d", i)
				at := now.Add(time.Duration(i/2) * time.Second) // pairs share an updatedAt
				if _, _, err := h.f.store.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: at, UpdatedAt: at}); err != nil {
					t.Fatal(err)
				}
				want = append([]string{id}, want...)
			}
			if _, _, err := h.f.store.CreateThread(ctx, agent.Thread{ID: "bobs", Owner: "bob", CreatedAt: now, UpdatedAt: now}); err != nil {
				t.Fatal(err)
			}
			type listView struct {
				Threads []agent.Thread
				Page    struct {
					NextCursor string
					HasMore    bool
				}
			}
			list := func(q url.Values) listView {
				t.Helper()
				resp := h.f.do(t, "GET", "/threads?"+q.Encode(), token(t, "alice"), nil)
				body := readAll(t, resp)
				if resp.StatusCode != 200 {
					t.Fatalf("GET /threads?%s: %d %s", q.Encode(), resp.StatusCode, body)
				}
				var v listView
				if err := json.Unmarshal(body, &v); err != nil {
					t.Fatal(err)
				}
				if v.Page.HasMore != (v.Page.NextCursor != "") {
					t.Fatalf("GET /threads?%s: page %+v", q.Encode(), v.Page)
				}
				return v
			}
			for _, limit := range []int{1, 2, 3, 7, 200} {
				var got []string
				q := url.Values{"limit": {fmt.Sprint(limit)}}
				for pages := 0; ; pages++ {
					if pages > 10 {
						t.Fatalf("limit %d: no end after 10 pages", limit)
					}
					v := list(q)
					if len(v.Threads) > limit {
						t.Fatalf("limit %d: a page of %d", limit, len(v.Threads))
					}
					for _, th := range v.Threads {
						got = append(got, th.ID)
					}
					if !v.Page.HasMore {
						break
					}
					q = url.Values{"limit": {fmt.Sprint(limit)}, "cursor": {v.Page.NextCursor}}
				}
				if !slices.Equal(got, want) {
					t.Fatalf("limit %d: walked %v, want %v", limit, got, want)
				}
			}

			first := list(url.Values{"limit": {"2"}})
			appendMessages(t, h.f.store, "paged", "a", 4)
			_, msgs, _ := h.page("/threads/paged", url.Values{"limit": {"2"}})
			for _, c := range []struct {
				q    url.Values
				code string
			}{
				{url.Values{"cursor": {"not-a-cursor"}}, agent.CodeInvalidCursor},
				{url.Values{"cursor": {msgs.Page.NextCursor}}, agent.CodeInvalidCursor}, // a messages cursor
				{url.Values{"cursor": {strings.Repeat("A", 2000)}}, agent.CodeInvalidCursor},
				{url.Values{"limit": {"0"}}, agent.CodeInvalidLimit},
				{url.Values{"limit": {"201"}, "cursor": {first.Page.NextCursor}}, agent.CodeInvalidLimit},
			} {
				resp := h.f.do(t, "GET", "/threads?"+c.q.Encode(), token(t, "alice"), nil)
				if resp.StatusCode != 400 {
					t.Fatalf("GET /threads?%s: %d, want 400", c.q.Encode(), resp.StatusCode)
				}
				if got := errorCode(t, resp); got != c.code {
					t.Fatalf("GET /threads?%s: code %s, want %s", c.q.Encode(), got, c.code)
				}
			}
			// Another user's walk from alice's cursor lists only their own.
			resp := h.f.do(t, "GET", "/threads?"+url.Values{"cursor": {first.Page.NextCursor}}.Encode(), token(t, "bob"), nil)
			var bobs listView
			if err := json.Unmarshal(readAll(t, resp), &bobs); err != nil || resp.StatusCode != 200 {
				t.Fatalf("bob with alice's cursor: %d %v", resp.StatusCode, err)
			}
			for _, th := range bobs.Threads {
				if th.Owner != "bob" {
					t.Fatalf("bob listed %s of %s", th.ID, th.Owner)
				}
			}
		})
	}
}
