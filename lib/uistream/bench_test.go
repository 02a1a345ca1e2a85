package uistream

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

type discardSink struct{}

func (discardSink) Append([]byte) {}

// BenchmarkEncoder measures the per-token cost of the hot path: one text-delta frame to the client and the
// sink.
func BenchmarkEncoder(b *testing.B) {
	e := NewEncoder(io.Discard, discardSink{})
	c := TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: "hello "}
	b.ReportAllocs()
	for b.Loop() {
		if err := e.Encode(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
}

// BenchmarkEncoderToolOutput measures a 4 KiB tool output (raw JSON is validated, not re-encoded).
func BenchmarkEncoderToolOutput(b *testing.B) {
	out, _ := json.Marshal(map[string]string{"text": string(make([]byte, 4096))})
	e := NewEncoder(io.Discard, discardSink{})
	c := ToolOutputAvailable{ToolCallID: "call_1", Output: out}
	b.ReportAllocs()
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		if err := e.Encode(c); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "chunks/s")
}

// BenchmarkEncoderSegmenter adds the Segmenter as sink (segments written to a no-op store).
func BenchmarkEncoderSegmenter(b *testing.B) {
	s, err := NewSegmenter(context.Background(), SegmenterConfig{
		ThreadID: "th", RunID: "run",
		Write:    func(context.Context, agent.Segment) error { return nil },
		Clock:    agent.SystemClock{},
		Interval: 10 * time.Millisecond,
	})
	if err != nil {
		b.Fatal(err)
	}
	e := NewEncoder(io.Discard, s)
	c := TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: "hello "}
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
