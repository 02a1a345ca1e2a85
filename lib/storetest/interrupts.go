package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// interruptStore is what interrupt cases need: an interrupt is created under an existing thread, and the thread's
// delete takes its interrupts with it.
type interruptStore interface {
	agent.ThreadStore
	agent.RunStore
	agent.InterruptStore
}

func interruptPort(s agent.Store) interruptStore { return s }

func interruptTests() []test {
	type c = leaf[interruptStore]
	return group(interruptPort,
		c{"CreateInsertIfAbsent", testCreateInterruptInsertIfAbsent},
		c{"CreateNeedsLiveThread", testCreateInterruptNeedsThread},
		c{"GetUnknown", testGetInterruptUnknown},
		c{"ListOrder", testListInterruptsOrder},
		c{"ListOneMessages", testListMessageInterrupts},
		c{"Resolve", testResolveInterrupt},
		c{"ResolveEveryStatus", testResolveInterruptStatuses},
		c{"ResolveOnce", testResolveInterruptOnce},
		c{"ResolveRaceOneWinner", testResolveInterruptRace},
		c{"RawJSONByteForByte", testInterruptRawJSON},
		c{"LargeInputAndResponse", testInterruptLarge},
		c{"ListExpired", testListExpiredInterrupts},
		c{"ListExpiredDefaultLimit", testListExpiredInterruptsDefaultLimit},
		c{"DeleteThreadRemovesInterrupts", testDeleteThreadRemovesInterrupts},
		c{"InvalidRefused", testInterruptInvalid},
		c{"ResolvedKeptForTheKeepAge", testResolvedInterruptKept},
	)
}

type interrupts = env[interruptStore]

// interruptOf is a pending approval on threadID created at created, expiring a day later (DefaultInterruptTTL).
func interruptOf(threadID, id string, created time.Time) agent.Interrupt {
	return agent.Interrupt{
		ID:         id,
		ThreadID:   threadID,
		RunID:      "run-of-" + id,
		Epoch:      3,
		MessageID:  "msg-of-" + id,
		Kind:       agent.InterruptApproval,
		ToolCallID: "call-of-" + id,
		ToolName:   "delete_note",
		Input:      json.RawMessage(`{"id":"note-1"}`),
		Signature:  "sig-of-" + id,
		Status:     agent.InterruptPending,
		CreatedAt:  created,
		ExpiresAt:  created.Add(agent.DefaultInterruptTTL),
	}
}

// createInterrupt creates in (which must be new) and checks that the store returns it as given.
func createInterrupt[S agent.InterruptStore](e *env[S], in agent.Interrupt) agent.Interrupt {
	e.t.Helper()
	got, created, err := e.s.CreateInterrupt(e.ctx, in)
	must(e.t, err, "CreateInterrupt "+in.ID)
	if !created {
		e.t.Fatalf("CreateInterrupt(%s): created = false for a new id", in.ID)
	}
	sameInterrupt(e.t, "CreateInterrupt "+in.ID, got, in)
	return got
}

func getInterrupt[S agent.InterruptStore](e *env[S], threadID, messageID, id string) agent.Interrupt {
	e.t.Helper()
	got, err := e.s.GetInterrupt(e.ctx, threadID, messageID, id)
	must(e.t, err, "GetInterrupt "+id)
	return got
}

// resolved is in as ResolveInterrupt with req must leave it.
func resolved(in agent.Interrupt, req agent.ResolveRequest) agent.Interrupt {
	in.Status, in.Response, in.ResolvedAt = req.Status, req.Response, req.Now
	return in
}

// sameInterrupt compares two interrupts: Input and Response byte for byte (nil and empty are one answer), the rest
// with reflect.DeepEqual (times UTC, millisecond precision).
func sameInterrupt(t *testing.T, what string, got, want agent.Interrupt) {
	t.Helper()
	sameBytes(t, what+": input", got.Input, want.Input)
	sameBytes(t, what+": response", got.Response, want.Response)
	got.Input, got.Response, want.Input, want.Response = nil, nil, nil, nil
	same(t, what, got, want)
}

// wantInterrupts checks ListInterrupts of threadID against want, in order.
func wantInterrupts[S agent.InterruptStore](e *env[S], threadID string, want ...agent.Interrupt) {
	e.t.Helper()
	got, err := e.s.ListInterrupts(e.ctx, threadID)
	must(e.t, err, "ListInterrupts")
	if len(got) != len(want) {
		ids := make([]string, len(got))
		for i, in := range got {
			ids[i] = in.ID
		}
		e.t.Fatalf("ListInterrupts(%s) = %d interrupts %v, want %d", threadID, len(got), ids, len(want))
	}
	for i := range want {
		sameInterrupt(e.t, fmt.Sprintf("ListInterrupts(%s)[%d]", threadID, i), got[i], want[i])
	}
}

