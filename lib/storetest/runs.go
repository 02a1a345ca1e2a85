package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
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
		c{"HeartbeatWhileCanceled", testHeartbeatWhileCanceled},
		c{"KeepClaimsAnswersEachAsHeartbeat", testKeepClaims},
		c{"FinishRunStatuses", testFinishRunStatuses},
		c{"FinishRunAddsUsage", testFinishRunAddsUsage},
		c{"FinishRunMovesThreadUp", testFinishRunMovesThreadUp},
		c{"FinishRunFenced", testFinishRunFenced},
		c{"FinishAfterTakeoverKeepsNewClaim", testFinishAfterTakeover},
		c{"FinishRunAfterReapIsFenced", testFinishRunAfterReap},
		c{"TakeOverIsTheReapDecision", testTakeOver},
		c{"ListRunsOrder", testListRunsOrder},
		c{"ListRunsPage", testListRunsPage},
		c{"ListStaleClaims", testListStaleClaims},
		c{"GetRunUnknown", testGetRunUnknown},
		c{"ClaimWrongOwnerIsNotFound", testClaimWrongOwner},
		c{"ClaimResultThread", testClaimResultThread},
		c{"ClaimWithoutStaleAfterNeverTakesOver", testClaimNoStaleAfter},
		c{"ClaimReservesPositions", testClaimReservesPositions},
		c{"ClaimRetryIsIdempotent", testClaimRetry},
		c{"ClaimConcurrentRetriesConverge", testClaimConcurrentRetries},
		c{"RequestCancelNamedRun", testRequestCancelNamedRun},
		c{"MarkReader", testMarkReader},
		c{"ReadersOfReadsEveryClaimsMark", testReadersOf},
		c{"FinishRunRefusesNonTerminal", testFinishRunNonTerminal},
		c{"ReleaseClaim", testReleaseClaim},
		c{"ReleaseClaimWithoutRunRow", testReleaseClaimWithoutRun},
		c{"ReapCountsUsageOnce", testReleaseThenFinish},
		c{"ListStaleClaimsDefaultLimit", testListStaleClaimsDefaultLimit},
		c{"ListOrphanRuns", testListOrphanRuns},
		c{"OrphanListedThroughLaterTurns", testOrphanThroughLaterTurns},
		c{"NoteTakesSealedByTheOutcome", testNoteTakes},
		c{"ReleasedUsageKeptUntilTheOutcome", testReleasedUsage},
		c{"StubRunOnlyWhereMissing", testStubRun},
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
	want.HeartbeatAt = at(2 * time.Second) // a cancel request is not a fence: the heartbeat is recorded (REVIEW D2)
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
	must(t, e.s.Heartbeat(e.ctx, th.ID, last.Run.Fence(), at(time.Hour+time.Second)), "Heartbeat after takeover")
}

// KeepClaims is Heartbeat for a batch: each claim is answered, in order, as Heartbeat would answer it (a live
// claim nil, a cancel-requested one run_canceled with its heartbeat recorded, a taken-over or unknown one
// run_fenced, one whose gate refuses the gate's error), only the accepted claims' heartbeats are written, and each
// recorded claim comes back as GetThread reads it. An empty batch is answered with an empty slice.
func testKeepClaims(e *claims) {
	t := e.t
	for _, empty := range [][]agent.KeptClaim{nil, {}} {
		if got := e.s.KeepClaims(e.ctx, empty, at(time.Second)); len(got) != 0 {
			t.Fatalf("KeepClaims(%#v) = %s, want no results", empty, show(got))
		}
	}
	live := func() (agent.Thread, agent.Run) {
		th := newThread(e)
		return th, claim(e, th, e.id("run"), at(0)).Run
	}
	liveA, runA := live()
	liveB, runB := live()
	canceled, runC := live()
	_, err := e.s.RequestCancel(e.ctx, canceled.ID, runC.ID, at(time.Second))
	must(t, err, "RequestCancel")
	taken, runT := live()
	claim(e, taken, e.id("run"), at(time.Hour)) // a lazy takeover: runT is fenced
	refused, runR := live()
	unknown := e.id("th")

	doubt := errors.New("claim in doubt")
	var asked sync.Map
	gate := func(name string, err error) func() error {
		return func() error { asked.Store(name, true); return err }
	}
	now := at(20 * time.Second)
	batch := []agent.KeptClaim{
		{ThreadID: liveA.ID, Fence: runA.Fence(), Gate: gate("liveA", nil)},
		{ThreadID: canceled.ID, Fence: runC.Fence()},
		{ThreadID: taken.ID, Fence: runT.Fence(), Gate: gate("taken", nil)},
		{ThreadID: unknown, Fence: agent.Fence{RunID: e.id("run"), Epoch: 1}},
		{ThreadID: refused.ID, Fence: runR.Fence(), Gate: gate("refused", doubt)},
		{ThreadID: liveB.ID, Fence: runB.Fence()},
	}
	before := map[string]agent.Thread{taken.ID: getThread(e, taken.ID), refused.ID: getThread(e, refused.ID)}
	got := e.s.KeepClaims(e.ctx, batch, now)
	if len(got) != len(batch) {
		t.Fatalf("KeepClaims answered %d results for %d claims: %s", len(got), len(batch), show(got))
	}
	for _, name := range []string{"liveA", "refused"} {
		if _, ok := asked.Load(name); !ok {
			t.Fatalf("the gate of claim %s was never asked", name)
		}
	}
	for i, k := range []struct {
		name string
		kind agent.Kind
		code string
	}{
		{"live A", 0, ""},
		{"canceled", agent.KindCanceled, agent.CodeRunCanceled},
		{"taken over", agent.KindConflict, agent.CodeRunFenced},
		{"unknown thread", agent.KindConflict, agent.CodeRunFenced},
		{"gate refused", 0, ""},
		{"live B", 0, ""},
	} {
		r := got[i]
		switch {
		case k.name == "gate refused":
			if !errors.Is(r.Err, doubt) {
				t.Fatalf("%s: error = %v, want the gate's %v", k.name, r.Err, doubt)
			}
		case k.code == "":
			must(t, r.Err, k.name+": KeepClaims")
		default:
			wantErr(t, r.Err, k.kind, k.code, k.name+": KeepClaims")
		}
		var th agent.Thread
		if batch[i].ThreadID != unknown {
			th = getThread(e, batch[i].ThreadID)
		}
		if b, ok := before[batch[i].ThreadID]; ok {
			same(t, k.name+": thread unchanged", th, b)
			same(t, k.name+": no claim returned", r.Claim, agent.Claim{})
			continue
		}
		if batch[i].ThreadID == unknown {
			same(t, k.name+": no claim returned", r.Claim, agent.Claim{})
			continue
		}
		want := agent.Claim{RunID: batch[i].Fence.RunID, Epoch: batch[i].Fence.Epoch, HeartbeatAt: now,
			CancelRequested: k.code == agent.CodeRunCanceled}
		same(t, k.name+": stored claim", th.ActiveRun, &want)
		same(t, k.name+": returned claim (as GetThread reads it)", r.Claim, *th.ActiveRun)
	}
	// The accepted heartbeats keep their claims off the reaper's list; the refused one's claim stays stale.
	stale, err := e.s.ListStaleClaims(e.ctx, at(10*time.Second), 1000)
	must(t, err, "ListStaleClaims")
	listed := map[string]bool{}
	for _, sc := range stale {
		listed[sc.ThreadID] = true
	}
	for _, th := range []agent.Thread{liveA, liveB, canceled} {
		if listed[th.ID] {
			t.Fatalf("thread %s kept at %s is listed stale before %s", th.ID, now, at(10*time.Second))
		}
	}
	if !listed[refused.ID] {
		t.Fatalf("thread %s, whose gate refused its heartbeat, is not listed stale before %s", refused.ID, at(10*time.Second))
	}
}

