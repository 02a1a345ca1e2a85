package segments_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/segments"
)

// A reader attaching to a run in another process (issue 18 item 4) gets what is stored at once, before any wait,
// marks its presence right then (so the run's keeper probe can find it), and its first wait is already the
// attached poll period: nothing holds the first words back on the reader's side.
func TestFollowerAttachReadsAtOnceAndPollsFast(t *testing.T) {
	t.Parallel()
	for _, stored := range []int{0, 2} {
		t.Run(map[int]string{0: "nothing stored yet", 2: "two segments stored"}[stored], func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			store := newNotifyStore(t)
			var want []byte
			for seq := range stored {
				if err := store.AppendSegment(ctx, agent.Segment{ThreadID: "th", RunID: "run", Seq: int64(seq), Data: frame(seq),
					CreatedAt: h0, ExpiresAt: h0.Add(agent.SegmentTTL)}); err != nil {
					t.Fatal(err)
				}
				want = append(want, frame(seq)...)
			}
			clock := &stepClock{setClock: setClock{t: h0}, waits: make(chan time.Duration), pass: make(chan struct{})}
			var (
				mu    sync.Mutex
				marks []time.Time
			)
			f := segments.Follower{Segments: store, Clock: clock,
				Ended: func(context.Context) (bool, error) { return false, nil },
				MarkReader: func(_ context.Context, until time.Time) error {
					mu.Lock()
					defer mu.Unlock()
					marks = append(marks, clock.Now())
					return nil
				}}
			var out bytes.Buffer
			done := make(chan error, 1)
			go func() { _, err := f.Follow(ctx, "run", &out, func() {}); done <- err }()

			first := <-clock.waits // the reader waits for the first time: what it did before is done
			mu.Lock()
			marked := append([]time.Time(nil), marks...)
			mu.Unlock()
			if !bytes.Equal(out.Bytes(), want) {
				t.Errorf("before its first wait the reader wrote %q, want what is stored %q", out.Bytes(), want)
			}
			if len(marked) != 1 || !marked[0].Equal(h0) {
				t.Errorf("presence marks before the first wait at %v, want one at the attach (%s)", marked, h0)
			}
			if first > segments.DefaultPollAttached {
				t.Errorf("first wait %s, want at most the attached poll %s", first, segments.DefaultPollAttached)
			}
			cancel()
			clock.pass <- struct{}{}
			for {
				select {
				case <-clock.waits:
					clock.pass <- struct{}{}
				case <-done:
					return
				}
			}
		})
	}
}
