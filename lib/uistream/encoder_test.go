package uistream

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

var update = flag.Bool("update", false, "rewrite testdata/*.sse golden files")

// recordingSink keeps a copy of every frame it is handed.
type recordingSink struct {
	mu     sync.Mutex
	frames [][]byte
}

func (r *recordingSink) Append(frame []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frames = append(r.frames, bytes.Clone(frame))
}

func (r *recordingSink) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Join(r.frames, nil)
}

// setup returns an encoder writing to a recorder and a recording sink.
func setup(t *testing.T, opts ...EncoderOption) (*Encoder, *httptest.ResponseRecorder, *recordingSink) {
	t.Helper()
	rec := httptest.NewRecorder()
	sink := &recordingSink{}
	return NewEncoder(rec, sink, opts...), rec, sink
}

func encodeAll(t *testing.T, e *Encoder, chunks []Chunk) {
	t.Helper()
	for i, c := range chunks {
		if err := e.Encode(c); err != nil {
			t.Fatalf("chunk %d (%s): %v", i, c.ChunkType(), err)
		}
	}
	e.Done()
}

// The wire format is pinned byte for byte: golden files are reviewed by eye and parsed by the AI SDK in
// aisdktest. Run `go test ./lib/uistream -run TestGolden -update` after an intended change.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			e, rec, sink := setup(t)
			encodeAll(t, e, s.chunks)
			got := rec.Body.Bytes()
			if !bytes.Equal(got, sink.bytes()) {
				t.Fatalf("client and sink received different bytes:\nclient %q\nsink   %q", got, sink.bytes())
			}
			path := filepath.Join("testdata", s.name+".sse")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("stream differs from %s:\ngot:\n%s\nwant:\n%s", path, got, want)
			}
			// Every payload is valid JSON and the stream parses back into the same number of chunks.
			chunks, done, err := ParseFrames(got)
			if err != nil || !done || len(chunks) != len(s.chunks) {
				t.Errorf("ParseFrames: %d chunks, done=%v, err=%v; want %d chunks, done", len(chunks), done, err, len(s.chunks))
			}
		})
	}
}

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	SetHeaders(rec.Header())
	want := map[string]string{
		"Content-Type":                  "text/event-stream",
		"Cache-Control":                 "no-cache",
		"Connection":                    "keep-alive",
		"X-Vercel-Ai-Ui-Message-Stream": "v1",
		"X-Accel-Buffering":             "no",
	}
	for k, v := range want {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
}

func TestEncodeRejectsInvalidChunks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		chunk Chunk
	}{
		{"text-delta without id", TextDelta{Delta: "x"}},
		{"text-start without id", TextStart{}},
		{"reasoning-end without id", ReasoningEnd{}},
		{"tool-input-start without tool name", ToolInputStart{ToolCallID: "c"}},
		{"tool-input-delta without call id", ToolInputDelta{InputTextDelta: "{"}},
		{"tool-input-available with invalid input", ToolInputAvailable{ToolCallID: "c", ToolName: "t", Input: json.RawMessage(`{"a":`)}},
		{"tool-input-error with invalid utf8 input", ToolInputError{ToolCallID: "c", ToolName: "t", Input: json.RawMessage("\"\xff\"")}},
		{"tool-output-available without call id", ToolOutputAvailable{Output: json.RawMessage(`1`)}},
		{"tool-output-available with two values", ToolOutputAvailable{ToolCallID: "c", Output: json.RawMessage(`1 2`)}},
		{"approval without approval id", ToolApprovalRequest{ToolCallID: "c"}},
		{"denied without call id", ToolOutputDenied{}},
		{"data without prefix", Data{Type: "subagent", Data: json.RawMessage(`1`)}},
		{"data with empty name", Data{Type: "data-", Data: json.RawMessage(`1`)}},
		{"finish with an ai@7-only reason", Finish{FinishReason: "interrupted"}},
		{"finish with invalid metadata", Finish{Metadata: json.RawMessage(`{`)}},
		{"start with invalid metadata", Start{MessageID: "m", Metadata: json.RawMessage(`nope`)}},
		{"message-metadata without metadata", MessageMetadata{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, rec, sink := setup(t)
			err := e.Encode(tt.chunk)
			if agent.CodeOf(err) != CodeInvalidChunk || agent.KindOf(err) != agent.KindInternal {
				t.Fatalf("Encode = %v, want an internal %s error", err, CodeInvalidChunk)
			}
			if rec.Body.Len() != 0 || len(sink.bytes()) != 0 || e.Frames() != 0 {
				t.Errorf("an invalid chunk wrote %q to the client and %q to the sink", rec.Body.String(), sink.bytes())
			}
			// The encoder is still usable: the failed chunk left no partial bytes in its buffer.
			if err := e.Encode(StartStep{}); err != nil || rec.Body.String() != "data: {\"type\":\"start-step\"}\n\n" {
				t.Errorf("after the error: Encode = %v, body %q", err, rec.Body.String())
			}
		})
	}
}