// A retried insert (a lost answer, a replayed step) converges on the first record whatever the retry carries; the
// same id under another thread is another interrupt.
func testCreateInterruptInsertIfAbsent(e *interrupts) {
	t := e.t
	th := newThread(e)
	in := interruptOf(th.ID, e.id("int"), at(time.Second))
	createInterrupt(e, in)
	stored := getInterrupt(e, th.ID, in.MessageID, in.ID)
	sameInterrupt(t, "GetInterrupt after create", stored, in)
	wantUTC(t, "GetInterrupt", stored.CreatedAt, stored.ExpiresAt)

	again := in
	again.RunID, again.Epoch = "another-run", 9 // the same message: an id is the thread's, derived from run and call
	again.Kind, again.ToolCallID, again.ToolName = agent.InterruptClientTool, "another-call", "ask_user_question"
	again.Input, again.Signature = json.RawMessage(`{"question":"sure?"}`), "another-signature"
	again.CreatedAt, again.ExpiresAt = at(time.Hour), at(48*time.Hour)
	got, created, err := e.s.CreateInterrupt(e.ctx, again)
	must(t, err, "CreateInterrupt again")
	if created {
		t.Fatal("CreateInterrupt of an existing id: created = true")
	}
	sameInterrupt(t, "CreateInterrupt of an existing id returns the stored one", got, in)
	sameInterrupt(t, "GetInterrupt after the second create", getInterrupt(e, th.ID, in.MessageID, in.ID), in)

	// A resolved interrupt is not reset to pending by a late retry of its create either.
	req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptApproved,
		Response: json.RawMessage(`{"approved":true}`), Now: at(time.Minute)}
	_, err = e.s.ResolveInterrupt(e.ctx, req)
	must(t, err, "ResolveInterrupt")
	got, created, err = e.s.CreateInterrupt(e.ctx, in)
	must(t, err, "CreateInterrupt after resolve")
	if created {
		t.Fatal("CreateInterrupt after resolve: created = true")
	}
	sameInterrupt(t, "CreateInterrupt after resolve returns the resolved one", got, resolved(in, req))

	// The same id on another thread is independent of the first.
	other := newThread(e)
	twin := again
	twin.ThreadID, twin.MessageID = other.ID, "another-message"
	createInterrupt(e, twin)
	sameInterrupt(t, "GetInterrupt(other thread)", getInterrupt(e, other.ID, twin.MessageID, in.ID), twin)
	sameInterrupt(t, "GetInterrupt(first thread)", getInterrupt(e, th.ID, in.MessageID, in.ID), resolved(in, req))
	wantInterrupts(e, th.ID, resolved(in, req))
	wantInterrupts(e, other.ID, twin)
}

// An interrupt belongs to a thread that exists: an unknown thread, or one deleted, is not found, and nothing is
// left behind. (A thread half way through its delete, tombstoned, is refused too; the suite cannot produce one, so
// each adapter tests that on its own.)
func testCreateInterruptNeedsThread(e *interrupts) {
	t := e.t
	unknown := e.id("th")
	in := interruptOf(unknown, e.id("int"), at(0))
	_, _, err := e.s.CreateInterrupt(e.ctx, in)
	wantErr(t, err, agent.KindNotFound, "", "CreateInterrupt(unknown thread)")
	_, err = e.s.GetInterrupt(e.ctx, unknown, in.MessageID, in.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt after a refused create")
	wantInterrupts(e, unknown)

	th := newThread(e)
	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	in = interruptOf(th.ID, e.id("int"), at(0))
	_, _, err = e.s.CreateInterrupt(e.ctx, in)
	wantErr(t, err, agent.KindNotFound, "", "CreateInterrupt(deleted thread)")
	wantInterrupts(e, th.ID)
	got, err := e.s.ListExpiredInterrupts(e.ctx, in.ExpiresAt.Add(time.Hour), 1000)
	must(t, err, "ListExpiredInterrupts")
	for _, x := range got {
		if x.ThreadID == unknown || x.ThreadID == th.ID {
			t.Fatalf("ListExpiredInterrupts lists %s of a thread that refused it", x.ID)
		}
	}
}

func testGetInterruptUnknown(e *interrupts) {
	t := e.t
	_, err := e.s.GetInterrupt(e.ctx, e.id("th"), e.id("msg"), e.id("int"))
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt(unknown thread)")
	if !errors.Is(err, agent.ErrInterruptNotFound) {
		t.Fatalf("GetInterrupt(unknown thread): %v does not match ErrInterruptNotFound", err)
	}
	th := newThread(e)
	in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))
	_, err = e.s.GetInterrupt(e.ctx, th.ID, in.MessageID, e.id("int"))
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt(unknown id)")
	// An interrupt is found only under its own thread.
	other := newThread(e)
	_, err = e.s.GetInterrupt(e.ctx, other.ID, in.MessageID, in.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt(interrupt of another thread)")
	// And only under the message that asked it.
	_, err = e.s.GetInterrupt(e.ctx, th.ID, e.id("msg"), in.ID)
	wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt(interrupt of another message)")
	_, err = e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: e.id("msg"), ID: in.ID,
		Status: agent.InterruptApproved, Now: at(time.Minute)})
	wantErr(t, err, agent.KindNotFound, "", "ResolveInterrupt(interrupt of another message)")
	wantInterrupts(e, th.ID, in)
	wantInterrupts(e, other.ID)
	wantInterrupts(e, e.id("th"))
}

