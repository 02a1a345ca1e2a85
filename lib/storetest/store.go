package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// storeTests are the cases that span every port.
func storeTests() []test {
	type c = leaf[agent.Store]
	return group(wholeStore,
		c{"CanceledContext", testCanceledContext},
	)
}

type whole = env[agent.Store]

// threadState is everything a reader can see of one thread through the port.
type threadState struct {
	Thread   *agent.Thread
	Messages []agent.MessageRecord
	Runs     []agent.Run
	Segments map[string][]agent.Segment // by run id
}

// readState reads everything the port shows of thread id; runIDs are the runs whose segments to read (segments
// are keyed by run, and a deleted thread's runs are no longer listed).
func readState(e *whole, id string, runIDs ...string) threadState {
	e.t.Helper()
	var st threadState
	th, err := e.s.GetThread(e.ctx, id)
	switch {
	case err == nil:
		st.Thread = &th
	case agent.IsKind(err, agent.KindNotFound):
	default:
		e.t.Fatalf("GetThread(%s): %v", id, err)
	}
	st.Messages, err = e.s.ListMessages(e.ctx, id)
	must(e.t, err, "ListMessages")
	st.Runs, err = e.s.ListRuns(e.ctx, id)
	must(e.t, err, "ListRuns")
	st.Segments = map[string][]agent.Segment{}
	for _, r := range runIDs {
		segs, err := e.s.ListSegments(e.ctx, r, 0, at(0))
		must(e.t, err, "ListSegments")
		if len(segs) > 0 {
			st.Segments[r] = segs
		}
	}
	// Nil and empty lists are one answer.
	if len(st.Messages) == 0 {
		st.Messages = nil
	}
	if len(st.Runs) == 0 {
		st.Runs = nil
	}
	return st
}

// wantGone checks that nothing of thread id (with the given runs and message ids) can be read any more.
func wantGone(e *whole, what, id string, runIDs, msgIDs []string) {
	e.t.Helper()
	st := readState(e, id, runIDs...)
	if st.Thread != nil || len(st.Messages) != 0 || len(st.Runs) != 0 || len(st.Segments) != 0 {
		e.t.Fatalf("%s: thread %s still shows %s", what, id, show(st))
	}
	for _, r := range runIDs {
		_, err := e.s.GetRun(e.ctx, id, r)
		wantErr(e.t, err, agent.KindNotFound, "", what+": GetRun")
	}
	for _, m := range msgIDs {
		_, err := e.s.GetMessage(e.ctx, id, m)
		wantErr(e.t, err, agent.KindNotFound, "", what+": GetMessage")
	}
}

// turn runs one whole turn on th as the engine does: claim with two positions, the user message at the first,
// a draft and then the final assistant message at the second, segments, finish. It returns the run and the ids
// of the messages it wrote.
func turn(e *whole, th agent.Thread, now time.Time) (agent.Run, []string) {
	e.t.Helper()
	req := claimReq(th, e.id("run"), now)
	req.Reserve = 2
	res, err := e.s.ClaimRun(e.ctx, req)
	must(e.t, err, "ClaimRun")
	run := res.Run
	user := agent.Message{ID: e.id("msg"), Role: agent.RoleUser, Parts: textParts("question")}
	asst := agent.Message{ID: run.AssistantMessageID, Role: agent.RoleAssistant, Parts: textParts("answer")}
	for _, w := range []agent.MessageWrite{
		{ThreadID: th.ID, Seq: run.FirstSeq, Message: user, Fence: run.Fence(), Final: true, Now: now},
		{ThreadID: th.ID, Seq: run.AssistantSeq(), Message: asst, Fence: run.Fence(), Now: now},
		{ThreadID: th.ID, Seq: run.AssistantSeq(), Message: asst, Fence: run.Fence(), Final: true, Now: now},
	} {
		must(e.t, e.s.PutMessage(e.ctx, w), "PutMessage")
	}
	for i, final := range []bool{false, true} {
		must(e.t, e.s.AppendSegment(e.ctx, segment(th.ID, run.ID, int64(i), "data: x\n\n", final)), "AppendSegment")
	}
	finish(e, run, agent.RunCompleted, agent.Usage{InputTokens: 1, TotalTokens: 1}, now.Add(time.Second))
	return run, []string{user.ID, asst.ID}
}