// A cancel request is not a fence (REVIEW D2): a stopped run still finishing (a slow tool returning) keeps its
// claim alive. Each heartbeat is recorded and answers KindCanceled/CodeRunCanceled, so the claim never goes stale
// under the run and no reaper takes it, while the run learns it was asked to stop.
func testHeartbeatWhileCanceled(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	_, err := e.s.RequestCancel(e.ctx, th.ID, run.ID, at(time.Second))
	must(t, err, "RequestCancel")
	for _, beat := range []time.Duration{20 * time.Second, 40 * time.Second, time.Minute} {
		err := e.s.Heartbeat(e.ctx, th.ID, run.Fence(), at(beat))
		wantErr(t, err, agent.KindCanceled, agent.CodeRunCanceled, fmt.Sprintf("Heartbeat at %s after the stop", beat))
		same(t, fmt.Sprintf("claim after the heartbeat at %s", beat), getThread(e, th.ID).ActiveRun,
			&agent.Claim{RunID: run.ID, Epoch: run.Epoch, HeartbeatAt: at(beat), CancelRequested: true})
	}
	// A reaper deciding at a cutoff the heartbeats passed keeps its hands off; the run finishes canceled.
	err = e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: run.Fence(), StaleBefore: at(50 * time.Second)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "ReleaseClaim of a canceled run that heartbeats")
	finish(e, run, agent.RunCanceled, agent.Usage{}, at(time.Minute+time.Second))
	if got := getThread(e, th.ID); got.ActiveRun != nil {
		t.Fatalf("claim after the canceled run finished = %s, want none", show(got.ActiveRun))
	}
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
		{InputTokens: 100, OutputTokens: 20, TotalTokens: 120, CachedInputTokens: 50, ReasoningTokens: 12, CacheWriteTokens: 30, CostMicroUSD: 987},
		{InputTokens: 7, OutputTokens: 3, TotalTokens: 10, CostMicroUSD: 5},
		{},
	}
	var total agent.Usage
	for i, u := range usages {
		now := at(time.Duration(i) * time.Minute)
		run := claim(e, th, e.id("run"), now).Run
		finish(e, run, agent.RunCompleted, u, now.Add(time.Second))
		total = total.Add(u)
		if got := getRun(e, th.ID, run.ID).Usage; got != u {
			t.Fatalf("run %d usage = %+v, want %+v", i, got, u)
		}
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

// A run whose claim was taken over (a lazy takeover by a later claim) is fenced: its FinishRun changes nothing,
// and the new claim survives.
func testFinishAfterTakeover(e *claims) {
	t := e.t
	th := newThread(e)
	old := claim(e, th, e.id("run"), at(0)).Run
	res := claim(e, th, e.id("run"), at(time.Hour))
	if res.Previous == nil || res.Previous.RunID != old.ID {
		t.Fatalf("takeover Previous = %s, want %s", show(res.Previous), old.ID)
	}
	late := finished(old, agent.RunCompleted, agent.Usage{InputTokens: 3, TotalTokens: 3}, at(time.Hour+time.Second))
	wantErr(t, e.s.FinishRun(e.ctx, late), agent.KindConflict, agent.CodeRunFenced, "FinishRun(taken-over run)")
	if got := getRun(e, th.ID, old.ID); got.Status != agent.RunRunning {
		t.Fatalf("taken-over run after its FinishRun: %s, want running (the reaper records it)", got.Status)
	}
	got := getThread(e, th.ID)
	same(t, "new claim survives", got.ActiveRun, &agent.Claim{RunID: res.Run.ID, Epoch: 2, HeartbeatAt: at(time.Hour)})
	if got.Usage != (agent.Usage{}) {
		t.Fatalf("thread usage = %+v, want none added by a fenced finish", got.Usage)
	}
	must(t, e.s.Heartbeat(e.ctx, th.ID, agent.Fence{RunID: res.Run.ID, Epoch: 2}, at(time.Hour+2*time.Second)), "Heartbeat(new run)")
	finish(e, res.Run, agent.RunCompleted, agent.Usage{}, at(time.Hour+3*time.Second))
	if c := getThread(e, th.ID).ActiveRun; c != nil {
		t.Fatalf("claim after the new run finished = %s, want none", show(c))
	}
}

// REVIEW D4 (knownBugs seed 2745), fence C: a FinishRun in flight across the reaper's decision is refused as
// fenced: the run stays as the reaper records it, and its usage does not reach the thread through it.
func testFinishRunAfterReap(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	hold, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), StaleBefore: at(time.Minute),
		RunID: run.ID, Now: at(time.Minute)})
	must(t, err, "TakeOver")
	done := finished(run, agent.RunCompleted, agent.Usage{InputTokens: 100, OutputTokens: 50, TotalTokens: 150}, at(time.Minute+time.Second))
	wantErr(t, e.s.FinishRun(e.ctx, done), agent.KindConflict, agent.CodeRunFenced, "FinishRun after the reaper's decision")
	if got := getRun(e, th.ID, run.ID); got.Status != agent.RunRunning || got.Usage != (agent.Usage{}) {
		t.Fatalf("run after a fenced FinishRun = %s, want running with no usage", show(got))
	}
	got := getThread(e, th.ID)
	if got.Usage != (agent.Usage{}) {
		t.Fatalf("thread usage after a fenced FinishRun = %+v, want none", got.Usage)
	}
	same(t, "the reaper's claim", got.ActiveRun, &agent.Claim{RunID: hold.RunID, Epoch: hold.Epoch, HeartbeatAt: at(time.Minute)})
	// The same after the reaper gave the thread back.
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: hold}), "ReleaseClaim(reaper)")
	wantErr(t, e.s.FinishRun(e.ctx, done), agent.KindConflict, agent.CodeRunFenced, "FinishRun after the reap")
	if got := getRun(e, th.ID, run.ID); got.Status != agent.RunRunning {
		t.Fatalf("run after a fenced FinishRun = %s, want running", show(got))
	}
}

// TakeOver takes a stale claim at epoch+1 under the reaper's run id: a live claim, another run's, another epoch
// or a second take are refused; an idle thread is taken only when asked for one (no fence).
func testTakeOver(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	take := agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), StaleBefore: at(0), RunID: run.ID, Now: at(time.Minute)}
	_, err := e.s.TakeOver(e.ctx, take)
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "TakeOver of a live claim")
	_, err = e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, RunID: run.ID, Now: at(time.Minute)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "TakeOver of a claimed thread as idle")
	take.StaleBefore = at(time.Second)
	hold, err := e.s.TakeOver(e.ctx, take)
	must(t, err, "TakeOver")
	if want := (agent.Fence{RunID: agent.ReapRunID(run.ID), Epoch: run.Epoch + 1}); hold != want {
		t.Fatalf("TakeOver = %+v, want %+v", hold, want)
	}
	_, err = e.s.TakeOver(e.ctx, take)
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "second TakeOver")
	wantErr(t, e.s.Heartbeat(e.ctx, th.ID, run.Fence(), at(time.Minute)), agent.KindConflict, agent.CodeRunFenced, "Heartbeat of the dead run")
	// A reaper that died is reaped the same way: its claim is taken at the next epoch, named after the same run.
	again, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: hold, StaleBefore: at(2 * time.Minute),
		RunID: agent.ReapedRunID(hold.RunID), Now: at(2 * time.Minute)})
	must(t, err, "TakeOver of a dead reaper's claim")
	if want := (agent.Fence{RunID: agent.ReapRunID(run.ID), Epoch: run.Epoch + 2}); again != want {
		t.Fatalf("TakeOver of a dead reaper = %+v, want %+v", again, want)
	}
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: again}), "ReleaseClaim")
	idle, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, RunID: run.ID, Now: at(3 * time.Minute)})
	must(t, err, "TakeOver of an idle thread")
	if idle.Epoch != run.Epoch+3 {
		t.Fatalf("TakeOver of an idle thread: epoch %d, want %d", idle.Epoch, run.Epoch+3)
	}
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: idle}), "ReleaseClaim")
	if res := claim(e, th, e.id("run"), at(4*time.Minute)); res.Run.Epoch != run.Epoch+4 {
		t.Fatalf("claim after the reaps: epoch %d, want %d", res.Run.Epoch, run.Epoch+4)
	}
	_, err = e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: e.id("th"), RunID: run.ID, Now: at(time.Minute)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "TakeOver of an unknown thread")
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

