package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func runTests() []test {
	type c = leaf[claimStore]
	return group(claimPort,
		c{"ClaimIdleThread", testClaimIdleThread},
		c{"ClaimUnknownThread", testClaimUnknownThread},
		c{"ClaimRaceOneWinner", testClaimRaceOneWinner},
		c{"TakeoverRaceOneWinner", testTakeoverRaceOneWinner},
		c{"EpochIncreasesOnEveryClaim", testEpochIncreases},
		c{"StaleTakeover", testStaleTakeover},
		c{"Heartbeat", testHeartbeat},
		c{"HeartbeatFenced", testHeartbeatFenced},
		c{"RequestCancel", testRequestCancel},
		c{"FinishRunStatuses", testFinishRunStatuses},
		c{"FinishRunAddsUsage", testFinishRunAddsUsage},
		c{"FinishRunMovesThreadUp", testFinishRunMovesThreadUp},
		c{"FinishRunFenced", testFinishRunFenced},
		c{"FinishAfterTakeoverKeepsNewClaim", testFinishAfterTakeover},
		c{"ListRunsOrder", testListRunsOrder},
		c{"ListStaleClaims", testListStaleClaims},
		c{"GetRunUnknown", testGetRunUnknown},
	)
}

type claims = env[claimStore]

func testClaimIdleThread(e *claims) {
	t := e.t
	th := newThread(e)
	runID := e.id("run")
	now := at(time.Second)
	res := claim(e, th, runID, now)
	want := agent.Run{
		ID:                 runID,
		ThreadID:           th.ID,
		Trigger:            agent.TriggerUser,
		Status:             agent.RunRunning,
		AssistantMessageID: "msg_of_" + runID,
		Epoch:              1,
		// No Reserve asked: one position, the first of a thread without messages.
		FirstSeq:  0,
		Reserved:  1,
		CreatedAt: now,
		UpdatedAt: now,
	}
	got := getThread(e, th.ID)
	same(t, "ClaimRun result", res, agent.ClaimResult{Run: want, Thread: got})
	same(t, "GetRun after claim", getRun(e, th.ID, runID), want)

	if got.Epoch != 1 {
		t.Fatalf("thread epoch after first claim = %d, want 1", got.Epoch)
	}
	same(t, "thread claim", got.ActiveRun, &agent.Claim{RunID: runID, Epoch: 1, HeartbeatAt: now})
	// The claim touches nothing else a user sees.
	if got.Owner != th.Owner || got.Title != th.Title || got.Settings != th.Settings || got.Usage != th.Usage ||
		!got.CreatedAt.Equal(th.CreatedAt) {
		t.Fatalf("thread after claim = %s, want the fields of %s", show(got), show(th))
	}
}

func testClaimUnknownThread(e *claims) {
	_, err := e.s.ClaimRun(e.ctx, claimReq(agent.Thread{ID: e.id("th"), Owner: e.id("user")}, e.id("run"), at(0)))
	wantErr(e.t, err, agent.KindNotFound, "", "ClaimRun(unknown thread)")
}

// race claims th with n distinct runs at once and returns the winners' results and the losers' errors.
func race(e *claims, th agent.Thread, n int, now time.Time) ([]agent.ClaimResult, []error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		winners []agent.ClaimResult
		losers  []error
		start   = make(chan struct{})
	)
	base := e.id("run")
	for i := range n {
		wg.Go(func() {
			<-start
			res, err := e.s.ClaimRun(e.ctx, claimReq(th, fmt.Sprintf("%s-%02d", base, i), now))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				losers = append(losers, err)
			} else {
				winners = append(winners, res)
			}
		})
	}
	close(start)
	wg.Wait()
	return winners, losers
}

// Of 50 concurrent claimers exactly one wins; the rest see run_active and leave no run behind.
func testClaimRaceOneWinner(e *claims) {
	t := e.t
	th := newThread(e)
	winners, losers := race(e, th, 50, at(time.Second))
	if len(winners) != 1 {
		t.Fatalf("%d of 50 concurrent claims won, want exactly 1", len(winners))
	}
	for _, err := range losers {
		wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "losing ClaimRun")
	}
	win := winners[0]
	if win.Run.Epoch != 1 || win.Previous != nil {
		t.Fatalf("winner = %s, want epoch 1 and no previous claim", show(win))
	}
	got := getThread(e, th.ID)
	if got.Epoch != 1 || got.ActiveRun == nil || got.ActiveRun.RunID != win.Run.ID {
		t.Fatalf("thread after race = %s, want the winner %s at epoch 1", show(got), win.Run.ID)
	}
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	same(t, "runs after race", runs, []agent.Run{win.Run})
}