// A held claim refuses the delete (REVIEW H3: the check and the tombstone are one conditional write), however old
// its heartbeat (a stale claim is freed by the reaper first), and the refused delete changes nothing.
func testDeleteThreadClaimed(e *whole) {
	t := e.t
	for _, reaped := range []bool{false, true} {
		th := newThread(e)
		done, _ := turn(e, th, at(0))
		live := claim(e, th, e.id("run"), at(time.Minute)).Run
		must(t, e.s.AppendSegment(e.ctx, segment(th.ID, live.ID, 0, "data: y\n\n", false)), "AppendSegment")
		before := readState(e, th.ID, done.ID, live.ID)
		err := e.s.DeleteThread(e.ctx, th.ID)
		wantErr(t, err, agent.KindConflict, agent.CodeRunActive, "DeleteThread(claimed)")
		same(t, "thread after a refused delete", readState(e, th.ID, done.ID, live.ID), before)
		// The claim holder is not disturbed.
		must(t, e.s.Heartbeat(e.ctx, th.ID, live.Fence(), at(2*time.Minute)), "Heartbeat after a refused delete")

		// Once the claim is released, by the run's finish or by the reaper, the delete goes through.
		if reaped {
			must(t, e.s.ReleaseClaim(e.ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: live.Fence(),
				StaleBefore: at(time.Hour), Now: at(time.Hour)}), "ReleaseClaim")
		} else {
			finish(e, live, agent.RunCanceled, agent.Usage{}, at(3*time.Minute))
		}
		must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread after release")
		wantGone(e, "after delete", th.ID, []string{done.ID, live.ID}, nil)
	}
}

// A thread re-created with the id of a deleted one shows nothing of it: no messages (hidden ones included), runs,
// segments, and no fence left over from its messages to refuse the new thread's writes.
func testDeleteThreadRecreate(e *whole) {
	t := e.t
	th := newThread(e)
	r1, msgs1 := turn(e, th, at(0))
	r2, msgs2 := turn(e, th, at(time.Minute))
	// A third run deletes the second reply (a regenerate) and stops: a hidden message stays behind in stores that
	// keep deleted rows.
	r3 := claim(e, th, e.id("run"), at(2*time.Minute)).Run
	must(t, e.s.DeleteMessage(e.ctx, th.ID, msgs2[1], r3.Fence()), "DeleteMessage")
	finish(e, r3, agent.RunCompleted, agent.Usage{}, at(3*time.Minute))

	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	runs := []string{r1.ID, r2.ID, r3.ID}
	old := append(msgs1, msgs2...)
	wantGone(e, "after delete", th.ID, runs, old)

	fresh := agent.Thread{ID: th.ID, Owner: e.id("user"), Title: "someone else's", CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
	got, created, err := e.s.CreateThread(e.ctx, fresh)
	must(t, err, "CreateThread(same id)")
	if !created {
		t.Fatal("CreateThread(same id) after delete: created = false")
	}
	// A store may start the new thread's epochs above the deleted one's (its runs are fenced by them).
	if got.Epoch < 0 {
		t.Fatalf("re-created thread: epoch %d", got.Epoch)
	}
	fresh.Epoch = got.Epoch
	same(t, "re-created thread", got, fresh)
	st := readState(e, th.ID, runs...)
	if len(st.Messages) != 0 || len(st.Runs) != 0 || len(st.Segments) != 0 {
		t.Fatalf("re-created thread shows the deleted one's %s", show(st))
	}
	for _, id := range old {
		_, err := e.s.GetMessage(e.ctx, th.ID, id)
		wantErr(t, err, agent.KindNotFound, "", "GetMessage(old id) in the re-created thread")
	}

	// The new owner's first run (the epoch after the thread's) may write messages with the old ids (written at
	// higher epochs and finalized, or hidden, in the deleted thread): nothing of those rows fences it.
	run := claim(e, fresh, e.id("run"), at(2*time.Hour)).Run
	if run.Epoch != got.Epoch+1 {
		t.Fatalf("first claim of the re-created thread: epoch %d, want %d", run.Epoch, got.Epoch+1)
	}
	var want []agent.MessageRecord
	for i, id := range []string{msgs1[0], msgs2[1]} {
		m := agent.Message{ID: id, Role: agent.RoleUser, Parts: textParts("new text")}
		seq := run.FirstSeq + int64(i)
		must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: seq, Message: m, Fence: run.Fence(),
			Now: at(2 * time.Hour)}), "PutMessage(old id) in the re-created thread")
		want = append(want, agent.MessageRecord{ThreadID: th.ID, Seq: seq, Message: m,
			CreatedAt: at(2 * time.Hour), UpdatedAt: at(2 * time.Hour)})
	}
	wantMessages(e, th.ID, want...)
	if u := getThread(e, th.ID).Usage; u != (agent.Usage{}) {
		t.Fatalf("re-created thread usage = %+v, want none of the deleted one's", u)
	}
}

