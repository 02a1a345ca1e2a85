package segments

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream"
)

// Reader bounds (DESIGN.md principle 6).
const (
	// DefaultPollMin is the first wait after a poll that found nothing new; each empty poll doubles it.
	DefaultPollMin = 100 * time.Millisecond
	// DefaultPollMax caps the backoff: a reader of a quiet run costs at most one segment read per PollMax.
	DefaultPollMax = 2 * time.Second
	// DefaultPollAttached is the poll period of a reader that marks its presence (Follower.MarkReader): the run
	// then flushes every segments.DefaultHurryInterval, and the reader's lag is the two together.
	DefaultPollAttached = 50 * time.Millisecond
	// DefaultEndGrace is how long a reader waits, once the run is over, for the writer's final segment (written
	// just after the claim is released) before it ends the stream itself.
	DefaultEndGrace = 5 * time.Second
)

// Follower replays a run's stream segments from the start and tails new ones until the run ends. Whatever
// happened to the writer, what it writes always ends with a finish chunk and [DONE]: the final segment when there
// is one, otherwise a synthesized end.
//
// It follows a run in one of two ways (issue 18 item 4):
//   - Same process: when Hub publishes the run (this process writes it), the reader reads the stored segments
//     below the Segmenter's snapshot, then gets every frame as the run appends it (hub.go). No poll, no presence.
//   - Anywhere else: it polls the store. With MarkReader set it also marks its presence on the run's claim when it
//     attaches and every half of Presence while it stays, and polls every PollAttached; the run, seeing the mark
//     with its heartbeats, flushes every DefaultHurryInterval (Segmenter.Hurry). Without readers nothing of this
//     happens: the presence write is the reader's, and the writer's flush period is unchanged. Once the mark is
//     refused (the run is over) the reader backs off as one without presence does.
type Follower struct {
	Segments agent.SegmentStore
	Clock    agent.Clock
	// Ended reports whether the run is over (its claim released or moved on). It is asked only after a poll that
	// found nothing new, and at most every PollMin..PollMax (backing off while nothing comes), so it may also do
	// housekeeping, such as reaping a run whose claim went stale (which writes the final segment the next poll
	// then reads).
	Ended func(ctx context.Context) (bool, error)
	// Hub, when set, serves a run this process writes from its Segmenter.
	Hub *Hub
	// MarkReader, when set, records the reader's presence on the run's claim until the given time
	// (agent.RunStore.MarkReader for the followed run).
	MarkReader func(ctx context.Context, until time.Time) error
	// Logger reports failed presence marks; nil discards.
	Logger *slog.Logger
	// Poll bounds; zero means the defaults above (Presence: agent.DefaultReaderPresence). A negative Presence
	// turns presence off: the reader never marks itself and polls as one without MarkReader does.
	PollMin, PollMax, PollAttached, EndGrace, Presence time.Duration
}

// Follow copies the run's stream to w (flush after each batch), starting at segment 0. It returns nil once the
// stream is complete, or the error that stopped it early: the client went away (write error or ctx done), or a
// store read failed before anything was written. started reports whether any byte reached w.
func (f Follower) Follow(ctx context.Context, runID string, w io.Writer, flush func()) (started bool, err error) {
	fl := &following{f: f, runID: runID, w: w, flush: flush, timers: agent.TimersOf(f.Clock)}
	if fl.f.Logger == nil {
		fl.f.Logger = slog.New(slog.DiscardHandler)
	}
	if sub := f.Hub.subscribe(runID); sub != nil {
		done, err := fl.live(ctx, sub)
		if done || err != nil {
			return fl.started, err
		}
	}
	err = fl.poll(ctx)
	return fl.started, err
}

// following is one Follow's state: the position in the stream is segment next, of which partial (the bytes a
// live feed delivered of it) went out already.
type following struct {
	f       Follower
	runID   string
	w       io.Writer
	flush   func()
	timers  agent.Timers
	started bool
	next    int64
	partial []byte
}

// write sends b to the reader.
func (fl *following) write(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := fl.w.Write(b); err != nil {
		return err
	}
	fl.started = true
	return nil
}

