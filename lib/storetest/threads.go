package storetest

import (
	"fmt"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func threadTests() []test {
	type c = leaf[agent.ThreadStore]
	tests := group(threadPort,
		c{"CreateThreadInsertIfAbsent", testCreateThreadInsertIfAbsent},
		c{"GetThreadUnknown", testGetThreadUnknown},
		c{"UpdateThread", testUpdateThread},
		c{"UpdateThreadUnknown", testUpdateThreadUnknown},
		c{"ListThreadsOrder", testListThreadsOrder},
		c{"ListThreadsDefaultLimit", testListThreadsDefaultLimit},
		c{"ListThreadsPages", testListThreadsPages},
		c{"DeleteThreadUnknown", testDeleteThreadUnknown},
	)
	tests = append(tests, group(claimPort,
		leaf[claimStore]{"ListThreadsShowsClaimsAndUsage", testListThreadsFullRecords},
	)...)
	// Deleting a thread is about everything under it (the cases after the first are in store.go, beside the
	// helpers that read a whole thread).
	type all = leaf[agent.Store]
	return append(tests, group(wholeStore,
		all{"DeleteThreadCascades", testDeleteThreadCascades},
		all{"DeleteThreadRefusedWhileClaimed", testDeleteThreadClaimed},
		all{"DeleteThreadThenRecreateIsEmpty", testDeleteThreadRecreate},
		all{"DeleteThreadRacesClaims", testDeleteThreadRace},
		all{"DeletedThreadsLateWritesStayOut", testDeletedThreadsLateWrites},
		all{"FinishDeleteLeavesALiveThread", testFinishDeleteLeavesALiveThread},
	)...)
}

type threads = env[agent.ThreadStore]

// A retried create (a double-submitted first message) must converge on the first record, whatever the retry carries.
func testCreateThreadInsertIfAbsent(e *threads) {
	t := e.t
	th := agent.Thread{
		ID:        e.id("th"),
		Owner:     e.id("user"),
		Title:     "first",
		Settings:  agent.ThreadSettings{ReviewTools: true},
		CreatedAt: at(0),
		UpdatedAt: at(time.Second),
	}
	got, created, err := e.s.CreateThread(e.ctx, th)
	must(t, err, "CreateThread")
	if !created {
		t.Fatal("CreateThread of a new id: created = false")
	}
	same(t, "CreateThread result", got, th)
	wantUTC(t, "CreateThread result", got.CreatedAt, got.UpdatedAt)
	same(t, "GetThread after create", getThread(e, th.ID), th)

	again := th
	again.Owner = e.id("intruder")
	again.Title = "second"
	again.Settings = agent.ThreadSettings{}
	again.CreatedAt = at(time.Hour)
	again.UpdatedAt = at(time.Hour)
	got, created, err = e.s.CreateThread(e.ctx, again)
	must(t, err, "CreateThread again")
	if created {
		t.Fatal("CreateThread of an existing id: created = true")
	}
	same(t, "CreateThread of an existing id returns the stored thread", got, th)
	same(t, "GetThread after second create", getThread(e, th.ID), th)
}

func testGetThreadUnknown(e *threads) {
	_, err := e.s.GetThread(e.ctx, e.id("th"))
	wantErr(e.t, err, agent.KindNotFound, "", "GetThread(unknown)")
}

func testUpdateThread(e *threads) {
	title := func(s string) *string { return &s }
	review := &agent.ThreadSettings{ReviewTools: true}
	cases := []struct {
		name  string
		patch agent.ThreadPatch
		edit  func(*agent.Thread)
	}{
		{"empty patch only bumps UpdatedAt", agent.ThreadPatch{}, func(*agent.Thread) {}},
		{"title", agent.ThreadPatch{Title: title("renamed")}, func(th *agent.Thread) { th.Title = "renamed" }},
		{"clear title", agent.ThreadPatch{Title: title("")}, func(th *agent.Thread) { th.Title = "" }},
		{"settings", agent.ThreadPatch{Settings: review}, func(th *agent.Thread) { th.Settings = *review }},
		{"both", agent.ThreadPatch{Title: title("both"), Settings: review}, func(th *agent.Thread) {
			th.Title = "both"
			th.Settings = *review
		}},
	}
	for _, tc := range cases {
		th := newThread(e)
		now := at(time.Minute)
		want := th
		tc.edit(&want)
		want.UpdatedAt = now
		got, err := e.s.UpdateThread(e.ctx, th.ID, tc.patch, now)
		must(e.t, err, tc.name+": UpdateThread")
		same(e.t, tc.name+": UpdateThread result", got, want)
		same(e.t, tc.name+": GetThread after update", getThread(e, th.ID), want)
	}
}

func testUpdateThreadUnknown(e *threads) {
	title := "x"
	_, err := e.s.UpdateThread(e.ctx, e.id("th"), agent.ThreadPatch{Title: &title}, at(0))
	wantErr(e.t, err, agent.KindNotFound, "", "UpdateThread(unknown)")
}

// ListThreads is the sidebar: newest-updated first, ties broken by id descending so pages are stable, one
// owner only.
func testListThreadsOrder(e *threads) {
	t := e.t
	owner := e.id("user")
	base := e.id("th")
	updated := map[string]time.Duration{"a": 1 * time.Second, "b": 3 * time.Second, "c": 2 * time.Second, "d": 3 * time.Second, "e": 0}
	stored := map[string]agent.Thread{}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		stored[k] = createThread(e, owner, base+"-"+k, at(updated[k]))
	}
	// Another owner's newer thread must not show up.
	createThread(e, e.id("other"), base+"-z", at(time.Hour))

	want := func(keys ...string) []agent.Thread {
		out := make([]agent.Thread, len(keys))
		for i, k := range keys {
			out[i] = stored[k]
		}
		return out
	}
	cases := []struct {
		limit int
		want  []agent.Thread
	}{
		{0, want("d", "b", "c", "a", "e")},
		{-1, want("d", "b", "c", "a", "e")},
		{100, want("d", "b", "c", "a", "e")},
		{5, want("d", "b", "c", "a", "e")},
		{2, want("d", "b")},
		{1, want("d")},
	}
	for _, tc := range cases {
		// Twice: a tie must come back in the same order every time.
		for range 2 {
			got, err := e.s.ListThreads(e.ctx, owner, tc.limit)
			must(t, err, "ListThreads")
			same(t, fmt.Sprintf("ListThreads(limit %d)", tc.limit), got, tc.want)
		}
	}

	// Updating the oldest thread moves it to the top.
	title := "bumped"
	bumped, err := e.s.UpdateThread(e.ctx, stored["e"].ID, agent.ThreadPatch{Title: &title}, at(time.Minute))
	must(t, err, "UpdateThread")
	stored["e"] = bumped
	got, err := e.s.ListThreads(e.ctx, owner, 0)
	must(t, err, "ListThreads after update")
	same(t, "ListThreads after update", got, want("e", "d", "b", "c", "a"))

	got, err = e.s.ListThreads(e.ctx, e.id("nobody"), 0)
	must(t, err, "ListThreads(unknown owner)")
	if len(got) != 0 {
		t.Fatalf("ListThreads(unknown owner) = %d threads, want none", len(got))
	}
}