// A stale claim is taken over by exactly one of many concurrent claimers, and only that one sees Previous.
func testTakeoverRaceOneWinner(e *claims) {
	t := e.t
	th := newThread(e)
	old := claim(e, th, e.id("run"), at(0)).Run
	winners, losers := race(e, th, 20, at(staleAfter+time.Second))
	if len(winners) != 1 {
		t.Fatalf("%d of 20 concurrent takeovers won, want exactly 1", len(winners))
	}
	for _, err := range losers {
		wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "losing takeover")
	}
	win := winners[0]
	same(t, "winner's previous claim", win.Previous, &agent.Claim{RunID: old.ID, Epoch: 1, HeartbeatAt: at(0)})
	if win.Run.Epoch != 2 {
		t.Fatalf("takeover epoch = %d, want 2", win.Run.Epoch)
	}
	if got := getThread(e, th.ID); got.Epoch != 2 || got.ActiveRun.RunID != win.Run.ID {
		t.Fatalf("thread after takeover race = %s, want %s at epoch 2", show(got), win.Run.ID)
	}
}

// The epoch is a fencing token: every claim hands out a bigger one, on the thread and on the run, whether it
// claims an idle thread or takes over a stale claim.
func testEpochIncreases(e *claims) {
	t := e.t
	th := newThread(e)
	check := func(run agent.Run, want int64) {
		t.Helper()
		if run.Epoch != want {
			t.Fatalf("claim %d: run epoch = %d", want, run.Epoch)
		}
		if got := getThread(e, th.ID); got.Epoch != want || got.ActiveRun == nil || got.ActiveRun.Epoch != want {
			t.Fatalf("claim %d: thread = %s, want epoch %d", want, show(got), want)
		}
		if got := getRun(e, th.ID, run.ID); got.Epoch != want {
			t.Fatalf("claim %d: stored run epoch = %d", want, got.Epoch)
		}
	}
	now := at(0)
	for want := int64(1); want <= 3; want++ {
		run := claim(e, th, e.id("run"), now).Run
		check(run, want)
		finish(e, run, agent.RunCompleted, agent.Usage{}, now.Add(time.Second))
		now = now.Add(time.Minute)
	}
	check(claim(e, th, e.id("run"), now).Run, 4)
	check(claim(e, th, e.id("run"), now.Add(time.Hour)).Run, 5)

	// The first claim takes the stored epoch + 1, also when a thread was created with an epoch.
	seeded := agent.Thread{ID: e.id("th"), Owner: e.id("user"), Epoch: 41, CreatedAt: at(0), UpdatedAt: at(0)}
	_, _, err := e.s.CreateThread(e.ctx, seeded)
	must(t, err, "CreateThread(epoch 41)")
	th = seeded
	check(claim(e, th, e.id("run"), at(0)).Run, 42)
}

// A claim is taken over only when its heartbeat is strictly older than StaleAfter.
func testStaleTakeover(e *claims) {
	cases := []struct {
		name     string
		age      time.Duration // time since the last heartbeat when the second claim comes
		takeover bool
	}{
		{"fresh", time.Second, false},
		{"exactly staleAfter", staleAfter, false},
		{"just stale", staleAfter + time.Millisecond, true},
		{"long dead", time.Hour, true},
	}
	for _, tc := range cases {
		t := e.t
		th := newThread(e)
		first := claim(e, th, e.id("run"), at(0)).Run
		beat := at(10 * time.Second)
		must(t, e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: first.ID, Epoch: first.Epoch}, beat), tc.name+": Heartbeat")

		second := e.id("run")
		res, err := e.s.ClaimRun(e.ctx, claimReq(th, second, beat.Add(tc.age)))
		if !tc.takeover {
			wantErr(t, err, agent.KindConflict, agent.CodeRunActive, tc.name+": ClaimRun")
			same(t, tc.name+": claim kept", getThread(e, th.ID).ActiveRun,
				&agent.Claim{RunID: first.ID, Epoch: 1, HeartbeatAt: beat})
			continue
		}
		must(t, err, tc.name+": ClaimRun")
		same(t, tc.name+": Previous", res.Previous, &agent.Claim{RunID: first.ID, Epoch: 1, HeartbeatAt: beat})
		if res.Run.ID != second || res.Run.Epoch != 2 {
			t.Fatalf("%s: takeover run = %s, want %s at epoch 2", tc.name, show(res.Run), second)
		}
		same(t, tc.name+": claim after takeover", getThread(e, th.ID).ActiveRun,
			&agent.Claim{RunID: second, Epoch: 2, HeartbeatAt: beat.Add(tc.age)})
		// The store does not reap the old run; the caller does (FinishRun with the old epoch).
		if got := getRun(e, th.ID, first.ID); got.Status != agent.RunRunning {
			t.Fatalf("%s: taken-over run status = %s, want running until the caller reaps it", tc.name, got.Status)
		}
	}
}

