package engine

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// probeStore is the keeper rig's scripted store that also hands every reader probe (ReadersOf) to the test and
// takes the runs' stream segments.
type probeStore struct {
	*keeperStore
	probes chan probeCall
	segs   chan agent.Segment
}

type probeCall struct {
	ctx     context.Context
	threads []string
	answer  chan probeAnswer
}

type probeAnswer struct {
	marks []agent.ReaderMark
	err   error
}

func (s *probeStore) ReadersOf(ctx context.Context, threadIDs []string) ([]agent.ReaderMark, error) {
	c := probeCall{ctx: ctx, threads: threadIDs, answer: make(chan probeAnswer)}
	s.probes <- c
	a := <-c.answer
	return a.marks, a.err
}

func (s *probeStore) AppendSegment(_ context.Context, seg agent.Segment) error {
	s.segs <- seg
	return nil
}

const probePeriod = 100 * time.Millisecond

// probeRig is a keeper rig whose engine probes for readers every probePeriod. Its Heartbeat is an hour, so the
// clock's armed signals after the first two (the batch loop's and the probe loop's) are the probe loop's alone;
// the runs' segments flush only when something cuts them (SegmentFlush and SegmentHurry are an hour too).
type probeRig struct {
	*keeperRig
	ps   *probeStore
	outs map[string]*output
}

func newProbeRig(t *testing.T, threads ...string) *probeRig {
	ks := &keeperStore{batches: make(chan keeperCall)}
	ps := &probeStore{keeperStore: ks, probes: make(chan probeCall), segs: make(chan agent.Segment, 10)}
	r := &probeRig{keeperRig: &keeperRig{t: t, clock: newKeeperClock(), store: ks, runs: map[string]*keeperRun{}}, ps: ps, outs: map[string]*output{}}
	r.e = New(Deps{Store: ps, Clock: r.clock}, Config{Heartbeat: time.Hour, StaleAfter: 10 * time.Hour,
		SegmentFlush: time.Hour, SegmentHurry: time.Hour, ReaderProbe: probePeriod})
	for _, th := range threads {
		run := r.start(th)
		out := newOutput(context.Background(), r.e, run.turn.run, io.Discard)
		out.turn = run.turn
		run.turn.outp.Store(out)
		r.outs[th] = out
		out.seg.Append(frame(th + "-1"))
		t.Cleanup(func() {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = out.seg.Close(ctx)
		})
	}
	t.Cleanup(func() {
		for _, run := range r.runs {
			run.guard.stop()
		}
	})
	r.waitArmed() // the batch loop's first wait
	r.waitArmed() // the probe loop's
	return r
}

func frame(word string) []byte {
	return []byte(`data: {"type":"text-delta","id":"t","delta":"` + word + `"}` + "\n\n")
}

// probe moves the clock on one probePeriod and returns the probe the keeper sends then.
func (r *probeRig) probe() probeCall {
	r.t.Helper()
	r.clock.add(probePeriod)
	select {
	case c := <-r.ps.probes:
		return c
	case <-time.After(10 * time.Second):
		r.t.Fatal("no reader probe after a probe period")
		return probeCall{}
	}
}

// answer answers c and waits until the probe loop waits again (so the answer has been applied).
func (r *probeRig) answer(c probeCall, a probeAnswer) {
	r.t.Helper()
	c.answer <- a
	r.waitArmed()
}

// closeSeg closes th's Segmenter and returns the segments it wrote from then on (the final one last).
func (r *probeRig) closeSeg(th string) []agent.Segment {
	r.t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.outs[th].seg.Close(context.Background()) }()
	var got []agent.Segment
	for {
		select {
		case s := <-r.ps.segs:
			got = append(got, s)
			if s.Final {
				if err := <-done; err != nil {
					r.t.Fatalf("%s: close: %v", th, err)
				}
				return got
			}
		case <-time.After(10 * time.Second):
			r.t.Fatalf("%s: no final segment", th)
			return nil
		}
	}
}

