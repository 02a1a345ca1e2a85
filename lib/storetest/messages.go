package storetest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func messageTests() []test {
	return []test{
		{"OrderedBySeq", testMessagesOrderedBySeq},
		{"UpsertKeepsPosition", testMessageUpsert},
		{"RawPartsByteForByte", testMessageRawParts},
		{"Unknown", testMessageUnknown},
		{"DeleteMessage", testDeleteMessage},
		{"OneMegabyte", testMessageOneMegabyte},
	}
}

func textParts(texts ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(texts))
	for i, s := range texts {
		out[i] = agent.EncodePart(agent.Part{Type: "text", Text: s})
	}
	return out
}

// sameRecord compares a stored message with the expected one; parts and metadata byte for byte.
func sameRecord(e *env, what string, got, want agent.MessageRecord) {
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

func (e *env) put(threadID string, seq int64, m agent.Message, now time.Time) agent.MessageRecord {
	e.t.Helper()
	must(e.t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: threadID, Seq: seq, Message: m, Fence: legacyFence, Now: now}), "PutMessage "+m.ID)
	return agent.MessageRecord{ThreadID: threadID, Seq: seq, Message: m, CreatedAt: now, UpdatedAt: now}
}

func (e *env) wantMessages(threadID string, want ...agent.MessageRecord) {
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
func testMessagesOrderedBySeq(e *env) {
	th := e.newThread()
	msg := func(id string, role agent.Role) agent.Message {
		return agent.Message{ID: th.ID + "-" + id, Role: role, Parts: textParts("text of " + id)}
	}
	r2 := e.put(th.ID, 2, msg("c", agent.RoleUser), at(1*time.Second))
	r0 := e.put(th.ID, 0, msg("b", agent.RoleUser), at(2*time.Second))
	r1 := e.put(th.ID, 1, msg("a", agent.RoleAssistant), at(3*time.Second))
	r3b := e.put(th.ID, 3, msg("y", agent.RoleUser), at(4*time.Second))
	r3a := e.put(th.ID, 3, msg("x", agent.RoleUser), at(5*time.Second))
	e.wantMessages(th.ID, r0, r1, r2, r3a, r3b)

	got, err := e.s.GetMessage(e.ctx, th.ID, r1.Message.ID)
	must(e.t, err, "GetMessage")
	sameRecord(e, "GetMessage", got, r1)
	wantUTC(e.t, "GetMessage", got.CreatedAt, got.UpdatedAt)
}

// The engine rewrites its draft assistant message after every step: the message keeps its place and creation time
// and takes the new content, metadata included.
func testMessageUpsert(e *env) {
	th := e.newThread()
	id := th.ID + "-asst"
	user := e.put(th.ID, 0, agent.Message{ID: th.ID + "-user", Role: agent.RoleUser, Parts: textParts("hi")}, at(0))
	draft := e.put(th.ID, 1, agent.Message{
		ID: id, Role: agent.RoleAssistant, Parts: textParts("dra"), Metadata: json.RawMessage(`{"status":"streaming"}`),
	}, at(time.Second))
	later := e.put(th.ID, 2, agent.Message{ID: th.ID + "-later", Role: agent.RoleUser, Parts: textParts("next")}, at(2*time.Second))

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
		must(e.t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: 99, Message: m, Fence: legacyFence, Now: now}), "PutMessage upsert")
		want := draft
		want.Message = m
		want.UpdatedAt = now
		got, err := e.s.GetMessage(e.ctx, th.ID, id)
		must(e.t, err, "GetMessage")
		sameRecord(e, fmt.Sprintf("upsert %d", i), got, want)
		e.wantMessages(th.ID, user, want, later)
	}
}

// Parts the engine does not understand must come back exactly as the client sent them.
func testMessageRawParts(e *env) {
	th := e.newThread()
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
	rec := e.put(th.ID, 0, m, at(0))
	got, err := e.s.GetMessage(e.ctx, th.ID, m.ID)
	must(e.t, err, "GetMessage")
	sameRecord(e, "GetMessage", got, rec)
	e.wantMessages(th.ID, rec)

	// Empty parts and no metadata are fine too.
	empty := e.put(th.ID, 1, agent.Message{ID: th.ID + "-empty", Role: agent.RoleUser}, at(time.Second))
	e.wantMessages(th.ID, rec, empty)
}

