package storetest

import (
	"fmt"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func segmentTests() []test {
	type c = leaf[agent.SegmentStore]
	return group(segmentPort,
		c{"AppendAndList", testSegmentsAppendAndList},
		c{"InsertIfAbsent", testSegmentInsertIfAbsent},
		c{"ExpiredSkipped", testSegmentsExpired},
		c{"RunsIsolated", testSegmentsRunsIsolated},
		c{"ListStopsAtFinal", testSegmentsStopAtFinal},
		c{"InvalidRefused", testSegmentsInvalid},
	)
}

type segments = env[agent.SegmentStore]

// segment builds a segment created at at(0) that expires after agent.SegmentTTL.
func segment(threadID, runID string, seq int64, data string, final bool) agent.Segment {
	return agent.Segment{
		ThreadID: threadID, RunID: runID, Seq: seq, Data: []byte(data), Final: final,
		CreatedAt: at(0), ExpiresAt: at(agent.SegmentTTL),
	}
}

func wantSegments[S agent.SegmentStore](e *env[S], runID string, from int64, now time.Time, want ...agent.Segment) {
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

func appendAll(e *segments, segs ...agent.Segment) {
	e.t.Helper()
	for _, s := range segs {
		must(e.t, e.s.AppendSegment(e.ctx, s), fmt.Sprintf("AppendSegment(seq %d)", s.Seq))
	}
}

func testSegmentsAppendAndList(e *segments) {
	th := e.id("th")
	run := e.id("run")
	segs := []agent.Segment{
		segment(th, run, 0, "data: {\"type\":\"start\",\"messageId\":\"m1\"}\n\n", false),
		segment(th, run, 1, "data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"h\u00e9\"}\n\n", false),
		// Opaque bytes: not even valid UTF-8 is required.
		segment(th, run, 2, "\x00\xff\xfe binary \x80", false),
		segment(th, run, 3, "data: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n", true),
	}
	segs[3].CreatedAt = at(time.Second)
	// Written out of order: readers still get them by seq.
	appendAll(e, segs[1], segs[0], segs[3], segs[2])
	now := at(time.Minute)
	wantSegments(e, run, 0, now, segs...)
	wantSegments(e, run, 1, now, segs[1:]...)
	wantSegments(e, run, 3, now, segs[3])
	wantSegments(e, run, 4, now)
	wantSegments(e, e.id("run"), 0, now)

	got, err := e.s.ListSegments(e.ctx, run, 0, now)
	must(e.t, err, "ListSegments")
	wantUTC(e.t, "segment times", got[0].CreatedAt, got[0].ExpiresAt)
}

// A retried flush of the same seq must not overwrite what readers may already have seen.
func testSegmentInsertIfAbsent(e *segments) {
	th := e.id("th")
	run := e.id("run")
	first := segment(th, run, 0, "data: first\n\n", false)
	must(e.t, e.s.AppendSegment(e.ctx, first), "AppendSegment")
	second := segment(th, run, 0, "data: second, longer\n\n", true)
	second.CreatedAt = at(time.Second)
	must(e.t, e.s.AppendSegment(e.ctx, second), "AppendSegment(same seq)")
	wantSegments(e, run, 0, at(time.Minute), first)
}

// ExpiresAt < now is expired; ExpiresAt == now is still readable.
func testSegmentsExpired(e *segments) {
	th := e.id("th")
	run := e.id("run")
	now := at(time.Hour)
	segs := []agent.Segment{
		segment(th, run, 0, "a", false),
		segment(th, run, 1, "b", false),
		segment(th, run, 2, "c", false),
		segment(th, run, 3, "d", true),
	}
	segs[0].ExpiresAt = now.Add(-time.Millisecond)
	segs[1].ExpiresAt = now
	segs[2].ExpiresAt = now.Add(-time.Minute)
	appendAll(e, segs...)
	wantSegments(e, run, 0, now, segs[1], segs[3])
	wantSegments(e, run, 0, at(0), segs...)
}

func testSegmentsRunsIsolated(e *segments) {
	th := e.id("th")
	runA, runB := e.id("run"), e.id("run")
	a := segment(th, runA, 0, "a0", false)
	b0 := segment(th, runB, 0, "b0", false)
	b1 := segment(th, runB, 1, "b1", true)
	appendAll(e, a, b0, b1)
	wantSegments(e, runA, 0, at(0), a)
	wantSegments(e, runB, 0, at(0), b0, b1)
}

// The reaper's final segment ends the stream for every reader: what a fenced writer appends after it (its own
// later segments, even its own "final" one) is never read, from any starting point.
func testSegmentsStopAtFinal(e *segments) {
	th := e.id("th")
	run := e.id("run")
	segs := []agent.Segment{
		segment(th, run, 0, "data: a\n\n", false),
		segment(th, run, 1, "data: reaped\n\n", true),
		segment(th, run, 2, "data: zombie\n\n", false),
		segment(th, run, 3, "data: zombie finish\n\n", true),
	}
	// The zombie's segments land before and after the final one is written: order of writes does not matter.
	appendAll(e, segs[0], segs[2], segs[1], segs[3])
	now := at(time.Minute)
	wantSegments(e, run, 0, now, segs[0], segs[1])
	wantSegments(e, run, 1, now, segs[1])
	wantSegments(e, run, 2, now)
	wantSegments(e, run, 3, now)
}

// Bad segments are refused with the catalog's code, the same in every store, and nothing is stored.
func testSegmentsInvalid(e *segments) {
	th := e.id("th")
	run := e.id("run")
	cases := []struct {
		name string
		seg  agent.Segment
	}{
		{"negative seq", segment(th, run, -1, "data: x\n\n", false)},
		{"negative seq, final", segment(th, run, -5, "data: x\n\n", true)},
		{"no run id", segment(th, "", 0, "data: x\n\n", false)},
	}
	for _, tc := range cases {
		err := e.s.AppendSegment(e.ctx, tc.seg)
		wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidSegment, tc.name+": AppendSegment")
	}
	// A negative from is just "from the start": only the valid segment is there.
	ok := segment(th, run, 0, "data: ok\n\n", false)
	appendAll(e, ok)
	wantSegments(e, run, -10, at(time.Minute), ok)
}
