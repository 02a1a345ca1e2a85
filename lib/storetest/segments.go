package storetest

import (
	"fmt"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func segmentTests() []test {
	return []test{
		{"AppendAndList", testSegmentsAppendAndList},
		{"InsertIfAbsent", testSegmentInsertIfAbsent},
		{"ExpiredSkipped", testSegmentsExpired},
		{"RunsIsolated", testSegmentsRunsIsolated},
	}
}

// segment builds a segment created at at(0) that expires after agent.SegmentTTL.
func segment(threadID, runID string, seq int64, data string, final bool) agent.Segment {
	return agent.Segment{
		ThreadID: threadID, RunID: runID, Seq: seq, Data: []byte(data), Final: final,
		CreatedAt: at(0), ExpiresAt: at(agent.SegmentTTL),
	}
}

func (e *env) wantSegments(runID string, from int64, now time.Time, want ...agent.Segment) {
	e.t.Helper()
	got, err := e.s.ListSegments(e.ctx, runID, from, now)
	must(e.t, err, "ListSegments")
	if len(got) != len(want) {
		seqs := make([]int64, len(got))
		for i, s := range got {
			seqs[i] = s.Seq
		}
		e.t.Fatalf("ListSegments(from %d) = seqs %v, want %d segments", from, seqs, len(want))
	}
	for i := range want {
		what := fmt.Sprintf("ListSegments(from %d)[%d]", from, i)
		sameBytes(e.t, what+" data", got[i].Data, want[i].Data)
		g, w := got[i], want[i]
		g.Data, w.Data = nil, nil
		same(e.t, what, g, w)
	}
}

func testSegmentsAppendAndList(e *env) {
	th := e.newThread()
	run := e.id("run")
	segs := []agent.Segment{
		segment(th.ID, run, 0, "data: {\"type\":\"start\",\"messageId\":\"m1\"}\n\n", false),
		segment(th.ID, run, 1, "data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"h\u00e9\"}\n\n", false),
		// Opaque bytes: not even valid UTF-8 is required.
		segment(th.ID, run, 2, "\x00\xff\xfe binary \x80", false),
		segment(th.ID, run, 3, "data: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n", true),
	}
	segs[3].CreatedAt = at(time.Second)
	// Written out of order: readers still get them by seq.
	for _, i := range []int{1, 0, 3, 2} {
		must(e.t, e.s.AppendSegment(e.ctx, segs[i]), "AppendSegment")
	}
	now := at(time.Minute)
	e.wantSegments(run, 0, now, segs...)
	e.wantSegments(run, 1, now, segs[1:]...)
	e.wantSegments(run, 3, now, segs[3])
	e.wantSegments(run, 4, now)
	e.wantSegments(e.id("run"), 0, now)

	got, err := e.s.ListSegments(e.ctx, run, 0, now)
	must(e.t, err, "ListSegments")
	wantUTC(e.t, "segment times", got[0].CreatedAt, got[0].ExpiresAt)
}

// A retried flush of the same seq must not overwrite what readers may already have seen.
func testSegmentInsertIfAbsent(e *env) {
	th := e.newThread()
	run := e.id("run")
	first := segment(th.ID, run, 0, "data: first\n\n", false)
	must(e.t, e.s.AppendSegment(e.ctx, first), "AppendSegment")
	second := segment(th.ID, run, 0, "data: second, longer\n\n", true)
	second.CreatedAt = at(time.Second)
	must(e.t, e.s.AppendSegment(e.ctx, second), "AppendSegment(same seq)")
	e.wantSegments(run, 0, at(time.Minute), first)
}

// ExpiresAt < now is expired; ExpiresAt == now is still readable.
func testSegmentsExpired(e *env) {
	th := e.newThread()
	run := e.id("run")
	now := at(time.Hour)
	segs := []agent.Segment{
		segment(th.ID, run, 0, "a", false),
		segment(th.ID, run, 1, "b", false),
		segment(th.ID, run, 2, "c", false),
		segment(th.ID, run, 3, "d", true),
	}
	segs[0].ExpiresAt = now.Add(-time.Millisecond)
	segs[1].ExpiresAt = now
	segs[2].ExpiresAt = now.Add(-time.Minute)
	for _, s := range segs {
		must(e.t, e.s.AppendSegment(e.ctx, s), "AppendSegment")
	}
	e.wantSegments(run, 0, now, segs[1], segs[3])
	e.wantSegments(run, 0, at(0), segs...)
}

func testSegmentsRunsIsolated(e *env) {
	th := e.newThread()
	runA, runB := e.id("run"), e.id("run")
	a := segment(th.ID, runA, 0, "a0", false)
	b0 := segment(th.ID, runB, 0, "b0", false)
	b1 := segment(th.ID, runB, 1, "b1", true)
	for _, s := range []agent.Segment{a, b0, b1} {
		must(e.t, e.s.AppendSegment(e.ctx, s), "AppendSegment")
	}
	e.wantSegments(runA, 0, at(0), a)
	e.wantSegments(runB, 0, at(0), b0, b1)
}
