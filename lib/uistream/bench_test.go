package uistream

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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

// BenchmarkEncoderHTTP measures one text-delta frame written to a real net/http response over loopback, read
// by a client: every frame flushed on its own (a word at a time), or five at a time with EncodeMore (words that
// arrived together).
func BenchmarkEncoderHTTP(b *testing.B) {
	for _, batch := range []int{1, 5} {
		b.Run(fmt.Sprintf("flush every %d", batch), func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				SetHeaders(w.Header())
				e := NewEncoder(w, discardSink{})
				c := TextDelta{ID: "txt_01jb2c3d4e5f6g7h8j9k", Delta: "hello "}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					var err error
					if (i+1)%batch == 0 {
						err = e.Encode(c)
					} else {
						err = e.EncodeMore(c)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
				e.Done()
			}))
			defer srv.Close()
			res, err := srv.Client().Get(srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		})
	}
}