// Pages of runs walk ListRuns' order backwards, created-at ties by id, each run exactly once, with More set on
// every page but the last.
func testListRunsPage(e *claims) {
	t := e.t
	th := newThread(e)
	base := e.id("run")
	var all []agent.Run
	for i, sec := range []int{0, 10, 10, 10, 20, 30, 30} { // three created at 10 s, two at 30 s: ties by id
		r := claim(e, th, fmt.Sprintf("%s-%d", base, 9-i), at(time.Duration(sec)*time.Second)).Run
		all = append(all, finish(e, r, agent.RunCompleted, agent.Usage{}, at(time.Duration(sec)*time.Second)))
	}
	want, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	if len(want) != len(all) {
		t.Fatalf("ListRuns = %d runs, want %d", len(want), len(all))
	}
	for _, limit := range []int{1, 2, 3, 7, 8} {
		for _, oldest := range []bool{false, true} {
			got := walk(t, "runs", limit, len(all), oldest, func(from agent.RunCursor) (agent.Page[agent.Run], error) {
				return e.s.ListRunsPage(e.ctx, th.ID, agent.RunPage{From: from, Oldest: oldest, Limit: limit})
			}, agent.Run.Cursor)
			same(t, fmt.Sprintf("runs paged by %d (oldest first: %v)", limit, oldest), got, want)
		}
	}
	p, err := e.s.ListRunsPage(e.ctx, e.id("th"), agent.RunPage{})
	must(t, err, "ListRunsPage(unknown thread)")
	if len(p.Items) != 0 || p.More {
		t.Fatalf("ListRunsPage(unknown thread) = %d runs, more %v; want none", len(p.Items), p.More)
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
			want := agent.Claim{RunID: runs[i].ID, Epoch: runs[i].Epoch, HeartbeatAt: runs[i].CreatedAt}
			same(t, fmt.Sprintf("stale claim %d", i), c, want)
		}
	}
	if limited, err := e.s.ListStaleClaims(e.ctx, cutoff, 2); err != nil || len(limited) > 2 {
		t.Fatalf("ListStaleClaims(limit 2) = %d claims, %v", len(limited), err)
	}
	// A heartbeat refreshes claim 0; finishing run 1 releases its claim: only claim 2 stays stale.
	must(t, e.s.Heartbeat(e.ctx, threads[0].ID, runs[0].Fence(), base.Add(time.Hour)), "Heartbeat")
	finish(e, runs[1], agent.RunCompleted, agent.Usage{}, base.Add(time.Hour))
	got, err = e.s.ListStaleClaims(e.ctx, cutoff, 1000)
	must(t, err, "ListStaleClaims after refresh and release")
	if found := mine(got); len(found) != 1 || found[threads[2].ID].RunID != runs[2].ID {
		t.Fatalf("stale claims after refresh and release = %v, want only %s", found, threads[2].ID)
	}
}

// Another owner's thread is reported exactly like a missing one, and the refused claim changes nothing.
func testClaimWrongOwner(e *claims) {
	t := e.t
	th := newThread(e)
	before := getThread(e, th.ID)
	for _, owner := range []string{e.id("intruder"), ""} {
		req := claimReq(th, e.id("run"), at(time.Second))
		req.Owner = owner
		_, err := e.s.ClaimRun(e.ctx, req)
		wantErr(t, err, agent.KindNotFound, "", "ClaimRun as "+strconv.Quote(owner))
		_, missing := e.s.ClaimRun(e.ctx, claimReq(agent.Thread{ID: e.id("th"), Owner: owner}, e.id("run"), at(0)))
		if agent.CodeOf(err) != agent.CodeOf(missing) {
			t.Fatalf("wrong owner answers %s, a missing thread %s: they must be one answer", agent.CodeOf(err), agent.CodeOf(missing))
		}
	}
	same(t, "thread after refused claims", getThread(e, th.ID), before)
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	if len(runs) != 0 {
		t.Fatalf("refused claims left %d runs", len(runs))
	}
	// The owner still claims it, at the first epoch.
	if got := claim(e, th, e.id("run"), at(2*time.Second)).Run; got.Epoch != 1 {
		t.Fatalf("owner's claim after refused ones: epoch %d, want 1", got.Epoch)
	}
}

// ClaimResult.Thread is the thread as the claim left it (a turn reads nothing else before it starts): the same as
// GetThread right after, for a first claim, a claim on a thread with history, and a takeover.
func testClaimResultThread(e *claims) {
	t := e.t
	th := newThread(e)
	settings := agent.ThreadSettings{ReviewTools: true}
	_, err := e.s.UpdateThread(e.ctx, th.ID, agent.ThreadPatch{Settings: &settings}, at(time.Second))
	must(t, err, "UpdateThread")
	steps := []time.Time{at(time.Minute), at(2 * time.Minute), at(time.Hour)}
	for i, now := range steps {
		res := claim(e, th, e.id("run"), now)
		got := getThread(e, th.ID)
		same(t, fmt.Sprintf("claim %d: ClaimResult.Thread", i), res.Thread, got)
		same(t, fmt.Sprintf("claim %d: ClaimResult.Thread.ActiveRun", i), res.Thread.ActiveRun,
			&agent.Claim{RunID: res.Run.ID, Epoch: res.Run.Epoch, HeartbeatAt: now})
		if res.Thread.Settings != settings || res.Thread.Owner != th.Owner || res.Thread.Epoch != res.Run.Epoch {
			t.Fatalf("claim %d: ClaimResult.Thread = %s, want the stored thread at epoch %d", i, show(res.Thread), res.Run.Epoch)
		}
		if i == 0 {
			// Finish the first run with usage; the second claim's thread carries it. The third claim takes the
			// second over (an hour later).
			finish(e, res.Run, agent.RunCompleted, agent.Usage{InputTokens: 9, TotalTokens: 9}, now.Add(time.Second))
		}
		if i > 0 && res.Thread.Usage != (agent.Usage{InputTokens: 9, TotalTokens: 9}) {
			t.Fatalf("claim %d: ClaimResult.Thread.Usage = %+v, want the finished run's", i, res.Thread.Usage)
		}
	}
}

// StaleAfter <= 0 means never take over: the caller reaps through ReleaseClaim first, so that the reaper's
// conditional release is the only reap decision.
func testClaimNoStaleAfter(e *claims) {
	t := e.t
	for _, sa := range []time.Duration{0, -time.Second} {
		th := newThread(e)
		first := claim(e, th, e.id("run"), at(0)).Run
		before := getThread(e, th.ID)
		req := claimReq(th, e.id("run"), at(24*time.Hour))
		req.StaleAfter = sa
		_, err := e.s.ClaimRun(e.ctx, req)
		wantErr(t, err, agent.KindConflict, agent.CodeRunActive, fmt.Sprintf("ClaimRun(StaleAfter %v) of a day-old claim", sa))
		same(t, "thread after the refused claim", getThread(e, th.ID), before)
		// Once released, the same request claims at once.
		must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: first.Fence(),
			StaleBefore: at(time.Hour), Now: at(24 * time.Hour)}), "ReleaseClaim")
		res, err := e.s.ClaimRun(e.ctx, req)
		must(t, err, "ClaimRun after release")
		if res.Previous != nil || res.Run.Epoch != 2 {
			t.Fatalf("claim after release = %s, want epoch 2 and no previous claim", show(res))
		}
	}
}

