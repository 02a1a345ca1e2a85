package engine

import (
	"context"
	"encoding/json"
	"io"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// output fans every chunk out to the client (best effort: a gone client is ignored, the run goes on) and to
// the run's stream segments (flushed at least every SegmentFlush, at step ends and at close).
type output struct {
	ctx context.Context
	e   *Engine
	run agent.Run
	enc *uistream.Encoder
	seg *uistream.Segmenter
}

func newOutput(ctx context.Context, e *Engine, run agent.Run, client io.Writer) *output {
	o := &output{ctx: ctx, e: e, run: run}
	seg, err := uistream.NewSegmenter(ctx, uistream.SegmenterConfig{ThreadID: run.ThreadID, RunID: run.ID,
		Write: e.store.AppendSegment, Clock: e.clock, Interval: e.cfg.SegmentFlush, Logger: e.log})
	if err != nil {
		// Only a configuration bug gets here; stream to the client without persistence rather than not at all.
		e.log.Error("segmenter", "thread_id", run.ThreadID, "run_id", run.ID, "err", err)
		o.enc = uistream.NewEncoder(client, nil)
		return o
	}
	o.seg = seg
	o.enc = uistream.NewEncoder(client, seg)
	return o
}

// send encodes c for the client and the segments.
func (o *output) send(c uistream.Chunk) {
	if err := o.enc.Encode(c); err != nil {
		o.e.log.Error("encode chunk", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "type", c.ChunkType(), "err", err)
	}
}

// flush waits until every chunk sent so far is in the store (called at step ends).
func (o *output) flush() {
	if o.seg == nil {
		return
	}
	if err := o.seg.Flush(o.ctx); err != nil {
		o.e.log.Warn("flush segments", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "err", err)
	}
}

// close ends the stream with [DONE] and writes the final segment.
func (o *output) close() {
	o.enc.Done()
	if o.seg == nil {
		return
	}
	if err := o.seg.Close(o.ctx); err != nil {
		o.e.log.Warn("close segments", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "err", err)
	}
}

// metadataJSON marshals server-authored metadata; the values are plain structs and cannot fail.
func metadataJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("engine: metadata: " + err.Error())
	}
	return b
}