// Issue 16 item 2 (REVIEW D10, the prior H3's residual): a run of a deleted thread that writes late, between the
// delete and a thread created again on the id, or after it, is refused or never read: the new thread shows none
// of it (not as its newest message either), and the old run cannot change what the new thread's runs wrote.
func testDeletedThreadsLateWrites(e *whole) {
	t := e.t
	th := newThread(e)
	old := claim(e, th, e.id("run"), at(0)).Run
	msg := func(id, text string) agent.Message {
		return agent.Message{ID: id, Role: agent.RoleUser, Parts: textParts(text)}
	}
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: old.FirstSeq, Message: msg(e.id("msg"), "old"),
		Fence: old.Fence(), Final: true, Now: at(0)}), "PutMessage")
	finish(e, old, agent.RunCompleted, agent.Usage{}, at(time.Second))
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")

	// late writes a message of the old run: refused, or accepted where no reader of the new thread looks.
	late := func(what, id string) {
		t.Helper()
		err := e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: old.AssistantSeq() + 100, Message: msg(id, "late"),
			Fence: old.Fence(), Now: at(time.Minute)})
		if err != nil && !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("%s: PutMessage of the deleted thread's run: %v, want nil or %s", what, err, agent.CodeRunFenced)
		}
	}
	between, after := e.id("msg"), e.id("msg")
	late("between the delete and the new thread", between)
	fresh := agent.Thread{ID: th.ID, Owner: th.Owner, Title: "again", CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
	again, created, err := e.s.CreateThread(e.ctx, fresh)
	must(t, err, "CreateThread(same id)")
	if !created {
		t.Fatal("CreateThread(same id) after delete: created = false")
	}
	late("after the new thread", after)
	// An interrupt the old run asks late (its run and epoch name it): refused, or never read in the new thread.
	lateAsk := interruptOf(th.ID, e.id("int"), at(time.Minute))
	lateAsk.RunID, lateAsk.Epoch = old.ID, old.Epoch
	if _, _, err := e.s.CreateInterrupt(e.ctx, lateAsk); err != nil && !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("CreateInterrupt of the deleted thread's run: %v, want nil or %s", err, agent.CodeRunFenced)
	}
	if ins, err := e.s.ListInterrupts(e.ctx, th.ID); err != nil || len(ins) != 0 {
		t.Fatalf("interrupts of the new thread = %s, %v, want none of the deleted one's run", show(ins), err)
	}
	_, err = e.s.GetInterrupt(e.ctx, th.ID, lateAsk.MessageID, lateAsk.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt(the deleted thread's run's) in the new thread")
	// A job the old run dispatches late: refused, or never read in the new thread.
	lateJob := jobOf(th.ID, e.id("call"), at(time.Minute))
	lateJob.ID = agent.JobID(th.ID, old.ID, lateJob.ToolCallID)
	lateJob.Execution, lateJob.Writer = lateJob.ID, old.Fence()
	if _, _, err := e.s.CreateJob(e.ctx, lateJob); err != nil && !errors.Is(err, agent.ErrRunFenced) {
		t.Fatalf("CreateJob of the deleted thread's run: %v, want nil or %s", err, agent.CodeRunFenced)
	}
	if js, err := e.s.ListJobs(e.ctx, th.ID); err != nil || len(js) != 0 {
		t.Fatalf("jobs of the new thread = %s, %v, want none of the deleted one's run", show(js), err)
	}
	if page, err := e.s.ListJobsPage(e.ctx, th.ID, 10); err != nil || len(page.Jobs) != 0 {
		t.Fatalf("job page of the new thread = %s, %v, want none of the deleted one's run", show(page), err)
	}
	_, err = e.s.GetJob(e.ctx, th.ID, lateJob.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeJobNotFound, "GetJob(the deleted thread's run's) in the new thread")
	st := readState(e, th.ID, old.ID)
	if len(st.Messages) != 0 || len(st.Runs) != 0 {
		t.Fatalf("the new thread shows the deleted one's late writes: %s", show(st))
	}
	for _, id := range []string{between, after} {
		_, err := e.s.GetMessage(e.ctx, th.ID, id)
		wantErr(t, err, agent.KindNotFound, "", "GetMessage(late id) in the new thread")
	}
	_, err = e.s.GetRun(e.ctx, th.ID, old.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetRun(the deleted thread's run) in the new thread")

	// The new thread's own run writes; the old run can change none of it, and its late messages never read as
	// the newest.
	run := claim(e, again, e.id("run"), at(2*time.Hour)).Run
	mine := msg(e.id("msg"), "new")
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.FirstSeq, Message: mine, Fence: run.Fence(),
		Now: at(2 * time.Hour)}), "PutMessage by the new thread's run")
	err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: old.FirstSeq, Message: msg(mine.ID, "overwritten"),
		Fence: old.Fence(), Now: at(3 * time.Hour)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "PutMessage by the deleted thread's run over the new thread's message")
	late("while the new thread runs", e.id("msg"))
	want := agent.MessageRecord{ThreadID: th.ID, Seq: run.FirstSeq, Message: mine, CreatedAt: at(2 * time.Hour), UpdatedAt: at(2 * time.Hour)}
	wantMessages(e, th.ID, want)
	page, err := e.s.ListMessagesPage(e.ctx, th.ID, agent.MessagePage{Limit: 1})
	must(t, err, "ListMessagesPage")
	if len(page.Items) != 1 || page.Items[0].Message.ID != mine.ID || page.More {
		t.Fatalf("newest page of the new thread = %s, want %s alone", show(page), mine.ID)
	}
	runs, err := e.s.ListRuns(e.ctx, th.ID)
	must(t, err, "ListRuns")
	if len(runs) != 1 || runs[0].ID != run.ID {
		t.Fatalf("runs of the new thread = %s, want %s alone", show(runs), run.ID)
	}
}

