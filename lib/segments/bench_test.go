package segments_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/uistream"
)

// BenchmarkEncoderSegmenter adds the Segmenter as sink (segments written to a no-op store).
func BenchmarkEncoderSegmenter(b *testing.B) {
	s, err := segments.NewSegmenter(context.Background(), segments.SegmenterConfig{
		ThreadID: "th", RunID: "run",
		Write:    func(context.Context, agent.Segment) error { return nil },
		Clock:    agent.SystemClock{},
		Interval: 10 * time.Millisecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	e := uistream.NewEncoder(io.Discard, s)
	c := uistream.TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: "hello "}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Encode(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
	b.StopTimer()
	if err := s.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(s.Stats().Segments), "segments")
}
