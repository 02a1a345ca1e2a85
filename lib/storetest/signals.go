package storetest

import (
	"reflect"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// signalStore is what the completion signal cases need: threads to claim, runs, and the signals' outbox.
type signalStore interface {
	claimStore
	agent.SignalStore
}

func signalPort(s agent.Store) signalStore { return s }

func signalTests() []test {
	type c = leaf[signalStore]
	return group(signalPort,
		c{"OutcomeStoresSignalPending", testSignalArmedWithOutcome},
		c{"RecordOutcomeStoresSignalPending", testSignalArmedByReaper},
		c{"ClaimIsCompareAndSet", testSignalClaim},
		c{"SettleTakesItOutOfTheList", testSignalSettle},
		c{"ConcurrentClaimsOneWinner", testSignalClaimRace},
		c{"UnknownRun", testSignalUnknown},
		c{"StubRunStoresSignalPending", testSignalStub},
	)
}

// signalDue is the due time the cases arm with: far in the past of the fixed clock, so that a shared table's
// other signals (other cases, later runs) sort after the case's own in ListDueSignals.
func signalDue(d time.Duration) time.Time { return at(-24*time.Hour + d) }

// endedWithSignal claims a fresh run on th and finishes it with status, its signal armed due at due.
func endedWithSignal(e *env[signalStore], th agent.Thread, status agent.RunStatus, due time.Time) agent.Run {
	e.t.Helper()
	res := claim(e, th, e.id("run"), at(0))
	run := finished(res.Run, status, agent.Usage{InputTokens: 3, OutputTokens: 4, TotalTokens: 7}, at(time.Second))
	run.Signal = &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, DueAt: due}
	if err := e.s.FinishRun(e.ctx, run); err != nil {
		e.t.Fatalf("FinishRun(%s) with a signal: %v", run.ID, err)
	}
	return run
}

// dueOf lists the due signals before before and keeps those of the given threads.
func dueOf(e *env[signalStore], before time.Time, threads ...string) []agent.Run {
	e.t.Helper()
	got, err := e.s.ListDueSignals(e.ctx, before, 1000)
	must(e.t, err, "ListDueSignals")
	want := map[string]bool{}
	for _, id := range threads {
		want[id] = true
	}
	var out []agent.Run
	for _, r := range got {
		if r.Signal == nil || r.Signal.Status != agent.SignalPending {
			e.t.Fatalf("ListDueSignals lists run %s with signal %+v", r.ID, r.Signal)
		}
		if want[r.ThreadID] {
			out = append(out, r)
		}
	}
	return out
}

func testSignalArmedWithOutcome(e *env[signalStore]) {
	t := e.t
	th := newThread(e)
	run := endedWithSignal(e, th, agent.RunFailed, signalDue(time.Minute))
	got, err := e.s.GetRun(e.ctx, th.ID, run.ID)
	must(t, err, "GetRun")
	want := &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, DueAt: signalDue(time.Minute)}
	if !reflect.DeepEqual(got.Signal, want) {
		t.Fatalf("GetRun().Signal = %+v, want %+v (stored by FinishRun's outcome write)", got.Signal, want)
	}
	if got.Status != agent.RunFailed {
		t.Fatalf("status = %s, want failed", got.Status)
	}
	// Not listed before it is due; listed once due, with the run's outcome.
	if l := dueOf(e, signalDue(time.Minute), th.ID); len(l) != 0 {
		t.Fatalf("listed before its due time: %+v", l)
	}
	l := dueOf(e, signalDue(time.Minute+time.Millisecond), th.ID)
	if len(l) != 1 || l[0].ID != run.ID || l[0].Status != agent.RunFailed || l[0].Usage != run.Usage ||
		!reflect.DeepEqual(l[0].Signal, want) {
		t.Fatalf("ListDueSignals = %+v, want run %s with %+v", l, run.ID, want)
	}
	// A run finished without a signal has none, and is never listed.
	th2 := newThread(e)
	plain := finish(e, claim(e, th2, e.id("run"), at(0)).Run, agent.RunCompleted, agent.Usage{}, at(time.Second))
	got, err = e.s.GetRun(e.ctx, th2.ID, plain.ID)
	must(t, err, "GetRun")
	if got.Signal != nil {
		t.Fatalf("a run finished without a signal reads %+v", got.Signal)
	}
	if l := dueOf(e, at(time.Hour), th2.ID); len(l) != 0 {
		t.Fatalf("a run without a signal is listed: %+v", l)
	}
}

func testSignalArmedByReaper(e *env[signalStore]) {
	t := e.t
	th := newThread(e)
	res := claim(e, th, e.id("run"), at(0))
	hold, err := e.s.TakeOver(e.ctx, agent.TakeRequest{ThreadID: th.ID, Fence: res.Run.Fence(), RunID: res.Run.ID, Now: at(time.Minute)})
	must(t, err, "TakeOver")
	run := finished(res.Run, agent.RunFailed, agent.Usage{}, at(time.Minute))
	run.Error = &agent.RunError{Code: agent.CodeStale, Message: "stopped"}
	run.Signal = &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, DueAt: signalDue(2 * time.Minute)}
	must(t, e.s.RecordOutcome(e.ctx, run, hold), "RecordOutcome")
	l := dueOf(e, signalDue(time.Hour), th.ID)
	if len(l) != 1 || l[0].ID != run.ID || l[0].Error == nil || l[0].Error.Code != agent.CodeStale {
		t.Fatalf("ListDueSignals after a reap = %+v, want the reaped run failed with code stale", l)
	}
}