// segment sends a stored segment, less what a live feed sent of it already; done when it is the final one.
func (fl *following) segment(seg agent.Segment) (done bool, err error) {
	data := seg.Data
	if seg.Seq == fl.next && len(fl.partial) > 0 && bytes.HasPrefix(data, fl.partial) {
		data = data[len(fl.partial):]
	}
	fl.partial = fl.partial[:0]
	if err := fl.write(data); err != nil {
		return false, err
	}
	fl.next = seg.Seq + 1
	return seg.Final, nil
}

// live follows a run published by this process's hub: the stored segments below the snapshot, then the feed.
// done is true when the stream is complete; false with a nil error when the feed ended early and the store
// has the rest.
func (fl *following) live(ctx context.Context, sub *subscription) (done bool, err error) {
	defer sub.cancel()
	for fl.next < sub.from {
		segs, err := fl.f.Segments.ListSegments(ctx, fl.runID, fl.next, fl.f.Clock.Now())
		if err != nil {
			return false, err
		}
		if len(segs) == 0 {
			break // a segment the writer did not store (it lost its claim): the feed has ended or will
		}
		for _, seg := range segs {
			if seg.Seq >= sub.from {
				break
			}
			if done, err := fl.segment(seg); done || err != nil {
				fl.flush()
				return done, err
			}
		}
		if last := segs[len(segs)-1]; last.Seq >= sub.from-1 {
			break
		}
	}
	fl.next = max(fl.next, sub.from)
	for {
		items, end := sub.take()
		for _, it := range items {
			if it.seq != fl.next {
				fl.next, fl.partial = it.seq, fl.partial[:0]
			}
			if err := fl.write(it.data); err != nil {
				return false, err
			}
			fl.partial = append(fl.partial, it.data...)
		}
		if len(items) > 0 {
			fl.flush()
		}
		switch end {
		case subComplete:
			return true, nil
		case subFallback:
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-sub.ready:
		}
	}
}

// poll follows the run in the store.
func (fl *following) poll(ctx context.Context) error {
	f := fl.f
	pollMin := cmp.Or(f.PollMin, DefaultPollMin)
	pollMax := cmp.Or(f.PollMax, DefaultPollMax)
	attached := cmp.Or(f.PollAttached, DefaultPollAttached)
	grace := cmp.Or(f.EndGrace, DefaultEndGrace)
	presence := cmp.Or(f.Presence, agent.DefaultReaderPresence)
	present := f.MarkReader != nil && presence > 0
	var markedAt time.Time // the last presence mark
	idle := pollMin        // the backoff: the wait between Ended checks while nothing comes
	var endedDue time.Time // when Ended is asked next (zero: at the first empty poll)
	var endedAt time.Time  // when Ended first said yes
	for {
		segs, err := f.Segments.ListSegments(ctx, fl.runID, fl.next, f.Clock.Now())
		if err != nil {
			return err
		}
		for _, seg := range segs {
			done, err := fl.segment(seg)
			if err != nil {
				return err
			}
			if done {
				fl.flush()
				return nil
			}
		}
		now := f.Clock.Now()
		if present && (markedAt.IsZero() || now.Sub(markedAt) >= presence/2) {
			markedAt = now
			err := f.MarkReader(ctx, now.Add(presence))
			switch {
			case agent.IsKind(err, agent.KindConflict) || agent.IsKind(err, agent.KindNotFound):
				present = false // the run is over: Ended will see it
			case err != nil && ctx.Err() == nil:
				f.Logger.Warn("mark resumed-stream reader", "run_id", fl.runID, "err", err)
			}
		}
		if len(segs) > 0 {
			fl.flush()
			idle = pollMin
			if !present {
				endedDue = time.Time{} // the first empty poll asks
				continue
			}
			// Data came, so the writer lives: Ended waits while the reader polls on.
			endedDue = now.Add(pollMin)
		} else if !present || !now.Before(endedDue) {
			ended, err := f.Ended(ctx)
			if err != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if ended {
				if endedAt.IsZero() {
					endedAt = now
				}
				if now.Sub(endedAt) >= grace {
					if err := fl.write(SynthesizedEnd(fl.runID)); err != nil {
						return err
					}
					fl.flush()
					return nil
				}
			}
			endedDue = now.Add(idle)
			idle = min(2*idle, pollMax)
		}
		wait := endedDue.Sub(now)
		if present {
			wait = min(wait, attached)
		}
		wait = max(wait, 0)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-fl.timers.After(wait):
		}
	}
}