func testHeartbeat(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	for i := 1; i <= 3; i++ {
		now := at(time.Duration(i) * 5 * time.Second)
		must(t, e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: run.ID, Epoch: run.Epoch}, now), "Heartbeat")
		same(t, "claim after heartbeat", getThread(e, th.ID).ActiveRun,
			&agent.Claim{RunID: run.ID, Epoch: 1, HeartbeatAt: now})
	}
	// A heartbeat keeps a long run from being taken over.
	_, err := e.s.ClaimRun(e.ctx, claimReq(th, e.id("run"), at(15*time.Second+staleAfter)))
	wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "ClaimRun after heartbeats")
}

// A heartbeat that does not name the current claim fails and changes nothing.
func testHeartbeatFenced(e *claims) {
	cases := []struct {
		name string
		// arrange returns the thread and the (run id, epoch) that must be fenced.
		arrange func() (agent.Thread, string, int64)
	}{
		{"wrong run id", func() (agent.Thread, string, int64) {
			th := newThread(e)
			claim(e, th, e.id("run"), at(0))
			return th, e.id("run"), 1
		}},
		{"newer epoch", func() (agent.Thread, string, int64) {
			th := newThread(e)
			r := claim(e, th, e.id("run"), at(0)).Run
			return th, r.ID, r.Epoch + 1
		}},
		{"older epoch after finish and reclaim", func() (agent.Thread, string, int64) {
			th := newThread(e)
			r := claim(e, th, e.id("run"), at(0)).Run
			finish(e, r, agent.RunCompleted, agent.Usage{}, at(time.Second))
			next := claim(e, th, e.id("run"), at(2*time.Second)).Run
			return th, next.ID, next.Epoch - 1
		}},
		{"finished run", func() (agent.Thread, string, int64) {
			th := newThread(e)
			r := claim(e, th, e.id("run"), at(0)).Run
			finish(e, r, agent.RunCompleted, agent.Usage{}, at(time.Second))
			return th, r.ID, r.Epoch
		}},
		{"wrong run id on a cancel-requested claim", func() (agent.Thread, string, int64) {
			th := newThread(e)
			claim(e, th, e.id("run"), at(0))
			_, err := e.s.RequestCancel(e.ctx, th.ID, "", at(time.Second))
			must(e.t, err, "RequestCancel")
			return th, e.id("run"), 1
		}},
		{"older epoch of a cancel-requested claim", func() (agent.Thread, string, int64) {
			th := newThread(e)
			r := claim(e, th, e.id("run"), at(0)).Run
			_, err := e.s.RequestCancel(e.ctx, th.ID, "", at(time.Second))
			must(e.t, err, "RequestCancel")
			return th, r.ID, r.Epoch - 1
		}},
		{"taken over", func() (agent.Thread, string, int64) {
			th := newThread(e)
			r := claim(e, th, e.id("run"), at(0)).Run
			claim(e, th, e.id("run"), at(time.Hour))
			return th, r.ID, r.Epoch
		}},
	}
	for _, tc := range cases {
		th, runID, epoch := tc.arrange()
		before := getThread(e, th.ID)
		err := e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: runID, Epoch: epoch}, at(2*time.Hour))
		wantErr(e.t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": Heartbeat")
		same(e.t, tc.name+": thread unchanged", getThread(e, th.ID), before)
	}
}