// ListInterrupts returns every interrupt of the thread, whatever its status, oldest first and ties by id, and
// nothing of another thread.
func testListInterruptsOrder(e *interrupts) {
	th := newThread(e)
	base := e.id("int")
	created := map[string]time.Duration{"c": time.Second, "a": 3 * time.Second, "b": 3 * time.Second, "e": 0, "d": 2 * time.Second}
	stored := map[string]agent.Interrupt{}
	for _, k := range []string{"c", "a", "b", "e", "d"} {
		stored[k] = createInterrupt(e, interruptOf(th.ID, base+"-"+k, at(created[k])))
	}
	// Statuses do not matter to the list.
	for k, st := range map[string]agent.InterruptStatus{"a": agent.InterruptDenied, "e": agent.InterruptExpired} {
		req := agent.ResolveRequest{ThreadID: th.ID, MessageID: stored[k].MessageID, ID: stored[k].ID, Status: st, Now: at(time.Minute)}
		got, err := e.s.ResolveInterrupt(e.ctx, req)
		must(e.t, err, "ResolveInterrupt")
		stored[k] = got
	}
	other := newThread(e)
	createInterrupt(e, interruptOf(other.ID, base+"-z", at(-time.Hour)))
	for range 2 { // twice: ties come back in the same order every time
		wantInterrupts(e, th.ID, stored["e"], stored["c"], stored["d"], stored["a"], stored["b"])
	}
}

// ListMessageInterrupts returns the interrupts one message asked, every status, oldest first and ties by id, and
// nothing another message (or the same message id in another thread) asked. It reads that message's only: the
// thread's other interrupts, however many and however large, cost it no request and no read unit (REVIEW S7: a
// reviewTools thread with thousands of answered approvals read them all per answer).
func testListMessageInterrupts(e *interrupts) {
	t := e.t
	th := newThread(e)
	msg, base := e.id("msg"), e.id("int")
	ask := func(threadID, messageID, id string, created time.Duration) agent.Interrupt {
		in := interruptOf(threadID, id, at(created))
		in.MessageID = messageID
		return createInterrupt(e, in)
	}
	mine := []agent.Interrupt{ask(th.ID, msg, base+"-b", time.Second), ask(th.ID, msg, base+"-a", time.Second),
		ask(th.ID, msg, base+"-c", 0)}
	got, err := e.s.ResolveInterrupt(e.ctx, mine[1].Resolve(agent.InterruptDenied, at(time.Minute)))
	must(t, err, "ResolveInterrupt")
	mine[1] = got
	want := []agent.Interrupt{mine[2], mine[1], mine[0]}
	// Neighbours whose keys a careless prefix read would meet: a message whose id extends this one's, the same
	// message id in another thread.
	ask(th.ID, msg+"#x", e.id("int"), 0)
	ask(th.ID, msg+"x", e.id("int"), 0)
	other := newThread(e)
	ask(other.ID, msg, e.id("int"), 0)

	list := func(what string) agent.StoreUsage {
		t.Helper()
		m := new(agent.StoreMeter)
		got, err := e.s.ListMessageInterrupts(agent.WithStoreMeter(e.ctx, m), th.ID, msg)
		must(t, err, "ListMessageInterrupts "+what)
		if len(got) != len(want) {
			t.Fatalf("ListMessageInterrupts %s = %d interrupts, want %d", what, len(got), len(want))
		}
		for i := range want {
			sameInterrupt(t, fmt.Sprintf("ListMessageInterrupts %s [%d]", what, i), got[i], want[i])
		}
		return m.Snapshot()
	}
	before := list("alone")
	// Another message of the thread asks (and is answered) many times, with inputs of a few KB each.
	input := json.RawMessage(`{"note":"` + strings.Repeat("x", 4000) + `"}`)
	for i := range 30 {
		in := interruptOf(th.ID, fmt.Sprintf("%s-old-%02d", base, i), at(-time.Hour))
		in.MessageID, in.Input = e.id("msg"), input
		createInterrupt(e, in)
		_, err := e.s.ResolveInterrupt(e.ctx, in.Resolve(agent.InterruptApproved, at(-time.Minute)))
		must(t, err, "ResolveInterrupt (another message's)")
	}
	after := list("beside 30 answered interrupts of other messages")
	if after.Requests != before.Requests || after.ReadUnits != before.ReadUnits {
		t.Fatalf("ListMessageInterrupts read %d requests, %.1f read units beside 30 other interrupts, %d and %.1f alone: "+
			"it reads other messages' interrupts", after.Requests, after.ReadUnits, before.Requests, before.ReadUnits)
	}
	for _, tc := range []struct{ what, threadID, messageID string }{
		{"unknown message", th.ID, e.id("msg")},
		{"unknown thread", e.id("th"), msg},
	} {
		got, err := e.s.ListMessageInterrupts(e.ctx, tc.threadID, tc.messageID)
		must(t, err, "ListMessageInterrupts "+tc.what)
		if len(got) != 0 {
			t.Fatalf("ListMessageInterrupts(%s) = %d interrupts, want none", tc.what, len(got))
		}
	}
}

