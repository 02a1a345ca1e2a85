package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// jobStore is what job cases need: a job is created under an existing thread, and the thread's delete takes its
// jobs with it.
type jobStore interface {
	agent.ThreadStore
	agent.RunStore
	agent.JobStore
}

func jobPort(s agent.Store) jobStore { return s }

func jobTests() []test {
	type c = leaf[jobStore]
	return group(jobPort,
		c{"CreateInsertIfAbsent", testCreateJobInsertIfAbsent},
		c{"CreateRaceOneWinner", testCreateJobRace},
		c{"CreateNeedsLiveThread", testCreateJobNeedsThread},
		c{"GetUnknown", testGetJobUnknown},
		c{"ListOrder", testListJobsOrder},
		c{"ListPage", testListJobsPage},
		c{"Activity", testJobActivity},
		c{"Finish", testFinishJob},
		c{"FinishFailure", testFinishJobFailure},
		c{"FinishRaceOneWinner", testFinishJobRace},
		c{"MarkDelivered", testMarkJobDelivered},
		c{"DueAtRoundTrips", testJobDueAt},
		c{"SetDue", testSetJobDue},
		c{"RawJSONByteForByte", testJobRawJSON},
		c{"LargeInputAndResult", testJobLarge},
		c{"ListDue", testListDueJobs},
		c{"ListDueDefaultLimit", testListDueJobsDefaultLimit},
		c{"DeleteThreadRemovesJobs", testDeleteThreadRemovesJobs},
		c{"InvalidRefused", testJobInvalid},
	)
}

type jobs = env[jobStore]

// jobOf is a running research job of threadID created at created, due (its execution's deadline) half an hour
// later.
func jobOf(threadID, toolCallID string, created time.Time) agent.Job {
	return agent.Job{
		ID:         agent.JobID(threadID, "run_1", toolCallID),
		ThreadID:   threadID,
		Owner:      "owner-of-" + threadID,
		Kind:       "research",
		ToolCallID: toolCallID,
		Input:      json.RawMessage(`{"topic":"tides"}`),
		Status:     agent.JobRunning,
		Activity:   "starting",
		Execution:  agent.JobID(threadID, "run_1", toolCallID),
		DueAt:      created.Add(30 * time.Minute),
		CreatedAt:  created,
		UpdatedAt:  created,
	}
}

// createJob creates j (which must be new) and checks that the store returns it as given.
func createJob[S agent.JobStore](e *env[S], j agent.Job) agent.Job {
	e.t.Helper()
	got, created, err := e.s.CreateJob(e.ctx, j)
	must(e.t, err, "CreateJob "+j.ID)
	if !created {
		e.t.Fatalf("CreateJob(%s): created = false for a new id", j.ID)
	}
	sameJob(e.t, "CreateJob "+j.ID, got, j)
	return got
}

func getJob[S agent.JobStore](e *env[S], threadID, id string) agent.Job {
	e.t.Helper()
	got, err := e.s.GetJob(e.ctx, threadID, id)
	must(e.t, err, "GetJob "+id)
	return got
}

// finishJob stores r (which must win) and returns the job as stored.
func finishJob[S agent.JobStore](e *env[S], r agent.JobResult) agent.Job {
	e.t.Helper()
	got, stored, err := e.s.FinishJob(e.ctx, r)
	must(e.t, err, "FinishJob "+r.ID)
	if !stored {
		e.t.Fatalf("FinishJob(%s): stored = false for an unfinished job", r.ID)
	}
	return got
}

// jobFinished is j as FinishJob with r must leave it.
func jobFinished(j agent.Job, r agent.JobResult) agent.Job {
	j.Result, j.Error, j.Usage = r.Result, r.Error, r.Usage
	j.FinishedAt, j.UpdatedAt, j.DueAt = r.Now, r.Now, r.DueAt
	return j
}

// jobDelivered is j as MarkJobDelivered at now must leave it.
func jobDelivered(j agent.Job, now time.Time) agent.Job {
	j.SteerDelivered, j.Status, j.DueAt, j.UpdatedAt = true, agent.JobDone, time.Time{}, now
	if j.Failed() {
		j.Status = agent.JobError
	}
	return j
}

// resultOf is a successful result of j stored at now, with delivery due a minute later.
func resultOf(j agent.Job, result string, now time.Time) agent.JobResult {
	return agent.JobResult{ThreadID: j.ThreadID, ID: j.ID, Result: json.RawMessage(result), DueAt: now.Add(time.Minute), Now: now}
}

// sameJob compares two jobs: Input and Result byte for byte (nil and empty are one answer), the rest with
// reflect.DeepEqual (times UTC, millisecond precision).
func sameJob(t *testing.T, what string, got, want agent.Job) {
	t.Helper()
	sameBytes(t, what+": input", got.Input, want.Input)
	sameBytes(t, what+": result", got.Result, want.Result)
	got.Input, got.Result, want.Input, want.Result = nil, nil, nil, nil
	same(t, what, got, want)
}

// wantJobs checks ListJobs of threadID against want, in order.
func wantJobs[S agent.JobStore](e *env[S], threadID string, want ...agent.Job) {
	e.t.Helper()
	got, err := e.s.ListJobs(e.ctx, threadID)
	must(e.t, err, "ListJobs")
	if len(got) != len(want) {
		ids := make([]string, len(got))
		for i, j := range got {
			ids[i] = j.ID
		}
		e.t.Fatalf("ListJobs(%s) = %d jobs %v, want %d", threadID, len(got), ids, len(want))
	}
	for i := range want {
		sameJob(e.t, fmt.Sprintf("ListJobs(%s)[%d]", threadID, i), got[i], want[i])
	}
}

