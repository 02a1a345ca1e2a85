package storetest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func messageTests() []test {
	type c = leaf[agent.MessageStore]
	return group(messagePort,
		c{"OrderedBySeq", testMessagesOrderedBySeq},
		c{"PagesNewestFirst", testMessagePages},
		c{"PageLargeAndDeleted", testMessagePageLargeAndDeleted},
		c{"UpsertKeepsPosition", testMessageUpsert},
		c{"RawPartsByteForByte", testMessageRawParts},
		c{"Unknown", testMessageUnknown},
		c{"DeleteMessage", testDeleteMessage},
		c{"OneMegabyte", testMessageOneMegabyte},
		c{"Fenced", testMessageFenced},
		c{"FinalRetryConverges", testMessageFinalRetry},
		c{"DeleteFenced", testDeleteMessageFenced},
		c{"EditHidesTheTailInOneWrite", testEditHidesTheTail},
		c{"SettledEditKeepsAnUncleanedTailHidden", testSettledEditKeepsTailHidden},
		c{"EditCleanupNamesTheHiddenTail", testEditCleanupNamesTheTail},
		c{"FenceMessageStubsAndFences", testFenceMessage},
		c{"InvalidRefused", testMessageInvalid},
	)
}

type messages = env[agent.MessageStore]

// writer is the fence of cases about content rather than fencing: one run that never finalizes.
var writer = agent.Fence{RunID: "writer", Epoch: 1}

func textParts(texts ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(texts))
	for i, s := range texts {
		out[i] = agent.EncodePart(agent.Part{Type: "text", Text: s})
	}
	return out
}

// sameRecord compares a stored message with the expected one; parts and metadata byte for byte.
func sameRecord[S any](e *env[S], what string, got, want agent.MessageRecord) {
	e.t.Helper()
	t := e.t
	if got.ThreadID != want.ThreadID || got.Seq != want.Seq || got.Message.ID != want.Message.ID ||
		got.Message.Role != want.Message.Role {
		t.Fatalf("%s: got thread %s seq %d id %s role %s, want thread %s seq %d id %s role %s", what,
			got.ThreadID, got.Seq, got.Message.ID, got.Message.Role,
			want.ThreadID, want.Seq, want.Message.ID, want.Message.Role)
	}
	same(t, what+": CreatedAt", got.CreatedAt, want.CreatedAt)
	same(t, what+": UpdatedAt", got.UpdatedAt, want.UpdatedAt)
	if len(got.Message.Parts) != len(want.Message.Parts) {
		t.Fatalf("%s: %d parts, want %d", what, len(got.Message.Parts), len(want.Message.Parts))
	}
	for i := range want.Message.Parts {
		sameBytes(t, fmt.Sprintf("%s: part %d", what, i), got.Message.Parts[i], want.Message.Parts[i])
	}
	sameBytes(t, what+": metadata", got.Message.Metadata, want.Message.Metadata)
}

// byWriter is m's upsert at seq by writer.
func byWriter(threadID string, seq int64, m agent.Message, now time.Time) agent.MessageWrite {
	return agent.MessageWrite{ThreadID: threadID, Seq: seq, Message: m, Fence: writer, Now: now}
}

// put writes m as a new message at seq (by writer) and returns the record it must read back as.
func put[S agent.MessageStore](e *env[S], threadID string, seq int64, m agent.Message, now time.Time) agent.MessageRecord {
	e.t.Helper()
	return putAs(e, writer, false, threadID, seq, m, now)
}

// putAs writes m as a new message at seq with fence f (final when final is set).
func putAs[S agent.MessageStore](e *env[S], f agent.Fence, final bool, threadID string, seq int64, m agent.Message,
	now time.Time) agent.MessageRecord {
	e.t.Helper()
	w := agent.MessageWrite{ThreadID: threadID, Seq: seq, Message: m, Fence: f, Final: final, Now: now}
	must(e.t, e.s.PutMessage(e.ctx, w), "PutMessage "+m.ID)
	return agent.MessageRecord{ThreadID: threadID, Seq: seq, Message: m, CreatedAt: now, UpdatedAt: now}
}

func wantMessages[S agent.MessageStore](e *env[S], threadID string, want ...agent.MessageRecord) {
	e.t.Helper()
	got, err := e.s.ListMessages(e.ctx, threadID)
	must(e.t, err, "ListMessages")
	if len(got) != len(want) {
		ids := make([]string, len(got))
		for i, r := range got {
			ids[i] = r.Message.ID
		}
		e.t.Fatalf("ListMessages = %d messages %v, want %d", len(got), ids, len(want))
	}
	for i := range want {
		sameRecord(e, fmt.Sprintf("ListMessages[%d]", i), got[i], want[i])
	}
}

// Messages come back by seq whatever order they were written in; equal seqs are ordered by id.
func testMessagesOrderedBySeq(e *messages) {
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	msg := func(id string, role agent.Role) agent.Message {
		return agent.Message{ID: th.ID + "-" + id, Role: role, Parts: textParts("text of " + id)}
	}
	r2 := put(e, th.ID, 2, msg("c", agent.RoleUser), at(1*time.Second))
	r0 := put(e, th.ID, 0, msg("b", agent.RoleUser), at(2*time.Second))
	r1 := put(e, th.ID, 1, msg("a", agent.RoleAssistant), at(3*time.Second))
	r3b := put(e, th.ID, 3, msg("y", agent.RoleUser), at(4*time.Second))
	r3a := put(e, th.ID, 3, msg("x", agent.RoleUser), at(5*time.Second))
	wantMessages(e, th.ID, r0, r1, r2, r3a, r3b)

	got, err := e.s.GetMessage(e.ctx, th.ID, r1.Message.ID)
	must(e.t, err, "GetMessage")
	sameRecord(e, "GetMessage", got, r1)
	wantUTC(e.t, "GetMessage", got.CreatedAt, got.UpdatedAt)
}