// limit <= 0 means 100: the 101st (oldest) thread is left out.
func testListThreadsDefaultLimit(e *threads) {
	t := e.t
	owner := e.id("user")
	base := e.id("th")
	for i := range 101 {
		createThread(e, owner, fmt.Sprintf("%s-%03d", base, i), at(time.Duration(i)*time.Second))
	}
	for _, limit := range []int{0, -5} {
		got, err := e.s.ListThreads(e.ctx, owner, limit)
		must(t, err, "ListThreads")
		if len(got) != 100 {
			t.Fatalf("ListThreads(limit %d) = %d threads, want 100", limit, len(got))
		}
		if got[0].ID != base+"-100" || got[99].ID != base+"-001" {
			t.Fatalf("ListThreads(limit %d) = %s .. %s, want %s-100 .. %s-001", limit, got[0].ID, got[99].ID, base, base)
		}
	}
	got, err := e.s.ListThreads(e.ctx, owner, 101)
	must(t, err, "ListThreads(101)")
	if len(got) != 101 {
		t.Fatalf("ListThreads(limit 101) = %d threads, want 101", len(got))
	}
}

// GET /threads pages (REVIEW S24): a walk by cursor reads every thread once, in ListThreads' order, ties
// included; a thread updated during the walk moves above it and is not met again; a deleted one is never on a
// page; a cursor on a place no thread holds any more still reads on from there.
func testListThreadsPages(e *threads) {
	t := e.t
	owner := e.id("user")
	base := e.id("th")
	// Seven threads, three sharing one updatedAt (ties by id descending), and another owner's in between.
	updated := []time.Duration{5, 3, 3, 3, 2, 1, 0}
	var want []string
	for i, d := range updated {
		id := fmt.Sprintf("%s-%d", base, i)
		createThread(e, owner, id, at(d*time.Second))
	}
	createThread(e, e.id("other"), base+"-z", at(2*time.Second))
	want = []string{base + "-0", base + "-3", base + "-2", base + "-1", base + "-4", base + "-5", base + "-6"}

	walk := func(limit int, during func(step int)) ([]string, int) {
		var got []string
		var from agent.ThreadCursor
		pages := 0
		for {
			page, err := e.s.ListThreadsPage(e.ctx, owner, agent.ThreadPage{From: from, Limit: limit})
			must(t, err, "ListThreadsPage")
			pages++
			for _, th := range page.Items {
				got = append(got, th.ID)
			}
			if !page.More {
				return got, pages
			}
			if len(page.Items) == 0 {
				t.Fatalf("ListThreadsPage: an empty page with More")
			}
			from = page.Items[len(page.Items)-1].Cursor()
			if during != nil {
				during(pages)
			}
			if pages > 20 {
				t.Fatalf("ListThreadsPage: no end after 20 pages: %v", got)
			}
		}
	}
	for _, limit := range []int{1, 2, 3, 7, 100} {
		got, pages := walk(limit, nil)
		same(t, fmt.Sprintf("walk by %d", limit), got, want)
		if wantPages := (len(want) + limit - 1) / limit; limit < len(want) && pages != wantPages {
			t.Fatalf("walk by %d: %d pages, want %d", limit, pages, wantPages)
		}
	}

	// During a walk by 2: after the first page, the last thread is updated (it moves to the top, above the walk)
	// and a thread of the next page is deleted.
	title := "bumped"
	got, _ := walk(2, func(step int) {
		if step != 1 {
			return
		}
		_, err := e.s.UpdateThread(e.ctx, base+"-6", agent.ThreadPatch{Title: &title}, at(time.Minute))
		must(t, err, "UpdateThread")
		must(t, e.s.DeleteThread(e.ctx, base+"-2"), "DeleteThread")
	})
	same(t, "walk by 2 while updating and deleting", got, []string{base + "-0", base + "-3", base + "-1", base + "-4", base + "-5"})

	// A cursor on a thread that has since moved (or gone) still reads on from its place.
	from := agent.ThreadCursor{UpdatedAt: at(3 * time.Second), ID: base + "-2"}
	page, err := e.s.ListThreadsPage(e.ctx, owner, agent.ThreadPage{From: from, Limit: 2})
	must(t, err, "ListThreadsPage(from a gone thread)")
	same(t, "page after a gone thread", ids(page.Items), []string{base + "-1", base + "-4"})
	if !page.More {
		t.Fatal("ListThreadsPage(from a gone thread): More = false, want true")
	}

	page, err = e.s.ListThreadsPage(e.ctx, e.id("nobody"), agent.ThreadPage{})
	must(t, err, "ListThreadsPage(unknown owner)")
	if len(page.Items) != 0 || page.More {
		t.Fatalf("ListThreadsPage(unknown owner) = %d threads, more %v; want none", len(page.Items), page.More)
	}
}

