package sim

// Stream readers (issue 16, "Tests": every reader ends with finish; a stopped run ends canceled).
//
// A reader is what GET /threads/{id}/stream runs (lib/httpapi resumeStream): threads.Service.Attach, which reads
// the thread's active claim and follows that run's stream segments (segments.Follower) from the first one until
// the final one, asking whether the run ended after every poll that found nothing new (and reaping a run whose
// claim went stale on the way, which writes the final segment), and synthesizing an end once the run is over and
// no final segment came within EndGrace. In the sim a reader is a process of its own, attached while a run holds
// the thread's claim, and it stays deterministic the way the others do: every poll of its segments
// (ListSegments) is a handoff to the scheduler, so it reads while the writer streams, crashes, is stopped,
// fenced or reaped, and one poll happens per grant, in the seed's order. Its poll waits are a microsecond of
// real time (nothing happens between two polls but its own calls); its EndGrace is a millisecond of virtual
// time (the drain moves the clock on once only waiting processes are left); it takes no stream leases (their
// renewal ticks in real time; lib/threads tests the leases). Readers are drawn from a stream of their own, not
// in the seeds of the regression lists (they keep the schedules they were found with).
//
// The invariant stream-reader, for every reader whose Attach followed a run to its end:
//   - the stream is whole: it ends with a finish chunk and [DONE], and an error chunk is followed only by finish;
//   - unless it ended with the synthesized end (no final segment within EndGrace), its finish names the run and
//     says the run's stored outcome (a stopped run: canceled), or, for a continuation with nothing to do, the
//     stored reply's metadata;
//   - the text it saw is a prefix of the run's stored reply text (for a continuation, which streams only what it
//     adds to the reply it continues: a part of it), unless the reply is gone (an edit, a delete).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/transcript"
	"github.com/agentloop/agentloop/lib/uistream"
)

// readerIDs offsets readers' process ids, so that other processes keep the ids (and the fates) they had.
const readerIDs = 100_000

// readerState is what the schedule knows of its readers.
type readerState struct {
	rng  *rand.Rand // nil: the schedule has none
	n    int
	list []*simReader
}

// simReader is one GET /threads/{id}/stream.
type simReader struct {
	p        *proc
	threadID string
	run      string // the run whose claim the reader found (Attach reads the same claim first)
	out      bytes.Buffer
	active   bool
	err      error
	done     bool
}

// foundWithReaders are the seeds of regressions found with readers; the other regressions keep the schedules
// they were found with (no readers).
var foundWithReaders = []uint64{449, 688, 8590996860698516015, 7959872465901649856}

// initReaders gives the schedule readers, unless its seed names a schedule found before readers existed.
func (w *world) initReaders() {
	if slices.Contains(drawnBeforeJobs, w.seed) || slices.Contains(regressions, w.seed) && !slices.Contains(foundWithReaders, w.seed) {
		return
	}
	for _, kb := range knownBugs {
		if kb.seed == w.seed {
			return
		}
	}
	w.readers.rng = rand.New(rand.NewPCG(w.seed, 0x7265616465))
}

// maybeAttach is drawn before each step: now and then a reader attaches to a thread whose claim a run holds.
func (w *world) maybeAttach() error {
	r := w.readers.rng
	if r == nil || r.IntN(10) != 0 {
		return nil
	}
	type held struct {
		th  *simThread
		run string
	}
	var hs []held
	for _, th := range w.threads {
		if c, ok := w.claimOf(th.id); ok && c != nil && !strings.HasPrefix(c.RunID, "reap:") {
			hs = append(hs, held{th, c.RunID})
		}
	}
	if len(hs) == 0 {
		return nil
	}
	h := hs[r.IntN(len(hs))]
	return w.attachReader(h.th, h.run)
}