// REVIEW S10: FinishDelete finishes only a delete left half done. A caller that reads an id as missing (a
// tombstone reads so) calls it without knowing the owner, so a live thread (one created since that read, maybe
// by another user) and an unknown id are left as they are; a deleted thread stays deleted.
func testFinishDeleteLeavesALiveThread(e *whole) {
	t := e.t
	th := newThread(e)
	run, msgs := turn(e, th, at(0))
	before := readState(e, th.ID, run.ID)
	must(t, e.s.FinishDelete(e.ctx, th.ID), "FinishDelete(live thread)")
	same(t, "a live thread after FinishDelete", readState(e, th.ID, run.ID), before)
	must(t, e.s.FinishDelete(e.ctx, e.id("th")), "FinishDelete(unknown id)")
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	must(t, e.s.FinishDelete(e.ctx, th.ID), "FinishDelete(deleted thread)")
	wantGone(e, "after FinishDelete", th.ID, []string{run.ID}, msgs)
}

// DeleteThread against many concurrent claims (REVIEW H3). Exactly one of two things happens: the delete loses
// (run_active) and the thread is intact with the one winner's run and message; or the delete wins, no claim
// succeeded, and nothing is left under the id, also after it is created again.
func testDeleteThreadRace(e *whole) {
	t := e.t
	const rounds, claimers = 8, 16
	var deleted, refused int
	for round := range rounds {
		th := newThread(e)
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			start    = make(chan struct{})
			winners  []agent.Run
			written  []string
			claimErr []error
			delErr   error
		)
		wg.Go(func() {
			<-start
			delErr = e.s.DeleteThread(e.ctx, th.ID)
		})
		// Every other round the claimers start a little late, so that both outcomes come up (the checks hold
		// for either).
		lag := time.Duration(round%2) * time.Duration(round) * 300 * time.Microsecond
		for i := range claimers {
			wg.Go(func() {
				<-start
				time.Sleep(lag)
				req := claimReq(th, fmt.Sprintf("%s-r%02d-%02d", th.ID, round, i), at(time.Second))
				req.Reserve = 2
				res, err := e.s.ClaimRun(e.ctx, req)
				if err != nil {
					mu.Lock()
					claimErr = append(claimErr, err)
					mu.Unlock()
					return
				}
				// The winner writes its user message at once, as a turn does.
				m := agent.Message{ID: e.id("msg"), Role: agent.RoleUser, Parts: textParts("hi")}
				err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: res.Run.FirstSeq, Message: m,
					Fence: res.Run.Fence(), Final: true, Now: at(time.Second)})
				mu.Lock()
				defer mu.Unlock()
				winners = append(winners, res.Run)
				if err == nil {
					written = append(written, m.ID)
				}
			})
		}
		close(start)
		wg.Wait()

		for _, err := range claimErr {
			// Before the delete: run_active; during it: thread_deleting; after it: not found.
			if !errors.Is(err, agent.ErrRunActive) && !errors.Is(err, agent.ErrThreadDeleting) &&
				!agent.IsKind(err, agent.KindNotFound) {
				t.Fatalf("round %d: losing ClaimRun: %v, want run_active, thread_deleting or not found", round, err)
			}
		}
		if delErr != nil {
			refused++
			wantErr(t, delErr, agent.KindConflict, agent.CodeRunActive, fmt.Sprintf("round %d: DeleteThread", round))
			if len(winners) != 1 || len(written) != 1 {
				t.Fatalf("round %d: delete refused with %d winners and %d messages, want 1 and 1", round, len(winners), len(written))
			}
			st := readState(e, th.ID, winners[0].ID)
			if st.Thread == nil || st.Thread.ActiveRun == nil || st.Thread.ActiveRun.RunID != winners[0].ID ||
				len(st.Runs) != 1 || len(st.Messages) != 1 || st.Messages[0].Message.ID != written[0] {
				t.Fatalf("round %d: after a refused delete the thread shows %s, want the winner's run and message", round, show(st))
			}
			finish(e, winners[0], agent.RunCompleted, agent.Usage{}, at(2*time.Second))
			must(t, e.s.DeleteThread(e.ctx, th.ID), fmt.Sprintf("round %d: DeleteThread after the run", round))
		} else {
			deleted++
			if len(winners) != 0 {
				t.Fatalf("round %d: the delete succeeded but %d claims won too", round, len(winners))
			}
		}
		var runIDs []string
		for _, r := range winners {
			runIDs = append(runIDs, r.ID)
		}
		wantGone(e, fmt.Sprintf("round %d: after delete", round), th.ID, runIDs, written)
		fresh := agent.Thread{ID: th.ID, Owner: th.Owner, CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)}
		_, created, err := e.s.CreateThread(e.ctx, fresh)
		must(t, err, "CreateThread after delete")
		if !created {
			t.Fatalf("round %d: CreateThread after delete: created = false", round)
		}
		if st := readState(e, th.ID, runIDs...); len(st.Messages) != 0 || len(st.Runs) != 0 || len(st.Segments) != 0 {
			t.Fatalf("round %d: re-created thread shows %s", round, show(st))
		}
	}
	t.Logf("%d rounds: the delete won %d, the claims won %d", rounds, deleted, refused)
}