// Stop: the cancel request rides on the claim; the run's next heartbeat sees it and the run finishes as canceled.
func testRequestCancel(e *claims) {
	t := e.t
	th := newThread(e)
	_, err := e.s.RequestCancel(e.ctx, th.ID, "", at(0))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "RequestCancel(idle thread)")

	run := claim(e, th, e.id("run"), at(0)).Run
	want := agent.Claim{RunID: run.ID, Epoch: 1, HeartbeatAt: at(0), CancelRequested: true}
	for range 2 { // a repeated stop is harmless
		c, err := e.s.RequestCancel(e.ctx, th.ID, "", at(time.Second))
		must(t, err, "RequestCancel")
		same(t, "RequestCancel result", c, want)
		same(t, "claim after RequestCancel", getThread(e, th.ID).ActiveRun, &want)
	}

	err = e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: run.ID, Epoch: run.Epoch}, at(2*time.Second))
	wantErr(t, err, agent.KindCanceled, agent.CodeRunCanceled, "Heartbeat after RequestCancel")
	same(t, "claim after canceled heartbeat", getThread(e, th.ID).ActiveRun, &want)

	// A cancel request does not free the thread: until the run finishes, others still get run_active.
	_, err = e.s.ClaimRun(e.ctx, claimReq(th, e.id("run"), at(3*time.Second)))
	wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "ClaimRun while cancel pending")

	finish(e, run, agent.RunCanceled, agent.Usage{}, at(4*time.Second))
	if got := getThread(e, th.ID); got.ActiveRun != nil {
		t.Fatalf("claim after canceled run finished = %s, want none", show(got.ActiveRun))
	}
	_, err = e.s.RequestCancel(e.ctx, th.ID, "", at(5*time.Second))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "RequestCancel after finish")

	// A new claim starts without the old cancel request, also when it takes over a cancel-requested stale claim.
	next := claim(e, th, e.id("run"), at(6*time.Second)).Run
	_, err = e.s.RequestCancel(e.ctx, th.ID, "", at(7*time.Second))
	must(t, err, "RequestCancel(next)")
	last := claim(e, th, e.id("run"), at(time.Hour))
	same(t, "Previous of a cancel-requested stale claim", last.Previous,
		&agent.Claim{RunID: next.ID, Epoch: 2, HeartbeatAt: at(6 * time.Second), CancelRequested: true})
	same(t, "claim after takeover", getThread(e, th.ID).ActiveRun,
		&agent.Claim{RunID: last.Run.ID, Epoch: 3, HeartbeatAt: at(time.Hour)})
	must(t, e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: last.Run.ID, Epoch: 3}, at(time.Hour+time.Second)), "Heartbeat after takeover")
}

// Every terminal status, with or without an error, round-trips and releases the claim.
func testFinishRunStatuses(e *claims) {
	cases := []struct {
		status agent.RunStatus
		err    *agent.RunError
	}{
		{agent.RunCompleted, nil},
		{agent.RunInterrupted, nil},
		{agent.RunCanceled, nil},
		{agent.RunFailed, &agent.RunError{Code: agent.CodeModelError, Message: "upstream said 500: \"boom\""}},
		{agent.RunFailed, &agent.RunError{Code: agent.CodeStale}},
	}
	for _, tc := range cases {
		th := newThread(e)
		run := claim(e, th, e.id("run"), at(0)).Run
		run = finished(run, tc.status, agent.Usage{InputTokens: 7}, at(time.Minute))
		run.Error = tc.err
		must(e.t, e.s.FinishRun(e.ctx, run), "FinishRun "+string(tc.status))
		got := getRun(e, th.ID, run.ID)
		same(e.t, "run after FinishRun "+string(tc.status), got, run)
		wantUTC(e.t, "finished run", got.CreatedAt, got.UpdatedAt, got.FinishedAt)
		if c := getThread(e, th.ID).ActiveRun; c != nil {
			e.t.Fatalf("claim after FinishRun %s = %s, want none", tc.status, show(c))
		}
	}
}

func testFinishRunAddsUsage(e *claims) {
	t := e.t
	th := newThread(e)
	usages := []agent.Usage{
		{InputTokens: 100, OutputTokens: 20, TotalTokens: 120, CachedInputTokens: 50},
		{InputTokens: 7, OutputTokens: 3, TotalTokens: 10},
		{},
	}
	var total agent.Usage
	for i, u := range usages {
		now := at(time.Duration(i) * time.Minute)
		run := claim(e, th, e.id("run"), now).Run
		finish(e, run, agent.RunCompleted, u, now.Add(time.Second))
		total = total.Add(u)
		if got := getThread(e, th.ID).Usage; got != total {
			t.Fatalf("thread usage after run %d = %+v, want %+v", i, got, total)
		}
	}
}