// walkPages reads the thread's messages page by page (newest first, or oldest first) and returns them in thread
// order (oldest first), checking each page's size and More flag on the way.
func walkPages[S agent.MessageStore](e *env[S], threadID string, limit int, oldest bool) []agent.MessageRecord {
	e.t.Helper()
	return walk(e.t, "messages", limit, 1000, oldest, func(from agent.MessageCursor) (agent.Page[agent.MessageRecord], error) {
		return e.s.ListMessagesPage(e.ctx, threadID, agent.MessagePage{From: from, Oldest: oldest, Limit: limit})
	}, agent.MessageRecord.Cursor)
}

// walk reads a list page by page from its start (read's zero cursor), each page from the last item's cursor, and
// returns the items in oldest-first order, checking each page's size and More flag, and that it ends within
// maxPages, on the way.
func walk[T, C any](t *testing.T, what string, limit, maxPages int, oldest bool, read func(from C) (agent.Page[T], error), cursor func(T) C) []T {
	t.Helper()
	var got []T
	var cur C
	for pages := 0; ; pages++ {
		if pages > maxPages {
			t.Fatalf("%s, limit %d: more than %d pages", what, limit, maxPages)
		}
		p, err := read(cur)
		must(t, err, "list "+what+" page")
		if len(p.Items) > limit || p.More && len(p.Items) < limit {
			t.Fatalf("%s, limit %d: a page of %d, more %v", what, limit, len(p.Items), p.More)
		}
		got = append(got, p.Items...)
		if !p.More {
			break
		}
		cur = cursor(p.Items[len(p.Items)-1])
	}
	if !oldest {
		slices.Reverse(got)
	}
	return got
}

// Pages walk ListMessages' order backwards from the newest: written out of order, with gaps in the positions,
// equal seqs ordered by id (a tie may fall on a page boundary), deleted messages left out, each message exactly
// once, whatever the page size. An empty or unknown thread is one empty page.
func testMessagePages(e *messages) {
	th := e.id("th")
	msg := func(id string) agent.Message {
		return agent.Message{ID: th + "-" + id, Role: agent.RoleUser, Parts: textParts("text of " + id)}
	}
	var want []agent.MessageRecord
	for i, w := range []struct {
		seq int64
		id  string
	}{{7, "g"}, {0, "a"}, {3, "d"}, {3, "c"}, {1, "b"}, {12, "h"}, {5, "f"}, {4, "e"}, {3, "x"}, {20, "z"}} {
		want = append(want, put(e, th, w.seq, msg(w.id), at(time.Duration(i)*time.Second)))
	}
	for _, id := range []string{"x", "z"} {
		must(e.t, e.s.DeleteMessage(e.ctx, th, th+"-"+id, writer), "DeleteMessage")
	}
	want = slices.DeleteFunc(want, func(r agent.MessageRecord) bool { return r.Message.ID == th+"-x" || r.Message.ID == th+"-z" })
	slices.SortFunc(want, func(a, b agent.MessageRecord) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), strings.Compare(a.Message.ID, b.Message.ID))
	})
	wantMessages(e, th, want...)
	for _, limit := range []int{1, 2, 3, 4, 8, 9, 100} {
		for _, oldest := range []bool{false, true} {
			got := walkPages(e, th, limit, oldest)
			if len(got) != len(want) {
				e.t.Fatalf("limit %d, oldest %v: %d messages, want %d", limit, oldest, len(got), len(want))
			}
			for i := range want {
				sameRecord(e, fmt.Sprintf("limit %d, oldest %v: message %d", limit, oldest, i), got[i], want[i])
			}
		}
	}
	// A cursor in the middle reads on from there, exclusively, whatever was read before it.
	p, err := e.s.ListMessagesPage(e.ctx, th, agent.MessagePage{From: want[4].Cursor(), Limit: 2})
	must(e.t, err, "ListMessagesPage(from the middle)")
	if len(p.Items) != 2 || !p.More {
		e.t.Fatalf("page before %v = %d messages, more %v; want 2 and more", want[4].Cursor(), len(p.Items), p.More)
	}
	sameRecord(e, "page from the middle [0]", p.Items[0], want[3])
	sameRecord(e, "page from the middle [1]", p.Items[1], want[2])
	p, err = e.s.ListMessagesPage(e.ctx, th, agent.MessagePage{From: want[4].Cursor(), Oldest: true, Limit: 2})
	must(e.t, err, "ListMessagesPage(oldest first, from the middle)")
	if len(p.Items) != 2 || !p.More {
		e.t.Fatalf("page after %v = %d messages, more %v; want 2 and more", want[4].Cursor(), len(p.Items), p.More)
	}
	sameRecord(e, "page after the middle [0]", p.Items[0], want[5])
	sameRecord(e, "page after the middle [1]", p.Items[1], want[6])
	for _, unknown := range []string{e.id("th"), th + "-none"} {
		p, err := e.s.ListMessagesPage(e.ctx, unknown, agent.MessagePage{Limit: 3})
		must(e.t, err, "ListMessagesPage(unknown thread)")
		if len(p.Items) != 0 || p.More {
			e.t.Fatalf("ListMessagesPage(unknown thread) = %d messages, more %v; want none", len(p.Items), p.More)
		}
	}
}