func ids(ths []agent.Thread) []string {
	out := make([]string, len(ths))
	for i, th := range ths {
		out[i] = th.ID
	}
	return out
}

// ListThreads returns whole threads (claim and usage included, as GetThread does), in the documented order
// whatever a claim did to UpdatedAt.
func testListThreadsFullRecords(e *claims) {
	t := e.t
	owner := e.id("user")
	base := e.id("th")
	var ths []agent.Thread
	for i := range 3 {
		ths = append(ths, createThread(e, owner, fmt.Sprintf("%s-%d", base, i), at(time.Duration(i)*time.Second)))
	}
	claim(e, ths[0], e.id("run"), at(time.Minute))
	done := claim(e, ths[1], e.id("run"), at(time.Minute)).Run
	finish(e, done, agent.RunCompleted, agent.Usage{InputTokens: 4, OutputTokens: 2, TotalTokens: 6}, at(2*time.Minute))

	got, err := e.s.ListThreads(e.ctx, owner, 0)
	must(t, err, "ListThreads")
	if len(got) != len(ths) {
		t.Fatalf("ListThreads = %d threads, want %d", len(got), len(ths))
	}
	for i, th := range got {
		same(t, "ListThreads entry vs GetThread", th, getThread(e, th.ID))
		if i > 0 {
			prev := got[i-1]
			if th.UpdatedAt.After(prev.UpdatedAt) || (th.UpdatedAt.Equal(prev.UpdatedAt) && th.ID > prev.ID) {
				t.Fatalf("ListThreads order: %s (%v) after %s (%v)", th.ID, th.UpdatedAt, prev.ID, prev.UpdatedAt)
			}
		}
	}
}