// Resolving answers a pending interrupt once: the stored interrupt takes the status, the response and the time.
func testResolveInterrupt(e *interrupts) {
	t := e.t
	th := newThread(e)
	in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))
	req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptApproved,
		Response: json.RawMessage(`{"approved":true,"reason":"go ahead"}`), Now: at(time.Minute)}
	got, err := e.s.ResolveInterrupt(e.ctx, req)
	must(t, err, "ResolveInterrupt")
	want := resolved(in, req)
	sameInterrupt(t, "ResolveInterrupt result", got, want)
	wantUTC(t, "ResolveInterrupt result", got.ResolvedAt)
	sameInterrupt(t, "GetInterrupt after resolve", getInterrupt(e, th.ID, in.MessageID, in.ID), want)
	wantInterrupts(e, th.ID, want)

	_, err = e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: e.id("int"),
		Status: agent.InterruptApproved, Now: at(time.Minute)})
	wantErr(t, err, agent.KindNotFound, "", "ResolveInterrupt(unknown id)")
	_, err = e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: e.id("th"), MessageID: in.MessageID, ID: in.ID,
		Status: agent.InterruptApproved, Now: at(time.Minute)})
	wantErr(t, err, agent.KindNotFound, "", "ResolveInterrupt(unknown thread)")
	wantInterrupts(e, th.ID, want)
}

// Every status but pending is a resolution, and a resolution may carry no response (an expiry, a cancel).
func testResolveInterruptStatuses(e *interrupts) {
	th := newThread(e)
	cases := []struct {
		status   agent.InterruptStatus
		response string
	}{
		{agent.InterruptApproved, `{"approved":true}`},
		{agent.InterruptDenied, `{"approved":false,"reason":"no"}`},
		{agent.InterruptAnswered, `{"output":{"answer":"blue"}}`},
		{agent.InterruptAnswered, `{"errorText":"the user closed the dialog"}`},
		{agent.InterruptExpired, ``},
		{agent.InterruptCanceled, ``},
	}
	var want []agent.Interrupt
	for i, tc := range cases {
		in := interruptOf(th.ID, fmt.Sprintf("%s-%d", th.ID, i), at(time.Duration(i)*time.Second))
		if tc.status == agent.InterruptAnswered {
			in.Kind, in.ToolName = agent.InterruptClientTool, "ask_user_question"
		}
		createInterrupt(e, in)
		req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: tc.status, Now: at(time.Hour)}
		if tc.response != "" {
			req.Response = json.RawMessage(tc.response)
		}
		got, err := e.s.ResolveInterrupt(e.ctx, req)
		must(e.t, err, "ResolveInterrupt "+string(tc.status))
		sameInterrupt(e.t, "ResolveInterrupt "+string(tc.status), got, resolved(in, req))
		want = append(want, resolved(in, req))
	}
	wantInterrupts(e, th.ID, want...)
}

// A resolved interrupt stays resolved: a second answer, identical or not, changes nothing and returns the stored
// interrupt with already_resolved, so the caller can tell its own repeat (or a retry whose answer was lost) from a
// conflicting answer. Pending is not a resolution.
func testResolveInterruptOnce(e *interrupts) {
	t := e.t
	th := newThread(e)
	in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))

	for _, st := range []agent.InterruptStatus{agent.InterruptPending, "", "maybe"} {
		req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: st, Response: json.RawMessage(`{}`), Now: at(time.Minute)}
		_, err := e.s.ResolveInterrupt(e.ctx, req)
		wantErr(t, err, agent.KindInvalid, agent.CodeInvalidStatus, fmt.Sprintf("ResolveInterrupt(status %q)", st))
	}
	sameInterrupt(t, "GetInterrupt after refused resolves", getInterrupt(e, th.ID, in.MessageID, in.ID), in)

	first := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptDenied,
		Response: json.RawMessage(`{"approved":false,"reason":"not now"}`), Now: at(time.Minute)}
	_, err := e.s.ResolveInterrupt(e.ctx, first)
	must(t, err, "ResolveInterrupt")
	want := resolved(in, first)

	approve := first
	approve.Status, approve.Response, approve.Now = agent.InterruptApproved, json.RawMessage(`{"approved":true}`), at(2*time.Minute)
	expire := first
	expire.Status, expire.Response, expire.Now = agent.InterruptExpired, nil, at(48*time.Hour)
	for name, req := range map[string]agent.ResolveRequest{"identical": first, "conflicting": approve, "expiry": expire} {
		got, err := e.s.ResolveInterrupt(e.ctx, req)
		wantErr(t, err, agent.KindConflict, agent.CodeAlreadyResolved, name+" second resolve")
		if !errors.Is(err, agent.ErrAlreadyResolved) {
			t.Fatalf("%s second resolve: %v does not match ErrAlreadyResolved", name, err)
		}
		sameInterrupt(t, name+" second resolve returns the stored interrupt", got, want)
	}
	sameInterrupt(t, "GetInterrupt after the second resolves", getInterrupt(e, th.ID, in.MessageID, in.ID), want)
}