// A finished turn moves its thread to the top of its owner's list: the release sets UpdatedAt to FinishedAt.
func testFinishRunMovesThreadUp(e *claims) {
	t := e.t
	owner := e.id("owner")
	older := createThread(e, owner, e.id("th"), at(time.Minute))
	newer := createThread(e, owner, e.id("th"), at(2*time.Minute))
	run := claim(e, older, e.id("run"), at(3*time.Minute)).Run
	finish(e, run, agent.RunCompleted, agent.Usage{}, at(4*time.Minute))
	got, err := e.s.ListThreads(e.ctx, owner, 0)
	must(t, err, "ListThreads")
	if len(got) != 2 || got[0].ID != older.ID || got[1].ID != newer.ID {
		t.Fatalf("ListThreads after a finished turn = %s, want %s first", show(got), older.ID)
	}
	if !got[0].UpdatedAt.Equal(at(4 * time.Minute)) {
		t.Fatalf("UpdatedAt after finish = %s, want the run's FinishedAt %s", got[0].UpdatedAt, at(4*time.Minute))
	}
}

// FinishRun is a compare-and-set from running at the run's epoch: a second finish or a stale epoch changes nothing.
func testFinishRunFenced(e *claims) {
	t := e.t
	cases := []struct {
		name string
		// arrange returns the thread and a finish that must be fenced.
		arrange func() (agent.Thread, agent.Run)
	}{
		{"second finish", func() (agent.Thread, agent.Run) {
			th := newThread(e)
			run := claim(e, th, e.id("run"), at(0)).Run
			finish(e, run, agent.RunCompleted, agent.Usage{InputTokens: 5}, at(time.Second))
			return th, finished(run, agent.RunFailed, agent.Usage{InputTokens: 1000}, at(time.Hour))
		}},
		{"older epoch", func() (agent.Thread, agent.Run) {
			th := newThread(e)
			run := claim(e, th, e.id("run"), at(0)).Run
			run.Epoch--
			return th, finished(run, agent.RunCompleted, agent.Usage{InputTokens: 1000}, at(time.Hour))
		}},
		{"newer epoch", func() (agent.Thread, agent.Run) {
			th := newThread(e)
			run := claim(e, th, e.id("run"), at(0)).Run
			run.Epoch++
			return th, finished(run, agent.RunCompleted, agent.Usage{InputTokens: 1000}, at(time.Hour))
		}},
	}
	for _, tc := range cases {
		th, run := tc.arrange()
		beforeThread := getThread(e, th.ID)
		beforeRun := getRun(e, th.ID, run.ID)
		err := e.s.FinishRun(e.ctx, run)
		wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": FinishRun")
		same(t, tc.name+": run unchanged", getRun(e, th.ID, run.ID), beforeRun)
		same(t, tc.name+": thread unchanged", getThread(e, th.ID), beforeThread)
	}
}

// The reaper finishes a run whose claim was already taken over: the run is recorded and the new claim survives.
func testFinishAfterTakeover(e *claims) {
	t := e.t
	th := newThread(e)
	old := claim(e, th, e.id("run"), at(0)).Run
	res := claim(e, th, e.id("run"), at(time.Hour))
	if res.Previous == nil || res.Previous.RunID != old.ID {
		t.Fatalf("takeover Previous = %s, want %s", show(res.Previous), old.ID)
	}
	reaped := finished(old, agent.RunFailed, agent.Usage{InputTokens: 3, TotalTokens: 3}, at(time.Hour+time.Second))
	reaped.Error = &agent.RunError{Code: agent.CodeStale, Message: "heartbeat lost"}
	must(t, e.s.FinishRun(e.ctx, reaped), "FinishRun(taken-over run)")
	same(t, "reaped run", getRun(e, th.ID, old.ID), reaped)

	got := getThread(e, th.ID)
	same(t, "new claim survives", got.ActiveRun, &agent.Claim{RunID: res.Run.ID, Epoch: 2, HeartbeatAt: at(time.Hour)})
	// Usage is added only by the write that releases a claim, and a takeover released none: the reaped run's
	// usage is not counted here (the engine reaps through ReleaseClaim before it claims, which counts it once).
	if got.Usage != (agent.Usage{}) {
		t.Fatalf("thread usage = %+v, want none added by a finish that released no claim", got.Usage)
	}
	must(t, e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: res.Run.ID, Epoch: 2}, at(time.Hour+2*time.Second)), "Heartbeat(new run)")
	finish(e, res.Run, agent.RunCompleted, agent.Usage{}, at(time.Hour+3*time.Second))
	if c := getThread(e, th.ID).ActiveRun; c != nil {
		t.Fatalf("claim after the new run finished = %s, want none", show(c))
	}
}