// DeleteThread removes everything under the thread and nothing of its neighbour; the id can then be used afresh.
func testDeleteThreadCascades(e *env[agent.Store]) {
	t := e.t
	fill := func(th agent.Thread) (runIDs []string) {
		r1 := claim(e, th, th.ID+"-r1", at(time.Second)).Run
		for i := range 2 {
			m := agent.Message{ID: fmt.Sprintf("%s-m%d", th.ID, i), Role: agent.RoleUser, Parts: textParts("hello")}
			w := byWriter(th.ID, int64(i), m, at(0))
			w.Fence = r1.Fence()
			must(t, e.s.PutMessage(e.ctx, w), "PutMessage")
		}
		finish(e, r1, agent.RunCompleted, agent.Usage{InputTokens: 1}, at(2*time.Second))
		r2 := claim(e, th, th.ID+"-r2", at(3*time.Second)).Run
		finish(e, r2, agent.RunFailed, agent.Usage{}, at(4*time.Second)) // a held claim would refuse the delete
		for _, id := range []string{r1.ID, r2.ID} {
			must(t, e.s.AppendSegment(e.ctx, segment(th.ID, id, 0, "data: x\n\n", false)), "AppendSegment")
		}
		return []string{r1.ID, r2.ID}
	}
	th := newThread(e)
	runs := fill(th)
	neighbour := newThread(e)
	neighbourRuns := fill(neighbour)

	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")

	_, err := e.s.GetThread(e.ctx, th.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetThread after delete")
	_, err = e.s.GetMessage(e.ctx, th.ID, th.ID+"-m0")
	wantErr(t, err, agent.KindNotFound, "", "GetMessage after delete")
	msgs, err := e.s.ListMessages(e.ctx, th.ID)
	must(t, err, "ListMessages after delete")
	if len(msgs) != 0 {
		t.Fatalf("ListMessages after delete = %d messages, want none", len(msgs))
	}
	rs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns after delete")
	if len(rs) != 0 {
		t.Fatalf("ListRuns after delete = %d runs, want none", len(rs))
	}
	for _, id := range runs {
		_, err = e.s.GetRun(e.ctx, th.ID, id)
		wantErr(t, err, agent.KindNotFound, "", "GetRun after delete")
		segs, err := e.s.ListSegments(e.ctx, id, 0, at(0))
		must(t, err, "ListSegments after delete")
		if len(segs) != 0 {
			t.Fatalf("ListSegments(%s) after delete = %d segments, want none", id, len(segs))
		}
	}

	// The neighbour is untouched.
	getThread(e, neighbour.ID)
	msgs, err = e.s.ListMessages(e.ctx, neighbour.ID)
	must(t, err, "ListMessages(neighbour)")
	rs, err2 := e.s.ListRuns(e.ctx, neighbour.ID)
	must(t, err2, "ListRuns(neighbour)")
	if len(msgs) != 2 || len(rs) != 2 {
		t.Fatalf("neighbour has %d messages and %d runs, want 2 and 2", len(msgs), len(rs))
	}
	for _, id := range neighbourRuns {
		segs, err := e.s.ListSegments(e.ctx, id, 0, at(0))
		must(t, err, "ListSegments(neighbour)")
		if len(segs) != 1 {
			t.Fatalf("neighbour run %s has %d segments, want 1", id, len(segs))
		}
	}

	// A repeated delete is a no-op, and the id is free again with nothing left under it.
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread again")
	fresh := agent.Thread{ID: th.ID, Owner: th.Owner, Title: "reborn", CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
	got, created, err := e.s.CreateThread(e.ctx, fresh)
	must(t, err, "CreateThread after delete")
	if !created {
		t.Fatal("CreateThread after delete: created = false")
	}
	fresh.Epoch = got.Epoch // a store may start a thread created again above the deleted one's epochs
	same(t, "CreateThread after delete", got, fresh)
	msgs, err = e.s.ListMessages(e.ctx, th.ID)
	must(t, err, "ListMessages after re-create")
	if len(msgs) != 0 {
		t.Fatalf("ListMessages after re-create = %d messages, want none", len(msgs))
	}
}

func testDeleteThreadUnknown(e *threads) {
	must(e.t, e.s.DeleteThread(e.ctx, e.id("th")), "DeleteThread(unknown)")
}
