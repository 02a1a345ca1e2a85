package uistream

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Sink receives every encoded frame, in order. frame is only valid during the call: a sink that keeps it must
// copy it. Append must not block for long; the Segmenter only copies into a buffer.
type Sink interface {
	Append(frame []byte)
}

// DefaultClientWriteTimeout bounds one write to the client. A client that stops reading (without closing)
// would otherwise stall the run on a full TCP window; after the timeout it is treated as gone. The connection's
// deadline is moved only when less than the timeout is left of it, to 1.5 times the timeout ahead (once per
// half timeout, rather than once per frame: issue 18), so a write fails after between 1 and 1.5 timeouts.
const DefaultClientWriteTimeout = 10 * time.Second

// CodeClientGone is the code of ClientErr: the client connection failed, the stream goes on for the sink.
const CodeClientGone = agent.CodeClientGone

// CodeStreamDone is the code of the error returned by Encode after Done.
const CodeStreamDone = agent.CodeStreamDone

// EncoderOption configures an Encoder.
type EncoderOption func(*Encoder)

// WithClientWriteTimeout sets the per-write deadline on the client connection (when the writer supports
// deadlines, as net/http's does; see DefaultClientWriteTimeout). d <= 0 disables it.
func WithClientWriteTimeout(d time.Duration) EncoderOption {
	return func(e *Encoder) { e.writeTimeout = d }
}

// Encoder writes UI message stream frames to a client and to a Sink. It is safe for concurrent use (tool
// goroutines may emit their results); frames are written whole and in the order Encode calls acquire the
// encoder.
//
// The client side is best effort: after the first failed write (client disconnected, write timeout) the
// encoder stops writing to the client, records the error (ClientErr) and keeps feeding the sink, because the
// run continues and its stream must be persisted for resume.
type Encoder struct {
	mu           sync.Mutex
	w            io.Writer
	flush        func() error
	setDeadline  func(time.Time) error
	writeTimeout time.Duration
	deadline     time.Time // the connection's write deadline as last set
	unflushed    bool      // EncodeMore wrote frames that no flush has sent yet
	sink         Sink
	buf          []byte
	clientErr    error
	done         bool
	frames       int64
}

// NewEncoder returns an encoder writing to w and sink; either may be nil (a server-side turn has no client;
// a test may want no sink). When w is an http.ResponseWriter every frame is flushed at once through
// http.ResponseController (and guarded by a write deadline); otherwise a Flush() error or http.Flusher method
// of w is used when present. Set the response headers (SetHeaders) before the first Encode.
func NewEncoder(w io.Writer, sink Sink, opts ...EncoderOption) *Encoder {
	e := &Encoder{w: w, sink: sink, writeTimeout: DefaultClientWriteTimeout, buf: make([]byte, 0, 512)}
	for _, o := range opts {
		o(e)
	}
	switch f := w.(type) {
	case http.ResponseWriter:
		rc := http.NewResponseController(f)
		e.flush = rc.Flush
		e.setDeadline = rc.SetWriteDeadline
	case interface{ Flush() error }:
		e.flush = f.Flush
	case http.Flusher:
		e.flush = func() error { f.Flush(); return nil }
	}
	return e
}

// Encode writes the frame of c, and flushes it (with any frame EncodeMore left) to the client. It fails only
// for an invalid chunk (nothing is written then) or after Done; a client failure is not an error of Encode (see
// ClientErr).
func (e *Encoder) Encode(c Chunk) error { return e.encode(c, true) }

// EncodeMore writes the frame of c as Encode does but leaves it in the client's write buffer: the caller has
// another frame at hand and sends it at once (issue 18: one write for words that arrived together). The next
// Encode, Flush or Done sends it; the sink gets it now.
func (e *Encoder) EncodeMore(c Chunk) error { return e.encode(c, false) }

// Flush sends the frames EncodeMore left to the client; nothing when there are none.
func (e *Encoder) Flush() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.unflushed {
		e.flushClient()
	}
}

func (e *Encoder) encode(c Chunk, flush bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return agent.E(agent.KindInternal, CodeStreamDone, "%s chunk after the end of the stream", c.ChunkType())
	}
	buf, err := AppendFrame(e.buf[:0], c)
	e.buf = buf
	if err != nil {
		return err
	}
	e.emit(buf, flush)
	return nil
}

// Done writes the final [DONE] frame. Later calls are no-ops; later Encode calls fail.
func (e *Encoder) Done() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done {
		return
	}
	e.done = true
	e.emit([]byte(DoneFrame), true)
	if e.setDeadline != nil && e.clientErr == nil {
		// The deadline is the connection's, not this response's: left set, it would fail the response's own end
		// (written when the handler returns, after the run's outcome and its slot are stored) once that work
		// outlasts the write timeout, and any later keep-alive request on the connection.
		_ = e.setDeadline(time.Time{})
	}
}

// ClientErr reports why the client stopped receiving frames (an *agent.Error with CodeClientGone), or nil
// while it still does.
func (e *Encoder) ClientErr() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.clientErr
}

// Frames reports how many frames were encoded, [DONE] included.
func (e *Encoder) Frames() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.frames
}

// emit hands frame to the sink first (persistence is what resume relies on), then to the client, flushed
// when flush is set.
func (e *Encoder) emit(frame []byte, flush bool) {
	e.frames++
	if e.sink != nil {
		e.sink.Append(frame)
	}
	if e.w == nil || e.clientErr != nil {
		return
	}
	if e.setDeadline != nil && e.writeTimeout > 0 {
		// A connection deadline is wall-clock time by nature (the net package compares it with the system
		// clock), so no injected clock here.
		if now := time.Now(); e.deadline.Sub(now) < e.writeTimeout {
			e.deadline = now.Add(e.writeTimeout + e.writeTimeout/2)
			if err := e.setDeadline(e.deadline); errors.Is(err, http.ErrNotSupported) {
				e.setDeadline = nil
			}
		}
	}
	if _, err := e.w.Write(frame); err != nil {
		e.clientErr = agent.Wrap(err, agent.KindUnavailable, CodeClientGone, "write to client")
		return
	}
	e.unflushed = true
	if flush {
		e.flushClient()
	}
}

// flushClient sends what the client's writer holds.
func (e *Encoder) flushClient() {
	e.unflushed = false
	if e.clientErr != nil {
		return
	}
	if e.flush != nil {
		if err := e.flush(); err != nil {
			if errors.Is(err, http.ErrNotSupported) {
				e.flush = nil
				return
			}
			e.clientErr = agent.Wrap(err, agent.KindUnavailable, CodeClientGone, "flush to client")
		}
	}
}