// Every claim reserves its own message positions: Reserve of them (at least one), right after everything any
// earlier claim reserved, whether the earlier run finished or was taken over; a refused claim reserves nothing.
// The run row keeps them.
func testClaimReservesPositions(e *claims) {
	t := e.t
	th := newThread(e)
	cases := []struct {
		reserve  int
		takeover bool // claim an hour later without finishing the previous run
	}{
		{0, false}, // a thread's first claim starts at 0; no Reserve means one
		{3, false},
		{-2, false},
		{2, true},
		{5, true},
		{1, false},
	}
	var (
		next int64 // the first position no claim has reserved
		prev agent.Run
		now  = at(0)
		all  []agent.Run
	)
	for i, tc := range cases {
		if i > 0 {
			// While prev holds the thread, a claim is refused and reserves nothing.
			req := claimReq(th, e.id("run"), now)
			req.Reserve = 50
			_, err := e.s.ClaimRun(e.ctx, req)
			wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "refused claim")
			if !tc.takeover {
				finish(e, prev, agent.RunCompleted, agent.Usage{}, now.Add(time.Second))
			}
		}
		now = now.Add(time.Hour)
		req := claimReq(th, e.id("run"), now)
		req.Reserve = tc.reserve
		res, err := e.s.ClaimRun(e.ctx, req)
		must(t, err, fmt.Sprintf("claim %d", i))
		run := res.Run
		want := max(tc.reserve, 1)
		if run.FirstSeq != next || run.Reserved != want {
			t.Fatalf("claim %d (Reserve %d): positions [%d,+%d), want [%d,+%d)", i, tc.reserve, run.FirstSeq, run.Reserved,
				next, want)
		}
		if got := run.AssistantSeq(); got != next+int64(want)-1 {
			t.Fatalf("claim %d: AssistantSeq = %d, want the last reserved position %d", i, got, next+int64(want)-1)
		}
		same(t, fmt.Sprintf("claim %d: GetRun", i), getRun(e, th.ID, run.ID), run)
		next += int64(want)
		prev = run
		all = append(all, run)
	}
	// ListRuns carries the positions too.
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	got := map[string]agent.Run{}
	for _, r := range runs {
		got[r.ID] = r
	}
	for _, r := range all {
		if g := got[r.ID]; g.FirstSeq != r.FirstSeq || g.Reserved != r.Reserved {
			t.Fatalf("ListRuns: run %s at [%d,+%d), want [%d,+%d)", r.ID, g.FirstSeq, g.Reserved, r.FirstSeq, r.Reserved)
		}
	}
}

// A claim whose response was lost is retried with the same RunID: the retry gets the same result (same epoch,
// same positions, same Previous) and changes nothing, instead of run_active for a claim nobody runs (REVIEW L20).
func testClaimRetry(e *claims) {
	t := e.t
	// check claims with req, retries it, and checks the thread then holds wantRuns runs (the retry adds none).
	check := func(name string, th agent.Thread, req agent.ClaimRequest, wantRuns int) {
		t.Helper()
		first, err := e.s.ClaimRun(e.ctx, req)
		must(t, err, name+": ClaimRun")
		after := getThread(e, th.ID)
		retry := req
		retry.Now = req.Now.Add(5 * time.Second) // the SDK retries a little later
		retry.Reserve = req.Reserve + 7          // and whatever else the retry carries, the stored claim wins
		for range 2 {
			again, err := e.s.ClaimRun(e.ctx, retry)
			must(t, err, name+": retried ClaimRun")
			same(t, name+": retried ClaimResult", again, first)
			same(t, name+": thread after retry", getThread(e, th.ID), after)
		}
		runs, err := e.s.ListRuns(e.ctx, th.ID)
		must(t, err, name+": ListRuns")
		if len(runs) != wantRuns {
			t.Fatalf("%s: %d runs after retries, want %d", name, len(runs), wantRuns)
		}
		// The next claim's positions start after the first attempt's reservation, not the retry's.
		finish(e, first.Run, agent.RunCompleted, agent.Usage{}, retry.Now.Add(time.Second))
		next := claim(e, th, e.id("run"), retry.Now.Add(2*time.Second)).Run
		if want := first.Run.FirstSeq + int64(first.Run.Reserved); next.FirstSeq != want || next.Epoch != first.Run.Epoch+1 {
			t.Fatalf("%s: next claim at seq %d epoch %d, want %d and %d", name, next.FirstSeq, next.Epoch, want, first.Run.Epoch+1)
		}
	}

	th := newThread(e)
	req := claimReq(th, e.id("run"), at(time.Second))
	req.Reserve = 2
	check("idle thread", th, req, 1)

	// A takeover's retry still reports the claim it took over, so the caller reaps it.
	th = newThread(e)
	old := claim(e, th, e.id("run"), at(0)).Run
	req = claimReq(th, e.id("run"), at(time.Hour))
	check("takeover", th, req, 2)
	if got := getRun(e, th.ID, old.ID); got.Status != agent.RunRunning {
		t.Fatalf("taken-over run status %s, want running until the caller reaps it", got.Status)
	}
}

// The SDK's retries of one claim can overlap the first attempt: however they interleave, the claim applies once
// (one epoch, one reservation, one run) and every attempt gets that one result.
func testClaimConcurrentRetries(e *claims) {
	t := e.t
	th := newThread(e)
	req := claimReq(th, e.id("run"), at(time.Second))
	req.Reserve = 3
	const attempts = 12
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]agent.ClaimResult, attempts)
		errs    = make([]error, attempts)
	)
	for i := range attempts {
		wg.Go(func() {
			<-start
			r := req
			r.Now = req.Now.Add(time.Duration(i) * time.Millisecond)
			results[i], errs[i] = e.s.ClaimRun(e.ctx, r)
		})
	}
	close(start)
	wg.Wait()
	for i := range attempts {
		must(t, errs[i], fmt.Sprintf("attempt %d", i))
		// Nothing heartbeats in between, so even the thread in every result is the same.
		same(t, fmt.Sprintf("attempt %d's result", i), results[i], results[0])
	}
	if got := results[0].Run; got.Epoch != 1 || got.FirstSeq != 0 || got.Reserved != 3 {
		t.Fatalf("converged claim = %s, want epoch 1 at [0,+3)", show(got))
	}
	same(t, "thread after the retries", getThread(e, th.ID), results[0].Thread)
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	same(t, "runs after the retries", runs, []agent.Run{results[0].Run})
}