// A page holds large messages whole (a store that keeps them in pieces reads the page's pieces), and leaves out
// messages deleted in its range, even a whole page's worth of them; a message brought back after its delete is
// read at its new position.
func testMessagePageLargeAndDeleted(e *messages) {
	th := e.id("th")
	big := strings.Repeat("large tool output ", 40_000) // 720 KB: beyond one DynamoDB item
	var want []agent.MessageRecord
	for i := range 12 {
		m := agent.Message{ID: fmt.Sprintf("%s-%02d", th, i), Role: agent.RoleAssistant, Parts: textParts(fmt.Sprintf("%d", i))}
		if i%4 == 1 {
			m.Parts = textParts(big, fmt.Sprintf("%d", i))
		}
		want = append(want, put(e, th, int64(i), m, at(time.Duration(i)*time.Second)))
	}
	for i := 3; i <= 8; i++ { // six deleted in a row: more than a page of 4
		must(e.t, e.s.DeleteMessage(e.ctx, th, want[i].Message.ID, writer), "DeleteMessage")
	}
	back := put(e, th, 20, want[5].Message, at(30*time.Second)) // brought back by a newer write, at a new position
	want = append(slices.Concat(want[:3], want[9:]), back)
	for _, limit := range []int{1, 4, 5, 100} {
		for _, oldest := range []bool{false, true} {
			got := walkPages(e, th, limit, oldest)
			if len(got) != len(want) {
				e.t.Fatalf("limit %d, oldest %v: %d messages, want %d", limit, oldest, len(got), len(want))
			}
			for i := range want {
				sameRecord(e, fmt.Sprintf("limit %d, oldest %v: message %d", limit, oldest, i), got[i], want[i])
			}
		}
	}
}

// The engine rewrites its draft assistant message after every step: the message keeps its place and creation time
// and takes the new content, metadata included.
func testMessageUpsert(e *messages) {
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	id := th.ID + "-asst"
	user := put(e, th.ID, 0, agent.Message{ID: th.ID + "-user", Role: agent.RoleUser, Parts: textParts("hi")}, at(0))
	draft := put(e, th.ID, 1, agent.Message{
		ID: id, Role: agent.RoleAssistant, Parts: textParts("dra"), Metadata: json.RawMessage(`{"status":"streaming"}`),
	}, at(time.Second))
	later := put(e, th.ID, 2, agent.Message{ID: th.ID + "-later", Role: agent.RoleUser, Parts: textParts("next")}, at(2*time.Second))

	steps := []agent.Message{
		{ID: id, Role: agent.RoleAssistant, Parts: append(textParts("draft"), json.RawMessage(`{"type":"step-start"}`)),
			Metadata: json.RawMessage(`{"status":"streaming","runId":"r1"}`)},
		{ID: id, Role: agent.RoleAssistant, Parts: textParts("final answer"),
			Metadata: json.RawMessage(`{"status":"completed"}`)},
		// Metadata dropped: the new content replaces the old one entirely.
		{ID: id, Role: agent.RoleAssistant, Parts: textParts("final answer", "and more")},
	}
	for i, m := range steps {
		now := at(time.Duration(10+i) * time.Second)
		// A different seq on upsert is ignored: the message keeps its position.
		must(e.t, e.s.PutMessage(e.ctx, byWriter(th.ID, 99, m, now)), "PutMessage upsert")
		want := draft
		want.Message = m
		want.UpdatedAt = now
		got, err := e.s.GetMessage(e.ctx, th.ID, id)
		must(e.t, err, "GetMessage")
		sameRecord(e, fmt.Sprintf("upsert %d", i), got, want)
		wantMessages(e, th.ID, user, want, later)
	}
}

// Parts the engine does not understand must come back exactly as the client sent them.
func testMessageRawParts(e *messages) {
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	parts := []json.RawMessage{
		json.RawMessage(`{"type":"text","text":"<b>bold</b> & \u00e9 é \ud83c\udf89 🎉 \"q\" \\ \/"}`),
		json.RawMessage(`{ "type" : "data-weather" ,	"data" : { "z" : 1, "a" : [1.0, 2e3, -0.0, 1E-7, 10000000000000000000001] } , "id":"w1" }`),
		json.RawMessage("{\"type\":\"tool-search\",\n  \"toolCallId\":\"c1\",\n  \"state\":\"output-available\",\n  \"input\":{\"q\":\"x\"},\n  \"output\":\"line1\\nline2\\t\\u0000\"\n}"),
		json.RawMessage(`{"type":"file","mediaType":"image/png","url":"data:image/png;base64,iVBORw0KGgo=","providerMetadata":null}`),
		json.RawMessage(`{"type":"step-start"}`),
		json.RawMessage(`{"type":"source-url","sourceId":"s1","url":"https://example.com/?a=1&b=<2>","title":""}`),
	}
	m := agent.Message{
		ID: th.ID + "-m", Role: agent.RoleAssistant, Parts: parts,
		Metadata: json.RawMessage(`{"status":"completed",  "custom": {"b":2, "a":[true,false,null]}}`),
	}
	rec := put(e, th.ID, 0, m, at(0))
	got, err := e.s.GetMessage(e.ctx, th.ID, m.ID)
	must(e.t, err, "GetMessage")
	sameRecord(e, "GetMessage", got, rec)
	wantMessages(e, th.ID, rec)

	// Empty parts and no metadata are fine too.
	empty := put(e, th.ID, 1, agent.Message{ID: th.ID + "-empty", Role: agent.RoleUser}, at(time.Second))
	wantMessages(e, th.ID, rec, empty)
}