func testMessageUnknown(e *env) {
	t := e.t
	_, err := e.s.GetMessage(e.ctx, e.id("th"), "m1")
	wantErr(t, err, agent.KindNotFound, "", "GetMessage(unknown thread)")
	th := e.newThread()
	_, err = e.s.GetMessage(e.ctx, th.ID, e.id("msg"))
	wantErr(t, err, agent.KindNotFound, "", "GetMessage(unknown id)")

	// A message is found only under its own thread.
	m := e.put(th.ID, 0, agent.Message{ID: e.id("msg"), Role: agent.RoleUser, Parts: textParts("x")}, at(0))
	other := e.newThread()
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

func testDeleteMessage(e *env) {
	t := e.t
	th := e.newThread()
	var recs []agent.MessageRecord
	for i := range 3 {
		recs = append(recs, e.put(th.ID, int64(i), agent.Message{
			ID: fmt.Sprintf("%s-m%d", th.ID, i), Role: agent.RoleUser, Parts: textParts("x"),
		}, at(time.Duration(i)*time.Second)))
	}
	must(t, e.s.DeleteMessage(e.ctx, th.ID, recs[1].Message.ID, legacyFence), "DeleteMessage")
	_, err := e.s.GetMessage(e.ctx, th.ID, recs[1].Message.ID)
	wantErr(t, err, agent.KindNotFound, "", "GetMessage after delete")
	e.wantMessages(th.ID, recs[0], recs[2])

	must(t, e.s.DeleteMessage(e.ctx, th.ID, recs[1].Message.ID, legacyFence), "DeleteMessage again")
	must(t, e.s.DeleteMessage(e.ctx, th.ID, e.id("msg"), legacyFence), "DeleteMessage(unknown id)")
	must(t, e.s.DeleteMessage(e.ctx, e.id("th"), "m", legacyFence), "DeleteMessage(unknown thread)")
	e.wantMessages(th.ID, recs[0], recs[2])

	// Put after delete is a fresh insert: new position, new creation time.
	again := e.put(th.ID, 5, recs[1].Message, at(time.Minute))
	e.wantMessages(th.ID, recs[0], recs[2], again)
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
func testMessageOneMegabyte(e *env) {
	t := e.t
	th := e.newThread()
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
	user := e.put(th.ID, 0, agent.Message{ID: th.ID + "-user", Role: agent.RoleUser, Parts: textParts("fetch it")}, at(0))
	rec := e.put(th.ID, 1, m, at(time.Second))
	after := e.put(th.ID, 2, agent.Message{ID: th.ID + "-after", Role: agent.RoleUser, Parts: textParts("thanks")}, at(2*time.Second))

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
	e.wantMessages(th.ID, user, rec, after)

	// Shrink it: the upsert replaces the whole megabyte.
	small := agent.Message{ID: m.ID, Role: agent.RoleAssistant, Parts: textParts("truncated")}
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: 1, Message: small, Fence: legacyFence, Now: at(time.Minute)}), "PutMessage(shrink)")
	rec.Message = small
	rec.UpdatedAt = at(time.Minute)
	e.wantMessages(th.ID, user, rec, after)

	// And grow it again with different content.
	body2 := randomText(1<<20 + 12345)[12345:]
	m.Parts[1] = agent.EncodePart(agent.Part{Type: "tool-fetch_page", ToolCallID: "call_1",
		State: agent.StateOutputAvailable, Output: mustJSON(body2)})
	must(t, e.s.PutMessage(e.ctx, agent.MessageWrite{ThreadID: th.ID, Seq: 1, Message: m, Fence: legacyFence, Now: at(2 * time.Minute)}), "PutMessage(grow)")
	rec.Message = m
	rec.UpdatedAt = at(2 * time.Minute)
	e.wantMessages(th.ID, user, rec, after)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