// Stop names the run it means: a stop that arrives after its run ended must not cancel the next one (REVIEW L19).
func testRequestCancelNamedRun(e *claims) {
	t := e.t
	th := newThread(e)
	a := claim(e, th, e.id("run"), at(0)).Run
	_, err := e.s.RequestCancel(e.ctx, th.ID, e.id("run"), at(time.Second))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "RequestCancel(another run)")
	same(t, "claim after a stop for another run", getThread(e, th.ID).ActiveRun,
		&agent.Claim{RunID: a.ID, Epoch: 1, HeartbeatAt: at(0)})

	finish(e, a, agent.RunCompleted, agent.Usage{}, at(2*time.Second))
	c := claim(e, th, e.id("run"), at(3*time.Second)).Run
	// The user pressed stop on a; it arrives while c runs.
	_, err = e.s.RequestCancel(e.ctx, th.ID, a.ID, at(4*time.Second))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "RequestCancel(finished run) while another runs")
	must(t, e.s.Heartbeat(e.ctx, th.ID, c.Fence(), at(5*time.Second)), "Heartbeat of the run a late stop missed")

	got, err := e.s.RequestCancel(e.ctx, th.ID, c.ID, at(6*time.Second))
	must(t, err, "RequestCancel(named active run)")
	same(t, "RequestCancel result", got, agent.Claim{RunID: c.ID, Epoch: 2, HeartbeatAt: at(5 * time.Second), CancelRequested: true})
	err = e.s.Heartbeat(e.ctx, th.ID, c.Fence(), at(7*time.Second))
	wantErr(t, err, agent.KindCanceled, agent.CodeRunCanceled, "Heartbeat after a named stop")

	_, err = e.s.RequestCancel(e.ctx, e.id("th"), "", at(0))
	if err == nil {
		t.Fatal("RequestCancel(unknown thread) succeeded")
	}
}

// MarkReader moves the claim's ReadersUntil forward only (two readers, one marking less far, never shorten it),
// only while the claim names the run; a heartbeat and a stop keep it; the next claim starts without it, and so
// does the reaper's takeover.
func testMarkReader(e *claims) {
	t := e.t
	th := newThread(e)
	err := e.s.MarkReader(e.ctx, th.ID, e.id("run"), at(5*time.Second))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "MarkReader(idle thread)")
	err = e.s.MarkReader(e.ctx, e.id("th"), e.id("run"), at(5*time.Second))
	wantErr(t, err, agent.KindNotFound, agent.CodeThreadNotFound, "MarkReader(unknown thread)")

	a := claim(e, th, e.id("run"), at(0)).Run
	want := agent.Claim{RunID: a.ID, Epoch: 1, HeartbeatAt: at(0)}
	same(t, "claim before any reader", getThread(e, th.ID).ActiveRun, &want)
	steps := []struct {
		until, want time.Duration
	}{
		{5 * time.Second, 5 * time.Second},
		{7 * time.Second, 7 * time.Second},
		{6 * time.Second, 7 * time.Second}, // a reader that marks less far does not shorten another's
		{7 * time.Second, 7 * time.Second},
	}
	for _, st := range steps {
		must(t, e.s.MarkReader(e.ctx, th.ID, a.ID, at(st.until)), fmt.Sprintf("MarkReader(+%s)", st.until))
		want.ReadersUntil = at(st.want)
		same(t, fmt.Sprintf("claim after MarkReader(+%s)", st.until), getThread(e, th.ID).ActiveRun, &want)
	}
	err = e.s.MarkReader(e.ctx, th.ID, e.id("run"), at(time.Minute))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "MarkReader(another run)")

	must(t, e.s.Heartbeat(e.ctx, th.ID, a.Fence(), at(time.Second)), "Heartbeat")
	want.HeartbeatAt = at(time.Second)
	same(t, "claim after a heartbeat", getThread(e, th.ID).ActiveRun, &want)
	c, err := e.s.RequestCancel(e.ctx, th.ID, a.ID, at(2*time.Second))
	must(t, err, "RequestCancel")
	want.CancelRequested = true
	same(t, "RequestCancel's claim", c, want)

	finish(e, a, agent.RunCanceled, agent.Usage{}, at(3*time.Second))
	err = e.s.MarkReader(e.ctx, th.ID, a.ID, at(time.Minute))
	wantErr(t, err, agent.KindConflict, agent.CodeNoActiveRun, "MarkReader(finished run)")
	b := claim(e, th, e.id("run"), at(4*time.Second)).Run
	same(t, "next claim", getThread(e, th.ID).ActiveRun, &agent.Claim{RunID: b.ID, Epoch: 2, HeartbeatAt: at(4 * time.Second)})

	// A stale claim that readers marked: the reaper's takeover starts without the mark too.
	must(t, e.s.MarkReader(e.ctx, th.ID, b.ID, at(time.Hour)), "MarkReader(b)")
	f, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: b.Fence(), StaleBefore: at(time.Minute), RunID: b.ID, Now: at(time.Minute)})
	must(t, err, "TakeOver")
	same(t, "reaper's claim", getThread(e, th.ID).ActiveRun, &agent.Claim{RunID: f.RunID, Epoch: f.Epoch, HeartbeatAt: at(time.Minute)})
}

// ReadersOf answers one mark per thread asked, in order (a thread asked twice twice): the run its claim names
// and the claim's reader mark, none for an idle or unknown thread; it follows MarkReader and the next claim, and
// writes nothing (the claim reads the same after it). The store may read eventually consistently: the marks are
// asked until they show, a bounded number of times.
func testReadersOf(e *claims) {
	t := e.t
	marks, err := e.s.ReadersOf(e.ctx, nil)
	must(t, err, "ReadersOf(none)")
	if len(marks) != 0 {
		t.Fatalf("ReadersOf(none) = %+v, want none", marks)
	}
	read, marked, idle := newThread(e), newThread(e), newThread(e)
	unknown := e.id("th")
	a := claim(e, read, e.id("run"), at(0)).Run
	b := claim(e, marked, e.id("run"), at(0)).Run
	must(t, e.s.MarkReader(e.ctx, marked.ID, b.ID, at(5*time.Second)), "MarkReader")
	ids := []string{read.ID, marked.ID, idle.ID, unknown, marked.ID}
	want := []agent.ReaderMark{{ThreadID: read.ID, RunID: a.ID}, {ThreadID: marked.ID, RunID: b.ID, Until: at(5 * time.Second)},
		{ThreadID: idle.ID}, {ThreadID: unknown}, {ThreadID: marked.ID, RunID: b.ID, Until: at(5 * time.Second)}}
	readersUntil(e, "ReadersOf", ids, want)
	before := getThread(e, marked.ID)
	readersUntil(e, "ReadersOf again", ids, want)
	same(t, "thread after ReadersOf", getThread(e, marked.ID), before)

	// The mark moves on; the run's end takes it with the claim, and the next claim starts without it.
	must(t, e.s.MarkReader(e.ctx, marked.ID, b.ID, at(9*time.Second)), "MarkReader(+9s)")
	want[1].Until, want[4].Until = at(9*time.Second), at(9*time.Second)
	readersUntil(e, "ReadersOf after a later mark", ids, want)
	finish(e, b, agent.RunCompleted, agent.Usage{}, at(time.Second))
	want[1], want[4] = agent.ReaderMark{ThreadID: marked.ID}, agent.ReaderMark{ThreadID: marked.ID}
	readersUntil(e, "ReadersOf after the run finished", ids, want)
	c := claim(e, marked, e.id("run"), at(2*time.Second)).Run
	want[1], want[4] = agent.ReaderMark{ThreadID: marked.ID, RunID: c.ID}, agent.ReaderMark{ThreadID: marked.ID, RunID: c.ID}
	readersUntil(e, "ReadersOf after the next claim", ids, want)

	// Many threads at once (DynamoDB: more than one BatchGetItem of 100 keys).
	var many []string
	var wantMany []agent.ReaderMark
	for i := range 150 {
		id := e.id(fmt.Sprintf("th%d", i))
		many = append(many, id)
		wantMany = append(wantMany, agent.ReaderMark{ThreadID: id})
	}
	many = append(many, marked.ID)
	wantMany = append(wantMany, want[1])
	readersUntil(e, "ReadersOf(151 threads)", many, wantMany)
}

