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

// queueStore is what queue cases need: a queue belongs to an existing thread, and the thread's delete takes it
// with it.
type queueStore interface {
	agent.ThreadStore
	agent.QueueStore
}

func queuePort(s agent.Store) queueStore { return s }

func queueTests() []test {
	type c = leaf[queueStore]
	return group(queuePort,
		c{"EnqueueAssignsSeq", testEnqueueAssignsSeq},
		c{"EnqueueConcurrentDistinctSeqs", testEnqueueConcurrentSeqs},
		c{"EnqueueRaceOneWinner", testEnqueueRace},
		c{"EnqueueInsertIfAbsent", testEnqueueInsertIfAbsent},
		c{"TakenEntryExpires", testTakenEntryExpires},
		c{"MessageByteForByte", testQueuedMessageBytes},
		c{"Bound", testQueueBound},
		c{"DefaultBound", testQueueDefaultBound},
		c{"EnqueueNeedsLiveThread", testEnqueueNeedsThread},
		c{"Take", testTakeQueued},
		c{"ListQueuedThreads", testListQueuedThreads},
		c{"ListQueuedThreadsDefaultLimit", testListQueuedThreadsDefaultLimit},
		c{"DeleteThreadRemovesQueue", testDeleteThreadRemovesQueue},
		c{"EnqueueIntoARecreatedThreadRefused", testEnqueueIntoARecreatedThread},
		c{"EnqueueRacingARecreate", testEnqueueRacingARecreate},
		c{"InvalidRefused", testQueueInvalid},
	)
}

type queues = env[queueStore]

// queuedOf is a user message queued (multitask enqueue) on threadID at created.
func queuedOf(threadID, messageID string, created time.Time) agent.QueuedMessage {
	return agent.QueuedMessage{
		ThreadID:  threadID,
		Kind:      agent.QueueUser,
		Message:   agent.Message{ID: messageID, Role: agent.RoleUser, Parts: textParts("and also " + messageID)},
		Owner:     "owner-of-" + threadID,
		Status:    agent.QueueQueued,
		CreatedAt: created,
	}
}

// steerOf is the steer of job jobID, waiting in threadID's queue since created.
func steerOf(threadID, jobID string, created time.Time) agent.QueuedMessage {
	return agent.QueuedMessage{
		ThreadID: threadID,
		Kind:     agent.QueueSteer,
		Message: agent.Message{ID: agent.SteerMessageID(jobID), Role: agent.RoleUser, Parts: []json.RawMessage{
			json.RawMessage(`{"type":"data-job-result","data":{"jobId":"` + jobID + `","summary":"done"}}`),
		}},
		JobID:     jobID,
		Status:    agent.QueueQueued,
		CreatedAt: created,
	}
}

// enqueue queues q (which must be new) under the default bound and checks that the store returns it as given,
// with its seq.
func enqueue[S agent.QueueStore](e *env[S], q agent.QueuedMessage) agent.QueuedMessage {
	e.t.Helper()
	got, created, err := e.s.Enqueue(e.ctx, q, 0)
	must(e.t, err, "Enqueue "+q.Message.ID)
	if !created {
		e.t.Fatalf("Enqueue(%s): created = false for a new id", q.Message.ID)
	}
	q.Seq = got.Seq
	sameQueued(e.t, "Enqueue "+q.Message.ID, got, q)
	return got
}

func take[S agent.QueueStore](e *env[S], threadID, messageID string, now time.Time) {
	e.t.Helper()
	must(e.t, e.s.TakeQueued(e.ctx, threadID, messageID, now), "TakeQueued "+messageID)
}

// takenAt is q as TakeQueued at now must leave it: its message's parts and metadata are dropped.
func takenAt(q agent.QueuedMessage, now time.Time) agent.QueuedMessage {
	q.Status, q.TakenAt, q.ExpiresAt = agent.QueueTaken, now, now.Add(agent.DefaultQueueKeep)
	q.Message.Parts, q.Message.Metadata = nil, nil
	return q
}

// sameQueued compares two entries: the message's parts and metadata byte for byte, the rest with
// reflect.DeepEqual.
func sameQueued(t *testing.T, what string, got, want agent.QueuedMessage) {
	t.Helper()
	if len(got.Message.Parts) != len(want.Message.Parts) {
		t.Fatalf("%s: %d parts, want %d", what, len(got.Message.Parts), len(want.Message.Parts))
	}
	for i := range want.Message.Parts {
		sameBytes(t, fmt.Sprintf("%s: part %d", what, i), got.Message.Parts[i], want.Message.Parts[i])
	}
	sameBytes(t, what+": metadata", got.Message.Metadata, want.Message.Metadata)
	got.Message.Parts, got.Message.Metadata, want.Message.Parts, want.Message.Metadata = nil, nil, nil, nil
	want.Epoch = 0 // written only
	same(t, what, got, want)
}