// Concurrent answers race the compare-and-set (two tabs, a double click, the reaper's expiry): exactly one wins,
// and every loser is told already_resolved with the winner's interrupt.
func testResolveInterruptRace(e *interrupts) {
	t := e.t
	const n = 10
	statuses := []agent.InterruptStatus{agent.InterruptApproved, agent.InterruptDenied, agent.InterruptExpired,
		agent.InterruptCanceled, agent.InterruptAnswered}
	for round := range 3 {
		th := newThread(e)
		in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			results [n]agent.Interrupt
			errs    [n]error
			reqs    [n]agent.ResolveRequest
		)
		for i := range n {
			reqs[i] = agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: statuses[i%len(statuses)],
				Response: json.RawMessage(fmt.Sprintf(`{"by":%d}`, i)), Now: at(time.Duration(i+1) * time.Second)}
			wg.Go(func() {
				<-start
				results[i], errs[i] = e.s.ResolveInterrupt(e.ctx, reqs[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				if winner >= 0 {
					t.Fatalf("round %d: resolves %d and %d both won", round, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no resolve won: %v", round, errs)
		}
		want := resolved(in, reqs[winner])
		for i, err := range errs {
			what := fmt.Sprintf("round %d: resolve %d", round, i)
			if i != winner {
				wantErr(t, err, agent.KindConflict, agent.CodeAlreadyResolved, what)
			}
			sameInterrupt(t, what+" result", results[i], want)
		}
		sameInterrupt(t, fmt.Sprintf("round %d: GetInterrupt", round), getInterrupt(e, th.ID, in.MessageID, in.ID), want)
	}
}

// Input and Response are JSON kept byte for byte: whitespace, key order, number spelling and escapes inside the
// value (the signature covers the input, so a store that re-encoded it would break every verification).
func testInterruptRawJSON(e *interrupts) {
	th := newThread(e)
	in := interruptOf(th.ID, e.id("int"), at(0))
	in.Input = json.RawMessage("{ \"z\" : 1,\n\t\"a\" : [1.0, 2e3, -0.0, 1E-7, 10000000000000000000001], " +
		`"html": "<b>&</b> \u00e9 é \ud83c\udf89 🎉 \"q\" \\ \/", "nil": null}`)
	createInterrupt(e, in)
	sameInterrupt(e.t, "GetInterrupt", getInterrupt(e, th.ID, in.MessageID, in.ID), in)

	req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptAnswered,
		Response: json.RawMessage("{\"output\" :\n {\"b\":2, \"a\":[true,false,null], \"s\":\"\\u0000\\n\"}}"), Now: at(time.Second)}
	got, err := e.s.ResolveInterrupt(e.ctx, req)
	must(e.t, err, "ResolveInterrupt")
	sameInterrupt(e.t, "ResolveInterrupt result", got, resolved(in, req))
	wantInterrupts(e, th.ID, resolved(in, req))

	// A tool with no arguments: an empty object, and no input at all.
	for i, input := range []json.RawMessage{json.RawMessage(`{}`), nil} {
		x := interruptOf(th.ID, fmt.Sprintf("%s-%d", in.ID, i), at(time.Duration(i+1)*time.Second))
		x.Input = input
		createInterrupt(e, x)
		sameInterrupt(e.t, "GetInterrupt", getInterrupt(e, th.ID, x.MessageID, x.ID), x)
	}
}

// A client tool's input or output can be large (a pasted document): half a megabyte of input and more of response
// round-trip, through every read.
func testInterruptLarge(e *interrupts) {
	t := e.t
	th := newThread(e)
	in := interruptOf(th.ID, e.id("int"), at(0))
	in.Kind, in.ToolName = agent.InterruptClientTool, "review_document"
	in.Input = mustJSON(map[string]string{"document": randomText(500 << 10)})
	in.ExpiresAt = at(-45 * 24 * time.Hour) // expired long ago, so ListExpiredInterrupts returns it too
	createInterrupt(e, in)
	sameInterrupt(t, "GetInterrupt(large)", getInterrupt(e, th.ID, in.MessageID, in.ID), in)
	small := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(time.Second)))
	wantInterrupts(e, th.ID, in, small)
	wantExpired(e, at(-45*24*time.Hour+time.Second), []string{th.ID}, in)

	req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptAnswered,
		Response: mustJSON(map[string]any{"output": map[string]string{"edited": randomText(700 << 10)}}), Now: at(time.Minute)}
	got, err := e.s.ResolveInterrupt(e.ctx, req)
	must(t, err, "ResolveInterrupt(large)")
	want := resolved(in, req)
	sameInterrupt(t, "ResolveInterrupt(large) result", got, want)
	sameInterrupt(t, "GetInterrupt(large) after resolve", getInterrupt(e, th.ID, in.MessageID, in.ID), want)
	wantInterrupts(e, th.ID, want, small)
	got, err = e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptDenied,
		Response: json.RawMessage(`{"approved":false}`), Now: at(2 * time.Minute)})
	wantErr(t, err, agent.KindConflict, agent.CodeAlreadyResolved, "second resolve of the large one")
	sameInterrupt(t, "second resolve of the large one returns the stored interrupt", got, want)
	wantExpired(e, at(-45*24*time.Hour+time.Second), []string{th.ID})
}

