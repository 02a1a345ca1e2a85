// Package storetest is the conformance suite for agent.Store. Every Store adapter (the embedded SQLite store, the
// DynamoDB store, any later one) runs the same suite from its own tests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) agent.Store { return openTestStore(t) })
//	}
//
// The suite depends on the documented port only (lib/agent and the standard library). Each case is written against
// the narrowest interface it exercises: value cases take an agent.ValueStore, segment cases an agent.SegmentStore,
// message cases an agent.MessageStore, claim cases a ThreadStore plus RunStore, interrupt, job and queue cases a
// ThreadStore plus their own port (each needs its thread, and goes with its delete), and only the cases that span
// entities (a thread's delete against its claims and children, canceled contexts) the whole agent.Store. Run hands
// each case the store newStore returned, narrowed to that interface.
//
// Each leaf subtest calls newStore once and uses ids, owners and namespaces that are unique to that subtest, so
// newStore may hand out a fresh store per call or the same store (one shared table) every time. Subtests run in
// parallel, so newStore may be called concurrently; the caller's own test (and its t.Cleanup) outlives them all.
//
// What the suite requires beyond the Store doc comments, because callers rely on it:
//
//   - Times come back in UTC with millisecond precision. The suite only passes times that are already truncated to
//     the millisecond in UTC (a fixed fake clock), and compares returned values with reflect.DeepEqual, so a store
//     that returns a different location, drops milliseconds or keeps a monotonic reading fails.
//   - Message parts and metadata round-trip byte for byte: whitespace, key order, number spelling and escapes inside a
//     part are kept. (The suite never passes a part with whitespace around the JSON value; a store may drop that.)
//     Parts or metadata of length zero may come back as nil or empty.
//   - Messages need no thread row: the message cases write under thread ids that were never created.
//   - A message brought back after a delete (by a writer the fence lets through) is a new message: it takes the
//     write's seq and creation time, not the deleted one's.
//   - CreateThread stores the thread as given, its Epoch and ActiveRun included: that is how the suite builds a
//     claim whose run row is missing, to check that ReleaseClaim frees it.
//   - Segment data and KV values are opaque bytes: any byte sequence, including invalid UTF-8, round-trips.
//   - List methods return an empty (possibly nil) slice and no error for unknown parents.
//   - A claim sets the run's CreatedAt and UpdatedAt to the claim time; FinishRun stores the run's UpdatedAt as
//     given. Neither a claim nor ReleaseClaim is required to touch the thread's UpdatedAt.
//   - ReleaseClaim of an unknown thread is KindConflict/CodeRunFenced, like any release whose condition fails.
//   - Interrupts: Input and Response round-trip byte for byte (nil and empty are one answer), half a megabyte and
//     more included. CreateInterrupt takes only a pending interrupt with no resolution (a Response or a ResolvedAt
//     is CodeInvalidStatus), of a known kind; an empty interrupt id, an unknown kind or an input that is not JSON
//     is CodeInvalidMessage, an empty thread id CodeInvalidThreadID; a deleted thread refuses it like an unknown
//     one. ResolveInterrupt to pending or to an unknown status is CodeInvalidStatus. GetInterrupt of anything
//     unknown is CodeInterruptNotFound. ListExpiredInterrupts returns exactly min(limit, matching) interrupts, and
//     never a resolved one: a store whose index lags must re-check what it nominates.
//   - Jobs: Input and Result round-trip byte for byte, half a megabyte and more included, and so does every
//     field CreateJob is given (Owner, Activity, Execution, DueAt, the times). CreateJob takes only what Job.Check
//     accepts, FinishJob only what JobResult.Check accepts (CodeInvalidThreadID, CodeInvalidJob,
//     CodeInvalidStatus as those name them). Every job of an unknown id is CodeJobNotFound, for reads and writes.
//     FinishJob keeps Status running and sets FinishedAt = UpdatedAt = r.Now and DueAt = r.DueAt;
//     MarkJobDelivered sets UpdatedAt = now and clears DueAt; SetJobActivity sets UpdatedAt = now. ListDueJobs
//     returns exactly min(limit, matching) jobs and never a delivered one.
//   - Queue: the queued message round-trips byte for byte (a 450 KiB steer included), Seq is strictly increasing
//     per thread in acceptance order (gaps allowed), and TakeQueued sets TakenAt = now and ExpiresAt = now +
//     agent.DefaultQueueKeep. An entry's whole state is read back through Enqueue of its id (the stored entry is
//     returned), which is how the suite sees a taken one. ListQueuedThreads names each thread once.
//   - Limits: a refusal is a positive retryAfter and a nil error, exact to the millisecond (the earliest live
//     lease's expiry, or the window's end, minus Now); a lease expiring at Now is expired. Of concurrent acquirers
//     in one scope exactly the limit win. Bad requests are CodeInvalidLease; a renew without a live lease is
//     CodeLeaseLost.
//   - Errors are *agent.Error values (possibly wrapped), matched with errors.Is on their code. Not-found codes are
//     not pinned (a claim on another owner's thread must answer exactly as one on a missing thread); conflict,
//     invalid-input, unavailable and canceled codes are: both stores refuse the same bad input with the same code
//     from lib/agent's catalog.
//
// What the suite cannot reach through the port, and each adapter tests on its own: a delete interrupted after its
// tombstone (CodeThreadDeleting from CreateThread and ClaimRun, not found from CreateInterrupt, CreateJob and
// Enqueue, and the second DeleteThread that finishes the job; SQLite deletes in one transaction and has no such
// state), a store that stays busy through its retries (CodeStoreUnavailable), how much a heartbeat writes, and the
// queue bound under concurrent senders (exact in SQLite, best-effort in DynamoDB: see its Enqueue).
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Run runs the whole suite. newStore is called once per leaf subtest, with that subtest's t (so it can register
// cleanups on it).
func Run(t *testing.T, newStore func(t *testing.T) agent.Store) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Threads", threadTests()},
		{"Titles", titleTests()},
		{"Runs", runTests()},
		{"HandOver", handOverTests()},
		{"Messages", messageTests()},
		{"Segments", segmentTests()},
		{"Values", valueTests()},
		{"Interrupts", interruptTests()},
		{"Jobs", jobTests()},
		{"Queue", queueTests()},
		{"Limits", limitTests()},
		{"Store", storeTests()},
		{"Usage", usageTests()},
		{"Signals", signalTests()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					s := newStore(t)
					if s == nil {
						t.Fatal("newStore returned nil")
					}
					tc.run(t, s)
				})
			}
		})
	}
}