func testSignalClaim(e *env[signalStore]) {
	t := e.t
	th := newThread(e)
	run := endedWithSignal(e, th, agent.RunCompleted, signalDue(0))
	next := signalDue(time.Hour)
	must(t, e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: run.ID, Attempts: 0, NextDue: next}), "ClaimSignal")
	// The same attempt again is taken: another sweeper claimed it.
	err := e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: run.ID, Attempts: 0, NextDue: next})
	wantErr(t, err, agent.KindConflict, agent.CodeSignalTaken, "ClaimSignal of a taken attempt")
	got, err := e.s.GetRun(e.ctx, th.ID, run.ID)
	must(t, err, "GetRun")
	want := &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, Attempts: 1, DueAt: next}
	if !reflect.DeepEqual(got.Signal, want) {
		t.Fatalf("after a claim: %+v, want %+v", got.Signal, want)
	}
	// Moved in the list: not due before next, due after.
	if l := dueOf(e, signalDue(time.Minute), th.ID); len(l) != 0 {
		t.Fatalf("a claimed signal is still listed at its old due time: %+v", l)
	}
	if l := dueOf(e, next.Add(time.Millisecond), th.ID); len(l) != 1 || l[0].Signal.Attempts != 1 {
		t.Fatalf("ListDueSignals after the claim = %+v", l)
	}
	must(t, e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: run.ID, Attempts: 1, NextDue: next.Add(time.Hour)}), "ClaimSignal 2")
}

func testSignalSettle(e *env[signalStore]) {
	t := e.t
	for _, status := range []agent.SignalStatus{agent.SignalDelivered, agent.SignalDropped} {
		th := newThread(e)
		run := endedWithSignal(e, th, agent.RunCanceled, signalDue(0))
		must(t, e.s.SettleSignal(e.ctx, th.ID, run.ID, status), "SettleSignal")
		must(t, e.s.SettleSignal(e.ctx, th.ID, run.ID, status), "SettleSignal again") // idempotent
		must(t, e.s.SettleSignal(e.ctx, th.ID, run.ID, agent.SignalDelivered), "SettleSignal of a settled one")
		got, err := e.s.GetRun(e.ctx, th.ID, run.ID)
		must(t, err, "GetRun")
		if want := (&agent.RunSignal{Status: status, Owner: th.Owner}); !reflect.DeepEqual(got.Signal, want) {
			t.Fatalf("settled %s: %+v, want %+v", status, got.Signal, want)
		}
		if l := dueOf(e, at(time.Hour), th.ID); len(l) != 0 {
			t.Fatalf("a settled signal is listed: %+v", l)
		}
		err = e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: run.ID, NextDue: at(time.Hour)})
		wantErr(t, err, agent.KindConflict, agent.CodeSignalTaken, "ClaimSignal of a settled signal")
		// The run's outcome is as it was.
		if got.Status != agent.RunCanceled || got.Usage != run.Usage {
			t.Fatalf("settling changed the run: %+v", got)
		}
	}
	th := newThread(e)
	run := endedWithSignal(e, th, agent.RunCompleted, signalDue(0))
	wantErr(t, e.s.SettleSignal(e.ctx, th.ID, run.ID, agent.SignalPending), agent.KindInvalid, agent.CodeInvalidStatus, "SettleSignal pending")
}

func testSignalClaimRace(e *env[signalStore]) {
	t := e.t
	th := newThread(e)
	run := endedWithSignal(e, th, agent.RunInterrupted, signalDue(0))
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: run.ID, NextDue: signalDue(time.Duration(i+1) * time.Minute)})
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		if err == nil {
			won++
		} else {
			wantErr(t, err, agent.KindConflict, agent.CodeSignalTaken, "a losing ClaimSignal")
		}
	}
	if won != 1 {
		t.Fatalf("%d concurrent claims of one attempt won, want exactly 1", won)
	}
}

func testSignalUnknown(e *env[signalStore]) {
	t := e.t
	th := newThread(e)
	wantErr(t, e.s.ClaimSignal(e.ctx, agent.SignalClaim{ThreadID: th.ID, RunID: e.id("run"), NextDue: at(0)}), agent.KindNotFound, "", "ClaimSignal unknown run")
	wantErr(t, e.s.SettleSignal(e.ctx, th.ID, e.id("run"), agent.SignalDelivered), agent.KindNotFound, "", "SettleSignal unknown run")
	plain := finish(e, claim(e, th, e.id("run"), at(0)).Run, agent.RunCompleted, agent.Usage{}, at(time.Second))
	wantErr(t, e.s.SettleSignal(e.ctx, th.ID, plain.ID, agent.SignalDelivered), agent.KindNotFound, "", "SettleSignal of a run without a signal")
}

// A store that stubs missing runs (agent.RunStubber) stores the stub's armed signal with it.
func testSignalStub(e *env[signalStore]) {
	t := e.t
	st, ok := e.s.(agent.RunStubber)
	if !ok {
		t.Skip("the store stubs no runs")
	}
	th := newThread(e)
	stub := agent.Run{ID: e.id("run"), ThreadID: th.ID, Trigger: agent.TriggerUnknown, Status: agent.RunFailed, Epoch: 1,
		Error:     &agent.RunError{Code: agent.CodeStale, Message: "stopped"},
		CreatedAt: at(0), UpdatedAt: at(0), FinishedAt: at(0),
		Signal: &agent.RunSignal{Status: agent.SignalPending, Owner: th.Owner, DueAt: signalDue(0)}}
	_, created, err := st.StubRun(e.ctx, stub)
	must(t, err, "StubRun")
	if !created {
		t.Fatal("StubRun did not create the stub")
	}
	if l := dueOf(e, signalDue(time.Millisecond), th.ID); len(l) != 1 || l[0].ID != stub.ID || l[0].Signal.Owner != th.Owner {
		t.Fatalf("ListDueSignals after a stub = %+v", l)
	}
}