func TestEncodeOptionalFieldsOmitted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		chunk Chunk
		want  string
	}{
		{Start{}, `{"type":"start"}`},
		{Finish{}, `{"type":"finish"}`},
		{Data{Type: "data-x"}, `{"type":"data-x","data":null}`},
		{ToolInputAvailable{ToolCallID: "c", ToolName: "t"}, `{"type":"tool-input-available","toolCallId":"c","toolName":"t","input":null}`},
		{ToolOutputAvailable{ToolCallID: "c", Output: json.RawMessage(" [ 1 ,\n 2 ] ")}, `{"type":"tool-output-available","toolCallId":"c","output":[1,2]}`},
	}
	for _, tt := range tests {
		got, err := AppendFrame(nil, tt.chunk)
		if err != nil || string(got) != "data: "+tt.want+"\n\n" {
			t.Errorf("AppendFrame(%#v) = %q, %v; want %q", tt.chunk, got, err, tt.want)
		}
	}
}

// failingWriter accepts okWrites writes, then fails every write.
type failingWriter struct {
	okWrites int
	writes   int
	buf      bytes.Buffer
}

func (f *failingWriter) Write(p []byte) (int, error) {
	f.writes++
	if f.writes > f.okWrites {
		return 0, errors.New("broken pipe")
	}
	return f.buf.Write(p)
}

// A client that disconnects must not stop the stream from reaching the sink: the run goes on and persists.
func TestClientFailureKeepsFeedingSink(t *testing.T) {
	t.Parallel()
	w := &failingWriter{okWrites: 2}
	sink := &recordingSink{}
	e := NewEncoder(w, sink)
	chunks := samples()[0].chunks
	encodeAll(t, e, chunks)

	err := e.ClientErr()
	if agent.CodeOf(err) != CodeClientGone || agent.KindOf(err) != agent.KindUnavailable {
		t.Fatalf("ClientErr = %v, want %s", err, CodeClientGone)
	}
	if w.writes != 3 {
		t.Errorf("client saw %d write attempts, want 3 (no retries after the first failure)", w.writes)
	}
	frames, done, perr := ParseFrames(sink.bytes())
	if perr != nil || !done || len(frames) != len(chunks) {
		t.Errorf("sink got %d frames (done=%v, err=%v), want all %d and [DONE]", len(frames), done, perr, len(chunks))
	}
	if want := sink.frames[0]; !bytes.Equal(w.buf.Bytes()[:len(want)], want) {
		t.Errorf("client received %q, want it to start with %q", w.buf.Bytes(), want)
	}
}

func TestEncoderFlushesEveryFrame(t *testing.T) {
	t.Parallel()
	e, rec, _ := setup(t)
	if err := e.Encode(Start{MessageID: "m"}); err != nil {
		t.Fatal(err)
	}
	if !rec.Flushed {
		t.Error("the response was not flushed after the first frame")
	}
	if e.ClientErr() != nil {
		t.Errorf("ClientErr = %v", e.ClientErr())
	}
}

// bufioLike has a Flush() error method, as bufio.Writer does.
type bufioLike struct {
	bytes.Buffer
	flushes int
}

func (b *bufioLike) Flush() error { b.flushes++; return nil }

func TestEncoderWriters(t *testing.T) {
	t.Parallel()
	t.Run("flush method", func(t *testing.T) {
		t.Parallel()
		w := &bufioLike{}
		e := NewEncoder(w, nil)
		encodeAll(t, e, []Chunk{Start{}, Finish{}})
		if w.flushes != 3 {
			t.Errorf("flushes = %d, want 3", w.flushes)
		}
	})
	t.Run("no client", func(t *testing.T) {
		t.Parallel()
		sink := &recordingSink{}
		e := NewEncoder(nil, sink)
		encodeAll(t, e, []Chunk{Start{}, Finish{}})
		if got := string(sink.bytes()); got != "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"finish\"}\n\ndata: [DONE]\n\n" {
			t.Errorf("sink = %q", got)
		}
		if e.ClientErr() != nil || e.Frames() != 3 {
			t.Errorf("ClientErr = %v, Frames = %d", e.ClientErr(), e.Frames())
		}
	})
}

func TestEncodeAfterDone(t *testing.T) {
	t.Parallel()
	e, rec, _ := setup(t)
	e.Done()
	e.Done()
	if err := e.Encode(Finish{}); agent.CodeOf(err) != CodeStreamDone {
		t.Errorf("Encode after Done = %v, want %s", err, CodeStreamDone)
	}
	if rec.Body.String() != DoneFrame {
		t.Errorf("body = %q, want a single [DONE]", rec.Body.String())
	}
}