// wantExpired checks which interrupts of threads ListExpiredInterrupts(before) returns (any order), and that each
// comes back whole. Interrupts of other threads (other cases share the store) are ignored.
func wantExpired[S agent.InterruptStore](e *env[S], before time.Time, threads []string, want ...agent.Interrupt) {
	e.t.Helper()
	got, err := e.s.ListExpiredInterrupts(e.ctx, before, 1000)
	must(e.t, err, "ListExpiredInterrupts")
	mine := map[string]bool{}
	for _, id := range threads {
		mine[id] = true
	}
	var found []agent.Interrupt
	for _, in := range got {
		if in.Status != agent.InterruptPending || !in.ExpiresAt.Before(before) {
			e.t.Fatalf("ListExpiredInterrupts(%s) returned %s (%s, expires %s)", before, in.ID, in.Status, in.ExpiresAt)
		}
		if mine[in.ThreadID] {
			found = append(found, in)
		}
	}
	key := func(in agent.Interrupt) string { return in.ThreadID + "\x00" + in.ID }
	sort.Slice(found, func(i, j int) bool { return key(found[i]) < key(found[j]) })
	want = append([]agent.Interrupt(nil), want...)
	sort.Slice(want, func(i, j int) bool { return key(want[i]) < key(want[j]) })
	if len(found) != len(want) {
		ids := make([]string, len(found))
		for i, in := range found {
			ids[i] = in.ID
		}
		e.t.Fatalf("ListExpiredInterrupts(%s) lists %d of these threads' interrupts %v, want %d", before, len(found), ids, len(want))
	}
	for i := range want {
		sameInterrupt(e.t, "ListExpiredInterrupts entry "+want[i].ID, found[i], want[i])
	}
}

// ListExpiredInterrupts is the reaper's work list: the pending interrupts whose expiry is before the cutoff, across
// threads; not resolved ones, not ones expiring at or after the cutoff. The times sit forty days before every
// other case's (except the default-limit case, older still), so a shared store holds few others in the window.
func testListExpiredInterrupts(e *interrupts) {
	t := e.t
	base := at(-40 * 24 * time.Hour)
	cutoff := base.Add(time.Hour)
	a, b := newThread(e), newThread(e)
	mk := func(th agent.Thread, expires time.Duration) agent.Interrupt {
		in := interruptOf(th.ID, e.id("int"), base.Add(-time.Hour))
		in.ExpiresAt = base.Add(expires)
		return createInterrupt(e, in)
	}
	a1 := mk(a, 0)
	a2 := mk(a, 59*time.Minute)
	b1 := mk(b, time.Minute)
	atCutoff := mk(b, time.Hour)   // not before the cutoff
	future := mk(a, 2*time.Hour)   // not yet
	answered := mk(b, time.Second) // resolved below
	_, err := e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: b.ID, MessageID: answered.MessageID, ID: answered.ID,
		Status: agent.InterruptApproved, Response: json.RawMessage(`{"approved":true}`), Now: base})
	must(t, err, "ResolveInterrupt")
	threads := []string{a.ID, b.ID}
	wantExpired(e, cutoff, threads, a1, a2, b1)
	wantExpired(e, base.Add(3*time.Hour), threads, a1, a2, b1, atCutoff, future)
	wantExpired(e, base, threads)

	for _, limit := range []int{1, 2} {
		got, err := e.s.ListExpiredInterrupts(e.ctx, cutoff, limit)
		must(t, err, "ListExpiredInterrupts(limit)")
		if len(got) != limit {
			t.Fatalf("ListExpiredInterrupts(limit %d) = %d interrupts, want %d", limit, len(got), limit)
		}
	}

	// Once resolved (by the reaper, or an answer just in time) an interrupt is off the list.
	_, err = e.s.ResolveInterrupt(e.ctx, agent.ResolveRequest{ThreadID: a.ID, MessageID: a1.MessageID, ID: a1.ID, Status: agent.InterruptExpired, Now: cutoff})
	must(t, err, "ResolveInterrupt(expired)")
	wantExpired(e, cutoff, threads, a2, b1)
}