// wantQueued checks ListQueued of threadID against want, in order.
func wantQueued[S agent.QueueStore](e *env[S], threadID string, want ...agent.QueuedMessage) {
	e.t.Helper()
	got, err := e.s.ListQueued(e.ctx, threadID)
	must(e.t, err, "ListQueued")
	if len(got) != len(want) {
		ids := make([]string, len(got))
		for i, q := range got {
			ids[i] = q.Message.ID
		}
		e.t.Fatalf("ListQueued(%s) = %d entries %v, want %d", threadID, len(got), ids, len(want))
	}
	for i := range want {
		sameQueued(e.t, fmt.Sprintf("ListQueued(%s)[%d]", threadID, i), got[i], want[i])
	}
}

// Enqueue numbers entries in the order it accepts them, and ListQueued returns them in that order.
func testEnqueueAssignsSeq(e *queues) {
	t := e.t
	th := newThread(e)
	var list []agent.QueuedMessage
	for i, id := range []string{"m-c", "m-a", "m-b"} {
		q := queuedOf(th.ID, id, at(time.Duration(3-i)*time.Second)) // creation times do not order the queue
		q.Seq = 99 - int64(i)                                        // nor does a seq the caller passes
		got := enqueue(e, q)
		if len(list) > 0 && got.Seq <= list[len(list)-1].Seq {
			t.Fatalf("Enqueue(%s): seq %d after %d, want increasing", id, got.Seq, list[len(list)-1].Seq)
		}
		list = append(list, got)
	}
	steer := enqueue(e, steerOf(th.ID, agent.JobID(th.ID, "run_1", e.id("call")), at(0)))
	wantQueued(e, th.ID, append(list, steer)...)

	// Taking entries never hands their seqs out again: a later entry still comes after every earlier one.
	for _, q := range append(list, steer) {
		take(e, th.ID, q.Message.ID, at(time.Minute))
	}
	later := enqueue(e, queuedOf(th.ID, "m-later", at(time.Minute)))
	if later.Seq <= steer.Seq {
		t.Fatalf("Enqueue after the takes: seq %d, want above %d", later.Seq, steer.Seq)
	}
	wantQueued(e, th.ID, later)
}

// Concurrent senders each get their own seq: ten enqueues of distinct ids at once are ten entries with ten
// distinct seqs, listed in seq order.
func testEnqueueConcurrentSeqs(e *queues) {
	t := e.t
	const n = 10
	th := newThread(e)
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		got    [n]agent.QueuedMessage
		create [n]bool
		errs   [n]error
	)
	for i := range n {
		q := queuedOf(th.ID, fmt.Sprintf("%s-%d", e.id("msg"), i), at(time.Duration(i)*time.Millisecond))
		wg.Go(func() {
			<-start
			got[i], create[i], errs[i] = e.s.Enqueue(e.ctx, q, 0)
		})
	}
	close(start)
	wg.Wait()
	seqs := map[int64]string{}
	want := make([]agent.QueuedMessage, 0, n)
	for i := range n {
		must(t, errs[i], fmt.Sprintf("Enqueue %d", i))
		if !create[i] {
			t.Fatalf("Enqueue %d of a distinct id: created = false", i)
		}
		if other, dup := seqs[got[i].Seq]; dup {
			t.Fatalf("%s and %s got the same seq %d", other, got[i].Message.ID, got[i].Seq)
		}
		seqs[got[i].Seq] = got[i].Message.ID
		want = append(want, got[i])
	}
	sort.Slice(want, func(i, j int) bool { return want[i].Seq < want[j].Seq })
	wantQueued(e, th.ID, want...)
}

