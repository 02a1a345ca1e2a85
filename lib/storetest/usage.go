package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The usage cases: late usage of fenced runs, a run's store cost, and the per-request meter.
func usageTests() []test {
	type c = leaf[claimStore]
	return group(claimPort,
		c{"RecordLateUsageOnce", testRecordLateUsageOnce},
		c{"RecordLateUsageConcurrentDuplicates", testRecordLateUsageConcurrent},
		c{"RecordLateUsageRefusesLiveRun", testRecordLateUsageLiveRun},
		c{"RecordLateUsageRefusesARecreatedThread", testRecordLateUsageRecreated},
		c{"FinishRunRecordsStoreUsage", testFinishRunStoreUsage},
		c{"StoreMeterCountsRequests", testStoreMeter},
	)
}

// reaped claims a run, and reaps it as the reaper does (reap).
func reaped(e *claims, draft agent.Usage) (agent.Thread, agent.Run) {
	th, _, r := reap(e, draft)
	return th, r
}

var (
	// Every counter set, prompt-cache writes included (DynamoDB and SQLite once dropped them).
	draftUsage = agent.Usage{InputTokens: 40, OutputTokens: 10, TotalTokens: 50, CachedInputTokens: 8, ReasoningTokens: 3, CacheWriteTokens: 20, CostMicroUSD: 70}
	lateUsage  = agent.Usage{InputTokens: 100, OutputTokens: 25, TotalTokens: 125, CachedInputTokens: 60, ReasoningTokens: 5, CacheWriteTokens: 30, CostMicroUSD: 31}
)

// A reaped run's late spend reaches its run and its thread once, however often it is recorded.
func testRecordLateUsageOnce(e *claims) {
	t := e.t
	th, run := reaped(e, draftUsage)
	late := agent.LateUsage{ThreadID: th.ID, ThreadCreatedAt: th.CreatedAt, Fence: run.Fence(), Usage: lateUsage}
	for i := range 3 {
		must(t, e.s.RecordLateUsage(e.ctx, late), "RecordLateUsage")
		if got := getThread(e, th.ID).Usage; got != draftUsage.Add(lateUsage) {
			t.Fatalf("call %d: thread usage = %+v, want the draft's and the late usage once: %+v", i, got, draftUsage.Add(lateUsage))
		}
		got := getRun(e, th.ID, run.ID)
		if got.Usage != draftUsage.Add(lateUsage) || got.LateUsage == nil || *got.LateUsage != lateUsage {
			t.Fatalf("call %d: run = %s, want usage %+v with late %+v", i, show(got), draftUsage.Add(lateUsage), lateUsage)
		}
	}
	// The late usage of another run of the thread counts too, once.
	next := claim(e, getThread(e, th.ID), e.id("run"), at(2*time.Hour)).Run
	hold, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: next.Fence(), RunID: next.ID, Now: at(3 * time.Hour)})
	must(t, err, "TakeOver(next)")
	r := finished(next, agent.RunFailed, agent.Usage{}, at(3*time.Hour))
	must(t, e.s.RecordOutcome(e.ctx, r, hold), "RecordOutcome(next)")
	must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: hold}), "ReleaseClaim(next)")
	must(t, e.s.RecordLateUsage(e.ctx, agent.LateUsage{ThreadID: th.ID, Fence: next.Fence(), Usage: lateUsage}), "RecordLateUsage(next)")
	if got, want := getThread(e, th.ID).Usage, draftUsage.Add(lateUsage).Add(lateUsage); got != want {
		t.Fatalf("thread usage after a second late run = %+v, want %+v", got, want)
	}
	wantErr(t, e.s.RecordLateUsage(e.ctx, agent.LateUsage{ThreadID: th.ID, Fence: agent.Fence{RunID: e.id("run"), Epoch: 9}, Usage: lateUsage}),
		agent.KindNotFound, "", "RecordLateUsage(unknown run)")
	wantErr(t, e.s.RecordLateUsage(e.ctx, agent.LateUsage{ThreadID: e.id("th"), Fence: run.Fence(), Usage: lateUsage}),
		agent.KindNotFound, "", "RecordLateUsage(unknown thread)")
}

