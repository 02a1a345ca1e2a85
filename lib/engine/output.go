package engine

import (
	"context"
	"io"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/uistream"
)

// output fans every chunk out to the client (best effort: a gone client is ignored, the run goes on) and to
// the run's stream segments (flushed at least every SegmentFlush, at step ends and at close).
type output struct {
	ctx      context.Context
	e        *Engine
	run      agent.Run
	enc      *uistream.Encoder
	seg      *segments.Segmenter
	detached atomic.Bool // the run lost its claim: nothing more goes to the store
	// released is set once the run's FinishRun succeeded: its claim is let go, and the final segment is written
	// whatever the horizon says (REVIEW D7).
	released atomic.Bool
	// turn, once the run streams, gates every segment write at the claim's horizon (nil before).
	turn *Turn
}

func newOutput(ctx context.Context, e *Engine, run agent.Run, client io.Writer, startSeq ...int64) *output {
	o := &output{ctx: ctx, e: e, run: run}
	var from int64 // a continuation goes on with the segment after the last one stored (handover.go)
	if len(startSeq) > 0 {
		from = startSeq[0]
	}
	seg, err := segments.NewSegmenter(ctx, segments.SegmenterConfig{ThreadID: run.ThreadID, RunID: run.ID, StartSeq: from,
		Write: o.write, Clock: e.clock, Interval: e.cfg.SegmentFlush, HurryInterval: e.cfg.SegmentHurry, Logger: e.log, Hub: e.hub})
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

// write appends a segment unless the run was detached, gated at the claim's horizon with a deadline there.
// Insert-if-absent makes a fenced run's segments unable to overwrite anything, and readers stop at the first
// final segment, so nothing it appends after the reaper's final segment is ever read; detaching just saves the
// writes. Once the run's outcome is stored (released) the final segment goes out whatever the horizon says: the
// run ended well, and its readers must learn it (REVIEW D7).
func (o *output) write(ctx context.Context, s agent.Segment) error {
	if o.detached.Load() {
		return nil
	}
	if o.turn != nil && !o.released.Load() {
		if o.turn.mayWrite() != nil {
			return nil
		}
		actx, cancel := o.turn.attempt(ctx)
		defer cancel()
		ctx = actx
	}
	return o.e.store.AppendSegment(ctx, s)
}

// detach stops writing segments (the run lost its claim), and feeding this process's readers of the run: they go
// on from the store, whose story is the reaper's or the new claim holder's now.
func (o *output) detach() {
	o.detached.Store(true)
	if o.seg != nil {
		o.seg.Unpublish()
	}
}

// readers makes the run's segments flush faster (segments.Segmenter.Hurry) while the claim, as its keeper's
// heartbeat stored it, says resumed-stream readers in other processes are attached (agent.Claim.ReadersUntil,
// which only readers write): a run nobody reads flushes as ever.
func (t *Turn) readers(c agent.Claim, now time.Time) {
	if o := t.outp.Load(); o != nil && o.seg != nil && c.Readers(now) {
		o.seg.Hurry(c.ReadersUntil)
	}
}

// send encodes c for the client and the segments.
func (o *output) send(c uistream.Chunk) {
	if err := o.enc.Encode(c); err != nil {
		o.e.log.Error("encode chunk", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "type", c.ChunkType(), "err", err)
	}
}

// sendMore encodes c as send does but leaves the client's flush to flushClient or the next send: the model's
// next event is at hand (agent.ModelEvent.More).
func (o *output) sendMore(c uistream.Chunk) {
	if err := o.enc.EncodeMore(c); err != nil {
		o.e.log.Error("encode chunk", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "type", c.ChunkType(), "err", err)
	}
}

// flushClient sends the client what sendMore left.
func (o *output) flushClient() { o.enc.Flush() }

// flush waits until every chunk sent so far is in the store (called at step ends).
func (o *output) flush() {
	if o.seg == nil {
		return
	}
	if err := o.seg.Flush(o.ctx); err != nil {
		o.e.log.Warn("flush segments", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "err", err)
	}
}

// close ends the stream with [DONE] and writes the final segment, giving up after the segments' close timeout
// so a store that keeps refusing cannot hold the response open (REVIEW L16).
func (o *output) close() {
	o.enc.Done()
	if o.seg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(o.ctx, o.e.cfg.CloseTimeout)
	defer cancel()
	if err := o.seg.Close(ctx); err != nil {
		o.e.log.Warn("close segments", "thread_id", o.run.ThreadID, "run_id", o.run.ID, "err", err)
	}
}