// readersUntil asks ReadersOf(ids) until it answers want (an eventually consistent read may lag a write a
// moment), failing after a bounded number of asks.
func readersUntil(e *claims, what string, ids []string, want []agent.ReaderMark) {
	e.t.Helper()
	var got []agent.ReaderMark
	for range 50 {
		var err error
		got, err = e.s.ReadersOf(e.ctx, ids)
		must(e.t, err, what)
		if reflect.DeepEqual(got, want) {
			return
		}
	}
	e.t.Fatalf("%s = %+v, want %+v", what, got, want)
}

// FinishRun records only terminal outcomes; anything else is refused with the catalog's code and changes nothing.
func testFinishRunNonTerminal(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	beforeThread, beforeRun := getThread(e, th.ID), getRun(e, th.ID, run.ID)
	for _, status := range []agent.RunStatus{agent.RunRunning, ""} {
		bad := finished(run, status, agent.Usage{InputTokens: 100}, at(time.Minute))
		err := e.s.FinishRun(e.ctx, bad)
		wantErr(t, err, agent.KindInvalid, agent.CodeInvalidStatus, fmt.Sprintf("FinishRun(status %q)", status))
	}
	same(t, "run after refused finishes", getRun(e, th.ID, run.ID), beforeRun)
	same(t, "thread after refused finishes", getThread(e, th.ID), beforeThread)
}

// ReleaseClaim is the reaper's decision, re-checked in the write: same run, same epoch, heartbeat strictly before
// the cutoff. A live run keeps its claim; the release adds the usage its draft recorded.
func testReleaseClaim(e *claims) {
	usage := agent.Usage{InputTokens: 11, OutputTokens: 4, TotalTokens: 15, CachedInputTokens: 2}
	cases := []struct {
		name string
		// arrange claims a thread and returns the release to try.
		arrange  func(th agent.Thread) agent.ReleaseRequest
		released bool
	}{
		{"heartbeat before the cutoff", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence(), StaleBefore: at(time.Millisecond)}
		}, true},
		{"zero cutoff releases any heartbeat", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(time.Hour)).Run
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence()}
		}, true},
		{"cancel-requested claim", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			_, err := e.s.RequestCancel(e.ctx, th.ID, r.ID, at(time.Second))
			must(e.t, err, "RequestCancel")
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence(), StaleBefore: at(time.Minute)}
		}, true},
		{"heartbeat at the cutoff (a live run)", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			must(e.t, e.s.Heartbeat(e.ctx, th.ID, r.Fence(), at(time.Minute)), "Heartbeat")
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence(), StaleBefore: at(time.Minute)}
		}, false},
		{"heartbeat resumed after the index nominated it", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			must(e.t, e.s.Heartbeat(e.ctx, th.ID, r.Fence(), at(2*time.Minute)), "Heartbeat")
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence(), StaleBefore: at(time.Minute)}
		}, false},
		{"another run id", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: agent.Fence{RunID: e.id("run"), Epoch: r.Epoch}}
		}, false},
		{"another epoch", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: agent.Fence{RunID: r.ID, Epoch: r.Epoch + 1}}
		}, false},
		{"taken over", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			claim(e, th, e.id("run"), at(time.Hour))
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence()}
		}, false},
		{"already finished", func(th agent.Thread) agent.ReleaseRequest {
			r := claim(e, th, e.id("run"), at(0)).Run
			finish(e, r, agent.RunCompleted, agent.Usage{}, at(time.Second))
			return agent.ReleaseRequest{ThreadID: th.ID, Fence: r.Fence()}
		}, false},
	}
	for _, tc := range cases {
		t := e.t
		th := newThread(e)
		req := tc.arrange(th)
		req.Usage = usage
		req.Now = at(2 * time.Hour)
		before := getThread(e, th.ID)
		err := e.s.ReleaseClaim(e.ctx, req)
		if !tc.released {
			wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": ReleaseClaim")
			same(t, tc.name+": thread unchanged", getThread(e, th.ID), before)
			continue
		}
		must(t, err, tc.name+": ReleaseClaim")
		got := getThread(e, th.ID)
		if got.ActiveRun != nil || got.Usage != before.Usage.Add(usage) || got.Epoch != before.Epoch {
			t.Fatalf("%s: thread after release = %s, want idle at epoch %d with the draft's usage added",
				tc.name, show(got), before.Epoch)
		}
		// The released run is fenced; a second release changes nothing; the thread can be claimed at once.
		err = e.s.Heartbeat(e.ctx, th.ID, req.Fence, at(2*time.Hour))
		wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": Heartbeat after release")
		err = e.s.ReleaseClaim(e.ctx, req)
		wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, tc.name+": second ReleaseClaim")
		if got := getThread(e, th.ID); got.Usage != before.Usage.Add(usage) {
			t.Fatalf("%s: usage after a second release = %+v, want it added once", tc.name, got.Usage)
		}
		next := claimReq(th, e.id("run"), at(2*time.Hour))
		next.StaleAfter = 0
		res, err := e.s.ClaimRun(e.ctx, next)
		must(t, err, tc.name+": ClaimRun after release")
		if res.Previous != nil || res.Run.Epoch != req.Fence.Epoch+1 {
			t.Fatalf("%s: claim after release = %s, want epoch %d and no previous", tc.name, show(res), req.Fence.Epoch+1)
		}
	}
	err := e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: e.id("th"), Fence: agent.Fence{RunID: "r", Epoch: 1}})
	wantErr(e.t, err, agent.KindConflict, agent.CodeRunFenced, "ReleaseClaim(unknown thread)")
}

// A claim whose run row is missing (a process that died between the claim and the run write, in a store where
// those are two writes) is released the same way (REVIEW M2). The suite builds that state the one way the port
// allows: a thread created with its claim.
func testReleaseClaimWithoutRun(e *claims) {
	t := e.t
	ghost := agent.Claim{RunID: e.id("run"), Epoch: 4, HeartbeatAt: at(0)}
	th := agent.Thread{ID: e.id("th"), Owner: e.id("user"), Epoch: 4, ActiveRun: &ghost, CreatedAt: at(0), UpdatedAt: at(0)}
	got, created, err := e.s.CreateThread(e.ctx, th)
	must(t, err, "CreateThread(with a claim)")
	if !created || !reflect.DeepEqual(got.ActiveRun, &ghost) {
		t.Fatalf("CreateThread(with a claim) = %s, %t; want the claim stored", show(got), created)
	}
	_, err = e.s.GetRun(e.ctx, th.ID, ghost.RunID)
	wantErr(t, err, agent.KindNotFound, "", "GetRun(the claim's run)")
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: agent.Fence{RunID: ghost.RunID, Epoch: 4},
		StaleBefore: at(time.Minute), Now: at(time.Minute)}), "ReleaseClaim(claim without a run)")
	if got := getThread(e, th.ID); got.ActiveRun != nil || got.Epoch != 4 {
		t.Fatalf("thread after release = %s, want idle at epoch 4", show(got))
	}
	if res := claim(e, th, e.id("run"), at(2*time.Minute)); res.Run.Epoch != 5 {
		t.Fatalf("claim after release: epoch %d, want 5", res.Run.Epoch)
	}
}