// Duplicated late writes racing each other (a retried request beside its first attempt) count once.
func testRecordLateUsageConcurrent(e *claims) {
	t := e.t
	th, run := reaped(e, draftUsage)
	late := agent.LateUsage{ThreadID: th.ID, Fence: run.Fence(), Usage: lateUsage}
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() { errs[i] = e.s.RecordLateUsage(e.ctx, late) })
	}
	wg.Wait()
	for i, err := range errs {
		must(t, err, fmt.Sprintf("RecordLateUsage #%d", i))
	}
	if got := getThread(e, th.ID).Usage; got != draftUsage.Add(lateUsage) {
		t.Fatalf("thread usage = %+v, want %+v", got, draftUsage.Add(lateUsage))
	}
	if got := getRun(e, th.ID, run.ID).Usage; got != draftUsage.Add(lateUsage) {
		t.Fatalf("run usage = %+v, want %+v", got, draftUsage.Add(lateUsage))
	}
}

// A run that still holds its claim is not late (FinishRun counts its usage): the write is refused and changes
// nothing.
func testRecordLateUsageLiveRun(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	wantErr(t, e.s.RecordLateUsage(e.ctx, agent.LateUsage{ThreadID: th.ID, Fence: run.Fence(), Usage: lateUsage}),
		agent.KindConflict, agent.CodeRunActive, "RecordLateUsage(claimed)")
	if got := getThread(e, th.ID).Usage; got != (agent.Usage{}) {
		t.Fatalf("thread usage = %+v, want none", got)
	}
	if got := getRun(e, th.ID, run.ID); got.Usage != (agent.Usage{}) || got.LateUsage != nil {
		t.Fatalf("run = %s, want no usage", show(got))
	}
}

// A thread deleted and created again under the same id is another thread: a late write of a run of the old one
// is refused as not found and adds nothing to the new one.
func testRecordLateUsageRecreated(e *claims) {
	t := e.t
	th, run := reaped(e, draftUsage)
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	again, _, err := e.s.CreateThread(e.ctx, agent.Thread{ID: th.ID, Owner: th.Owner, CreatedAt: at(2 * time.Hour), UpdatedAt: at(2 * time.Hour)})
	must(t, err, "CreateThread(again)")
	wantErr(t, e.s.RecordLateUsage(e.ctx, agent.LateUsage{ThreadID: th.ID, ThreadCreatedAt: th.CreatedAt, Fence: run.Fence(), Usage: lateUsage}),
		agent.KindNotFound, "", "RecordLateUsage(recreated thread)")
	if got := getThread(e, again.ID).Usage; got != (agent.Usage{}) {
		t.Fatalf("the new thread's usage = %+v, want none", got)
	}
}

// FinishRun records the run's store cost; GetRun and ListRuns return it.
func testFinishRunStoreUsage(e *claims) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	r := finished(run, agent.RunCompleted, draftUsage, at(time.Second))
	r.Store = &agent.StoreUsage{Requests: 17, ReadUnits: 6.5, WriteUnits: 12.25, Throttled: 1}
	must(t, e.s.FinishRun(e.ctx, r), "FinishRun")
	same(t, "GetRun", getRun(e, th.ID, run.ID), r)
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	if len(runs) != 1 {
		t.Fatalf("ListRuns = %d runs", len(runs))
	}
	same(t, "ListRuns[0]", runs[0], r)
}

// Requests made with a context carrying a meter are counted on it, writes with their units; others are not.
func testStoreMeter(e *claims) {
	t := e.t
	th := newThread(e)
	var m agent.StoreMeter
	ctx := agent.WithStoreMeter(e.ctx, &m)
	res, err := e.s.ClaimRun(ctx, claimReq(th, e.id("run"), at(0)))
	must(t, err, "ClaimRun")
	afterClaim := m.Snapshot()
	if afterClaim.Requests < 1 || afterClaim.WriteUnits <= 0 {
		t.Fatalf("meter after ClaimRun = %+v, want at least one request and some write units", afterClaim)
	}
	// Unmetered calls leave the meter alone.
	_ = getRun(e, th.ID, res.Run.ID)
	if got := m.Snapshot(); got != afterClaim {
		t.Fatalf("meter after an unmetered read = %+v, want %+v", got, afterClaim)
	}
	if _, err := e.s.GetRun(ctx, th.ID, res.Run.ID); err != nil {
		t.Fatal(err)
	}
	if got := m.Snapshot(); got.Requests <= afterClaim.Requests || got.WriteUnits != afterClaim.WriteUnits {
		t.Fatalf("meter after a metered read = %+v, want more requests and no more write units than %+v", got, afterClaim)
	}
}