// One probe per probe period reads every run's reader mark in one store call; a run whose claim carries a live
// mark for it is hurried and what it appended is cut and written at once (here the only way it can be: both
// flush periods are an hour), once: the same mark seen again cuts nothing more. A mark for another run, or one
// that lapsed, hurries nothing. The probe is no heartbeat: no run's horizon moves and no batch goes out.
func TestKeeperProbeHurriesRunsWithReaders(t *testing.T) {
	t.Parallel()
	r := newProbeRig(t, "th-c", "th-a", "th-b")
	claimed := r.runs["th-a"].turn.goodAt()
	c := r.probe()
	if want := []string{"th-a", "th-b", "th-c"}; !slices.Equal(c.threads, want) {
		t.Fatalf("probe read %v, want every run's thread in one call: %v", c.threads, want)
	}
	now := r.clock.Now()
	r.answer(c, probeAnswer{marks: []agent.ReaderMark{
		{ThreadID: "th-a", RunID: "run-th-a", Until: now.Add(5 * time.Second)},
		{ThreadID: "th-b", RunID: "run-other", Until: now.Add(5 * time.Second)}, // another run's claim
		{ThreadID: "th-c", RunID: "run-th-c", Until: now},                       // lapsed
	}})
	select {
	case s := <-r.ps.segs:
		if s.ThreadID != "th-a" || s.Seq != 0 || s.Final || string(s.Data) != string(frame("th-a-1")) {
			t.Fatalf("segment written on the probe = %+v, want th-a's pending frame as segment 0", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the probe saw th-a's reader and its pending frame was not written")
	}
	for th, run := range r.runs {
		if got := run.turn.goodAt(); !got.Equal(claimed) {
			t.Fatalf("%s: claim known good at %s after a probe, want %s (a probe is no heartbeat)", th, got, claimed)
		}
	}

	// The same mark again: th-a is hurried already; nothing is cut.
	r.outs["th-a"].seg.Append(frame("th-a-2"))
	c = r.probe()
	r.answer(c, probeAnswer{marks: []agent.ReaderMark{{ThreadID: "th-a", RunID: "run-th-a", Until: now.Add(5 * time.Second)},
		{ThreadID: "th-b"}, {ThreadID: "th-c"}}})
	select {
	case b := <-r.store.batches:
		t.Fatalf("a probe sent a heartbeat batch %v", threadsOf(b))
	default:
	}
	for th, want := range map[string][]agent.Segment{
		"th-a": {{Seq: 1, Data: frame("th-a-2"), Final: true}},
		"th-b": {{Seq: 0, Data: frame("th-b-1"), Final: true}},
		"th-c": {{Seq: 0, Data: frame("th-c-1"), Final: true}},
	} {
		got := r.closeSeg(th)
		if len(got) != len(want) || got[0].Seq != want[0].Seq || string(got[0].Data) != string(want[0].Data) || !got[0].Final {
			t.Fatalf("%s: segments at close = %+v, want only the final one %+v (nothing cut by the probes)", th, got, want)
		}
	}
}

// A probe that fails is dropped, and one slower than a Heartbeat is cut at the Heartbeat: neither hurries
// anything, neither is asked again, and the next probe goes one probe period after it ended (probes never queue
// behind one another), and hurries as ever.
func TestKeeperProbeFailedOrSlowIsDropped(t *testing.T) {
	t.Parallel()
	r := newProbeRig(t, "th")
	c := r.probe()
	r.answer(c, probeAnswer{err: agent.E(agent.KindUnavailable, agent.CodeStoreUnavailable, "busy")})

	c = r.probe()
	r.clock.add(time.Hour) // the Heartbeat: the batch loop sends its batch, and the probe is cut
	if err := context.Cause(c.ctx); !errors.Is(err, errProbeSlow) {
		t.Fatalf("a probe pending a Heartbeat: context %v, want cut with errProbeSlow", err)
	}
	select {
	case b := <-r.store.batches:
		b.answer <- []agent.KeepResult{{}}
		r.waitArmed() // the batch loop waits again
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat batch at the Heartbeat")
	}
	select {
	case again := <-r.ps.probes:
		t.Fatalf("a second probe %v while the first was pending", again.threads)
	default:
	}
	r.answer(c, probeAnswer{err: context.Cause(c.ctx)})

	c = r.probe()
	r.answer(c, probeAnswer{marks: []agent.ReaderMark{{ThreadID: "th", RunID: "run-th", Until: r.clock.Now().Add(time.Second)}}})
	select {
	case s := <-r.ps.segs:
		if s.Seq != 0 || string(s.Data) != string(frame("th-1")) {
			t.Fatalf("segment = %+v, want the pending frame as segment 0", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the probe after a failed and a slow one did not hurry the run")
	}
	select {
	case again := <-r.ps.probes:
		t.Fatalf("a probe %v queued behind the slow one", again.threads)
	default:
	}
}