// The reaper's order: take the claim (the decision), record the run as failed, give the claim back adding the
// draft's usage. Usage reaches the thread exactly once, through the release; the run keeps what was recorded.
func testReleaseThenFinish(e *claims) {
	t := e.t
	draft := agent.Usage{InputTokens: 40, OutputTokens: 10, TotalTokens: 50}
	th, run, reaped := reap(e, draft)
	same(t, "reaped run", getRun(e, th.ID, run.ID), reaped)
	if got := getThread(e, th.ID).Usage; got != draft {
		t.Fatalf("thread usage = %+v, want the draft's %+v once", got, draft)
	}
	// A second reaper doing the same finds nothing to do and counts nothing.
	_, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), RunID: run.ID, Now: at(time.Hour)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "second reaper's TakeOver")
	other := reaped
	other.Usage = agent.Usage{InputTokens: 1, TotalTokens: 1}
	wantErr(t, e.s.RecordOutcome(e.ctx, other, agent.Fence{}), agent.KindConflict, agent.CodeRunFenced, "second reaper's RecordOutcome")
	wantErr(t, e.s.FinishRun(e.ctx, reaped), agent.KindConflict, agent.CodeRunFenced, "the dead run's FinishRun")
	if got := getThread(e, th.ID).Usage; got != draft {
		t.Fatalf("thread usage after a second reaper = %+v, want %+v", got, draft)
	}
}

// reap claims a run and reaps it as the reaper does: take the claim, record the run failed (stale) with the
// draft's usage, give the claim back adding that usage.
func reap(e *claims, draft agent.Usage) (agent.Thread, agent.Run, agent.Run) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	hold, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), StaleBefore: at(time.Minute),
		RunID: run.ID, Now: at(time.Hour)})
	must(t, err, "TakeOver")
	if got := getRun(e, th.ID, run.ID); got.Status != agent.RunRunning {
		t.Fatalf("run after the takeover: status %s, want running (the takeover decides, RecordOutcome records)", got.Status)
	}
	reaped := finished(run, agent.RunFailed, draft, at(time.Hour))
	reaped.Error = &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."}
	must(t, e.s.RecordOutcome(e.ctx, reaped, hold), "RecordOutcome(failed/stale)")
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: hold, Usage: draft, Now: at(time.Hour)}), "ReleaseClaim")
	return th, run, reaped
}

// limit <= 0 means agent.DefaultListLimit. The claims sit twenty days back, older than any other case's, and there
// are more of them than the default, so exactly the default comes back whatever else a shared table holds.
func testListStaleClaimsDefaultLimit(e *claims) {
	t := e.t
	base := at(-20 * 24 * time.Hour)
	for i := range agent.DefaultListLimit + 1 {
		claim(e, newThread(e), e.id("run"), base.Add(time.Duration(i)*time.Millisecond))
	}
	for _, limit := range []int{0, -1} {
		got, err := e.s.ListStaleClaims(e.ctx, base.Add(time.Second), limit)
		must(t, err, "ListStaleClaims")
		if len(got) != agent.DefaultListLimit {
			t.Fatalf("ListStaleClaims(limit %d) = %d claims, want %d", limit, len(got), agent.DefaultListLimit)
		}
		for _, sc := range got {
			if !sc.Claim.HeartbeatAt.Before(base.Add(time.Second)) {
				t.Fatalf("ListStaleClaims nominated a claim with heartbeat %s, after the cutoff", sc.Claim.HeartbeatAt)
			}
		}
	}
}

// ListOrphanRuns (agent.OrphanRunLister, REVIEW D15) names the runs recorded as running that no claim names, last
// changed before the cutoff: a claim released without the run's outcome (a crash inside FinishRun), and a run whose
// claim a later run took over. A claimed run, a finished run and one changed after the cutoff are not named. A
// store that does not offer the list skips the case.
func testListOrphanRuns(e *claims) {
	t := e.t
	lister, ok := any(e.s).(agent.OrphanRunLister)
	if !ok {
		t.Skip("the store does not list claimless running runs (agent.OrphanRunLister)")
	}
	base := at(-20 * 24 * time.Hour)
	cutoff := base.Add(3 * time.Minute)
	released := claim(e, newThread(e), e.id("run"), base).Run
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: released.ThreadID, Fence: released.Fence()}), "ReleaseClaim")
	claimed := claim(e, newThread(e), e.id("run"), base).Run
	done := claim(e, newThread(e), e.id("run"), base).Run
	finish(e, done, agent.RunCompleted, agent.Usage{}, base.Add(time.Minute))
	fresh := claim(e, newThread(e), e.id("run"), base.Add(5*time.Minute)).Run
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: fresh.ThreadID, Fence: fresh.Fence()}), "ReleaseClaim")
	th := newThread(e)
	overtaken := claim(e, th, e.id("run"), base).Run
	later := claim(e, th, e.id("run"), base.Add(staleAfter+time.Second)).Run

	got, err := lister.ListOrphanRuns(e.ctx, cutoff, 1000)
	must(t, err, "ListOrphanRuns")
	found := map[string]agent.Run{}
	for _, r := range got {
		found[r.ID] = r
	}
	for _, c := range []struct {
		run  agent.Run
		want bool
	}{{released, true}, {claimed, false}, {done, false}, {fresh, false}, {overtaken, true}, {later, false}} {
		r, ok := found[c.run.ID]
		if ok != c.want {
			t.Errorf("run %s (%s, epoch %d) listed = %t, want %t", c.run.ID, c.run.ThreadID, c.run.Epoch, ok, c.want)
		}
		if ok {
			same(t, "orphan run "+c.run.ID, r, c.run)
		}
	}
	if limited, err := lister.ListOrphanRuns(e.ctx, cutoff, 1); err != nil || len(limited) > 1 {
		t.Fatalf("ListOrphanRuns(limit 1) = %d runs, %v", len(limited), err)
	}
	// Once its outcome is recorded the released run is no longer named.
	must(t, e.s.RecordOutcome(e.ctx, finished(released, agent.RunFailed, agent.Usage{}, base.Add(time.Hour)), agent.Fence{}), "RecordOutcome")
	got, err = lister.ListOrphanRuns(e.ctx, cutoff, 1000)
	must(t, err, "ListOrphanRuns after the outcome")
	for _, r := range got {
		if r.ID == released.ID {
			t.Fatalf("run %s listed after its outcome was recorded", r.ID)
		}
	}
}

// A claimless running run stays on the orphan list however many turns the thread runs after it (a crash between
// FinishRun's release and its outcome, then the next messages answered as usual), until its outcome is recorded;
// the later runs, finished whole, are never named. A store that does not offer the list skips the case.
func testOrphanThroughLaterTurns(e *claims) {
	t := e.t
	lister, ok := any(e.s).(agent.OrphanRunLister)
	if !ok {
		t.Skip("the store does not list claimless running runs (agent.OrphanRunLister)")
	}
	base := at(-21 * 24 * time.Hour)
	th := newThread(e)
	orphan := claim(e, th, e.id("run"), base).Run
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: orphan.Fence(), Now: base.Add(time.Second)}), "ReleaseClaim")
	var later []agent.Run
	for i := range 3 {
		start := base.Add(time.Duration(2+2*i) * time.Second)
		run := claim(e, th, e.id("run"), start).Run
		finish(e, run, agent.RunCompleted, agent.Usage{}, start.Add(time.Second))
		later = append(later, run)
	}
	cutoff := base.Add(5 * time.Minute)
	listed := func() map[string]bool {
		t.Helper()
		got, err := lister.ListOrphanRuns(e.ctx, cutoff, 1000)
		must(t, err, "ListOrphanRuns")
		ids := map[string]bool{}
		for _, r := range got {
			ids[r.ID] = true
		}
		return ids
	}
	ids := listed()
	if !ids[orphan.ID] {
		t.Fatalf("the released run %s, followed by %d finished turns, is not listed: %v", orphan.ID, len(later), ids)
	}
	for _, r := range later {
		if ids[r.ID] {
			t.Fatalf("finished run %s listed as an orphan", r.ID)
		}
	}
	// Listed again (a sweep that did not finish it), and gone once its outcome is recorded.
	if !listed()[orphan.ID] {
		t.Fatalf("the released run %s is not listed by a second sweep", orphan.ID)
	}
	must(t, e.s.RecordOutcome(e.ctx, finished(orphan, agent.RunFailed, agent.Usage{}, base.Add(time.Hour)), agent.Fence{}), "RecordOutcome")
	if listed()[orphan.ID] {
		t.Fatalf("run %s listed after its outcome was recorded", orphan.ID)
	}
}