// ListRuns is oldest first with ties broken by id ascending.
func testListRunsOrder(e *claims) {
	t := e.t
	th := newThread(e)
	base := e.id("run")
	// run-2 first at 0s; then run-3 and run-1 both created at 10s (run-1 claimed after run-3 finished).
	r2 := claim(e, th, base+"-2", at(0)).Run
	r2 = finish(e, r2, agent.RunCompleted, agent.Usage{}, at(5*time.Second))
	r3 := claim(e, th, base+"-3", at(10*time.Second)).Run
	r3 = finish(e, r3, agent.RunFailed, agent.Usage{}, at(10*time.Second))
	r1 := claim(e, th, base+"-1", at(10*time.Second)).Run

	got, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	same(t, "ListRuns", got, []agent.Run{r2, r1, r3})

	got, err = e.s.ListRuns(e.ctx, e.id("th"))
	must(t, err, "ListRuns(unknown thread)")
	if len(got) != 0 {
		t.Fatalf("ListRuns(unknown thread) = %d runs, want none", len(got))
	}
}

func testGetRunUnknown(e *claims) {
	_, err := e.s.GetRun(e.ctx, e.id("th"), e.id("run"))
	wantErr(e.t, err, agent.KindNotFound, "", "GetRun(unknown thread)")
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	_, err = e.s.GetRun(e.ctx, th.ID, e.id("run"))
	wantErr(e.t, err, agent.KindNotFound, "", "GetRun(unknown run)")
	// A run is found only under its own thread.
	other := newThread(e)
	_, err = e.s.GetRun(e.ctx, other.ID, run.ID)
	wantErr(e.t, err, agent.KindNotFound, "", "GetRun(run of another thread)")
}

// ListStaleClaims finds exactly the claims whose heartbeat is older than the cutoff; a refreshed or released claim
// drops out. The times sit ten days before every other case's, so a table shared with them holds nothing older.
func testListStaleClaims(e *claims) {
	t := e.t
	base := at(-10 * 24 * time.Hour)
	var threads []agent.Thread
	var runs []agent.Run
	for i := range 5 {
		th := newThread(e)
		threads = append(threads, th)
		runs = append(runs, claim(e, th, e.id("run"), base.Add(time.Duration(i)*time.Minute)).Run)
	}
	cutoff := base.Add(3 * time.Minute)
	mine := func(got []agent.StaleClaim) map[string]agent.Claim {
		m := map[string]agent.Claim{}
		for _, sc := range got {
			for _, th := range threads {
				if sc.ThreadID == th.ID {
					m[th.ID] = sc.Claim
				}
			}
		}
		return m
	}
	got, err := e.s.ListStaleClaims(e.ctx, cutoff, 1000)
	must(t, err, "ListStaleClaims")
	found := mine(got)
	for i, th := range threads {
		c, ok := found[th.ID]
		if stale := i < 3; ok != stale {
			t.Fatalf("claim %d (heartbeat %s) listed = %t, want %t for cutoff %s", i, runs[i].CreatedAt, ok, stale, cutoff)
		}
		if ok {
			same(t, fmt.Sprintf("stale claim %d", i), c, agent.Claim{RunID: runs[i].ID, Epoch: runs[i].Epoch, HeartbeatAt: runs[i].CreatedAt})
		}
	}
	if limited, err := e.s.ListStaleClaims(e.ctx, cutoff, 2); err != nil || len(limited) > 2 {
		t.Fatalf("ListStaleClaims(limit 2) = %d claims, %v", len(limited), err)
	}
	// A heartbeat refreshes claim 0; finishing run 1 releases its claim: only claim 2 stays stale.
	must(t, e.s.Heartbeat(e.ctx, threads[0].ID, agent.Fence{RunID: runs[0].ID, Epoch: runs[0].Epoch}, base.Add(time.Hour)), "Heartbeat")
	finish(e, runs[1], agent.RunCompleted, agent.Usage{}, base.Add(time.Hour))
	got, err = e.s.ListStaleClaims(e.ctx, cutoff, 1000)
	must(t, err, "ListStaleClaims after refresh and release")
	if found := mine(got); len(found) != 1 || found[threads[2].ID].RunID != runs[2].ID {
		t.Fatalf("stale claims after refresh and release = %v, want only %s", found, threads[2].ID)
	}
}