// A canceled context ends every call with KindCanceled/CodeCanceled, and no write applies.
func testCanceledContext(e *whole) {
	t := e.t
	th := newThread(e)
	run := claim(e, th, e.id("run"), at(0)).Run
	m := agent.Message{ID: e.id("msg"), Role: agent.RoleUser, Parts: textParts("kept")}
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.FirstSeq, Message: m, Fence: run.Fence(),
		Now: at(0)}), "PutMessage")
	ns := "ns/" + e.id("user")
	must(t, e.s.PutValue(e.ctx, ns, "k", []byte("kept")), "PutValue")
	in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))
	job := createJob(e, jobOf(th.ID, e.id("call"), at(0)))
	queued := enqueue(e, queuedOf(th.ID, e.id("msg"), at(0)))
	before := readState(e, th.ID, run.ID)
	other := e.id("th")

	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	title := "changed"
	done := finished(run, agent.RunCompleted, agent.Usage{InputTokens: 5}, at(time.Second))
	calls := []struct {
		name string
		call func() error
	}{
		{"CreateThread", func() error {
			_, _, err := e.s.CreateThread(ctx, agent.Thread{ID: other, Owner: th.Owner, CreatedAt: at(0), UpdatedAt: at(0)})
			return err
		}},
		{"GetThread", func() error { _, err := e.s.GetThread(ctx, th.ID); return err }},
		{"ListThreads", func() error { _, err := e.s.ListThreads(ctx, th.Owner, 0); return err }},
		{"UpdateThread", func() error {
			_, err := e.s.UpdateThread(ctx, th.ID, agent.ThreadPatch{Title: &title}, at(time.Second))
			return err
		}},
		{"DeleteThread", func() error { return e.s.DeleteThread(ctx, other) }},
		{"ClaimRun", func() error { _, err := e.s.ClaimRun(ctx, claimReq(th, e.id("run"), at(time.Hour))); return err }},
		{"Heartbeat", func() error { return e.s.Heartbeat(ctx, th.ID, run.Fence(), at(time.Second)) }},
		{"KeepClaims", func() error {
			return e.s.KeepClaims(ctx, []agent.KeptClaim{{ThreadID: th.ID, Fence: run.Fence()}}, at(time.Second))[0].Err
		}},
		{"RequestCancel", func() error { _, err := e.s.RequestCancel(ctx, th.ID, "", at(time.Second)); return err }},
		{"FinishRun", func() error { return e.s.FinishRun(ctx, done) }},
		{"ReleaseClaim", func() error {
			return e.s.ReleaseClaim(ctx, agent.ReleaseRequest{ThreadID: th.ID, Fence: run.Fence(), Now: at(time.Second)})
		}},
		{"ListStaleClaims", func() error { _, err := e.s.ListStaleClaims(ctx, at(0), 0); return err }},
		{"GetRun", func() error { _, err := e.s.GetRun(ctx, th.ID, run.ID); return err }},
		{"ListRuns", func() error { _, err := e.s.ListRuns(ctx, th.ID); return err }},
		{"PutMessage", func() error {
			changed := agent.Message{ID: m.ID, Role: agent.RoleUser, Parts: textParts("changed")}
			return e.s.PutMessage(ctx, agent.MessageWrite{ThreadID: th.ID, Seq: run.FirstSeq, Message: changed,
				Fence: run.Fence(), Now: at(time.Second)})
		}},
		{"GetMessage", func() error { _, err := e.s.GetMessage(ctx, th.ID, m.ID); return err }},
		{"ListMessages", func() error { _, err := e.s.ListMessages(ctx, th.ID); return err }},
		{"DeleteMessage", func() error { return e.s.DeleteMessage(ctx, th.ID, m.ID, run.Fence()) }},
		{"AppendSegment", func() error { return e.s.AppendSegment(ctx, segment(th.ID, run.ID, 0, "data: x\n\n", false)) }},
		{"ListSegments", func() error { _, err := e.s.ListSegments(ctx, run.ID, 0, at(0)); return err }},
		{"PutValue", func() error { return e.s.PutValue(ctx, ns, "k2", []byte("v")) }},
		{"GetValue", func() error { _, err := e.s.GetValue(ctx, ns, "k"); return err }},
		{"ListValues", func() error { _, err := e.s.ListValues(ctx, ns); return err }},
		{"DeleteValue", func() error { return e.s.DeleteValue(ctx, ns, "k") }},
		{"CreateInterrupt", func() error {
			_, _, err := e.s.CreateInterrupt(ctx, interruptOf(th.ID, e.id("int"), at(0)))
			return err
		}},
		{"GetInterrupt", func() error { _, err := e.s.GetInterrupt(ctx, th.ID, in.MessageID, in.ID); return err }},
		{"ListInterrupts", func() error { _, err := e.s.ListInterrupts(ctx, th.ID); return err }},
		{"ResolveInterrupt", func() error {
			_, err := e.s.ResolveInterrupt(ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID,
				Status: agent.InterruptApproved, Now: at(time.Second)})
			return err
		}},
		{"ListExpiredInterrupts", func() error { _, err := e.s.ListExpiredInterrupts(ctx, at(0), 0); return err }},
		{"CreateJob", func() error { _, _, err := e.s.CreateJob(ctx, jobOf(th.ID, e.id("call"), at(0))); return err }},
		{"GetJob", func() error { _, err := e.s.GetJob(ctx, th.ID, job.ID); return err }},
		{"ListJobs", func() error { _, err := e.s.ListJobs(ctx, th.ID); return err }},
		{"SetJobActivity", func() error { return e.s.SetJobActivity(ctx, th.ID, job.ID, "changed", at(time.Second)) }},
		{"SetJobDue", func() error { return e.s.SetJobDue(ctx, th.ID, job.ID, at(time.Hour), at(time.Second)) }},
		{"FinishJob", func() error {
			_, _, err := e.s.FinishJob(ctx, resultOf(job, `{"changed":true}`, at(time.Second)))
			return err
		}},
		{"MarkJobDelivered", func() error { _, err := e.s.MarkJobDelivered(ctx, th.ID, job.ID, at(time.Second)); return err }},
		{"ListDueJobs", func() error { _, err := e.s.ListDueJobs(ctx, at(time.Hour), 0); return err }},
		{"Enqueue", func() error { _, _, err := e.s.Enqueue(ctx, queuedOf(th.ID, e.id("msg"), at(0)), 0); return err }},
		{"ListQueued", func() error { _, err := e.s.ListQueued(ctx, th.ID); return err }},
		{"TakeQueued", func() error { return e.s.TakeQueued(ctx, th.ID, queued.Message.ID, at(time.Second)) }},
		{"ListQueuedThreads", func() error { _, err := e.s.ListQueuedThreads(ctx, at(time.Hour), 0); return err }},
	}
	for _, c := range calls {
		wantErr(t, c.call(), agent.KindCanceled, agent.CodeCanceled, c.name+" with a canceled context")
	}
	same(t, "thread after canceled calls", readState(e, th.ID, run.ID), before)
	if _, err := e.s.GetThread(e.ctx, other); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("GetThread of the thread a canceled CreateThread named: %v, want not found", err)
	}
	got, err := e.s.ListValues(e.ctx, ns)
	must(t, err, "ListValues")
	if len(got) != 1 || got[0].Key != "k" || string(got[0].Value) != "kept" {
		t.Fatalf("values after canceled calls = %s, want only k=kept", show(got))
	}
	wantInterrupts(e, th.ID, in)
	wantJobs(e, th.ID, job)
	wantQueued(e, th.ID, queued)
}