func testMessageUnknown(e *messages) {
	t := e.t
	_, err := e.s.GetMessage(e.ctx, e.id("th"), "m1")
	wantErr(t, err, agent.KindNotFound, "", "GetMessage(unknown thread)")
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	_, err = e.s.GetMessage(e.ctx, th.ID, e.id("msg"))
	wantErr(t, err, agent.KindNotFound, "", "GetMessage(unknown id)")

	// A message is found only under its own thread.
	m := put(e, th.ID, 0, agent.Message{ID: e.id("msg"), Role: agent.RoleUser, Parts: textParts("x")}, at(0))
	other := agent.Thread{ID: e.id("th")}
	_, err = e.s.GetMessage(e.ctx, other.ID, m.Message.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetMessage(message of another thread)")

	for _, id := range []string{e.id("th"), other.ID} {
		got, err := e.s.ListMessages(e.ctx, id)
		must(t, err, "ListMessages")
		if len(got) != 0 {
			t.Fatalf("ListMessages(%s) = %d messages, want none", id, len(got))
		}
	}
}

func testDeleteMessage(e *messages) {
	t := e.t
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	var recs []agent.MessageRecord
	for i := range 3 {
		recs = append(recs, put(e, th.ID, int64(i), agent.Message{
			ID: fmt.Sprintf("%s-m%d", th.ID, i), Role: agent.RoleUser, Parts: textParts("x"),
		}, at(time.Duration(i)*time.Second)))
	}
	must(t, e.s.DeleteMessage(e.ctx, th.ID, recs[1].Message.ID, writer), "DeleteMessage")
	_, err := e.s.GetMessage(e.ctx, th.ID, recs[1].Message.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetMessage after delete")
	wantMessages(e, th.ID, recs[0], recs[2])

	must(t, e.s.DeleteMessage(e.ctx, th.ID, recs[1].Message.ID, writer), "DeleteMessage again")
	must(t, e.s.DeleteMessage(e.ctx, th.ID, e.id("msg"), writer), "DeleteMessage(unknown id)")
	must(t, e.s.DeleteMessage(e.ctx, e.id("th"), "m", writer), "DeleteMessage(unknown thread)")
	wantMessages(e, th.ID, recs[0], recs[2])

	// Put after delete is a fresh insert: new position, new creation time.
	again := put(e, th.ID, 5, recs[1].Message, at(time.Minute))
	wantMessages(e, th.ID, recs[0], recs[2], again)
}

// randomText returns at least n bytes of varied text: ASCII, JSON metacharacters, control characters and
// multi-byte runes, so neither escaping nor compression nor chunking can hide a mistake.
func randomText(n int) string {
	alphabet := []rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n\"\\/<>&{}[]:,.\x01\x7féß漢字🎉€")
	rng := rand.New(rand.NewChaCha8([32]byte{'a', 'g', 'e', 'n', 't'}))
	var b strings.Builder
	b.Grow(n + 4)
	for b.Len() < n {
		b.WriteRune(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

// A tool that returns a megabyte (a fetched page) must round-trip, and shrinking it again must leave nothing behind.
func testMessageOneMegabyte(e *messages) {
	t := e.t
	th := agent.Thread{ID: e.id("th")} // the message port asks for no thread row
	body := randomText(1 << 20)
	big := agent.EncodePart(agent.Part{
		Type: "tool-fetch_page", ToolCallID: "call_1", State: agent.StateOutputAvailable,
		Input:  json.RawMessage(`{"url":"https://example.com/big"}`),
		Output: mustJSON(map[string]string{"content": body}),
	})
	if len(big) < 1<<20 {
		t.Fatalf("test part is %d bytes, want at least 1 MiB", len(big))
	}
	m := agent.Message{
		ID: th.ID + "-big", Role: agent.RoleAssistant,
		Parts:    []json.RawMessage{json.RawMessage(`{"type":"step-start"}`), big, textParts("done")[0]},
		Metadata: json.RawMessage(`{"status":"completed"}`),
	}
	user := put(e, th.ID, 0, agent.Message{ID: th.ID + "-user", Role: agent.RoleUser, Parts: textParts("fetch it")}, at(0))
	rec := put(e, th.ID, 1, m, at(time.Second))
	after := put(e, th.ID, 2, agent.Message{ID: th.ID + "-after", Role: agent.RoleUser, Parts: textParts("thanks")}, at(2*time.Second))

	got, err := e.s.GetMessage(e.ctx, th.ID, m.ID)
	must(t, err, "GetMessage(big)")
	sameRecord(e, "GetMessage(big)", got, rec)
	p, err := agent.DecodePart(got.Message.Parts[1])
	must(t, err, "DecodePart")
	var out map[string]string
	must(t, json.Unmarshal(p.Output, &out), "decode output")
	if out["content"] != body {
		t.Fatal("decoded tool output differs from the original text")
	}
	wantMessages(e, th.ID, user, rec, after)

	// Shrink it: the upsert replaces the whole megabyte.
	small := agent.Message{ID: m.ID, Role: agent.RoleAssistant, Parts: textParts("truncated")}
	must(t, e.s.PutMessage(e.ctx, byWriter(th.ID, 1, small, at(time.Minute))), "PutMessage(shrink)")
	rec.Message = small
	rec.UpdatedAt = at(time.Minute)
	wantMessages(e, th.ID, user, rec, after)

	// And grow it again with different content.
	body2 := randomText(1<<20 + 12345)[12345:]
	m.Parts[1] = agent.EncodePart(agent.Part{Type: "tool-fetch_page", ToolCallID: "call_1",
		State: agent.StateOutputAvailable, Output: mustJSON(body2)})
	must(t, e.s.PutMessage(e.ctx, byWriter(th.ID, 1, m, at(2*time.Minute))), "PutMessage(grow)")
	rec.Message = m
	rec.UpdatedAt = at(2 * time.Minute)
	wantMessages(e, th.ID, user, rec, after)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// fenceStep is one write in a fencing scenario.
type fenceStep struct {
	op    string // "put" or "delete"
	fence agent.Fence
	final bool
	// refused: the write must fail with run_fenced and change nothing.
	refused bool
}

// runSteps applies steps to message id (each put with distinct content) and checks after each one that a
// refused write changed nothing and an applied one is what readers see. It returns the record readers see at the
// end (ok false when the message is hidden).
func runSteps(e *messages, threadID, id string, steps []fenceStep) (rec agent.MessageRecord, ok bool) {
	e.t.Helper()
	for i, st := range steps {
		what := fmt.Sprintf("step %d (%s at epoch %d, final %t)", i, st.op, st.fence.Epoch, st.final)
		now := at(time.Duration(i+1) * time.Second)
		m := agent.Message{ID: id, Role: agent.RoleAssistant, Parts: textParts(fmt.Sprintf("content of step %d", i)),
			Metadata: json.RawMessage(fmt.Sprintf(`{"runId":%q}`, st.fence.RunID))}
		var err error
		switch st.op {
		case "put":
			err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: threadID, Seq: int64(10 + i), Message: m,
				Fence: st.fence, Final: st.final, Now: now})
		case "delete":
			err = e.s.DeleteMessage(e.ctx, threadID, id, st.fence)
		default:
			e.t.Fatalf("%s: unknown op", what)
		}
		if st.refused {
			wantErr(e.t, err, agent.KindConflict, agent.CodeRunFenced, what)
		} else {
			must(e.t, err, what)
			switch {
			case st.op == "delete":
				ok = false
			case ok:
				// An upsert of a visible message keeps its position and creation time.
				rec.Message, rec.UpdatedAt = m, now
			default:
				// A new message, or one brought back after a delete, sits where this writer put it.
				rec = agent.MessageRecord{ThreadID: threadID, Seq: int64(10 + i), Message: m, CreatedAt: now, UpdatedAt: now}
				ok = true
			}
		}
		got, err := e.s.GetMessage(e.ctx, threadID, id)
		if ok {
			must(e.t, err, what+": GetMessage")
			sameRecord(e, what+": GetMessage", got, rec)
			wantMessages(e, threadID, rec)
		} else {
			wantErr(e.t, err, agent.KindNotFound, "", what+": GetMessage of a deleted message")
			wantMessages(e, threadID)
		}
	}
	return rec, ok
}

// A message remembers its last writer's epoch and whether that writer finalized it: a run that lost its claim
// cannot overwrite what a newer run (or the reaper, finalizing at the dead run's epoch) wrote.
func testMessageFenced(e *messages) {
	r1 := agent.Fence{RunID: "run-1", Epoch: 1}
	r2 := agent.Fence{RunID: "run-2", Epoch: 2}
	r3 := agent.Fence{RunID: "run-3", Epoch: 3}
	put := func(f agent.Fence, final, refused bool) fenceStep {
		return fenceStep{op: "put", fence: f, final: final, refused: refused}
	}
	cases := []struct {
		name  string
		steps []fenceStep
	}{
		{"drafts then final at one epoch", []fenceStep{put(r2, false, false), put(r2, false, false), put(r2, true, false)}},
		{"zombie at a lower epoch is refused", []fenceStep{put(r2, false, false), put(r1, false, true), put(r1, true, true)}},
		{"same epoch after final is refused", []fenceStep{put(r2, true, false), put(r2, false, true), put(r2, true, true)}},
		{"reaper finalizes at the dead run's epoch, the zombie is refused", []fenceStep{
			put(r2, false, false), // the run's draft
			put(r2, true, false),  // the reaper: failed, with synthesized results
			put(r2, false, true),  // the run, still alive, writes its next draft
		}},
		{"higher epoch overwrites a final message (a continuation run)", []fenceStep{
			put(r1, true, false), put(r2, false, false), put(r2, true, false), put(r3, false, false),
		}},
		{"first write at a lower epoch than a later one", []fenceStep{
			put(r1, false, false), put(r3, false, false), put(r2, false, true),
		}},
	}
	for _, tc := range cases {
		th := e.id("th")
		runSteps(e, th, e.id("msg"), tc.steps)
	}
}

// A deleted message keeps its fence: a late writer at a lower epoch cannot bring it back, and a delete is fenced
// like a write.
func testDeleteMessageFenced(e *messages) {
	r1 := agent.Fence{RunID: "run-1", Epoch: 1}
	r2 := agent.Fence{RunID: "run-2", Epoch: 2}
	r3 := agent.Fence{RunID: "run-3", Epoch: 3}
	put := func(f agent.Fence, final, refused bool) fenceStep {
		return fenceStep{op: "put", fence: f, final: final, refused: refused}
	}
	del := func(f agent.Fence, refused bool) fenceStep {
		return fenceStep{op: "delete", fence: f, refused: refused}
	}
	cases := []struct {
		name  string
		steps []fenceStep
	}{
		// Regenerate: run 2 deletes run 1's reply; run 1, a zombie, tries to write it again.
		{"a lower epoch cannot re-create a deleted message", []fenceStep{
			put(r1, false, false), del(r2, false), put(r1, false, true), put(r1, true, true),
		}},
		{"a lower epoch cannot delete", []fenceStep{put(r2, false, false), del(r1, true)}},
		{"a finalized message cannot be deleted at its own epoch", []fenceStep{put(r2, true, false), del(r2, true)}},
		{"a higher epoch deletes a final message", []fenceStep{put(r1, true, false), del(r2, false), del(r2, false)}},
		{"the deleter's epoch may write it again, as a new message", []fenceStep{
			put(r1, false, false), del(r2, false), put(r2, false, false),
		}},
		{"a higher epoch brings a deleted message back, as a new message", []fenceStep{
			put(r1, true, false), del(r2, false), put(r1, false, true), put(r3, true, false), put(r2, false, true),
		}},
	}
	for _, tc := range cases {
		runSteps(e, e.id("th"), e.id("msg"), tc.steps)
	}
	// Deleting an unknown message is a no-op at any epoch, and leaves nothing that fences a later write.
	th, id := e.id("th"), e.id("msg")
	must(e.t, e.s.DeleteMessage(e.ctx, th, id, r3), "DeleteMessage(unknown id)")
	runSteps(e, th, id, []fenceStep{put(r1, false, false)})
}

// Bad messages are refused with the catalog's code, the same in every store, and nothing is stored.
func testMessageInvalid(e *messages) {
	th := e.id("th")
	text := textParts("ok")[0]
	cases := []struct {
		name string
		w    agent.MessageWrite
		code string
	}{
		{"truncated part", agent.MessageWrite{Message: agent.Message{ID: "m1", Role: agent.RoleUser,
			Parts: []json.RawMessage{text, json.RawMessage(`{"type":`)}}}, agent.CodeInvalidMessage},
		{"empty part", agent.MessageWrite{Message: agent.Message{ID: "m1", Role: agent.RoleUser,
			Parts: []json.RawMessage{nil}}}, agent.CodeInvalidMessage},
		{"part that is not JSON", agent.MessageWrite{Message: agent.Message{ID: "m1", Role: agent.RoleUser,
			Parts: []json.RawMessage{json.RawMessage(`hello`)}}}, agent.CodeInvalidMessage},
		{"metadata that is not JSON", agent.MessageWrite{Message: agent.Message{ID: "m1", Role: agent.RoleAssistant,
			Parts: []json.RawMessage{text}, Metadata: json.RawMessage(`{"status":`)}}, agent.CodeInvalidMessage},
		{"no message id", agent.MessageWrite{Message: agent.Message{Role: agent.RoleUser,
			Parts: []json.RawMessage{text}}}, agent.CodeInvalidMessage},
		{"no thread id", agent.MessageWrite{Message: agent.Message{ID: "m1", Role: agent.RoleUser,
			Parts: []json.RawMessage{text}}}, agent.CodeInvalidThreadID},
	}
	for _, tc := range cases {
		w := tc.w
		if tc.code != agent.CodeInvalidThreadID {
			w.ThreadID = th
		}
		w.Fence, w.Now = writer, at(0)
		wantErr(e.t, e.s.PutMessage(e.ctx, w), agent.KindInvalid, tc.code, tc.name+": PutMessage")
	}
	wantMessages(e, th)
}

// A finalized write retried after a lost answer (the same run, epoch and content) converges; the same run with
// other content, or another run, is still refused (DESIGN principle 3).
func testMessageFinalRetry(e *messages) {
	th, id := e.id("th"), e.id("msg")
	f := agent.Fence{RunID: "run-1", Epoch: 1}
	m := agent.Message{ID: id, Role: agent.RoleAssistant, Parts: textParts("the reply"), Metadata: json.RawMessage(`{"status":"completed"}`)}
	w := agent.MessageWrite{ThreadID: th, Seq: 3, Message: m, Fence: f, Final: true, Now: at(time.Second)}
	must(e.t, e.s.PutMessage(e.ctx, w), "first write")
	must(e.t, e.s.PutMessage(e.ctx, w), "identical retry")
	other := w
	other.Message.Parts = textParts("something else")
	wantErr(e.t, e.s.PutMessage(e.ctx, other), agent.KindConflict, agent.CodeRunFenced, "same run, other content")
	zombie := w
	zombie.Fence = agent.Fence{RunID: "run-0", Epoch: 0}
	wantErr(e.t, e.s.PutMessage(e.ctx, zombie), agent.KindConflict, agent.CodeRunFenced, "a lower epoch")
	rec, err := e.s.GetMessage(e.ctx, th, id)
	must(e.t, err, "get")
	if len(rec.Message.Parts) != 1 || !bytes.Equal(rec.Message.Parts[0], m.Parts[0]) {
		e.t.Fatalf("stored parts %s, want %s", rec.Message.Parts, m.Parts)
	}
}

// FenceMessage (the reaper's fence B): an unknown id gets a hidden stub that refuses a lower writer's first write
// (which no message row could fence before) and lets a higher one bring the message back at its own seq; a stored
// message keeps its content and position, refuses a lower writer and lets the fence's own epoch write it; one
// written at the fence's epoch or above is left alone.
func testFenceMessage(e *messages) {
	t := e.t
	th := e.id("th") // no thread row: the message port's own fencing
	dead := agent.Fence{RunID: "run-1", Epoch: 1}
	reaper := agent.Fence{RunID: agent.ReapRunID("run-1"), Epoch: 2}
	next := agent.Fence{RunID: "run-3", Epoch: 3}
	reply := agent.Message{ID: th + "-reply", Role: agent.RoleAssistant, Parts: textParts("late reply")}
	must(t, e.s.FenceMessage(e.ctx, th, reply.ID, reaper), "FenceMessage(unknown id)")
	_, err := e.s.GetMessage(e.ctx, th, reply.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetMessage of a stub")
	wantMessages(e, th)
	err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: 5, Message: reply, Fence: dead, Final: true, Now: at(time.Second)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "the dead run's first write after the stub")
	wantMessages(e, th)
	must(t, e.s.FenceMessage(e.ctx, th, reply.ID, reaper), "FenceMessage again")
	back := putAs(e, next, true, th, 7, reply, at(2*time.Second))
	wantMessages(e, th, back)

	user := agent.Message{ID: th + "-user", Role: agent.RoleUser, Parts: textParts("hello")}
	stored := putAs(e, dead, false, th, 4, user, at(3*time.Second))
	must(t, e.s.FenceMessage(e.ctx, th, user.ID, reaper), "FenceMessage(stored id)")
	wantMessages(e, th, stored, back)
	other := user
	other.Parts = textParts("changed late")
	err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: 4, Message: other, Fence: dead, Final: true, Now: at(4 * time.Second)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "the dead run's write after the fence")
	final := putAs(e, reaper, true, th, 4, user, at(5*time.Second))
	final.CreatedAt = stored.CreatedAt
	wantMessages(e, th, final, back)
	// At or above the fence's epoch: left alone (the reaper's own final write stays final).
	must(t, e.s.FenceMessage(e.ctx, th, user.ID, reaper), "FenceMessage of a message at its epoch")
	err = e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: 4, Message: other, Fence: reaper, Now: at(6 * time.Second)})
	wantErr(t, err, agent.KindConflict, agent.CodeRunFenced, "a write over a message finalized at the fence's epoch")
}