// limit <= 0 means agent.DefaultListLimit. The interrupts expired sixty days back, before any other case's, and
// there are more of them than the default, so exactly the default comes back whatever else the store holds.
func testListExpiredInterruptsDefaultLimit(e *interrupts) {
	t := e.t
	base := at(-60 * 24 * time.Hour)
	ths := []agent.Thread{newThread(e), newThread(e), newThread(e)}
	for i := range agent.DefaultListLimit + 1 {
		in := interruptOf(ths[i%len(ths)].ID, fmt.Sprintf("%s-%03d", e.id("int"), i), base.Add(-time.Hour))
		in.ExpiresAt = base.Add(time.Duration(i) * time.Millisecond)
		createInterrupt(e, in)
	}
	for _, limit := range []int{0, -1} {
		got, err := e.s.ListExpiredInterrupts(e.ctx, base.Add(time.Second), limit)
		must(t, err, "ListExpiredInterrupts")
		if len(got) != agent.DefaultListLimit {
			t.Fatalf("ListExpiredInterrupts(limit %d) = %d interrupts, want %d", limit, len(got), agent.DefaultListLimit)
		}
	}
}

// A thread's delete takes its interrupts (pending, resolved, large) with it, and nothing of a neighbour's; an id
// used again starts with none.
func testDeleteThreadRemovesInterrupts(e *interrupts) {
	t := e.t
	base := at(-50 * 24 * time.Hour)
	fill := func(th agent.Thread) []agent.Interrupt {
		pending := interruptOf(th.ID, th.ID+"-pending", base)
		pending.ExpiresAt = base.Add(time.Minute)
		big := interruptOf(th.ID, th.ID+"-big", base.Add(time.Second))
		big.Input = mustJSON(map[string]string{"document": randomText(450 << 10)})
		big.ExpiresAt = base.Add(time.Minute)
		done := interruptOf(th.ID, th.ID+"-done", base.Add(2*time.Second))
		out := []agent.Interrupt{createInterrupt(e, pending), createInterrupt(e, big), createInterrupt(e, done)}
		req := agent.ResolveRequest{ThreadID: th.ID, MessageID: done.MessageID, ID: done.ID, Status: agent.InterruptAnswered,
			Response: mustJSON(map[string]string{"output": randomText(420 << 10)}), Now: base.Add(time.Minute)}
		got, err := e.s.ResolveInterrupt(e.ctx, req)
		must(t, err, "ResolveInterrupt")
		out[2] = got
		return out
	}
	th, neighbour := newThread(e), newThread(e)
	gone := fill(th)
	kept := fill(neighbour)
	cutoff := base.Add(time.Hour)
	wantExpired(e, cutoff, []string{th.ID, neighbour.ID}, gone[0], gone[1], kept[0], kept[1])

	must(t, e.s.DeleteThread(e.ctx, th.ID), "DeleteThread")
	for _, in := range gone {
		_, err := e.s.GetInterrupt(e.ctx, th.ID, in.MessageID, in.ID)
		wantErr(t, err, agent.KindNotFound, agent.CodeInterruptNotFound, "GetInterrupt after delete")
	}
	wantInterrupts(e, th.ID)
	wantExpired(e, cutoff, []string{th.ID, neighbour.ID}, kept[0], kept[1])
	wantInterrupts(e, neighbour.ID, kept...)

	// The id is free again, with no interrupt of the deleted thread: the same interrupt id is a new one.
	again := createThread(e, th.Owner, th.ID, at(time.Hour))
	wantInterrupts(e, th.ID)
	// A run of the new thread asks it (a store may refuse an interrupt no run of the new thread asked).
	run := claim(e, again, e.id("run"), at(time.Hour)).Run
	fresh := interruptOf(th.ID, gone[2].ID, at(time.Hour))
	fresh.RunID, fresh.Epoch = run.ID, run.Epoch
	createInterrupt(e, fresh)
	wantInterrupts(e, th.ID, fresh)
}