// A retried dispatch (a lost answer, a replayed step, a later run repeating the tool call) converges on the first
// record whatever the retry carries, even once the job has finished; the same id under another thread is another
// job.
func testCreateJobInsertIfAbsent(e *jobs) {
	t := e.t
	th := newThread(e)
	j := jobOf(th.ID, e.id("call"), at(time.Second))
	createJob(e, j)
	stored := getJob(e, th.ID, j.ID)
	sameJob(t, "GetJob after create", stored, j)
	wantUTC(t, "GetJob", stored.CreatedAt, stored.UpdatedAt, stored.DueAt)

	again := j
	again.Owner, again.Kind, again.ToolCallID = "someone else", "summarize", "another-call"
	again.Input, again.Activity, again.Execution = json.RawMessage(`{"topic":"waves"}`), "other", "other-execution"
	again.DueAt, again.CreatedAt, again.UpdatedAt = at(time.Hour), at(time.Hour), at(time.Hour)
	got, created, err := e.s.CreateJob(e.ctx, again)
	must(t, err, "CreateJob again")
	if created {
		t.Fatal("CreateJob of an existing id: created = true")
	}
	sameJob(t, "CreateJob of an existing id returns the stored one", got, j)
	sameJob(t, "GetJob after the second create", getJob(e, th.ID, j.ID), j)

	// A finished (and a delivered) job is not reset to running by a late retry of its create either.
	r := resultOf(j, `{"summary":"high"}`, at(time.Minute))
	done := finishJob(e, r)
	got, created, err = e.s.CreateJob(e.ctx, j)
	must(t, err, "CreateJob after finish")
	if created {
		t.Fatal("CreateJob after finish: created = true")
	}
	sameJob(t, "CreateJob after finish returns the finished one", got, done)
	delivered, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(2*time.Minute))
	must(t, err, "MarkJobDelivered")
	got, created, err = e.s.CreateJob(e.ctx, j)
	must(t, err, "CreateJob after delivery")
	if created {
		t.Fatal("CreateJob after delivery: created = true")
	}
	sameJob(t, "CreateJob after delivery returns the delivered one", got, delivered)

	// The same id on another thread is independent of the first.
	other := newThread(e)
	twin := again
	twin.ThreadID = other.ID
	createJob(e, twin)
	sameJob(t, "GetJob(other thread)", getJob(e, other.ID, j.ID), twin)
	sameJob(t, "GetJob(first thread)", getJob(e, th.ID, j.ID), delivered)
	wantJobs(e, th.ID, delivered)
	wantJobs(e, other.ID, twin)
}