// An edit commits in one write (fence D, REVIEW D14): a write with HideBefore keeps the edited message's position
// and hides every message after it and before HideBefore from lists and pages at once, in every direction and
// page size, while a message written later at or after HideBefore shows. Deleting the hidden messages afterwards
// is cleanup and changes nothing a list shows. An edit refused (fenced, or of a message not stored) hides
// nothing; a repeated edit converges; a later edit of the same message hides what the earlier one did and more.
func testEditHidesTheTail(e *messages) {
	t := e.t
	th := e.id("th") // the message port asks for no thread row
	var recs []agent.MessageRecord
	for i := range 6 {
		role := []agent.Role{agent.RoleUser, agent.RoleAssistant}[i%2]
		recs = append(recs, put(e, th, int64(i), agent.Message{ID: fmt.Sprintf("%s-m%d", th, i), Role: role,
			Parts: textParts(fmt.Sprintf("text %d", i))}, at(time.Duration(i)*time.Second)))
	}
	edit := func(f agent.Fence, id string, text string, hideBefore int64, now time.Time) error {
		return e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: hideBefore, Fence: f, Final: true, Now: now,
			HideBefore: hideBefore, Message: agent.Message{ID: id, Role: agent.RoleUser, Parts: textParts(text)}})
	}
	wantAll := func(what string, want ...agent.MessageRecord) {
		t.Helper()
		wantMessages(e, th, want...)
		for _, limit := range []int{1, 2, 3, 100} {
			for _, oldest := range []bool{false, true} {
				got := walkPages(e, th, limit, oldest)
				if len(got) != len(want) {
					t.Fatalf("%s: limit %d, oldest %v: %d messages, want %d", what, limit, oldest, len(got), len(want))
				}
				for i := range want {
					sameRecord(e, fmt.Sprintf("%s: limit %d, oldest %v: message %d", what, limit, oldest, i), got[i], want[i])
				}
			}
		}
	}

	// Refused edits hide nothing: an unknown or deleted message, and a writer below the message's own.
	run2 := agent.Fence{RunID: "edit2", Epoch: 2}
	wantErr(t, edit(run2, th+"-none", "x", 8, at(time.Minute)), agent.KindNotFound, agent.CodeMessageNotFound, "edit of an unknown message")
	old := agent.Fence{RunID: "old", Epoch: 0}
	wantErr(t, edit(old, recs[2].Message.ID, "x", 8, at(time.Minute)), agent.KindConflict, agent.CodeRunFenced, "edit by a fenced writer")
	wantAll("after refused edits", recs...)

	// The edit: m2 keeps its place and takes the new text; m3 to m5 are gone from every read at once.
	must(t, edit(run2, recs[2].Message.ID, "edited", 8, at(time.Minute)), "edit")
	edited := recs[2]
	edited.Message.Parts, edited.UpdatedAt = textParts("edited"), at(time.Minute)
	wantAll("after the edit", recs[0], recs[1], edited)
	must(t, edit(run2, recs[2].Message.ID, "edited", 8, at(time.Minute)), "the same edit again (a retry)")
	got, err := e.s.GetMessage(e.ctx, th, edited.Message.ID)
	must(t, err, "GetMessage(edited)")
	sameRecord(e, "GetMessage(edited)", got, edited)

	// The edit's reply, at the first position the edit left visible, shows.
	reply := putAs(e, run2, false, th, 8, agent.Message{ID: th + "-r8", Role: agent.RoleAssistant, Parts: textParts("reply")}, at(2*time.Minute))
	wantAll("after the reply", recs[0], recs[1], edited, reply)

	// Cleanup changes nothing a reader sees.
	for _, r := range recs[3:] {
		must(t, e.s.DeleteMessage(e.ctx, th, r.Message.ID, run2), "DeleteMessage "+r.Message.ID)
	}
	if st, ok := any(e.s).(agent.EditSettler); ok {
		must(t, st.SettleEdit(e.ctx, th, edited.Message.ID, run2), "SettleEdit")
	}
	wantAll("after the cleanup", recs[0], recs[1], edited, reply)

	// A second edit of the same message hides the first one's reply too.
	run3 := agent.Fence{RunID: "edit3", Epoch: 3}
	must(t, edit(run3, edited.Message.ID, "edited again", 12, at(3*time.Minute)), "second edit")
	edited.Message.Parts, edited.UpdatedAt = textParts("edited again"), at(3*time.Minute)
	wantAll("after the second edit", recs[0], recs[1], edited)
	// And an edit of an older message hides the edited one with everything else after it.
	must(t, edit(agent.Fence{RunID: "edit4", Epoch: 4}, recs[0].Message.ID, "first", 16, at(4*time.Minute)), "edit of the first message")
	first := recs[0]
	first.Message.Parts, first.UpdatedAt = textParts("first"), at(4*time.Minute)
	wantAll("after the edit of the first message", first)
}