// SynthesizedEnd ends a stream whose writer never wrote its final segment: the run's status as message
// metadata (the client stops reading at an error chunk, so the metadata goes first), an error, finish, [DONE].
func SynthesizedEnd(runID string) []byte {
	return ErrorEnd(agent.MessageMetadata{RunID: runID, Status: agent.MessageFailed}, "The run ended without finishing its stream.")
}

// ErrorEnd is the tail of a stream that ends in an error: message-metadata (so the client learns the run and its
// status before it stops reading at the error chunk), error, finish, [DONE]. It is the data of a final segment.
func ErrorEnd(md agent.MessageMetadata, message string) []byte {
	meta, err := json.Marshal(md)
	if err != nil {
		panic("segments: metadata: " + err.Error())
	}
	data, err := uistream.Frames(uistream.MessageMetadata{Metadata: meta}, uistream.Error{ErrorText: message},
		uistream.Finish{FinishReason: agent.FinishError, Metadata: meta})
	if err != nil {
		panic("segments: frames: " + err.Error())
	}
	return uistream.AppendDone(data)
}

// AppendFinal appends a final segment holding data after the run's last segment, unless a final one exists.
// Insert-if-absent makes it safe against a racing writer: whoever takes a seq first keeps it, and readers stop
// at the first final segment. A late segment of a writer still running (a fenced run's) that takes the seq
// first makes the append a no-op: the segments from that seq are read again and the final one goes after them
// (REVIEW D8), a few times at most.
func AppendFinal(ctx context.Context, store agent.SegmentStore, clock agent.Clock, threadID, runID string, data []byte) error {
	segs, err := store.ListSegments(ctx, runID, 0, clock.Now())
	if err != nil {
		return err
	}
	var next int64
	for attempt := 0; ; attempt++ {
		for _, s := range segs {
			if s.Final {
				return nil
			}
			next = s.Seq + 1
		}
		now := clock.Now()
		if err := store.AppendSegment(ctx, agent.Segment{ThreadID: threadID, RunID: runID, Seq: next, Data: data, Final: true,
			CreatedAt: now, ExpiresAt: now.Add(agent.SegmentTTL)}); err != nil {
			return err
		}
		if segs, err = store.ListSegments(ctx, runID, next, clock.Now()); err != nil || attempt == finalAttempts-1 {
			return err
		}
	}
}

// finalAttempts bounds AppendFinal's appends when late segments keep taking the seq.
const finalAttempts = 4

// EndOf is the end of a stream for a run that is over but whose own final segment is missing: an error end for
// a failed run (with its safe message), a plain finish otherwise.
func EndOf(run agent.Run) []byte {
	status := run.Status.MessageStatus()
	u := run.Usage
	md := agent.MessageMetadata{RunID: run.ID, Model: run.Model, Usage: &u, Status: status}
	if status == "" || status == agent.MessageFailed {
		md.Status = agent.MessageFailed
		msg := "The run stopped unexpectedly."
		if run.Error != nil && run.Error.Message != "" {
			msg = run.Error.Message
		}
		return ErrorEnd(md, msg)
	}
	meta, err := json.Marshal(md)
	if err != nil {
		panic("segments: metadata: " + err.Error())
	}
	reason := agent.FinishStop
	if run.Status == agent.RunCanceled {
		reason = agent.FinishOther
	}
	data, err := uistream.Frames(uistream.Finish{FinishReason: reason, Metadata: meta})
	if err != nil {
		panic("segments: frames: " + err.Error())
	}
	return uistream.AppendDone(data)
}