// Concurrent dispatches of one tool call (two engines replaying a step, a retry racing its first attempt): exactly
// one creates the job, and every caller gets the winner's job back.
func testCreateJobRace(e *jobs) {
	t := e.t
	const n = 10
	for round := range 3 {
		th := newThread(e)
		base := jobOf(th.ID, e.id("call"), at(0))
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results [n]agent.Job
			created [n]bool
			errs    [n]error
			tries   [n]agent.Job
		)
		for i := range n {
			tries[i] = base
			tries[i].Activity = fmt.Sprintf("attempt %d", i)
			tries[i].CreatedAt = at(time.Duration(i) * time.Second)
			wg.Go(func() {
				<-start
				results[i], created[i], errs[i] = e.s.CreateJob(e.ctx, tries[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			must(t, errs[i], fmt.Sprintf("round %d: CreateJob %d", round, i))
			if created[i] {
				if winner >= 0 {
					t.Fatalf("round %d: creates %d and %d both created the job", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no create created the job", round)
		}
		for i := range n {
			sameJob(t, fmt.Sprintf("round %d: create %d result", round, i), results[i], tries[winner])
		}
		wantJobs(e, th.ID, tries[winner])
	}
}

// A job belongs to a thread that exists: an unknown thread, or one deleted, is not found, and nothing is left
// behind. (A thread half way through its delete, tombstoned, is refused too; each adapter tests that on its own.)
func testCreateJobNeedsThread(e *jobs) {
	t := e.t
	base := at(-75 * 24 * time.Hour)
	unknown := e.id("th")
	j := jobOf(unknown, e.id("call"), base)
	_, _, err := e.s.CreateJob(e.ctx, j)
	wantErr(t, err, agent.KindNotFound, "", "CreateJob(unknown thread)")
	_, err = e.s.GetJob(e.ctx, unknown, j.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob after a refused create")
	wantJobs(e, unknown)

	th := newThread(e)
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	j2 := jobOf(th.ID, e.id("call"), base)
	_, _, err = e.s.CreateJob(e.ctx, j2)
	wantErr(t, err, agent.KindNotFound, "", "CreateJob(deleted thread)")
	wantJobs(e, th.ID)
	got, err := e.s.ListDueJobs(e.ctx, base.Add(time.Hour), 1000)
	must(t, err, "ListDueJobs")
	for _, x := range got {
		if x.ThreadID == unknown || x.ThreadID == th.ID {
			t.Fatalf("ListDueJobs lists %s of a thread that refused it", x.ID)
		}
	}
}

// Anything unknown is job_not_found, for reads and for every write.
func testGetJobUnknown(e *jobs) {
	t := e.t
	_, err := e.s.GetJob(e.ctx, e.id("th"), e.id("job"))
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob(unknown thread)")
	if !errors.Is(err, agent.ErrJobNotFound) {
		t.Fatalf("GetJob(unknown thread): %v does not match ErrJobNotFound", err)
	}
	th := newThread(e)
	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	missing := e.id("job")
	_, err = e.s.GetJob(e.ctx, th.ID, missing)
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob(unknown id)")
	// A job is found only under its own thread.
	other := newThread(e)
	_, err = e.s.GetJob(e.ctx, other.ID, j.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob(job of another thread)")

	err = e.s.SetJobActivity(e.ctx, th.ID, missing, "working", at(time.Second))
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "SetJobActivity(unknown id)")
	_, _, err = e.s.FinishJob(e.ctx, agent.JobResult{ThreadID: th.ID, ID: missing, Error: "boom", Now: at(time.Second)})
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "FinishJob(unknown id)")
	_, err = e.s.MarkJobDelivered(e.ctx, th.ID, missing, at(time.Second))
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "MarkJobDelivered(unknown id)")
	_, err = e.s.MarkJobDelivered(e.ctx, other.ID, j.ID, at(time.Second))
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "MarkJobDelivered(job of another thread)")
	wantJobs(e, other.ID)
	wantJobs(e, e.id("th"))
	wantJobs(e, th.ID, j)
}

// ListJobs returns every job of the thread, whatever its state, oldest first and ties by id, and nothing of
// another thread.
func testListJobsOrder(e *jobs) {
	th := newThread(e)
	created := map[string]time.Duration{"c": time.Second, "a": 3 * time.Second, "b": 3 * time.Second, "e": 0, "d": 2 * time.Second}
	stored := map[string]agent.Job{}
	for _, k := range []string{"c", "a", "b", "e", "d"} {
		j := jobOf(th.ID, e.id("call"), at(created[k]))
		j.ID = th.ID + "-" + k // ids whose order is known
		stored[k] = createJob(e, j)
	}
	// States do not matter to the list.
	stored["a"] = finishJob(e, resultOf(stored["a"], `{"ok":true}`, at(time.Minute)))
	stored["e"] = finishJob(e, agent.JobResult{ThreadID: th.ID, ID: stored["e"].ID, Error: "gave up", Now: at(time.Minute)})
	got, err := e.s.MarkJobDelivered(e.ctx, th.ID, stored["e"].ID, at(2*time.Minute))
	must(e.t, err, "MarkJobDelivered")
	stored["e"] = got
	other := newThread(e)
	createJob(e, jobOf(other.ID, e.id("call"), at(-time.Hour)))
	for range 2 { // twice: ties come back in the same order every time
		wantJobs(e, th.ID, stored["e"], stored["c"], stored["d"], stored["a"], stored["b"])
	}
}

// ListJobsPage returns every undelivered job of the thread and its newest delivered ones (by creation, then id),
// oldest first, and how many older delivered ones it left out; nothing of another thread (REVIEW S7: the view
// reads those, not every job the thread ran).
func testListJobsPage(e *jobs) {
	t := e.t
	th := newThread(e)
	stored := make([]agent.Job, 7)
	for i := range stored {
		j := jobOf(th.ID, e.id("call"), at(time.Duration(i)*time.Second))
		j.ID = fmt.Sprintf("%s-%d", th.ID, i) // ids whose order is known
		stored[i] = createJob(e, j)
	}
	// 0, 1, 3 and 5 are delivered (1 a failure); 4 finished but undelivered; 2 and 6 still run.
	for _, i := range []int{0, 1, 3, 4, 5} {
		r := resultOf(stored[i], `{"ok":true}`, at(time.Minute))
		if i == 1 {
			r = agent.JobResult{ThreadID: th.ID, ID: stored[i].ID, Error: "gave up", Now: at(time.Minute)}
		}
		stored[i] = finishJob(e, r)
		if i == 4 {
			continue
		}
		got, err := e.s.MarkJobDelivered(e.ctx, th.ID, stored[i].ID, at(time.Duration(10-i)*time.Minute)) // delivered out of order
		must(t, err, "MarkJobDelivered")
		stored[i] = got
	}
	other := newThread(e)
	createJob(e, jobOf(other.ID, e.id("call"), at(time.Hour)))
	for _, tc := range []struct {
		finished int
		want     []int
		omitted  int
	}{
		{finished: 2, want: []int{2, 3, 4, 5, 6}, omitted: 2},
		{finished: 0, want: []int{2, 4, 6}, omitted: 4},
		{finished: 4, want: []int{0, 1, 2, 3, 4, 5, 6}, omitted: 0},
		{finished: 10, want: []int{0, 1, 2, 3, 4, 5, 6}, omitted: 0},
	} {
		page, err := e.s.ListJobsPage(e.ctx, th.ID, tc.finished)
		must(t, err, "ListJobsPage")
		var ids []string
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		if len(page.Jobs) != len(tc.want) || page.Omitted != tc.omitted {
			t.Fatalf("ListJobsPage(%d) = %v omitted %d, want %v omitted %d", tc.finished, ids, page.Omitted, tc.want, tc.omitted)
		}
		for i, k := range tc.want {
			sameJob(t, fmt.Sprintf("ListJobsPage(%d)[%d]", tc.finished, i), page.Jobs[i], stored[k])
		}
	}
	page, err := e.s.ListJobsPage(e.ctx, e.id("th"), 5)
	must(t, err, "ListJobsPage(unknown thread)")
	if len(page.Jobs) != 0 || page.Omitted != 0 {
		t.Fatalf("ListJobsPage(unknown thread) = %d jobs, %d omitted", len(page.Jobs), page.Omitted)
	}
}

// The activity line changes while the job runs, and not once it has finished.
func testJobActivity(e *jobs) {
	t := e.t
	th := newThread(e)
	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	for i, line := range []string{"reading 3 sources", "", "writing the summary ✍️"} {
		now := at(time.Duration(i+1) * time.Second)
		must(t, e.s.SetJobActivity(e.ctx, th.ID, j.ID, line, now), "SetJobActivity")
		j.Activity, j.UpdatedAt = line, now
		sameJob(t, "GetJob after SetJobActivity", getJob(e, th.ID, j.ID), j)
	}
	wantJobs(e, th.ID, j)

	done := finishJob(e, resultOf(j, `{"summary":"done"}`, at(time.Minute)))
	err := e.s.SetJobActivity(e.ctx, th.ID, j.ID, "too late", at(2*time.Minute))
	wantErr(t, err, agent.KindConflict, agent.CodeJobFinished, "SetJobActivity after finish")
	if !errors.Is(err, agent.ErrJobFinished) {
		t.Fatalf("SetJobActivity after finish: %v does not match ErrJobFinished", err)
	}
	sameJob(t, "GetJob after the refused activity", getJob(e, th.ID, j.ID), done)

	delivered, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(3*time.Minute))
	must(t, err, "MarkJobDelivered")
	err = e.s.SetJobActivity(e.ctx, th.ID, j.ID, "much too late", at(4*time.Minute))
	wantErr(t, err, agent.KindConflict, agent.CodeJobFinished, "SetJobActivity after delivery")
	sameJob(t, "GetJob after the refused activity", getJob(e, th.ID, j.ID), delivered)
}

// FinishJob stores the result once: the winner's result, finish time and delivery deadline; the job stays running
// (undelivered) and a second finish, whatever it carries, changes nothing and says so.
func testFinishJob(e *jobs) {
	t := e.t
	th := newThread(e)
	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	r := resultOf(j, `{"summary":"the tides are high","sources":3}`, at(time.Minute))
	// The sub-agent's tokens are kept with its result (the delivering turn counts them).
	r.Usage = agent.Usage{InputTokens: 1200, OutputTokens: 340, TotalTokens: 1540, CachedInputTokens: 800, ReasoningTokens: 40, CacheWriteTokens: 200, CostMicroUSD: 901}
	got := finishJob(e, r)
	want := jobFinished(j, r)
	sameJob(t, "FinishJob result", got, want)
	if got.Status != agent.JobRunning || !got.Finished() || got.Failed() || got.SteerDelivered {
		t.Fatalf("FinishJob: status %s finished %v failed %v delivered %v; want running, finished, not failed, undelivered",
			got.Status, got.Finished(), got.Failed(), got.SteerDelivered)
	}
	wantUTC(t, "FinishJob result", got.FinishedAt, got.UpdatedAt, got.DueAt)
	sameJob(t, "GetJob after finish", getJob(e, th.ID, j.ID), want)

	for name, second := range map[string]agent.JobResult{
		"identical":      r,
		"another result": resultOf(j, `{"summary":"low"}`, at(2*time.Minute)),
		"a failure":      {ThreadID: th.ID, ID: j.ID, Error: "timed out", DueAt: at(time.Hour), Now: at(3 * time.Minute)},
	} {
		got, stored, err := e.s.FinishJob(e.ctx, second)
		must(t, err, name+" second finish")
		if stored {
			t.Fatalf("%s second finish: stored = true", name)
		}
		sameJob(t, name+" second finish returns the stored job", got, want)
	}
	wantJobs(e, th.ID, want)
}

// A failure is stored like a result: the job is finished and failed, and a later result does not replace it.
func testFinishJobFailure(e *jobs) {
	t := e.t
	th := newThread(e)
	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	// A failed sub-agent's tokens are kept with its failure too (issue 16 item 5: the delivering turn counts them).
	r := agent.JobResult{ThreadID: th.ID, ID: j.ID, Error: "the research service is down", DueAt: at(2 * time.Minute), Now: at(time.Minute),
		Usage: agent.Usage{InputTokens: 300, OutputTokens: 20, TotalTokens: 320}}
	got := finishJob(e, r)
	want := jobFinished(j, r)
	sameJob(t, "FinishJob(failure) result", got, want)
	if !got.Failed() || got.Status != agent.JobRunning {
		t.Fatalf("FinishJob(failure): failed %v status %s; want failed and still running", got.Failed(), got.Status)
	}
	got, stored, err := e.s.FinishJob(e.ctx, resultOf(j, `{"late":true}`, at(2*time.Minute)))
	must(t, err, "FinishJob after the failure")
	if stored {
		t.Fatal("FinishJob after the failure: stored = true")
	}
	sameJob(t, "FinishJob after the failure returns the failure", got, want)
	sameJob(t, "GetJob", getJob(e, th.ID, j.ID), want)
}

// Concurrent finishers (the sub-agent task, its retry, a reaper re-drive) race the compare-and-set: exactly one
// stores its result, and every one of them gets the stored job back.
func testFinishJobRace(e *jobs) {
	t := e.t
	const n = 10
	for round := range 3 {
		th := newThread(e)
		j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results [n]agent.Job
			stored  [n]bool
			errs    [n]error
			reqs    [n]agent.JobResult
		)
		for i := range n {
			now := at(time.Duration(i+1) * time.Second)
			if i%3 == 2 {
				reqs[i] = agent.JobResult{ThreadID: th.ID, ID: j.ID, Error: fmt.Sprintf("failure %d", i), DueAt: now.Add(time.Minute), Now: now}
			} else {
				reqs[i] = resultOf(j, fmt.Sprintf(`{"by":%d}`, i), now)
			}
			wg.Go(func() {
				<-start
				results[i], stored[i], errs[i] = e.s.FinishJob(e.ctx, reqs[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			must(t, errs[i], fmt.Sprintf("round %d: FinishJob %d", round, i))
			if stored[i] {
				if winner >= 0 {
					t.Fatalf("round %d: finishers %d and %d both stored", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no finisher stored", round)
		}
		want := jobFinished(j, reqs[winner])
		for i := range n {
			sameJob(t, fmt.Sprintf("round %d: finisher %d result", round, i), results[i], want)
		}
		sameJob(t, fmt.Sprintf("round %d: GetJob", round), getJob(e, th.ID, j.ID), want)
	}
}

// Delivery needs a finished job; it marks the steer delivered, moves the status to done (error for a failure),
// clears the deadline, and a repeat returns the delivered job unchanged.
func testMarkJobDelivered(e *jobs) {
	t := e.t
	th := newThread(e)
	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	_, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(time.Second))
	wantErr(t, err, agent.KindConflict, agent.CodeJobNotFinished, "MarkJobDelivered before finish")
	if !errors.Is(err, agent.ErrJobNotFinished) {
		t.Fatalf("MarkJobDelivered before finish: %v does not match ErrJobNotFinished", err)
	}
	sameJob(t, "GetJob after the refused delivery", getJob(e, th.ID, j.ID), j)

	done := finishJob(e, resultOf(j, `{"summary":"ok"}`, at(time.Minute)))
	got, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(2*time.Minute))
	must(t, err, "MarkJobDelivered")
	want := jobDelivered(done, at(2*time.Minute))
	sameJob(t, "MarkJobDelivered result", got, want)
	if got.Status != agent.JobDone || !got.SteerDelivered || !got.DueAt.IsZero() {
		t.Fatalf("MarkJobDelivered: status %s delivered %v due %v; want done, delivered, no deadline", got.Status, got.SteerDelivered, got.DueAt)
	}
	sameJob(t, "GetJob after delivery", getJob(e, th.ID, j.ID), want)
	for i := range 2 {
		again, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(time.Duration(3+i)*time.Minute))
		must(t, err, "MarkJobDelivered again")
		sameJob(t, "MarkJobDelivered again returns the delivered job unchanged", again, want)
	}

	failed := createJob(e, jobOf(th.ID, e.id("call"), at(time.Second)))
	failed = finishJob(e, agent.JobResult{ThreadID: th.ID, ID: failed.ID, Error: "no sources", DueAt: at(time.Hour), Now: at(time.Minute)})
	got, err = e.s.MarkJobDelivered(e.ctx, th.ID, failed.ID, at(2*time.Minute))
	must(t, err, "MarkJobDelivered(failure)")
	wantFailed := jobDelivered(failed, at(2*time.Minute))
	sameJob(t, "MarkJobDelivered(failure) result", got, wantFailed)
	if got.Status != agent.JobError {
		t.Fatalf("MarkJobDelivered(failure): status %s, want error", got.Status)
	}
	wantJobs(e, th.ID, want, wantFailed)
}

// DueAt is the reaper's deadline: the execution's while the job runs, the delivery grace once it finished, none
// once delivered; each round-trips exactly, and the zero deadline too.
func testJobDueAt(e *jobs) {
	t := e.t
	th := newThread(e)
	j := jobOf(th.ID, e.id("call"), at(0))
	j.DueAt = at(1800*time.Second + 123*time.Millisecond)
	createJob(e, j)
	sameJob(t, "GetJob", getJob(e, th.ID, j.ID), j)
	r := resultOf(j, `{"x":1}`, at(time.Minute))
	r.DueAt = at(61*time.Second + 7*time.Millisecond)
	want := jobFinished(j, r)
	sameJob(t, "FinishJob", finishJob(e, r), want)
	sameJob(t, "GetJob after finish", getJob(e, th.ID, j.ID), want)
	got, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(2*time.Minute))
	must(t, err, "MarkJobDelivered")
	if !got.DueAt.IsZero() || !getJob(e, th.ID, j.ID).DueAt.IsZero() {
		t.Fatalf("a delivered job is due at %v, want zero", got.DueAt)
	}

	zero := jobOf(th.ID, e.id("call"), at(time.Second))
	zero.DueAt = time.Time{}
	createJob(e, zero)
	sameJob(t, "GetJob(no deadline)", getJob(e, th.ID, zero.ID), zero)
}

// SetJobDue moves a running job's deadline (its start's to its execution's, or a start's again), within the
// reaper's work list too, and refuses a finished or unknown job, changing nothing.
func testSetJobDue(e *jobs) {
	t := e.t
	th := newThread(e)
	j := jobOf(th.ID, e.id("call"), at(-50*24*time.Hour))
	j.DueAt = at(-50*24*time.Hour + 2*time.Minute)
	createJob(e, j)
	wantDue(e, at(-50*24*time.Hour+3*time.Minute), []string{th.ID}, j)
	moved := at(-50*24*time.Hour + 31*time.Minute)
	must(t, e.s.SetJobDue(e.ctx, th.ID, j.ID, moved, at(-50*24*time.Hour+10*time.Second)), "SetJobDue")
	j.DueAt, j.UpdatedAt = moved, at(-50*24*time.Hour+10*time.Second)
	sameJob(t, "GetJob after SetJobDue", getJob(e, th.ID, j.ID), j)
	wantDue(e, at(-50*24*time.Hour+3*time.Minute), []string{th.ID})
	wantDue(e, at(-50*24*time.Hour+32*time.Minute), []string{th.ID}, j)

	err := e.s.SetJobDue(e.ctx, th.ID, e.id("job"), moved, at(-50*24*time.Hour+time.Minute))
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "SetJobDue(unknown id)")
	done := finishJob(e, resultOf(j, `{"ok":true}`, at(-50*24*time.Hour+time.Minute)))
	err = e.s.SetJobDue(e.ctx, th.ID, j.ID, moved, at(-50*24*time.Hour+2*time.Minute))
	wantErr(t, err, agent.KindConflict, agent.CodeJobFinished, "SetJobDue after finish")
	sameJob(t, "GetJob after the refused SetJobDue", getJob(e, th.ID, j.ID), done)
}

// Input and Result are JSON kept byte for byte (the result becomes the steer's payload as the sub-agent wrote it).
func testJobRawJSON(e *jobs) {
	th := newThread(e)
	j := jobOf(th.ID, e.id("call"), at(0))
	j.Input = json.RawMessage("{ \"z\" : 1,\n\t\"a\" : [1.0, 2e3, -0.0, 1E-7, 10000000000000000000001], " +
		`"html": "<b>&</b> \u00e9 é \ud83c\udf89 🎉 \"q\" \\ \/", "nil": null}`)
	createJob(e, j)
	sameJob(e.t, "GetJob", getJob(e, th.ID, j.ID), j)
	r := resultOf(j, "{\"output\" :\n {\"b\":2, \"a\":[true,false,null], \"s\":\"\\u0000\\n\"}}", at(time.Second))
	sameJob(e.t, "FinishJob", finishJob(e, r), jobFinished(j, r))
	wantJobs(e, th.ID, jobFinished(j, r))

	// A job with no input at all, and a scalar result.
	bare := jobOf(th.ID, e.id("call"), at(time.Second))
	bare.Input = nil
	createJob(e, bare)
	r = resultOf(bare, `"just a string"`, at(2*time.Second))
	sameJob(e.t, "FinishJob(scalar)", finishJob(e, r), jobFinished(bare, r))
}

// A job's input and its result can be large (a pasted document, a long report): half a megabyte of input and
// more of result round-trip, through every read.
func testJobLarge(e *jobs) {
	t := e.t
	th := newThread(e)
	j := jobOf(th.ID, e.id("call"), at(0))
	j.Input = mustJSON(map[string]string{"document": randomText(500 << 10)})
	j.DueAt = at(-85 * 24 * time.Hour) // due long ago, so ListDueJobs returns it too
	createJob(e, j)
	sameJob(t, "GetJob(large)", getJob(e, th.ID, j.ID), j)
	small := createJob(e, jobOf(th.ID, e.id("call"), at(time.Second)))
	wantJobs(e, th.ID, j, small)
	wantDue(e, at(-85*24*time.Hour+time.Second), []string{th.ID}, j)

	r := agent.JobResult{ThreadID: th.ID, ID: j.ID, Result: mustJSON(map[string]string{"report": randomText(700 << 10)}),
		DueAt: at(-85*24*time.Hour + time.Millisecond), Now: at(time.Minute)}
	want := jobFinished(j, r)
	sameJob(t, "FinishJob(large)", finishJob(e, r), want)
	sameJob(t, "GetJob(large) after finish", getJob(e, th.ID, j.ID), want)
	wantJobs(e, th.ID, want, small)
	wantDue(e, at(-85*24*time.Hour+time.Second), []string{th.ID}, want)
	got, stored, err := e.s.FinishJob(e.ctx, resultOf(j, `{"small":true}`, at(2*time.Minute)))
	must(t, err, "second finish of the large one")
	if stored {
		t.Fatal("second finish of the large one: stored = true")
	}
	sameJob(t, "second finish of the large one returns the stored job", got, want)
	delivered, err := e.s.MarkJobDelivered(e.ctx, th.ID, j.ID, at(3*time.Minute))
	must(t, err, "MarkJobDelivered(large)")
	sameJob(t, "MarkJobDelivered(large)", delivered, jobDelivered(want, at(3*time.Minute)))
	wantDue(e, at(-85*24*time.Hour+time.Second), []string{th.ID})
}

// wantDue checks which jobs of threads ListDueJobs(before) returns (any order), and that each comes back whole.
// Jobs of other threads (other cases share the store) are ignored.
func wantDue[S agent.JobStore](e *env[S], before time.Time, threads []string, want ...agent.Job) {
	e.t.Helper()
	got, err := e.s.ListDueJobs(e.ctx, before, 1000)
	must(e.t, err, "ListDueJobs")
	mine := map[string]bool{}
	for _, id := range threads {
		mine[id] = true
	}
	var found []agent.Job
	for _, j := range got {
		if j.SteerDelivered || !j.DueAt.Before(before) {
			e.t.Fatalf("ListDueJobs(%s) returned %s (delivered %v, due %s)", before, j.ID, j.SteerDelivered, j.DueAt)
		}
		if mine[j.ThreadID] {
			found = append(found, j)
		}
	}
	key := func(j agent.Job) string { return j.ThreadID + "\x00" + j.ID }
	sort.Slice(found, func(i, k int) bool { return key(found[i]) < key(found[k]) })
	want = append([]agent.Job(nil), want...)
	sort.Slice(want, func(i, k int) bool { return key(want[i]) < key(want[k]) })
	if len(found) != len(want) {
		ids := make([]string, len(found))
		for i, j := range found {
			ids[i] = j.ID
		}
		e.t.Fatalf("ListDueJobs(%s) lists %d of these threads' jobs %v, want %d", before, len(found), ids, len(want))
	}
	for i := range want {
		sameJob(e.t, "ListDueJobs entry "+want[i].ID, found[i], want[i])
	}
}

// ListDueJobs is the reaper's work list across threads: running jobs past their execution's deadline and
// finished ones past their delivery grace, never delivered ones, never ones due at or after the cutoff. The times
// sit seventy days before every other case's (the default-limit case is older still), so a shared store holds few
// others in the window.
func testListDueJobs(e *jobs) {
	t := e.t
	base := at(-70 * 24 * time.Hour)
	cutoff := base.Add(time.Hour)
	a, b := newThread(e), newThread(e)
	mk := func(th agent.Thread, due time.Duration) agent.Job {
		j := jobOf(th.ID, e.id("call"), base.Add(-2*time.Hour))
		j.DueAt = base.Add(due)
		return createJob(e, j)
	}
	overdue := mk(a, 0)               // running past its deadline
	overdue2 := mk(b, 59*time.Minute) // running, just before the cutoff
	atCutoff := mk(a, time.Hour)      // not before the cutoff
	running := mk(b, 2*time.Hour)     // its deadline is ahead
	graceOver := mk(a, 3*time.Hour)   // not due while running; finished below with its grace before the cutoff
	graceAhead := mk(b, time.Minute)  // due while running; finished below with its grace ahead: no longer due
	delivered := mk(a, -time.Minute)  // finished and delivered below
	failedOver := mk(b, 4*time.Hour)  // failed below, its grace before the cutoff
	graceOver = finishJob(e, agent.JobResult{ThreadID: a.ID, ID: graceOver.ID, Result: json.RawMessage(`{}`),
		DueAt: base.Add(30 * time.Minute), Now: base})
	graceAhead = finishJob(e, agent.JobResult{ThreadID: b.ID, ID: graceAhead.ID, Result: json.RawMessage(`{}`),
		DueAt: base.Add(5 * time.Hour), Now: base})
	failedOver = finishJob(e, agent.JobResult{ThreadID: b.ID, ID: failedOver.ID, Error: "crashed",
		DueAt: base.Add(10 * time.Minute), Now: base})
	finishJob(e, agent.JobResult{ThreadID: a.ID, ID: delivered.ID, Result: json.RawMessage(`{}`), DueAt: base.Add(-time.Minute), Now: base})
	_, err := e.s.MarkJobDelivered(e.ctx, a.ID, delivered.ID, base)
	must(t, err, "MarkJobDelivered")
	threads := []string{a.ID, b.ID}
	wantDue(e, cutoff, threads, overdue, overdue2, graceOver, failedOver)
	wantDue(e, base.Add(6*time.Hour), threads, overdue, overdue2, atCutoff, running, graceOver, graceAhead, failedOver)
	wantDue(e, base, threads)

	for _, limit := range []int{1, 2, 3} {
		got, err := e.s.ListDueJobs(e.ctx, cutoff, limit)
		must(t, err, "ListDueJobs(limit)")
		if len(got) != limit {
			t.Fatalf("ListDueJobs(limit %d) = %d jobs, want %d", limit, len(got), limit)
		}
	}

	// Once delivered, a job is off the list.
	_, err = e.s.MarkJobDelivered(e.ctx, a.ID, graceOver.ID, cutoff)
	must(t, err, "MarkJobDelivered")
	wantDue(e, cutoff, threads, overdue, overdue2, failedOver)
}

// limit <= 0 means agent.DefaultListLimit. The jobs fell due ninety days back, before any other case's, and there
// are more of them than the default, so exactly the default comes back whatever else the store holds.
func testListDueJobsDefaultLimit(e *jobs) {
	t := e.t
	base := at(-90 * 24 * time.Hour)
	ths := []agent.Thread{newThread(e), newThread(e), newThread(e)}
	for i := range agent.DefaultListLimit + 1 {
		j := jobOf(ths[i%len(ths)].ID, fmt.Sprintf("%s-%03d", e.id("call"), i), base.Add(-time.Hour))
		j.DueAt = base.Add(time.Duration(i) * time.Millisecond)
		createJob(e, j)
	}
	for _, limit := range []int{0, -1} {
		got, err := e.s.ListDueJobs(e.ctx, base.Add(time.Second), limit)
		must(t, err, "ListDueJobs")
		if len(got) != agent.DefaultListLimit {
			t.Fatalf("ListDueJobs(limit %d) = %d jobs, want %d", limit, len(got), agent.DefaultListLimit)
		}
	}
}

// A thread's delete takes its jobs (running, finished, delivered, large) with it, and nothing of a neighbour's;
// an id used again starts with none.
func testDeleteThreadRemovesJobs(e *jobs) {
	t := e.t
	base := at(-80 * 24 * time.Hour)
	fill := func(th agent.Thread) []agent.Job {
		running := jobOf(th.ID, th.ID+"-running", base)
		running.DueAt = base.Add(time.Minute)
		big := jobOf(th.ID, th.ID+"-big", base.Add(time.Second))
		big.Input = mustJSON(map[string]string{"document": randomText(450 << 10)})
		big.DueAt = base.Add(time.Minute)
		done := jobOf(th.ID, th.ID+"-done", base.Add(2*time.Second))
		out := []agent.Job{createJob(e, running), createJob(e, big), createJob(e, done)}
		out[2] = finishJob(e, agent.JobResult{ThreadID: th.ID, ID: done.ID,
			Result: mustJSON(map[string]string{"report": randomText(420 << 10)}), DueAt: base.Add(time.Minute), Now: base.Add(time.Minute)})
		delivered := createJob(e, jobOf(th.ID, th.ID+"-delivered", base.Add(3*time.Second)))
		finishJob(e, resultOf(delivered, `{}`, base.Add(time.Minute)))
		delivered, err := e.s.MarkJobDelivered(e.ctx, th.ID, delivered.ID, base.Add(2*time.Minute))
		must(t, err, "MarkJobDelivered")
		return append(out, delivered)
	}
	th, neighbour := newThread(e), newThread(e)
	gone := fill(th)
	kept := fill(neighbour)
	cutoff := base.Add(time.Hour)
	wantDue(e, cutoff, []string{th.ID, neighbour.ID}, gone[0], gone[1], gone[2], kept[0], kept[1], kept[2])

	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	for _, j := range gone {
		_, err := e.s.GetJob(e.ctx, th.ID, j.ID)
		wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob after delete")
	}
	wantJobs(e, th.ID)
	wantDue(e, cutoff, []string{th.ID, neighbour.ID}, kept[0], kept[1], kept[2])
	wantJobs(e, neighbour.ID, kept...)

	// The id is free again, with no job of the deleted thread: the same job id is a new job.
	again := createThread(e, th.Owner, th.ID, at(time.Hour))
	wantJobs(e, th.ID)
	// A run of the new thread dispatches it (a store may refuse a job no run of the new thread dispatched).
	fresh := jobOf(th.ID, th.ID+"-done", at(time.Hour))
	fresh.Writer = claim(e, again, e.id("run"), at(time.Hour)).Run.Fence()
	got, created, err := e.s.CreateJob(e.ctx, fresh)
	must(t, err, "CreateJob by the new thread's run")
	fresh.Writer = agent.Fence{} // written only
	if !created {
		t.Fatal("CreateJob by the new thread's run: created = false")
	}
	same(t, "CreateJob by the new thread's run", got, fresh)
	wantJobs(e, th.ID, fresh)
}

// Bad input is refused with the catalog's code, the same in every store, and nothing is stored or changed.
func testJobInvalid(e *jobs) {
	t := e.t
	th := newThread(e)
	cases := []struct {
		name string
		edit func(*agent.Job)
		code string
	}{
		{"no thread id", func(j *agent.Job) { j.ThreadID = "" }, agent.CodeInvalidThreadID},
		{"no id", func(j *agent.Job) { j.ID = "" }, agent.CodeInvalidJob},
		{"no kind", func(j *agent.Job) { j.Kind = "" }, agent.CodeInvalidJob},
		{"no tool call id", func(j *agent.Job) { j.ToolCallID = "" }, agent.CodeInvalidJob},
		{"input that is not JSON", func(j *agent.Job) { j.Input = json.RawMessage(`{"topic":`) }, agent.CodeInvalidJob},
		{"created done", func(j *agent.Job) { j.Status = agent.JobDone }, agent.CodeInvalidStatus},
		{"no status", func(j *agent.Job) { j.Status = "" }, agent.CodeInvalidStatus},
		{"created finished", func(j *agent.Job) { j.FinishedAt = at(time.Second) }, agent.CodeInvalidStatus},
		{"created delivered", func(j *agent.Job) { j.SteerDelivered = true }, agent.CodeInvalidStatus},
		{"created with a result", func(j *agent.Job) { j.Result = json.RawMessage(`{}`) }, agent.CodeInvalidStatus},
		{"created with a failure", func(j *agent.Job) { j.Error = "boom" }, agent.CodeInvalidStatus},
	}
	for _, tc := range cases {
		j := jobOf(th.ID, e.id("call"), at(0))
		tc.edit(&j)
		_, _, err := e.s.CreateJob(e.ctx, j)
		wantErr(t, err, agent.KindInvalid, tc.code, tc.name+": CreateJob")
	}
	wantJobs(e, th.ID)

	j := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	ok := resultOf(j, `{"ok":true}`, at(time.Second))
	results := []struct {
		name string
		edit func(*agent.JobResult)
	}{
		{"no thread id", func(r *agent.JobResult) { r.ThreadID = "" }},
		{"no job id", func(r *agent.JobResult) { r.ID = "" }},
		{"neither result nor error", func(r *agent.JobResult) { r.Result = nil }},
		{"both result and error", func(r *agent.JobResult) { r.Error = "and failed" }},
		{"result that is not JSON", func(r *agent.JobResult) { r.Result = json.RawMessage(`{"ok":tru}`) }},
	}
	for _, tc := range results {
		r := ok
		tc.edit(&r)
		_, _, err := e.s.FinishJob(e.ctx, r)
		wantErr(t, err, agent.KindInvalid, agent.CodeInvalidJob, tc.name+": FinishJob")
	}
	wantJobs(e, th.ID, j)
}