// testSettledEditKeepsTailHidden: an edit whose cleanup never ran (its process died after the edit's write), then
// a second edit of the same message that deletes only what it saw (its own reply) and settles: the first edit's
// tail, never deleted, stays hidden from every read (a store that keeps an edit record keeps it while the
// messages it hides exist).
func testSettledEditKeepsTailHidden(e *messages) {
	t := e.t
	th := e.id("th")
	var recs []agent.MessageRecord
	for i := range 4 {
		role := []agent.Role{agent.RoleUser, agent.RoleAssistant}[i%2]
		recs = append(recs, put(e, th, int64(i), agent.Message{ID: fmt.Sprintf("%s-m%d", th, i), Role: role,
			Parts: textParts(fmt.Sprintf("text %d", i))}, at(time.Duration(i)*time.Second)))
	}
	edit := func(f agent.Fence, text string, hideBefore int64, now time.Time) {
		t.Helper()
		must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: hideBefore, Fence: f, Final: true, Now: now,
			HideBefore: hideBefore, Message: agent.Message{ID: recs[2].Message.ID, Role: agent.RoleUser, Parts: textParts(text)}}), "edit "+text)
	}
	// The first edit of m2 hides m3; its process dies before any cleanup.
	run2 := agent.Fence{RunID: "edit2", Epoch: 2}
	edit(run2, "edited", 8, at(time.Minute))
	// The reaper's stub reply of the dead edit run, at its first position.
	reap := agent.Fence{RunID: "reap:edit2", Epoch: 3}
	reply := putAs(e, reap, true, th, 8, agent.Message{ID: th + "-r8", Role: agent.RoleAssistant, Parts: textParts("failed")}, at(2*time.Minute))
	// The edit sent again: it hides the stub, deletes it (all it saw) and settles.
	run4 := agent.Fence{RunID: "edit4", Epoch: 4}
	edit(run4, "edited", 12, at(3*time.Minute))
	must(t, e.s.DeleteMessage(e.ctx, th, reply.Message.ID, run4), "DeleteMessage "+reply.Message.ID)
	if st, ok := any(e.s).(agent.EditSettler); ok {
		must(t, st.SettleEdit(e.ctx, th, recs[2].Message.ID, run4), "SettleEdit")
	}
	edited := recs[2]
	edited.Message.Parts, edited.UpdatedAt = textParts("edited"), at(3*time.Minute)
	wantMessages(e, th, recs[0], recs[1], edited)
	for _, limit := range []int{1, 2, 100} {
		for _, oldest := range []bool{false, true} {
			got := walkPages(e, th, limit, oldest)
			if len(got) != 3 {
				var ids []string
				for _, r := range got {
					ids = append(ids, r.Message.ID)
				}
				t.Fatalf("limit %d, oldest %v: %v, want m0, m1 and the edited m2 (m3, hidden by the first edit, never deleted)", limit, oldest, ids)
			}
		}
	}
}

