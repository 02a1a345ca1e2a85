package segments_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
)

// Cut writes what is pending at once, with no tick (the tickers never fire here) and without waiting for the
// write; with nothing pending it cuts nothing (no empty segment), and after Close it does nothing.
func TestSegmenterCut(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := newTickers()
	written := make(chan agent.Segment, 10)
	seg, err := segments.NewSegmenter(ctx, segments.SegmenterConfig{ThreadID: "th", RunID: "run", Clock: &setClock{t: h0},
		NewTicker: ts.new, Write: func(_ context.Context, s agent.Segment) error { written <- s; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) agent.Segment {
		t.Helper()
		select {
		case s := <-written:
			return s
		case <-ctx.Done():
			t.Fatalf("%s: no segment written", what)
			return agent.Segment{}
		}
	}
	seg.Cut() // nothing pending
	seg.Append(frame(0))
	seg.Append(frame(1))
	seg.Cut()
	if s := next("cut"); s.Seq != 0 || s.Final || string(s.Data) != string(frame(0))+string(frame(1)) {
		t.Fatalf("cut wrote %+v, want segment 0 with both frames", s)
	}
	seg.Append(frame(2))
	if err := seg.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if s := next("close"); s.Seq != 1 || !s.Final || string(s.Data) != string(frame(2)) {
		t.Fatalf("close wrote %+v, want the final segment 1 with the frame appended after the cut", s)
	}
	seg.Cut()
	select {
	case s := <-written:
		t.Fatalf("a cut after close wrote %+v", s)
	default:
	}
}
