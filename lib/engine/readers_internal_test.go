package engine

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// hurryStore is the keeper rig's scripted store that also takes the run's stream segments.
type hurryStore struct {
	*keeperStore
	segs chan agent.Segment
}

func (s *hurryStore) AppendSegment(_ context.Context, seg agent.Segment) error {
	s.segs <- seg
	return nil
}

// A keeper answer whose claim says resumed-stream readers are attached (Claim.ReadersUntil ahead) makes the run's
// segments flush on the hurry interval: with the regular flush an hour away, the pending frame is written only
// because of it.
func TestKeeperAnswerWithReadersHurriesTheSegments(t *testing.T) {
	t.Parallel()
	ks := &keeperStore{batches: make(chan keeperCall)}
	hs := &hurryStore{keeperStore: ks, segs: make(chan agent.Segment, 10)}
	r := &keeperRig{t: t, clock: newKeeperClock(), store: ks, runs: map[string]*keeperRun{}}
	r.e = New(Deps{Store: hs, Clock: r.clock}, Config{Heartbeat: keeperBeat, StaleAfter: keeperStale, SegmentFlush: time.Hour, ReaderProbe: -1})
	run := r.start("th")
	out := newOutput(context.Background(), r.e, run.turn.run, io.Discard)
	out.turn = run.turn
	run.turn.outp.Store(out)
	t.Cleanup(func() {
		run.guard.stop()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = out.seg.Close(ctx)
	})
	out.seg.Append([]byte("data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"hi\"}\n\n"))

	c, ok := r.tick()
	if !ok {
		t.Fatal("no batch")
	}
	c.answer <- []agent.KeepResult{{Claim: agent.Claim{RunID: run.turn.run.ID, Epoch: 1, HeartbeatAt: c.now,
		ReadersUntil: c.now.Add(agent.DefaultReaderPresence)}}}
	r.waitArmed()
	r.clock.armed <- struct{}{}
	select {
	case seg := <-hs.segs:
		if seg.Seq != 0 || seg.Final {
			t.Fatalf("hurried segment = %+v", seg)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the segment was not written: the readers in the keeper's answer did not hurry the run's segments")
	}
}
