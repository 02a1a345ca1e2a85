package storetest

import (
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Generated titles (issue 20 item 5): SetGeneratedTitle writes only into a thread with no title, and the owner's
// title (UpdateThread with a Title) always wins, whichever lands first.
func titleTests() []test {
	type c = leaf[agent.ThreadStore]
	return group(threadPort,
		c{"GeneratedTitleOnce", testGeneratedTitleOnce},
		c{"GeneratedTitleNeverOverwrites", testGeneratedTitleNeverOverwrites},
		c{"UserTitleOverwritesGenerated", testUserTitleOverwritesGenerated},
		c{"GeneratedTitleRacesUserTitle", testGeneratedTitleRace},
		c{"GeneratedTitlesRace", testGeneratedTitlesRace},
		c{"GeneratedTitleRefused", testGeneratedTitleRefused},
	)
}

// untitled creates a fresh thread with no title, created and updated at at(0).
func untitled(e *threads) agent.Thread {
	e.t.Helper()
	th := agent.Thread{ID: e.id("th"), Owner: e.id("user"), CreatedAt: at(0), UpdatedAt: at(0)}
	got, _, err := e.s.CreateThread(e.ctx, th)
	must(e.t, err, "CreateThread")
	return got
}

// setGenerated calls SetGeneratedTitle and checks that what it returns is what GetThread reads.
func setGenerated(e *threads, id, title string, now time.Time) (agent.Thread, bool) {
	e.t.Helper()
	got, set, err := e.s.SetGeneratedTitle(e.ctx, id, title, now)
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

// The first generated title is stored (UpdatedAt moves to its time); a second one changes nothing.
func testGeneratedTitleOnce(e *threads) {
	t := e.t
	th := untitled(e)
	got, set := setGenerated(e, th.ID, "Trip to Lisbon", at(time.Minute))
	want := th
	want.Title, want.UpdatedAt = "Trip to Lisbon", at(time.Minute)
	if !set {
		t.Fatal("SetGeneratedTitle on an untitled thread: set = false")
	}
	same(t, "first generated title", got, want)
	got, set = setGenerated(e, th.ID, "Something else", at(time.Hour))
	if set {
		t.Fatal("a second generated title: set = true")
	}
	same(t, "a second generated title changes nothing", got, want)
}

// A title the owner chose, an empty one included, and a title the thread was created with are never replaced.
func testGeneratedTitleNeverOverwrites(e *threads) {
	cases := []struct {
		name  string
		setup func() agent.Thread
	}{
		{"owner's title", func() agent.Thread { return patchTitle(e, untitled(e).ID, "mine", at(time.Second)) }},
		{"owner cleared the title", func() agent.Thread { return patchTitle(e, untitled(e).ID, "", at(time.Second)) }},
		{"owner cleared a generated title", func() agent.Thread {
			th := untitled(e)
			setGenerated(e, th.ID, "generated", at(time.Second))
			return patchTitle(e, th.ID, "", at(2*time.Second))
		}},
		{"created with a title", func() agent.Thread { return newThread(e) }},
	}
	for _, tc := range cases {
		th := tc.setup()
		got, set := setGenerated(e, th.ID, "generated later", at(time.Hour))
		if set {
			e.t.Errorf("%s: SetGeneratedTitle set = true", tc.name)
		}
		same(e.t, tc.name+": unchanged", got, th)
	}
}

// The owner's title replaces a generated one, and a generation after that changes nothing.
func testUserTitleOverwritesGenerated(e *threads) {
	th := untitled(e)
	setGenerated(e, th.ID, "generated", at(time.Second))
	want := patchTitle(e, th.ID, "mine", at(2*time.Second))
	if want.Title != "mine" {
		e.t.Fatalf("UpdateThread over a generated title: title %q, want %q", want.Title, "mine")
	}
	got, set := setGenerated(e, th.ID, "generated again", at(time.Hour))
	if set {
		e.t.Error("SetGeneratedTitle after the owner's title: set = true")
	}
	same(e.t, "the owner's title stays", got, want)
}

// The race the issue names: a generated title and the owner's, sent at the same moment (many times over). Whichever
// lands first, the owner's is the thread's title at the end.
func testGeneratedTitleRace(e *threads) {
	const rounds = 8
	for i := range rounds {
		th := untitled(e)
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
			_, _, genErr = e.s.SetGeneratedTitle(e.ctx, th.ID, "generated", at(time.Second))
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
	th := untitled(e)
	titles := []string{"a", "b", "c", "d", "e", "f"}
	set := make([]bool, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			<-start
			_, set[i], errs[i] = e.s.SetGeneratedTitle(e.ctx, th.ID, titles[i], at(time.Second))
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
	_, _, err := e.s.SetGeneratedTitle(e.ctx, e.id("th"), "x", at(0))
	wantErr(e.t, err, agent.KindNotFound, "", "SetGeneratedTitle(unknown)")

	th := untitled(e)
	_, _, err = e.s.SetGeneratedTitle(e.ctx, th.ID, "", at(0))
	wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidTitle, "SetGeneratedTitle(empty title)")
	same(e.t, "an empty generated title changes nothing", getThread(e, th.ID), th)

	must(e.t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	_, _, err = e.s.SetGeneratedTitle(e.ctx, th.ID, "x", at(0))
	wantErr(e.t, err, agent.KindNotFound, "", "SetGeneratedTitle(deleted)")
}
