package engine

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// chunk is one UI message stream chunk; map keys marshal sorted, so frames are deterministic.
type chunk map[string]any

var doneFrame = []byte("data: [DONE]\n\n")

func encodeFrames(cs ...chunk) []byte {
	var out []byte
	for _, c := range cs {
		b, err := json.Marshal(c)
		if err != nil {
			panic("engine: encode chunk: " + err.Error())
		}
		out = append(out, "data: "...)
		out = append(out, b...)
		out = append(out, "\n\n"...)
	}
	return out
}

// output fans every frame out to the client (best effort: a gone client is ignored) and to the run's stream
// segments (flushed at least every SegmentFlush, at step ends and at close).
type output struct {
	ctx    context.Context
	e      *Engine
	run    agent.Run
	client io.Writer
	rc     *http.ResponseController

	mu        sync.Mutex
	clientErr error
	pending   []byte
	seq       int64
	closed    bool
	stop      chan struct{}
	wg        sync.WaitGroup
}

func newOutput(ctx context.Context, e *Engine, run agent.Run, client io.Writer) *output {
	o := &output{ctx: ctx, e: e, run: run, client: client, stop: make(chan struct{})}
	if rw, ok := client.(http.ResponseWriter); ok {
		o.rc = http.NewResponseController(rw)
	}
	o.wg.Add(1)
	go o.ticker()
	return o
}

func (o *output) ticker() {
	defer o.wg.Done()
	t := time.NewTicker(o.e.cfg.SegmentFlush)
	defer t.Stop()
	for {
		select {
		case <-o.stop:
			return
		case <-t.C:
			o.flush()
		}
	}
}

// send encodes c and writes it to the client and the pending segment.
func (o *output) send(c chunk) {
	frame := encodeFrames(c)
	o.write(frame)
}

func (o *output) write(frame []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	o.pending = append(o.pending, frame...)
	if o.clientErr == nil {
		if _, err := o.client.Write(frame); err != nil {
			o.clientErr = err
		} else if o.rc != nil {
			if err := o.rc.Flush(); err != nil {
				o.clientErr = err
			}
		}
	}
	if len(o.pending) >= maxSegmentBytes {
		o.flushLocked(false)
	}
}

// maxSegmentBytes bounds one stream segment so it fits any store item comfortably.
const maxSegmentBytes = 256 << 10

func (o *output) flush() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.flushLocked(false)
	}
}

func (o *output) flushLocked(final bool) {
	if len(o.pending) == 0 && !final {
		return
	}
	now := o.e.clock.Now()
	seg := agent.Segment{ThreadID: o.run.ThreadID, RunID: o.run.ID, Seq: o.seq, Data: o.pending, Final: final,
		CreatedAt: now, ExpiresAt: now.Add(agent.SegmentTTL)}
	if err := o.e.store.AppendSegment(o.ctx, seg); err != nil {
		o.e.log.Warn("append segment", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "seq", o.seq, "err", err)
		return // keep the bytes pending; the next flush retries with the same seq
	}
	o.seq++
	o.pending = nil
}

// close ends the stream: [DONE] to the client and, when persist is set, a final segment.
func (o *output) close(persist bool) {
	o.write(doneFrame)
	close(o.stop)
	o.wg.Wait()
	o.mu.Lock()
	defer o.mu.Unlock()
	if persist {
		o.flushLocked(true)
	}
	o.closed = true
}
