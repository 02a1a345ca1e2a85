package uistream

import (
	"encoding/json"
	"io"
	"testing"
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