// Bad input is refused with the catalog's code, the same in every store, and nothing is stored.
func testInterruptInvalid(e *interrupts) {
	t := e.t
	th := newThread(e)
	cases := []struct {
		name string
		edit func(*agent.Interrupt)
		code string
	}{
		{"no id", func(in *agent.Interrupt) { in.ID = "" }, agent.CodeInvalidMessage},
		{"an id with '#'", func(in *agent.Interrupt) { in.ID += "#2" }, agent.CodeInvalidMessage},
		{"no message id", func(in *agent.Interrupt) { in.MessageID = "" }, agent.CodeInvalidMessage},
		{"no thread id", func(in *agent.Interrupt) { in.ThreadID = "" }, agent.CodeInvalidThreadID},
		{"input that is not JSON", func(in *agent.Interrupt) { in.Input = json.RawMessage(`{"id":`) }, agent.CodeInvalidMessage},
		{"created with a response", func(in *agent.Interrupt) { in.Response = json.RawMessage(`{"approved":true}`) }, agent.CodeInvalidStatus},
		{"created with a resolution time", func(in *agent.Interrupt) { in.ResolvedAt = at(time.Second) }, agent.CodeInvalidStatus},
		{"unknown kind", func(in *agent.Interrupt) { in.Kind = "poll" }, agent.CodeInvalidMessage},
		{"no kind", func(in *agent.Interrupt) { in.Kind = "" }, agent.CodeInvalidMessage},
		{"created resolved", func(in *agent.Interrupt) { in.Status = agent.InterruptApproved }, agent.CodeInvalidStatus},
		{"no status", func(in *agent.Interrupt) { in.Status = "" }, agent.CodeInvalidStatus},
	}
	for _, tc := range cases {
		in := interruptOf(th.ID, e.id("int"), at(0))
		tc.edit(&in)
		_, _, err := e.s.CreateInterrupt(e.ctx, in)
		wantErr(t, err, agent.KindInvalid, tc.code, tc.name+": CreateInterrupt")
	}
	wantInterrupts(e, th.ID)

	in := createInterrupt(e, interruptOf(th.ID, e.id("int"), at(0)))
	ok := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptApproved, Now: at(time.Second)}
	resolves := []struct {
		name string
		edit func(*agent.ResolveRequest)
		code string
	}{
		{"no id", func(r *agent.ResolveRequest) { r.ID = "" }, agent.CodeInvalidMessage},
		{"no message id", func(r *agent.ResolveRequest) { r.MessageID = "" }, agent.CodeInvalidMessage},
		{"no thread id", func(r *agent.ResolveRequest) { r.ThreadID = "" }, agent.CodeInvalidThreadID},
		{"response that is not JSON", func(r *agent.ResolveRequest) { r.Response = json.RawMessage(`{"approved":tru}`) }, agent.CodeInvalidMessage},
		{"back to pending", func(r *agent.ResolveRequest) { r.Status = agent.InterruptPending }, agent.CodeInvalidStatus},
		{"unknown status", func(r *agent.ResolveRequest) { r.Status = "approved!" }, agent.CodeInvalidStatus},
	}
	for _, tc := range resolves {
		req := ok
		tc.edit(&req)
		_, err := e.s.ResolveInterrupt(e.ctx, req)
		wantErr(t, err, agent.KindInvalid, tc.code, tc.name+": ResolveInterrupt")
	}
	wantInterrupts(e, th.ID, in)
}

// A resolved interrupt stays readable (Get and List) for agent.DefaultResolvedInterruptKeep after its resolution,
// whatever else the thread resolves meanwhile: a retried answer is recognised within it. (After it the store
// removes it, each in its own way: the adapters test that.)
func testResolvedInterruptKept(e *interrupts) {
	th := newThread(e)
	a := createInterrupt(e, interruptOf(th.ID, e.id("apr"), at(0)))
	b := createInterrupt(e, interruptOf(th.ID, e.id("apr"), at(time.Second)))
	ra := agent.ResolveRequest{ThreadID: th.ID, MessageID: a.MessageID, ID: a.ID, Status: agent.InterruptApproved, Response: json.RawMessage(`{"approved":true}`), Now: at(time.Minute)}
	_, err := e.s.ResolveInterrupt(e.ctx, ra)
	must(e.t, err, "ResolveInterrupt "+a.ID)
	rb := agent.ResolveRequest{ThreadID: th.ID, MessageID: b.MessageID, ID: b.ID, Status: agent.InterruptDenied, Response: json.RawMessage(`{"approved":false}`),
		Now: at(time.Minute + agent.DefaultResolvedInterruptKeep - time.Millisecond)}
	_, err = e.s.ResolveInterrupt(e.ctx, rb)
	must(e.t, err, "ResolveInterrupt "+b.ID)
	sameInterrupt(e.t, "GetInterrupt "+a.ID, getInterrupt(e, th.ID, a.MessageID, a.ID), resolved(a, ra))
	wantInterrupts(e, th.ID, resolved(a, ra), resolved(b, rb))
}