// Concurrent enqueues of one message id (a retried POST racing its first attempt, two wakes of one job): exactly
// one creates the entry, and every caller gets the winner's entry back.
func testEnqueueRace(e *queues) {
	t := e.t
	const n = 10
	for round := range 3 {
		th := newThread(e)
		id := e.id("msg")
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			got    [n]agent.QueuedMessage
			create [n]bool
			errs   [n]error
			tries  [n]agent.QueuedMessage
		)
		for i := range n {
			tries[i] = queuedOf(th.ID, id, at(time.Duration(i)*time.Second))
			tries[i].Message.Parts = textParts(fmt.Sprintf("attempt %d", i))
			wg.Go(func() {
				<-start
				got[i], create[i], errs[i] = e.s.Enqueue(e.ctx, tries[i], 0)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			must(t, errs[i], fmt.Sprintf("round %d: Enqueue %d", round, i))
			if create[i] {
				if winner >= 0 {
					t.Fatalf("round %d: enqueues %d and %d both created the entry", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no enqueue created the entry", round)
		}
		want := tries[winner]
		want.Seq = got[winner].Seq
		for i := range n {
			sameQueued(t, fmt.Sprintf("round %d: enqueue %d result", round, i), got[i], want)
		}
		wantQueued(e, th.ID, want)
	}
}

// Enqueueing a message id that is stored already converges on the stored entry whatever the retry carries:
// while it is queued, and after a turn took it (nothing is queued again). The same id on another thread is
// another entry.
func testEnqueueInsertIfAbsent(e *queues) {
	t := e.t
	th := newThread(e)
	q := enqueue(e, queuedOf(th.ID, e.id("msg"), at(time.Second)))
	wantUTC(t, "Enqueue", q.CreatedAt)

	again := queuedOf(th.ID, q.Message.ID, at(time.Hour))
	again.Kind, again.JobID, again.Owner = agent.QueueSteer, "job-x", "someone else"
	again.Message.Parts, again.Message.Metadata = textParts("different"), json.RawMessage(`{"x":1}`)
	got, created, err := e.s.Enqueue(e.ctx, again, 0)
	must(t, err, "Enqueue again")
	if created {
		t.Fatal("Enqueue of an existing id: created = true")
	}
	sameQueued(t, "Enqueue of an existing id returns the stored entry", got, q)
	wantQueued(e, th.ID, q)

	take(e, th.ID, q.Message.ID, at(time.Minute))
	wantQueued(e, th.ID)
	for _, retry := range []agent.QueuedMessage{q, again} {
		got, created, err = e.s.Enqueue(e.ctx, retry, 0)
		must(t, err, "Enqueue after take")
		if created {
			t.Fatal("Enqueue after take: created = true")
		}
		sameQueued(t, "Enqueue after take returns the taken entry", got, takenAt(q, at(time.Minute)))
		wantQueued(e, th.ID)
	}

	other := newThread(e)
	twin := queuedOf(other.ID, q.Message.ID, at(0))
	twin = enqueue(e, twin)
	wantQueued(e, other.ID, twin)
	wantQueued(e, th.ID)
}

// A taken entry is kept until its ExpiresAt (DefaultQueueKeep after the take); an enqueue after that finds it
// gone, whether or not the store has removed it yet, and queues the id afresh behind everything before it.
func testTakenEntryExpires(e *queues) {
	t := e.t
	th := newThread(e)
	q := enqueue(e, queuedOf(th.ID, e.id("msg"), at(0)))
	take(e, th.ID, q.Message.ID, at(time.Second))
	late := queuedOf(th.ID, q.Message.ID, at(time.Second+agent.DefaultQueueKeep-time.Millisecond))
	got, created, err := e.s.Enqueue(e.ctx, late, 0)
	must(t, err, "Enqueue just before the expiry")
	if created {
		t.Fatal("Enqueue just before the taken entry's expiry: created = true")
	}
	sameQueued(t, "Enqueue just before the expiry", got, takenAt(q, at(time.Second)))

	fresh := enqueue(e, queuedOf(th.ID, q.Message.ID, at(2*time.Second+agent.DefaultQueueKeep)))
	if fresh.Seq <= q.Seq {
		t.Fatalf("re-queued id got seq %d, want above the expired entry's %d", fresh.Seq, q.Seq)
	}
	wantQueued(e, th.ID, fresh)
}

// The queued message round-trips byte for byte (parts are raw JSON, like a message's), a steer's large data part
// included, through every read.
func testQueuedMessageBytes(e *queues) {
	t := e.t
	th := newThread(e)
	q := queuedOf(th.ID, e.id("msg"), at(0))
	q.Message.Parts = []json.RawMessage{
		json.RawMessage("{ \"type\" : \"text\",\n\t\"text\" : \"<b>&</b> \\u00e9 é \\ud83c\\udf89 🎉 \\\"q\\\" \\\\ \\/\"}"),
		json.RawMessage(`{"type":"file","mediaType":"image/png","url":"data:image/png;base64,iVBORw0KGgo=","n":1.0e0}`),
	}
	q.Message.Metadata = json.RawMessage(`{ "sent" : "2031-03-04T05:06:07Z" }`)
	q = enqueue(e, q)

	jobID := agent.JobID(th.ID, "run_1", e.id("call"))
	steer := steerOf(th.ID, jobID, at(time.Second))
	steer.Message.Parts = []json.RawMessage{mustJSON(map[string]any{"type": "data-job-result",
		"data": map[string]string{"jobId": jobID, "report": randomText(450 << 10)}})}
	steer = enqueue(e, steer)
	wantQueued(e, th.ID, q, steer)
	got, created, err := e.s.Enqueue(e.ctx, steerOf(th.ID, jobID, at(time.Minute)), 0)
	must(t, err, "Enqueue of the large steer again")
	if created {
		t.Fatal("Enqueue of the large steer again: created = true")
	}
	sameQueued(t, "Enqueue of the large steer again", got, steer)
	take(e, th.ID, steer.Message.ID, at(time.Minute))
	got, _, err = e.s.Enqueue(e.ctx, steerOf(th.ID, jobID, at(2*time.Minute)), 0)
	must(t, err, "Enqueue of the large steer after take")
	sameQueued(t, "Enqueue of the large steer after take", got, takenAt(steer, at(time.Minute)))
	wantQueued(e, th.ID, q)
}

// A thread holds at most max queued entries: one more is queue_full and changes nothing; a stored id is still
// answered (a retry converges, the bound does not apply to it); taken entries do not count.
func testQueueBound(e *queues) {
	t := e.t
	const max = 3
	th := newThread(e)
	var list []agent.QueuedMessage
	for i := range max {
		got, created, err := e.s.Enqueue(e.ctx, queuedOf(th.ID, fmt.Sprintf("%s-%d", th.ID, i), at(time.Duration(i)*time.Second)), max)
		must(t, err, "Enqueue under the bound")
		if !created {
			t.Fatal("Enqueue under the bound: created = false")
		}
		list = append(list, got)
	}
	over := queuedOf(th.ID, th.ID+"-over", at(time.Minute))
	_, _, err := e.s.Enqueue(e.ctx, over, max)
	wantErr(t, err, agent.KindConflict, agent.CodeQueueFull, "Enqueue over the bound")
	if !errors.Is(err, agent.ErrQueueFull) {
		t.Fatalf("Enqueue over the bound: %v does not match ErrQueueFull", err)
	}
	wantQueued(e, th.ID, list...)

	got, created, err := e.s.Enqueue(e.ctx, queuedOf(th.ID, list[1].Message.ID, at(time.Minute)), max)
	must(t, err, "Enqueue of a stored id on a full queue")
	if created {
		t.Fatal("Enqueue of a stored id on a full queue: created = true")
	}
	sameQueued(t, "Enqueue of a stored id on a full queue", got, list[1])

	// A taken entry frees its place, and the refused id was never stored: it is created now.
	take(e, th.ID, list[0].Message.ID, at(2*time.Minute))
	got, created, err = e.s.Enqueue(e.ctx, over, max)
	must(t, err, "Enqueue after a take")
	if !created {
		t.Fatal("Enqueue of the id refused before: created = false")
	}
	_, _, err = e.s.Enqueue(e.ctx, queuedOf(th.ID, th.ID+"-over2", at(time.Minute)), max)
	wantErr(t, err, agent.KindConflict, agent.CodeQueueFull, "Enqueue over the bound again")
	wantQueued(e, th.ID, list[1], list[2], got)
	// A larger bound on the next call lets it in.
	_, created, err = e.s.Enqueue(e.ctx, queuedOf(th.ID, th.ID+"-over2", at(time.Minute)), max+1)
	must(t, err, "Enqueue under a larger bound")
	if !created {
		t.Fatal("Enqueue under a larger bound: created = false")
	}
}

// max <= 0 means agent.DefaultMaxQueued.
func testQueueDefaultBound(e *queues) {
	t := e.t
	th := newThread(e)
	for i := range agent.DefaultMaxQueued {
		_, created, err := e.s.Enqueue(e.ctx, queuedOf(th.ID, fmt.Sprintf("%s-%02d", th.ID, i), at(0)), 0)
		must(t, err, fmt.Sprintf("Enqueue %d under the default bound", i))
		if !created {
			t.Fatalf("Enqueue %d: created = false", i)
		}
	}
	for _, max := range []int{0, -1} {
		_, _, err := e.s.Enqueue(e.ctx, queuedOf(th.ID, th.ID+"-over", at(0)), max)
		wantErr(t, err, agent.KindConflict, agent.CodeQueueFull, fmt.Sprintf("Enqueue over the default bound (max %d)", max))
	}
	got, err := e.s.ListQueued(e.ctx, th.ID)
	must(t, err, "ListQueued")
	if len(got) != agent.DefaultMaxQueued {
		t.Fatalf("ListQueued = %d entries, want %d", len(got), agent.DefaultMaxQueued)
	}
}

// A queue belongs to a thread that exists: an unknown thread, or one deleted, is not found, and nothing is left
// behind. (A thread half way through its delete, tombstoned, is refused too; each adapter tests that on its own.)
func testEnqueueNeedsThread(e *queues) {
	t := e.t
	base := at(-75 * 24 * time.Hour)
	unknown := e.id("th")
	_, _, err := e.s.Enqueue(e.ctx, queuedOf(unknown, e.id("msg"), base), 0)
	wantErr(t, err, agent.KindNotFound, "", "Enqueue(unknown thread)")
	wantQueued(e, unknown)

	th := newThread(e)
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	_, _, err = e.s.Enqueue(e.ctx, queuedOf(th.ID, e.id("msg"), base), 0)
	wantErr(t, err, agent.KindNotFound, "", "Enqueue(deleted thread)")
	wantQueued(e, th.ID)
	got, err := e.s.ListQueuedThreads(e.ctx, base.Add(time.Hour), 1000)
	must(t, err, "ListQueuedThreads")
	for _, id := range got {
		if id == unknown || id == th.ID {
			t.Fatalf("ListQueuedThreads lists %s, which refused its entry", id)
		}
	}
}

// TakeQueued moves an entry out of the queue once: ListQueued leaves it out, a second take changes nothing (not
// even the take time), and an unknown entry is not found.
func testTakeQueued(e *queues) {
	t := e.t
	th := newThread(e)
	a := enqueue(e, queuedOf(th.ID, e.id("msg"), at(0)))
	b := enqueue(e, queuedOf(th.ID, e.id("msg"), at(time.Second)))
	c := enqueue(e, steerOf(th.ID, agent.JobID(th.ID, "run_1", e.id("call")), at(2*time.Second)))
	take(e, th.ID, b.Message.ID, at(time.Minute))
	wantQueued(e, th.ID, a, c)
	take(e, th.ID, b.Message.ID, at(time.Hour))
	wantQueued(e, th.ID, a, c)
	got, created, err := e.s.Enqueue(e.ctx, b, 0)
	must(t, err, "Enqueue of the taken id")
	if created {
		t.Fatal("Enqueue of the taken id: created = true")
	}
	sameQueued(t, "the taken entry keeps its first take", got, takenAt(b, at(time.Minute)))
	wantUTC(t, "taken entry", got.TakenAt, got.ExpiresAt)
	take(e, th.ID, a.Message.ID, at(2*time.Minute))
	take(e, th.ID, c.Message.ID, at(2*time.Minute))
	wantQueued(e, th.ID)

	err = e.s.TakeQueued(e.ctx, th.ID, e.id("msg"), at(time.Minute))
	wantErr(t, err, agent.KindNotFound, "", "TakeQueued(unknown id)")
	err = e.s.TakeQueued(e.ctx, e.id("th"), a.Message.ID, at(time.Minute))
	wantErr(t, err, agent.KindNotFound, "", "TakeQueued(unknown thread)")
	other := newThread(e)
	err = e.s.TakeQueued(e.ctx, other.ID, a.Message.ID, at(time.Minute))
	wantErr(t, err, agent.KindNotFound, "", "TakeQueued(entry of another thread)")
}

// wantQueuedThreads checks which of threads ListQueuedThreads(before) names (each once, any order). Other threads
// (other cases share the store) are ignored.
func wantQueuedThreads[S agent.QueueStore](e *env[S], before time.Time, threads []string, want ...string) {
	e.t.Helper()
	got, err := e.s.ListQueuedThreads(e.ctx, before, 1000)
	must(e.t, err, "ListQueuedThreads")
	mine := map[string]bool{}
	for _, id := range threads {
		mine[id] = true
	}
	seen := map[string]bool{}
	var found []string
	for _, id := range got {
		if seen[id] {
			e.t.Fatalf("ListQueuedThreads(%s) names %s twice", before, id)
		}
		seen[id] = true
		if mine[id] {
			found = append(found, id)
		}
	}
	sort.Strings(found)
	want = append([]string(nil), want...)
	sort.Strings(want)
	same(e.t, fmt.Sprintf("ListQueuedThreads(%s) of these threads", before), found, want)
}

// ListQueuedThreads is the reaper's work list: the threads with an entry queued before the cutoff, each once; not
// threads whose entries are all taken, nor ones whose entries were queued at or after the cutoff. The times sit
// seventy days before every other case's, so a shared store holds few others in the window.
func testListQueuedThreads(e *queues) {
	t := e.t
	base := at(-70 * 24 * time.Hour)
	cutoff := base.Add(time.Hour)
	a, b, c, d := newThread(e), newThread(e), newThread(e), newThread(e)
	enqueue(e, queuedOf(a.ID, e.id("msg"), base))
	enqueue(e, queuedOf(a.ID, e.id("msg"), base.Add(time.Minute)))
	b1 := enqueue(e, queuedOf(b.ID, e.id("msg"), base.Add(2*time.Minute)))
	enqueue(e, steerOf(b.ID, agent.JobID(b.ID, "run_1", e.id("call")), base.Add(59*time.Minute)))
	c1 := enqueue(e, queuedOf(c.ID, e.id("msg"), base))
	c2 := enqueue(e, queuedOf(c.ID, e.id("msg"), base))
	take(e, c.ID, c1.Message.ID, base.Add(time.Second))
	take(e, c.ID, c2.Message.ID, base.Add(time.Second))
	enqueue(e, queuedOf(d.ID, e.id("msg"), cutoff))
	threads := []string{a.ID, b.ID, c.ID, d.ID}
	wantQueuedThreads(e, cutoff, threads, a.ID, b.ID)
	wantQueuedThreads(e, cutoff.Add(time.Millisecond), threads, a.ID, b.ID, d.ID)
	wantQueuedThreads(e, base, threads)

	for _, limit := range []int{1, 2} {
		got, err := e.s.ListQueuedThreads(e.ctx, cutoff, limit)
		must(t, err, "ListQueuedThreads(limit)")
		if len(got) != limit {
			t.Fatalf("ListQueuedThreads(limit %d) = %v, want %d threads", limit, got, limit)
		}
	}

	// b's older entry taken, its younger one still queues it.
	take(e, b.ID, b1.Message.ID, cutoff)
	wantQueuedThreads(e, cutoff, threads, a.ID, b.ID)
	wantQueuedThreads(e, base.Add(30*time.Minute), threads, a.ID)
}

// limit <= 0 means agent.DefaultListLimit. The entries were queued ninety days back, before any other case's, on
// more threads than the default (two entries each), so exactly the default comes back whatever else the store
// holds.
func testListQueuedThreadsDefaultLimit(e *queues) {
	t := e.t
	base := at(-90 * 24 * time.Hour)
	for i := range agent.DefaultListLimit + 1 {
		th := newThread(e)
		enqueue(e, queuedOf(th.ID, e.id("msg"), base.Add(time.Duration(i)*time.Millisecond)))
		enqueue(e, queuedOf(th.ID, e.id("msg"), base.Add(time.Duration(i)*time.Millisecond)))
	}
	for _, limit := range []int{0, -1} {
		got, err := e.s.ListQueuedThreads(e.ctx, base.Add(time.Second), limit)
		must(t, err, "ListQueuedThreads")
		if len(got) != agent.DefaultListLimit {
			t.Fatalf("ListQueuedThreads(limit %d) = %d threads, want %d", limit, len(got), agent.DefaultListLimit)
		}
	}
}

// A thread's delete takes its queue (queued, taken, large entries) with it, and nothing of a neighbour's; an id
// used again starts with an empty queue, and a message id taken before is queued afresh.
func testDeleteThreadRemovesQueue(e *queues) {
	t := e.t
	base := at(-80 * 24 * time.Hour)
	fill := func(th agent.Thread) []agent.QueuedMessage {
		plain := enqueue(e, queuedOf(th.ID, th.ID+"-plain", base))
		big := steerOf(th.ID, agent.JobID(th.ID, "run_1", "call-big"), base.Add(time.Second))
		big.Message.Parts = []json.RawMessage{mustJSON(map[string]any{"type": "data-job-result",
			"data": map[string]string{"report": randomText(450 << 10)}})}
		big = enqueue(e, big)
		done := enqueue(e, queuedOf(th.ID, th.ID+"-done", base.Add(2*time.Second)))
		take(e, th.ID, done.Message.ID, base.Add(time.Minute))
		return []agent.QueuedMessage{plain, big, done}
	}
	th, neighbour := newThread(e), newThread(e)
	gone := fill(th)
	kept := fill(neighbour)
	cutoff := base.Add(time.Hour)
	wantQueuedThreads(e, cutoff, []string{th.ID, neighbour.ID}, th.ID, neighbour.ID)

	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	wantQueued(e, th.ID)
	wantQueuedThreads(e, cutoff, []string{th.ID, neighbour.ID}, neighbour.ID)
	wantQueued(e, neighbour.ID, kept[0], kept[1])
	err := e.s.TakeQueued(e.ctx, th.ID, gone[0].Message.ID, at(0))
	wantErr(t, err, agent.KindNotFound, "", "TakeQueued after delete")

	createThread(e, th.Owner, th.ID, at(time.Hour))
	wantQueued(e, th.ID)
	fresh := enqueue(e, queuedOf(th.ID, gone[2].Message.ID, at(time.Hour)))
	wantQueued(e, th.ID, fresh)
}

// Bad input is refused with the catalog's code, the same in every store, and nothing is queued.
func testQueueInvalid(e *queues) {
	t := e.t
	th := newThread(e)
	cases := []struct {
		name string
		edit func(*agent.QueuedMessage)
		code string
	}{
		{"no thread id", func(q *agent.QueuedMessage) { q.ThreadID = "" }, agent.CodeInvalidThreadID},
		{"no message id", func(q *agent.QueuedMessage) { q.Message.ID = "" }, agent.CodeInvalidMessage},
		{"an assistant message", func(q *agent.QueuedMessage) { q.Message.Role = agent.RoleAssistant }, agent.CodeInvalidMessage},
		{"no role", func(q *agent.QueuedMessage) { q.Message.Role = "" }, agent.CodeInvalidMessage},
		{"unknown kind", func(q *agent.QueuedMessage) { q.Kind = "later" }, agent.CodeInvalidMessage},
		{"no kind", func(q *agent.QueuedMessage) { q.Kind = "" }, agent.CodeInvalidMessage},
		{"a steer naming no job", func(q *agent.QueuedMessage) { q.Kind = agent.QueueSteer }, agent.CodeInvalidJob},
		{"created taken", func(q *agent.QueuedMessage) { q.Status = agent.QueueTaken }, agent.CodeInvalidStatus},
		{"no status", func(q *agent.QueuedMessage) { q.Status = "" }, agent.CodeInvalidStatus},
		{"a part that is not JSON", func(q *agent.QueuedMessage) {
			q.Message.Parts = append(q.Message.Parts, json.RawMessage(`{"type":"text","text":`))
		}, agent.CodeInvalidMessage},
		{"metadata that is not JSON", func(q *agent.QueuedMessage) { q.Message.Metadata = json.RawMessage(`{"a"}`) }, agent.CodeInvalidMessage},
	}
	for _, tc := range cases {
		q := queuedOf(th.ID, e.id("msg"), at(0))
		tc.edit(&q)
		_, _, err := e.s.Enqueue(e.ctx, q, 0)
		wantErr(t, err, agent.KindInvalid, tc.code, tc.name+": Enqueue")
	}
	wantQueued(e, th.ID)
	got, err := e.s.ListQueuedThreads(e.ctx, at(time.Second), 1000)
	must(t, err, "ListQueuedThreads")
	for _, id := range got {
		if id == th.ID {
			t.Fatal("ListQueuedThreads names a thread whose every enqueue was refused")
		}
	}
}

// threadAtEpoch creates a thread whose runs reached epoch (CreateThread stores the epoch as given).
func threadAtEpoch[S agent.ThreadStore](e *env[S], owner, id string, epoch int64, now time.Time) agent.Thread {
	e.t.Helper()
	th, created, err := e.s.CreateThread(e.ctx, agent.Thread{ID: id, Owner: owner, Title: "title of " + id, Epoch: epoch,
		CreatedAt: now, UpdatedAt: now})
	must(e.t, err, "CreateThread "+id)
	if !created {
		e.t.Fatalf("CreateThread(%s): created = false for a free id", id)
	}
	return th
}

// Issue 16 item 2, the queue: an enqueue names the thread incarnation its enqueuer saw (a run's epoch). Named
// for a thread deleted since, or deleted and created again on its id, it is refused as not found and writes
// nothing: a job's steer or a queued message of the deleted thread never lands in the new one. An epoch the
// thread never reached is of no incarnation of it either. The new thread's own enqueues (its epoch, or none
// named) land, the deleted thread's entry's id included, as a new entry.
func testEnqueueIntoARecreatedThread(e *queues) {
	t := e.t
	th := threadAtEpoch(e, e.id("user"), e.id("th"), 3, at(0))
	seen := th.Epoch
	old := queuedOf(th.ID, e.id("msg"), at(0))
	old.Epoch = seen
	enqueue(e, old)
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")

	late := func(what string, q agent.QueuedMessage) {
		t.Helper()
		_, _, err := e.s.Enqueue(e.ctx, q, 0)
		wantErr(t, err, agent.KindNotFound, "", what)
	}
	between := queuedOf(th.ID, e.id("msg"), at(time.Minute))
	between.Epoch = seen
	late("Enqueue into the deleted thread", between)

	again := threadAtEpoch(e, th.Owner, th.ID, 1, at(time.Hour))
	steer := steerOf(th.ID, e.id("job"), at(2*time.Hour))
	steer.Epoch = seen
	late("Enqueue of the deleted thread's job's steer into the new thread", steer)
	user := queuedOf(th.ID, e.id("msg"), at(2*time.Hour))
	user.Epoch = seen
	late("Enqueue of a message the deleted thread's run refused into the new thread", user)
	oldID := old
	oldID.CreatedAt = at(2 * time.Hour)
	late("Enqueue of the deleted thread's entry again into the new thread", oldID)
	future := queuedOf(th.ID, e.id("msg"), at(2*time.Hour))
	future.Epoch = again.Epoch + 1
	late("Enqueue at an epoch the new thread never reached", future)
	wantQueued(e, th.ID)
	wantQueuedThreads(e, at(3*time.Hour), []string{th.ID})

	mine := queuedOf(th.ID, old.Message.ID, at(3*time.Hour))
	mine.Epoch = again.Epoch
	a := enqueue(e, mine)
	b := enqueue(e, queuedOf(th.ID, e.id("msg"), at(3*time.Hour)))
	wantQueued(e, th.ID, a, b)
}

// An enqueue of a thread's incarnation racing its delete and a new thread on the id lands before the delete
// (which removes it) or is refused: the new thread never lists, returns or takes it, whatever the interleaving.
// Every other round the enqueue starts once the new thread exists; the others run both at once.
func testEnqueueRacingARecreate(e *queues) {
	t := e.t
	const rounds = 8
	for round := range rounds {
		th := threadAtEpoch(e, e.id("user"), e.id("th"), 2, at(0))
		q := queuedOf(th.ID, e.id("msg"), at(time.Minute))
		q.Epoch = th.Epoch
		var (
			wg             sync.WaitGroup
			start, rebuilt = make(chan struct{}), make(chan struct{})
			again          agent.Thread
			enqErr         error
		)
		wg.Go(func() {
			<-start
			defer close(rebuilt)
			if err := e.s.DeleteThread(e.ctx, th.ID); err != nil {
				t.Errorf("round %d: DeleteThread: %v", round, err)
				return
			}
			var err error
			again, _, err = e.s.CreateThread(e.ctx, agent.Thread{ID: th.ID, Owner: th.Owner, Title: "again", Epoch: 1,
				CreatedAt: at(time.Hour), UpdatedAt: at(time.Hour)})
			if err != nil {
				t.Errorf("round %d: CreateThread: %v", round, err)
			}
		})
		wg.Go(func() {
			<-start
			if round%2 == 0 {
				<-rebuilt
			}
			_, _, enqErr = e.s.Enqueue(e.ctx, q, 0)
		})
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		if enqErr != nil && !agent.IsKind(enqErr, agent.KindNotFound) {
			t.Fatalf("round %d: Enqueue racing the re-create: %v, want nil or not found", round, enqErr)
		}
		if round%2 == 0 && enqErr == nil {
			t.Fatalf("round %d: Enqueue of the deleted thread's incarnation after the new thread was created: accepted", round)
		}
		wantQueued(e, th.ID)
		err := e.s.TakeQueued(e.ctx, th.ID, q.Message.ID, at(2*time.Hour))
		wantErr(t, err, agent.KindNotFound, "", fmt.Sprintf("round %d: TakeQueued of the deleted thread's entry in the new thread", round))
		mine := q
		mine.Epoch, mine.CreatedAt = again.Epoch, at(2*time.Hour)
		got, created, err := e.s.Enqueue(e.ctx, mine, 0)
		must(t, err, "Enqueue by the new thread")
		if !created || got.Status != agent.QueueQueued {
			t.Fatalf("round %d: Enqueue of the id by the new thread = %s (created %v), want a new entry", round, show(got), created)
		}
	}
}