// newReader is a reader's process: no crash (the invariants are of whole streams), faults on its writes (a
// reader reaps a stale run) like any process's, drawn from the readers' stream.
func (w *world) newReader() *proc {
	w.mu.Lock()
	w.readers.n++
	id := readerIDs + w.readers.n
	w.mu.Unlock()
	p := &proc{w: w, id: id, kind: "reader", name: "reader#" + itoa(id), resume: make(chan struct{}), uwResume: make(chan struct{}),
		uwArrived: make(chan struct{}), consecFaults: map[string]int{}, armed: map[callKind]bool{}, awaitSettle: map[callKind]bool{}}
	p.rng = rand.New(rand.NewPCG(w.seed, uint64(id)))
	p.faultRng = rand.New(rand.NewPCG(w.seed^0x737472656b, uint64(id)))
	p.maxStreak = 2
	if w.readers.rng.Float64() < w.plan.faultyProcs {
		p.faultRate, p.lostFrac = w.plan.faultRate, w.plan.lostFrac
	}
	p.drawRequestFaults(false)
	p.store = &procStore{Store: w.base, p: p}
	var js agent.Jobs
	if w.jobsOn {
		js = w.jobs
	}
	p.reaper = reaper.New(reaper.Deps{Store: p.store, Tools: w.toolset(p), Jobs: js, Clock: w.clock},
		reaper.Config{StaleAfter: w.ecfg.StaleAfter, DeliveryGrace: w.contract.DeliveryGrace})
	p.svc = threads.New(threads.Deps{Store: p.store, Reaper: p.reaper, Clock: readerClock{w.clock}}, threads.Config{StaleAfter: w.ecfg.StaleAfter,
		// Presence off: the readers poll as they did before issue 18 (a presence mark is a reader's write outside
		// the scheduler's park points, and the faster flush it asks for is the writer's timing, not its story).
		Follow: segments.Follower{PollMin: time.Microsecond, PollMax: time.Microsecond, EndGrace: time.Millisecond,
			Presence: -1},
		MaxStreamsPerUser: -1, MaxStreamsPerRun: -1})
	w.mu.Lock()
	w.procs = append(w.procs, p)
	w.mu.Unlock()
	if p.faultRate > 0 {
		w.tracef("  %s: faultRate=%.2f", p.name, p.faultRate)
	}
	return p
}

// readerClock is a reader's clock: the virtual clock's time, and a follower's poll waits pass at once (the
// scheduler orders the polls themselves: readerPoll parks each one).
type readerClock struct{ *vclock }

func (readerClock) After(time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

func (w *world) attachReader(th *simThread, runID string) error {
	p := w.newReader()
	rd := &simReader{p: p, threadID: th.id, run: runID}
	w.mu.Lock()
	w.readers.list = append(w.readers.list, rd)
	w.mu.Unlock()
	w.tracef("%s: attach to %s (run %s)", p.name, th.id, runID)
	return w.start(p, func() {
		ctx := context.WithValue(withPhase(context.Background(), phaseOp), procKey{}, p)
		var out bytes.Buffer
		active, err := p.svc.Attach(ctx, w.owner, th.id, func() {}, &out, func() {})
		w.mu.Lock()
		rd.out, rd.active, rd.err, rd.done = out, active, err, true
		w.mu.Unlock()
		w.tracef("  %s: attach -> active=%v %d bytes %s", p.name, active, out.Len(), errStr(err))
	})
}

// readerPoll parks a reader before each poll of its segments: a handoff to the scheduler. False: the schedule
// is over.
func (p *proc) readerPoll(runID string, from int64) bool {
	if p.kind != "reader" || !calledByFollow() {
		return true // not a reader's poll (a reap's read of the segments it ends, say)
	}
	if !p.parkMain("poll") {
		return false
	}
	p.w.tracef("  %s: poll %s from %d", p.name, runID, from)
	return true
}

// calledByFollow reports whether the caller of procStore.ListSegments is segments.Follower.Follow (its store poll,
// or the stored part of a same-process reader's replay).
func calledByFollow() bool {
	var pcs [8]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		if !strings.Contains(f.Function, "internal/sim.") {
			return f.Function == "github.com/agentloop/agentloop/lib/segments.(*following).poll" ||
				f.Function == "github.com/agentloop/agentloop/lib/segments.(*following).live"
		}
		if !more {
			return false
		}
	}
}

// reportsRun reports whether md names a run of the thread and says that run's stored outcome.
func (w *world) reportsRun(ctx context.Context, threadID string, md agent.MessageMetadata) bool {
	named, err := w.base.GetRun(ctx, threadID, md.RunID)
	return err == nil && md.Status == named.Status.MessageStatus()
}

