package segments

import (
	"cmp"
	"context"
	"encoding/json"
	"io"
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
	// DefaultEndGrace is how long a reader waits, once the run is over, for the writer's final segment (written
	// just after the claim is released) before it ends the stream itself.
	DefaultEndGrace = 5 * time.Second
)

// Follower replays a run's stream segments from the start and tails new ones until the run ends. Whatever
// happened to the writer, what it writes always ends with a finish chunk and [DONE]: the final segment when there
// is one, otherwise a synthesized end.
type Follower struct {
	Segments agent.SegmentStore
	Clock    agent.Clock
	// Ended reports whether the run is over (its claim released or moved on). It is asked only after a poll that
	// found nothing new, so it may also do housekeeping, such as reaping a run whose claim went stale (which
	// writes the final segment the next poll then reads).
	Ended func(ctx context.Context) (bool, error)
	// Poll bounds; zero means the defaults above.
	PollMin, PollMax, EndGrace time.Duration
}

// Follow copies the run's stream to w (flush after each batch), starting at segment 0. It returns nil once the
// stream is complete, or the error that stopped it early: the client went away (write error or ctx done), or a
// store read failed before anything was written. started reports whether any byte reached w.
func (f Follower) Follow(ctx context.Context, runID string, w io.Writer, flush func()) (started bool, err error) {
	pollMin := cmp.Or(f.PollMin, DefaultPollMin)
	pollMax := cmp.Or(f.PollMax, DefaultPollMax)
	grace := cmp.Or(f.EndGrace, DefaultEndGrace)
	wait := pollMin
	var next int64
	var endedAt time.Time // when Ended first said yes
	for {
		segs, err := f.Segments.ListSegments(ctx, runID, next, f.Clock.Now())
		if err != nil {
			return started, err
		}
		for _, seg := range segs {
			if len(seg.Data) > 0 {
				if _, err := w.Write(seg.Data); err != nil {
					return true, err
				}
				started = true
			}
			next = seg.Seq + 1
			if seg.Final {
				flush()
				return true, nil
			}
		}
		if len(segs) > 0 {
			flush()
			wait = pollMin
			continue
		}
		ended, err := f.Ended(ctx)
		if err != nil && ctx.Err() != nil {
			return started, ctx.Err()
		}
		if ended {
			now := f.Clock.Now()
			if endedAt.IsZero() {
				endedAt = now
			}
			if now.Sub(endedAt) >= grace {
				if _, err := w.Write(SynthesizedEnd(runID)); err != nil {
					return true, err
				}
				flush()
				return true, nil
			}
		}
		select {
		case <-ctx.Done():
			return started, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, pollMax)
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