// Tool goroutines emit concurrently; frames must never interleave.
func TestEncoderConcurrentUse(t *testing.T) {
	t.Parallel()
	e, rec, sink := setup(t)
	const workers, per = 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range per {
				if err := e.Encode(TextDelta{ID: "t" + string(rune('a'+w)), Delta: strings.Repeat("x", w+1)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	e.Done()
	frames, done, err := ParseFrames(rec.Body.Bytes())
	if err != nil || !done || len(frames) != workers*per {
		t.Fatalf("%d frames, done=%v, err=%v", len(frames), done, err)
	}
	for _, f := range frames {
		var c struct{ ID, Delta string }
		if err := json.Unmarshal(f, &c); err != nil || len(c.Delta) != int(c.ID[1]-'a')+1 {
			t.Fatalf("garbled frame %s", f)
		}
	}
	if !bytes.Equal(rec.Body.Bytes(), sink.bytes()) {
		t.Error("client and sink order differ")
	}
}

// deadlineWriter is an http.ResponseWriter that counts flushes and write deadlines, and records what was
// flushed.
type deadlineWriter struct {
	httptest.ResponseRecorder
	pending   bytes.Buffer
	flushed   bytes.Buffer
	flushes   int
	deadlines []time.Time
}

func (d *deadlineWriter) Write(b []byte) (int, error) { return d.pending.Write(b) }
func (d *deadlineWriter) Flush() {
	d.flushes++
	d.flushed.Write(d.pending.Bytes())
	d.pending.Reset()
}
func (d *deadlineWriter) SetWriteDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

// EncodeMore leaves its frames to the next flush (Encode, Flush, Done), the sink gets them at once, and the
// bytes are those Encode writes.
func TestEncodeMoreFlushesWithTheNextFrame(t *testing.T) {
	t.Parallel()
	w, sink := &deadlineWriter{}, &recordingSink{}
	e := NewEncoder(w, sink)
	chunks := []Chunk{TextStart{ID: "t"}, TextDelta{ID: "t", Delta: "a "}, TextDelta{ID: "t", Delta: "b"}}
	for _, c := range chunks {
		if err := e.EncodeMore(c); err != nil {
			t.Fatal(err)
		}
	}
	if w.flushes != 0 || w.flushed.Len() != 0 || len(sink.frames) != 3 {
		t.Fatalf("after EncodeMore: %d flushes, %q flushed, %d sink frames; want none flushed, 3 in the sink", w.flushes, w.flushed.String(), len(sink.frames))
	}
	e.Flush()
	e.Flush() // nothing left: no flush
	if w.flushes != 1 {
		t.Fatalf("flushes = %d, want 1", w.flushes)
	}
	if err := e.EncodeMore(TextEnd{ID: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Encode(Finish{}); err != nil {
		t.Fatal(err)
	}
	e.Done()
	if w.flushes != 3 || w.pending.Len() != 0 {
		t.Fatalf("flushes = %d, %d bytes unflushed; want 3, 0", w.flushes, w.pending.Len())
	}
	var want bytes.Buffer
	ref := NewEncoder(&want, nil)
	encodeAll(t, ref, append(chunks, TextEnd{ID: "t"}, Finish{}))
	if w.flushed.String() != want.String() || string(sink.bytes()) != want.String() {
		t.Fatalf("client %q\nsink %q\nwant %q", w.flushed.String(), sink.bytes(), want.String())
	}
}

// The write deadline moves once per half timeout, not once per frame, and always leaves a write at least the
// timeout.
func TestWriteDeadlineMovedWhenLow(t *testing.T) {
	t.Parallel()
	w := &deadlineWriter{}
	const timeout = time.Hour // frames written within a test's run are all within half of it
	e := NewEncoder(w, nil, WithClientWriteTimeout(timeout))
	start := time.Now()
	for range 100 {
		if err := e.Encode(TextDelta{ID: "t", Delta: "w "}); err != nil {
			t.Fatal(err)
		}
	}
	if len(w.deadlines) != 1 {
		t.Fatalf("deadline set %d times for 100 frames, want once", len(w.deadlines))
	}
	if d := w.deadlines[0].Sub(start); d < timeout || d > timeout+timeout/2+time.Minute {
		t.Fatalf("deadline %s ahead, want between the timeout and 1.5 times it", d)
	}
	e.Done()
	if last := w.deadlines[len(w.deadlines)-1]; !last.IsZero() {
		t.Fatalf("deadline after Done = %s, want none", last)
	}
}