// chunk is the part of a stream chunk the checks read.
type chunk struct {
	Type            string          `json:"type"`
	Delta           string          `json:"delta"`
	MessageMetadata json.RawMessage `json:"messageMetadata"`
}

// checkReaders is the invariant stream-reader (after the quiesce).
func (w *world) checkReaders(ctx context.Context) {
	w.mu.Lock()
	list := slices.Clone(w.readers.list)
	w.mu.Unlock()
	for _, rd := range list {
		if !rd.done || !rd.active || rd.err != nil {
			continue // no run to attach to (204), or the read ended early (a store read failed)
		}
		who := fmt.Sprintf("%s (thread %s, run %s)", rd.p.name, rd.threadID, rd.run)
		raws, done, err := uistream.ParseFrames(rd.out.Bytes())
		if err != nil || !done || len(raws) == 0 {
			w.violate("stream-reader", "%s: the stream is not whole (done=%v, %d chunks, %v)", who, done, len(raws), err)
			continue
		}
		cs := make([]chunk, len(raws))
		for i, raw := range raws {
			if err := json.Unmarshal(raw, &cs[i]); err != nil {
				w.violate("stream-reader", "%s: chunk %d: %v", who, i, err)
			}
		}
		last := cs[len(cs)-1]
		if last.Type != "finish" {
			w.violate("stream-reader", "%s: the stream ends with %q, not finish", who, last.Type)
			continue
		}
		if i := slices.IndexFunc(cs, func(c chunk) bool { return c.Type == "error" }); i >= 0 && i != len(cs)-2 {
			w.violate("stream-reader", "%s: an error chunk at %d of %d is not followed by finish alone", who, i, len(cs))
		}
		var text strings.Builder
		for _, c := range cs {
			if c.Type == "text-delta" {
				text.WriteString(c.Delta)
			}
		}
		run, err := w.base.GetRun(ctx, rd.threadID, rd.run)
		if err != nil {
			continue // the thread was deleted since
		}
		var md agent.MessageMetadata
		_ = json.Unmarshal(last.MessageMetadata, &md)
		synth := bytes.HasSuffix(rd.out.Bytes(), segments.SynthesizedEnd(rd.run))
		rec, recErr := w.base.GetMessage(ctx, rd.threadID, run.AssistantMessageID)
		switch want := run.Status.MessageStatus(); {
		case synth:
		case run.Trigger == agent.TriggerContinuation && run.Status == agent.RunCompleted && run.Usage == (agent.Usage{}) &&
			md.RunID != rd.run && w.reportsRun(ctx, rd.threadID, md):
			// A continuation whose answers were all applied already (a repeated answer; seeds 5441672897310974592,
			// 7256163061666724118: answered twice at once, the first run reaped, which stored the answers on the
			// reply) has nothing to do: the engine records it completed, calls no model, and its finish reports
			// the stored reply as it is, with that reply's metadata (the run that stored it, its status; engine
			// finishNoop), which is what the client's copy of the message must become. The reply itself may be
			// changed since (hidden by a regenerate), so the finish is held to the run it names.
		case md.RunID != rd.run:
			w.violate("stream-reader", "%s: the finish names run %q", who, md.RunID)
		case md.Status != want:
			w.violate("stream-reader", "%s: the finish says %q, the run is %s (%q)", who, md.Status, run.Status, want)
		}
		if recErr != nil || text.Len() == 0 {
			continue
		}
		var stored strings.Builder
		for _, p := range transcript.Decode(rec.Message.Parts) {
			if p.Type == "text" {
				stored.WriteString(p.Text)
			}
		}
		seen, kept := text.String(), stored.String()
		if run.Trigger == agent.TriggerContinuation && !strings.Contains(kept, seen) ||
			run.Trigger != agent.TriggerContinuation && !strings.HasPrefix(kept, seen) {
			w.violate("stream-reader", "%s: the reader saw %q, the stored reply %s (%s) says %q", who, seen, rec.Message.ID,
				rec.Message.Meta().RunID, kept)
		}
	}
}