// test is one leaf of the suite, ready to run against a whole store.
type test struct {
	name string
	run  func(t *testing.T, s agent.Store)
}

// leaf is a case written against the port S it exercises: S is the narrowest interface the case needs, so a
// case cannot lean on a method outside it.
type leaf[S any] struct {
	name string
	fn   func(e *env[S])
}

// group turns cases written against S into tests; narrow is the (compile-time checked) conversion from the whole
// store to S.
func group[S any](narrow func(agent.Store) S, leaves ...leaf[S]) []test {
	out := make([]test, len(leaves))
	for i, l := range leaves {
		out[i] = test{name: l.name, run: func(t *testing.T, s agent.Store) {
			l.fn(&env[S]{t: t, ctx: t.Context(), s: narrow(s), ids: agent.RandomIDs{Clock: fakeClock{}}})
		}}
	}
	return out
}

// claimStore is what claim cases need: threads to claim, and the runs.
type claimStore interface {
	agent.ThreadStore
	agent.RunStore
}

// The narrowing conversions group takes.
func threadPort(s agent.Store) agent.ThreadStore   { return s }
func claimPort(s agent.Store) claimStore           { return s }
func messagePort(s agent.Store) agent.MessageStore { return s }
func segmentPort(s agent.Store) agent.SegmentStore { return s }
func valuePort(s agent.Store) agent.ValueStore     { return s }
func wholeStore(s agent.Store) agent.Store         { return s }

// env is what a leaf works with: its store (as the port S), a context that ends with the test, and unique ids.
type env[S any] struct {
	t   *testing.T
	ctx context.Context
	s   S
	ids agent.IDs
}

// id returns an id no other subtest (or earlier run against a persistent table) uses.
func (e *env[S]) id(prefix string) string { return e.ids.New(prefix) }

// fakeClock is the suite's fixed clock. Its reading has a non-zero millisecond part so that a store which drops
// milliseconds fails the comparisons.
type fakeClock struct{}

func (fakeClock) Now() time.Time {
	return time.Date(2031, time.March, 4, 5, 6, 7, 891_000_000, time.UTC)
}

// at returns the fake clock's reading plus d.
func at(d time.Duration) time.Time { return fakeClock{}.Now().Add(d) }

// The helpers below are generic over the case's port: each asks only for the interface it calls.

// newThread creates a fresh thread of a fresh owner, created and updated at at(0).
func newThread[S agent.ThreadStore](e *env[S]) agent.Thread {
	e.t.Helper()
	return createThread(e, e.id("user"), e.id("th"), at(0))
}

