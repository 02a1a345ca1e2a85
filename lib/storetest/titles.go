package storetest

import (
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Generated titles (issue 20 item 5): SetGeneratedTitle replaces only the title a thread was created with (the
// engine's provisional one), and the owner's title (UpdateThread with a Title) always wins, whichever lands first.
func titleTests() []test {
	type c = leaf[agent.ThreadStore]
	return group(threadPort,
		c{"GeneratedTitleOnce", testGeneratedTitleOnce},
		c{"GeneratedTitleNeverOverwrites", testGeneratedTitleNeverOverwrites},
		c{"UserTitleOverwritesGenerated", testUserTitleOverwritesGenerated},
		c{"GeneratedTitleRacesUserTitle", testGeneratedTitleRace},
		c{"GeneratedTitlesRace", testGeneratedTitlesRace},
		c{"GeneratedTitleRefused", testGeneratedTitleRefused},
		c{"AddUsage", testAddUsage},
	)
}

// titled creates a fresh thread with title (the provisional one), created and updated at at(0).
func titled(e *threads, title string) agent.Thread {
	e.t.Helper()
	th := agent.Thread{ID: e.id("th"), Owner: e.id("user"), Title: title, CreatedAt: at(0), UpdatedAt: at(0)}
	got, _, err := e.s.CreateThread(e.ctx, th)
	must(e.t, err, "CreateThread")
	return got
}

// setGenerated calls SetGeneratedTitle and checks that what it returns is what GetThread reads.
func setGenerated(e *threads, id, replaces, title string) (agent.Thread, bool) {
	e.t.Helper()
	got, set, err := e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: id, CreatedAt: at(0), Replaces: replaces, Title: title})
	must(e.t, err, "SetGeneratedTitle("+title+")")
	same(e.t, "SetGeneratedTitle("+title+") result against GetThread", got, getThread(e, id))
	return got, set
}

func patchTitle(e *threads, id, title string, now time.Time) agent.Thread {
	e.t.Helper()
	got, err := e.s.UpdateThread(e.ctx, id, agent.ThreadPatch{Title: &title}, now)
	must(e.t, err, "UpdateThread(title "+title+")")
	return got
}

// The first generated title replaces the provisional one (or none), UpdatedAt left alone; a second one changes
// nothing, whatever it says it replaces.
func testGeneratedTitleOnce(e *threads) {
	t := e.t
	for _, provisional := range []string{"plan a trip to lisbon", ""} {
		th := titled(e, provisional)
		got, set := setGenerated(e, th.ID, provisional, "Trip to Lisbon")
		want := th
		want.Title = "Trip to Lisbon"
		if !set {
			t.Fatalf("SetGeneratedTitle over %q: set = false", provisional)
		}
		same(t, "first generated title", got, want)
		for _, replaces := range []string{"Trip to Lisbon", provisional} {
			got, set = setGenerated(e, th.ID, replaces, "Something else")
			if set {
				t.Fatalf("a second generated title (replacing %q): set = true", replaces)
			}
			same(t, "a second generated title changes nothing", got, want)
		}
	}
}

// A title the owner chose (another text, the same text as the provisional one, or none) is never replaced,
// and neither is a title that is not the one the generation was asked for (it changed meanwhile).
func testGeneratedTitleNeverOverwrites(e *threads) {
	const provisional = "plan a trip"
	cases := []struct {
		name     string
		setup    func() agent.Thread
		replaces string
	}{
		{"owner's title", func() agent.Thread { return patchTitle(e, titled(e, provisional).ID, "mine", at(time.Second)) }, "mine"},
		{"owner's title, the provisional text", func() agent.Thread {
			return patchTitle(e, titled(e, provisional).ID, provisional, at(time.Second))
		}, provisional},
		{"owner cleared the title", func() agent.Thread { return patchTitle(e, titled(e, provisional).ID, "", at(time.Second)) }, ""},
		{"owner cleared a generated title", func() agent.Thread {
			th := titled(e, provisional)
			setGenerated(e, th.ID, provisional, "generated")
			return patchTitle(e, th.ID, "", at(2*time.Second))
		}, ""},
		{"not the title asked for", func() agent.Thread { return titled(e, "another title") }, provisional},
	}
	for _, tc := range cases {
		th := tc.setup()
		got, set := setGenerated(e, th.ID, tc.replaces, "generated later")
		if set {
			e.t.Errorf("%s: SetGeneratedTitle set = true", tc.name)
		}
		same(e.t, tc.name+": unchanged", got, th)
	}
}

// The owner's title replaces a generated one, and a generation after that changes nothing.
func testUserTitleOverwritesGenerated(e *threads) {
	th := titled(e, "provisional")
	setGenerated(e, th.ID, th.Title, "generated")
	want := patchTitle(e, th.ID, "mine", at(2*time.Second))
	if want.Title != "mine" {
		e.t.Fatalf("UpdateThread over a generated title: title %q, want %q", want.Title, "mine")
	}
	got, set := setGenerated(e, th.ID, "mine", "generated again")
	if set {
		e.t.Error("SetGeneratedTitle after the owner's title: set = true")
	}
	same(e.t, "the owner's title stays", got, want)
}