// NoteTakes (fence B's queue takes): a running run notes the queued messages it is about to store. A store that
// keeps the notes returns them on the run (Takes), and the reaper's RecordOutcome seals them: it applies only to
// exactly the takes it names (one noted since the reaper read the run fails it, and nothing changes); once the
// outcome is recorded, every note is refused. A store that keeps none (its writes check the claim) returns no
// Takes and refuses a note once the run's claim is gone.
func testNoteTakes(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	must(t, e.s.NoteTakes(e.ctx, run, []string{"steer_a"}), "NoteTakes")
	must(t, e.s.NoteTakes(e.ctx, run, []string{"steer_a", "steer_b"}), "NoteTakes again")
	got, err := e.s.GetRun(e.ctx, th.ID, run.ID)
	must(t, err, "GetRun")
	kept := len(got.Takes) > 0
	if kept && !slices.Equal(slices.Sorted(slices.Values(got.Takes)), []string{"steer_a", "steer_b"}) {
		t.Fatalf("Takes = %v, want steer_a and steer_b", got.Takes)
	}
	hold, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: run.Fence(), RunID: run.ID, Now: at(time.Hour)})
	must(t, err, "TakeOver")
	out := finished(got, agent.RunFailed, agent.Usage{}, at(time.Hour))
	if kept {
		stale := out
		stale.Takes = []string{"steer_a"}
		if err := e.s.RecordOutcome(e.ctx, stale, hold); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("RecordOutcome naming one of two takes: %v, want run_fenced", err)
		}
		if r, _ := e.s.GetRun(e.ctx, th.ID, run.ID); r.Status != agent.RunRunning {
			t.Fatalf("a refused RecordOutcome changed the run: %s", r.Status)
		}
	}
	must(t, e.s.RecordOutcome(e.ctx, out, hold), "RecordOutcome with the run's takes")
	if err := e.s.NoteTakes(e.ctx, run, []string{"steer_c"}); !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("NoteTakes after the outcome: %v, want run_fenced", err)
	}
}

// A release that leaves its run recorded as running (a crash inside DynamoDB's FinishRun, made of two writes; built
// here with ReleaseClaim naming the run) adds its usage to the thread and keeps it for the run (Run.Released, from
// GetRun and ListOrphanRuns), so that the reaper can record it when another run has overwritten the run's draft
// since (seed 1000019 of the simulation). Once the outcome is recorded the run's own usage is the truth, and
// Released is nil (while no reaper's claim names the run). A release without usage keeps nothing.
func testReleasedUsage(e *claims) {
	t := e.t
	base := at(-22 * 24 * time.Hour)
	th := newThread(e)
	u := agent.Usage{InputTokens: 5, OutputTokens: 2, TotalTokens: 7, CachedInputTokens: 1, ReasoningTokens: 1, CostMicroUSD: 30}
	run := claim(e, th, e.id("run"), base).Run
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: run.Fence(), Usage: u, Now: base.Add(time.Second)}), "ReleaseClaim")
	got, err := e.s.GetRun(e.ctx, th.ID, run.ID)
	must(t, err, "GetRun")
	if got.Released == nil || *got.Released != u || got.Usage != (agent.Usage{}) {
		t.Fatalf("the released run: Released %+v, Usage %+v; want Released %+v, no usage of its own yet", got.Released, got.Usage, u)
	}
	if lister, ok := any(e.s).(agent.OrphanRunLister); ok {
		orphans, err := lister.ListOrphanRuns(e.ctx, base.Add(5*time.Minute), 1000)
		must(t, err, "ListOrphanRuns")
		i := slices.IndexFunc(orphans, func(r agent.Run) bool { return r.ID == run.ID })
		if i < 0 || orphans[i].Released == nil || *orphans[i].Released != u {
			t.Fatalf("ListOrphanRuns: the released run %s is listed without its released usage %+v: %+v", run.ID, u, orphans)
		}
	}
	if th2, err := e.s.GetThread(e.ctx, th.ID); err != nil || th2.Usage != u {
		t.Fatalf("thread usage after the release: %+v %v, want %+v", th2.Usage, err, u)
	}

	// A later turn released with no usage keeps nothing for its run.
	next := claim(e, th, e.id("run"), base.Add(2*time.Second)).Run
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: next.Fence()}), "ReleaseClaim of the next run")
	if got, err := e.s.GetRun(e.ctx, th.ID, next.ID); err != nil || got.Released != nil {
		t.Fatalf("a release without usage: Released = %+v (%v), want nil", got.Released, err)
	}

	must(t, e.s.RecordOutcome(e.ctx, finished(run, agent.RunInterrupted, u, base.Add(time.Hour)), agent.Fence{}), "RecordOutcome")
	got, err = e.s.GetRun(e.ctx, th.ID, run.ID)
	must(t, err, "GetRun after the outcome")
	if got.Released != nil || got.Usage != u || got.Status != agent.RunInterrupted {
		t.Fatalf("after the outcome: %s usage %+v released %+v, want interrupted, usage %+v, nothing released", got.Status, got.Usage, got.Released, u)
	}
}

// testStubRun: the reaper's stub of a run item its claim's write never stored (agent.RunStubber, REVIEW D15) is
// stored only where no run item with its id exists: it reads back as given, a stored run is returned unchanged,
// and a second stub changes nothing. A store that writes a claim and its run in one write does not offer it.
func testStubRun(e *claims) {
	t := e.t
	stubber, ok := any(e.s).(agent.RunStubber)
	if !ok {
		t.Skip("the store writes a claim and its run item in one write (no agent.RunStubber)")
	}
	th := newThread(e)
	now := at(time.Minute)
	stub := agent.Run{ID: e.id("run"), ThreadID: th.ID, Status: agent.RunFailed, Epoch: 1,
		Error: &agent.RunError{Code: agent.CodeStale, Message: "The run stopped unexpectedly."}, CreatedAt: now, UpdatedAt: now, FinishedAt: now}
	got, created, err := stubber.StubRun(e.ctx, stub)
	must(t, err, "StubRun")
	if !created || got.ID != stub.ID || got.Status != agent.RunFailed {
		t.Fatalf("StubRun of a missing run = %+v, created %v; want the stub stored", got, created)
	}
	stored, err := e.s.GetRun(e.ctx, th.ID, stub.ID)
	must(t, err, "GetRun(stub)")
	if stored.Status != agent.RunFailed || stored.Error == nil || *stored.Error != *stub.Error || stored.Epoch != 1 {
		t.Fatalf("the stub reads back as %+v", stored)
	}
	again := stub
	again.Error = &agent.RunError{Code: agent.CodeInternal, Message: "other"}
	got, created, err = stubber.StubRun(e.ctx, again)
	must(t, err, "StubRun again")
	if created || got.Error == nil || *got.Error != *stub.Error {
		t.Fatalf("a second StubRun = %+v, created %v; want the first stub, unchanged", got, created)
	}
	// A stored run (here a claim's) is left alone.
	run := claim(e, th, e.id("run"), at(2*time.Minute)).Run
	other := stub
	other.ID = run.ID
	got, created, err = stubber.StubRun(e.ctx, other)
	must(t, err, "StubRun of a stored run")
	if created || got.Status != agent.RunRunning || got.Epoch != run.Epoch {
		t.Fatalf("StubRun of a stored running run = %+v, created %v; want the run as stored", got, created)
	}
}