func createThread[S agent.ThreadStore](e *env[S], owner, id string, updated time.Time) agent.Thread {
	e.t.Helper()
	th := agent.Thread{ID: id, Owner: owner, Title: "title of " + id, CreatedAt: at(0), UpdatedAt: updated}
	got, created, err := e.s.CreateThread(e.ctx, th)
	if err != nil {
		e.t.Fatalf("CreateThread(%s): %v", id, err)
	}
	if !created {
		e.t.Fatalf("CreateThread(%s): created = false for a new id", id)
	}
	return got
}

func getThread[S agent.ThreadStore](e *env[S], id string) agent.Thread {
	e.t.Helper()
	th, err := e.s.GetThread(e.ctx, id)
	if err != nil {
		e.t.Fatalf("GetThread(%s): %v", id, err)
	}
	return th
}

func getRun[S agent.RunStore](e *env[S], threadID, runID string) agent.Run {
	e.t.Helper()
	r, err := e.s.GetRun(e.ctx, threadID, runID)
	if err != nil {
		e.t.Fatalf("GetRun(%s): %v", runID, err)
	}
	return r
}

// claim claims th (as its owner) for runID at now with the default staleAfter of 30 s and fails the test on error.
func claim[S agent.RunStore](e *env[S], th agent.Thread, runID string, now time.Time) agent.ClaimResult {
	e.t.Helper()
	res, err := e.s.ClaimRun(e.ctx, claimReq(th, runID, now))
	if err != nil {
		e.t.Fatalf("ClaimRun(%s, %s): %v", th.ID, runID, err)
	}
	return res
}

// staleAfter is the takeover threshold the suite claims with.
const staleAfter = 30 * time.Second

func claimReq(th agent.Thread, runID string, now time.Time) agent.ClaimRequest {
	return agent.ClaimRequest{
		ThreadID:           th.ID,
		Owner:              th.Owner,
		RunID:              runID,
		Trigger:            agent.TriggerUser,
		AssistantMessageID: "msg_of_" + runID,
		Now:                now,
		StaleAfter:         staleAfter,
	}
}

// finish finishes run (as returned by a claim) with status at now and fails the test on error.
func finish[S agent.RunStore](e *env[S], run agent.Run, status agent.RunStatus, usage agent.Usage, now time.Time) agent.Run {
	e.t.Helper()
	run = finished(run, status, usage, now)
	if err := e.s.FinishRun(e.ctx, run); err != nil {
		e.t.Fatalf("FinishRun(%s): %v", run.ID, err)
	}
	return run
}

func finished(run agent.Run, status agent.RunStatus, usage agent.Usage, now time.Time) agent.Run {
	run.Status = status
	run.Usage = usage
	run.Steps = 2
	run.Model = "test-model"
	run.FinishedAt = now
	run.UpdatedAt = now
	return run
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// wantErr checks that err carries an *agent.Error of kind and, unless code is empty, matches code with errors.Is
// (as callers match, e.g. errors.Is(err, agent.ErrRunActive)).
func wantErr(t *testing.T, err error, kind agent.Kind, code, what string) {
	t.Helper()
	var ae *agent.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%s: error = %v (%T), want *agent.Error %s/%s", what, err, err, kind, orAny(code))
	}
	if ae.Kind != kind || (code != "" && !errors.Is(err, &agent.Error{Code: code})) {
		t.Fatalf("%s: error = %s/%s (%v), want %s/%s", what, ae.Kind, ae.Code, err, kind, orAny(code))
	}
}

func orAny(code string) string {
	if code == "" {
		return "(any code)"
	}
	return code
}

// same compares with reflect.DeepEqual, which also catches times in another location or with extra precision.
func same[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %s\n want %s\n(times must be UTC with millisecond precision)", what, show(got), show(want))
	}
}

// show renders v as JSON so pointers are followed and times show their zone.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

// wantUTC checks that each time is UTC and whole milliseconds.
func wantUTC(t *testing.T, what string, times ...time.Time) {
	t.Helper()
	for i, tm := range times {
		if tm.Location() != time.UTC || !tm.Equal(tm.Truncate(time.Millisecond)) {
			t.Fatalf("%s: time %d = %v, want UTC with millisecond precision", what, i, tm)
		}
	}
}

// sameBytes compares byte slices, treating nil and empty as equal, and reports large values by size only.
func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) > 512 || len(want) > 512 {
		n := 0
		for n < len(got) && n < len(want) && got[n] == want[n] {
			n++
		}
		t.Fatalf("%s: got %d bytes, want %d bytes; first difference at byte %d", what, len(got), len(want), n)
	}
	t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
}