// The race the issue names: a generated title and the owner's, sent at the same moment (many times over).
// Whichever lands first, the owner's is the thread's title at the end.
func testGeneratedTitleRace(e *threads) {
	const rounds = 8
	for i := range rounds {
		th := titled(e, "provisional")
		start := make(chan struct{})
		var wg sync.WaitGroup
		var userErr, genErr error
		wg.Go(func() {
			<-start
			title := "mine"
			_, userErr = e.s.UpdateThread(e.ctx, th.ID, agent.ThreadPatch{Title: &title}, at(time.Second))
		})
		wg.Go(func() {
			<-start
			_, _, genErr = e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title, Title: "generated"})
		})
		close(start)
		wg.Wait()
		must(e.t, userErr, "UpdateThread")
		must(e.t, genErr, "SetGeneratedTitle")
		if got := getThread(e, th.ID).Title; got != "mine" {
			e.t.Fatalf("round %d: title %q after the race, want the owner's %q", i, got, "mine")
		}
	}
}

// Of concurrent generated titles exactly one is set, and it is the thread's title.
func testGeneratedTitlesRace(e *threads) {
	const writers = 6
	th := titled(e, "provisional")
	titles := []string{"a", "b", "c", "d", "e", "f"}
	set := make([]bool, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			<-start
			_, set[i], errs[i] = e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title, Title: titles[i]})
		})
	}
	close(start)
	wg.Wait()
	winners := 0
	got := getThread(e, th.ID).Title
	for i := range writers {
		must(e.t, errs[i], "SetGeneratedTitle")
		if set[i] {
			winners++
			if got != titles[i] {
				e.t.Errorf("title %q, but the write of %q reported set", got, titles[i])
			}
		}
	}
	if winners != 1 {
		e.t.Errorf("%d concurrent generated titles were set, want exactly 1", winners)
	}
}

func testGeneratedTitleRefused(e *threads) {
	_, _, err := e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: e.id("th"), Title: "x"})
	wantErr(e.t, err, agent.KindNotFound, "", "SetGeneratedTitle(unknown)")

	th := titled(e, "provisional")
	_, _, err = e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title})
	wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidTitle, "SetGeneratedTitle(empty title)")
	same(e.t, "an empty generated title changes nothing", getThread(e, th.ID), th)

	must(e.t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	_, _, err = e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title, Title: "x"})
	wantErr(e.t, err, agent.KindNotFound, "", "SetGeneratedTitle(deleted)")

	// A thread created again on the id, with the same first title, is another incarnation: a title asked for
	// the deleted one stays out of it.
	again, _, err := e.s.CreateThread(e.ctx, agent.Thread{ID: th.ID, Owner: th.Owner, Title: th.Title, CreatedAt: at(time.Minute), UpdatedAt: at(time.Minute)})
	must(e.t, err, "CreateThread again")
	got, set, err := e.s.SetGeneratedTitle(e.ctx, agent.GeneratedTitle{ThreadID: th.ID, CreatedAt: th.CreatedAt, Replaces: th.Title, Title: "x"})
	must(e.t, err, "SetGeneratedTitle(an earlier incarnation)")
	if set {
		e.t.Error("SetGeneratedTitle for an earlier incarnation: set = true")
	}
	same(e.t, "the new incarnation is unchanged", got, again)
}

// AddUsage (a title's spend) adds to the thread's totals once per key, UpdatedAt left alone; a missing, deleted
// or re-created thread is not found and gets nothing.
func testAddUsage(e *threads) {
	t := e.t
	th := titled(e, "provisional")
	u := agent.Usage{InputTokens: 120, OutputTokens: 7, TotalTokens: 127, CachedInputTokens: 20, ReasoningTokens: 2,
		CacheWriteTokens: 30, CostMicroUSD: 45}
	add := func(key string) error {
		return e.s.AddUsage(e.ctx, agent.ThreadUsage{ThreadID: th.ID, CreatedAt: th.CreatedAt, Key: key, Usage: u})
	}
	must(t, add("run-1"), "AddUsage")
	must(t, add("run-1"), "AddUsage again (a retry)")
	want := th
	want.Usage = u
	same(t, "one spend, added once", getThread(e, th.ID), want)
	must(t, add("run-2"), "AddUsage(another key)")
	want.Usage = u.Add(u)
	same(t, "two spends", getThread(e, th.ID), want)

	err := e.s.AddUsage(e.ctx, agent.ThreadUsage{ThreadID: e.id("th"), CreatedAt: at(0), Key: "k", Usage: u})
	wantErr(t, err, agent.KindNotFound, "", "AddUsage(unknown)")
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	wantErr(t, add("run-3"), agent.KindNotFound, "", "AddUsage(deleted)")
	again, _, err := e.s.CreateThread(e.ctx, agent.Thread{ID: th.ID, Owner: th.Owner, Title: th.Title, CreatedAt: at(time.Minute), UpdatedAt: at(time.Minute)})
	must(t, err, "CreateThread again")
	wantErr(t, add("run-4"), agent.KindNotFound, "", "AddUsage(an earlier incarnation)")
	same(t, "the new incarnation is unchanged", getThread(e, th.ID), again)
}