// testEditCleanupNamesTheTail: the messages an edit hid are what its cleanup must delete, and someone other than the
// editing run (the reaper, at a later epoch, after fencing the edited message) can find them: a store that keeps
// them stored until deleted names them (agent.EditCleaner.HiddenByEdit, newest first, and only those still
// stored); any other store has deleted them in the edit's own write (GetMessage finds none). A message never
// edited, and an unknown one, hide nothing. After the cleanup no hidden message is found, and lists are unchanged.
func testEditCleanupNamesTheTail(e *messages) {
	t := e.t
	th := e.id("th")
	var recs []agent.MessageRecord
	for i := range 6 {
		role := []agent.Role{agent.RoleUser, agent.RoleAssistant}[i%2]
		recs = append(recs, put(e, th, int64(i), agent.Message{ID: fmt.Sprintf("%s-m%d", th, i), Role: role,
			Parts: textParts(fmt.Sprintf("text %d", i))}, at(time.Duration(i)*time.Second)))
	}
	cleaner, names := any(e.s).(agent.EditCleaner)
	hidden := func(what, id string, want ...string) {
		t.Helper()
		if !names {
			return
		}
		got, err := cleaner.HiddenByEdit(e.ctx, th, id)
		must(t, err, "HiddenByEdit "+what)
		if !slices.Equal(got, want) {
			t.Fatalf("HiddenByEdit %s = %v, want %v", what, got, want)
		}
	}
	gone := func(what string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, err := e.s.GetMessage(e.ctx, th, id); !agent.IsKind(err, agent.KindNotFound) {
				t.Fatalf("%s: GetMessage(%s) = %v, want not found", what, id, err)
			}
		}
	}
	hidden("of a message never edited", recs[2].Message.ID)
	hidden("of an unknown message", th+"-none")
	hidden("of an unknown thread", e.id("none"))

	// The edit of m2 hides m3 to m5; its run dies before any cleanup. The reaper fences the edited message.
	run2 := agent.Fence{RunID: "edit2", Epoch: 2}
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th, Seq: 2, Fence: run2, Final: true, Now: at(time.Minute),
		HideBefore: 8, Message: agent.Message{ID: recs[2].Message.ID, Role: agent.RoleUser, Parts: textParts("edited")}}), "edit")
	reap := agent.Fence{RunID: "reap:edit2", Epoch: 3}
	must(t, e.s.FenceMessage(e.ctx, th, recs[2].Message.ID, reap), "FenceMessage(edited)")
	edited := recs[2]
	edited.Message.Parts, edited.UpdatedAt = textParts("edited"), at(time.Minute)
	wantMessages(e, th, recs[0], recs[1], edited)
	tail := []string{recs[5].Message.ID, recs[4].Message.ID, recs[3].Message.ID}
	if !names {
		gone("after the edit (no store record of the tail)", tail...)
	}
	hidden("after the edit", recs[2].Message.ID, tail...)
	hidden("of a message the edit hid", recs[4].Message.ID)

	// The cleanup, by the reaper's fence: one at a time, each no longer named once deleted.
	for i, id := range tail {
		must(t, e.s.DeleteMessage(e.ctx, th, id, reap), "DeleteMessage "+id)
		hidden(fmt.Sprintf("after %d deletes", i+1), recs[2].Message.ID, tail[i+1:]...)
	}
	if st, ok := any(e.s).(agent.EditSettler); ok {
		must(t, st.SettleEdit(e.ctx, th, recs[2].Message.ID, reap), "SettleEdit")
	}
	gone("after the cleanup", tail...)
	wantMessages(e, th, recs[0], recs[1], edited)
	hidden("after the cleanup", recs[2].Message.ID)
}
