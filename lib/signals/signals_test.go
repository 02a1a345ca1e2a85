package signals_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/webhooks"
	"github.com/agentloop/agentloop/lib/webhooks/webhookstest"
)

// clock is the tests' virtual clock: the sweep's due times follow it, never the wall clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type fixture struct {
	t     *testing.T
	store *sqlite.Store
	clock *clock
	rcv   *webhookstest.Receiver
	box   *signals.Outbox
}

const backoff = 30 * time.Second

func setup(t *testing.T, failFirst int, cfg signals.Config) *fixture {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	f := &fixture{t: t, store: st, clock: &clock{t: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}, rcv: webhookstest.New(t, failFirst)}
	hook, err := webhooks.New(webhooks.Config{URL: f.rcv.URL, Secret: webhookstest.Secret, Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Backoff = backoff
	f.box = signals.New(signals.Deps{Store: st, Sinks: []agent.SignalSink{hook}, Clock: f.clock}, cfg)
	return f
}

// ended claims a run on a new thread and records its end as the engine does: armed, in FinishRun's write.
func (f *fixture) ended(status agent.RunStatus) agent.Run {
	f.t.Helper()
	ctx, now := f.t.Context(), f.clock.Now()
	th, _, err := f.store.CreateThread(ctx, agent.Thread{ID: "th_" + string(status) + now.Format("150405.000"), Owner: "alice", CreatedAt: now, UpdatedAt: now})
	if err != nil {
		f.t.Fatal(err)
	}
	res, err := f.store.ClaimRun(ctx, agent.ClaimRequest{ThreadID: th.ID, Owner: "alice", RunID: "run_" + th.ID, Trigger: agent.TriggerUser,
		AssistantMessageID: "msg_" + th.ID, Now: now, StaleAfter: time.Minute})
	if err != nil {
		f.t.Fatal(err)
	}
	run := res.Run
	run.Status, run.Usage, run.FinishedAt, run.UpdatedAt = status, agent.Usage{InputTokens: 3, OutputTokens: 2, TotalTokens: 5}, now, now
	run.Signal = f.box.Arm("alice", now)
	if err := f.store.FinishRun(ctx, run); err != nil {
		f.t.Fatal(err)
	}
	return run
}

func (f *fixture) signal(run agent.Run) agent.RunSignal {
	f.t.Helper()
	got, err := f.store.GetRun(f.t.Context(), run.ThreadID, run.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	if got.Signal == nil {
		f.t.Fatalf("run %s has no signal", run.ID)
	}
	return *got.Signal
}

func (f *fixture) sweep() int {
	f.t.Helper()
	n, err := f.box.Sweep(f.t.Context())
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// The receiver answers 500 to the first two attempts: the run's own attempt and the sweep's first retry fail,
// each retry waits its backoff (doubling), and the third attempt delivers; every attempt carries the same
// webhook-id and a valid signature, and the receiver takes the signal once.
func TestRetriesWithBackoffUntilDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t, 2, signals.Config{})
	run := f.ended(agent.RunCompleted)
	f.box.Deliver(t.Context(), run)
	if sg := f.signal(run); sg.Status != agent.SignalPending || !sg.DueAt.Equal(f.clock.Now().Add(backoff)) {
		t.Fatalf("after a failed first attempt: %+v, want pending, due one backoff on", sg)
	}
	if n := f.sweep(); n != 0 || len(f.rcv.Requests()) != 1 {
		t.Fatalf("a sweep before the due time sent (%d delivered, %d requests)", n, len(f.rcv.Requests()))
	}
	f.clock.advance(backoff + time.Millisecond)
	if n := f.sweep(); n != 0 || len(f.rcv.Requests()) != 2 {
		t.Fatalf("second attempt: %d delivered, %d requests", n, len(f.rcv.Requests()))
	}
	sg := f.signal(run)
	if sg.Attempts != 1 || !sg.DueAt.Equal(f.clock.Now().Add(2*backoff)) {
		t.Fatalf("after the second attempt: %+v, want 1 claimed attempt, due two backoffs on", sg)
	}
	f.clock.advance(backoff + time.Millisecond) // not yet: the backoff doubled
	if f.sweep(); len(f.rcv.Requests()) != 2 {
		t.Fatal("a sweep sent before the doubled backoff passed")
	}
	f.clock.advance(backoff)
	if n := f.sweep(); n != 1 {
		t.Fatalf("third attempt delivered %d", n)
	}
	if sg := f.signal(run); sg.Status != agent.SignalDelivered || !sg.DueAt.IsZero() {
		t.Fatalf("after delivery: %+v", sg)
	}
	reqs := f.rcv.Requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	for _, r := range reqs {
		if !r.Valid || r.ID != agent.SignalID(run.ID) {
			t.Fatalf("request %+v: want a valid signature and webhook-id %s", r, agent.SignalID(run.ID))
		}
	}
	got := f.rcv.Delivered()
	if len(got) != 1 {
		t.Fatalf("receiver took %d signals, want 1", len(got))
	}
	var d agent.SignalDetail
	if err := json.Unmarshal(got[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.Attempt != 3 || d.Status != "completed" || d.Usage.TotalTokens != 5 || d.Owner != "alice" {
		t.Fatalf("delivered %+v", d)
	}
	// Nothing more is due, ever.
	f.clock.advance(24 * time.Hour)
	if f.sweep(); len(f.rcv.Requests()) != 3 {
		t.Fatal("a delivered signal was sent again")
	}
}

// The process dies between the run's end and its first attempt: the outcome's write left the signal pending,
// and the sweep delivers it once due.
func TestCrashBeforeDeliveryStillDelivers(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{})
	run := f.ended(agent.RunCanceled) // no Deliver: the process is gone
	f.clock.advance(backoff + time.Millisecond)
	if n := f.sweep(); n != 1 {
		t.Fatalf("sweep delivered %d, want 1", n)
	}
	if got := f.rcv.Delivered(); len(got) != 1 {
		t.Fatalf("receiver took %d", len(got))
	}
	if sg := f.signal(run); sg.Status != agent.SignalDelivered {
		t.Fatalf("signal %+v", sg)
	}
}

// A delivery whose settle is lost (the process dies after the receiver took it) is sent again: the receiver
// deduplicates it by webhook-id.
func TestRedeliveryIsDeduplicated(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{})
	run := f.ended(agent.RunInterrupted)
	lost := signals.New(signals.Deps{Store: settleFails{f.store}, Sinks: []agent.SignalSink{mustHook(t, f)}, Clock: f.clock},
		signals.Config{Backoff: backoff})
	lost.Deliver(t.Context(), run)
	f.clock.advance(backoff + time.Millisecond)
	if n := f.sweep(); n != 1 {
		t.Fatalf("sweep delivered %d", n)
	}
	if reqs, got := f.rcv.Requests(), f.rcv.Delivered(); len(reqs) != 2 || len(got) != 1 {
		t.Fatalf("%d requests, %d taken: want 2 and 1", len(reqs), len(got))
	}
}

type settleFails struct{ *sqlite.Store }

func (settleFails) SettleSignal(context.Context, string, string, agent.SignalStatus) error {
	return errors.New("process died")
}

func mustHook(t *testing.T, f *fixture) agent.SignalSink {
	hook, err := webhooks.New(webhooks.Config{URL: f.rcv.URL, Secret: webhookstest.Secret, Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	return hook
}

// A receiver that stays down: after MaxAttempts attempts the signal is dropped, and no sweep sends it again.
func TestGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{MaxAttempts: 3, MaxBackoff: time.Minute})
	f.rcv.Down(true)
	run := f.ended(agent.RunFailed)
	f.box.Deliver(t.Context(), run)
	for range 5 {
		f.clock.advance(time.Hour)
		f.sweep()
	}
	if n := len(f.rcv.Requests()); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	if sg := f.signal(run); sg.Status != agent.SignalDropped {
		t.Fatalf("signal %+v, want dropped", sg)
	}
}

// Two sweepers at once: each due signal is attempted by one of them.
func TestConcurrentSweepsSendOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{})
	var runs []agent.Run
	for i := range 5 {
		runs = append(runs, f.ended(agent.RunCompleted))
		f.clock.advance(time.Duration(i+1) * time.Millisecond)
	}
	other := signals.New(signals.Deps{Store: f.store, Sinks: []agent.SignalSink{mustHook(t, f)}, Clock: f.clock}, signals.Config{Backoff: backoff})
	f.clock.advance(time.Hour)
	var wg sync.WaitGroup
	for _, b := range []*signals.Outbox{f.box, other} {
		wg.Go(func() {
			if _, err := b.Sweep(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n, m := len(f.rcv.Requests()), len(f.rcv.Delivered()); n != len(runs) || m != len(runs) {
		t.Fatalf("%d requests, %d taken: want %d each", n, m, len(runs))
	}
}

// In the background (a long-lived process), Deliver returns at once and Wait waits for the attempt.
func TestBackgroundDeliver(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{Background: true})
	run := f.ended(agent.RunCompleted)
	f.box.Deliver(t.Context(), run)
	f.box.Wait()
	if sg := f.signal(run); sg.Status != agent.SignalDelivered {
		t.Fatalf("signal %+v", sg)
	}
}

// A sweep whose invocation ends sooner than one attempt's timeout starts no attempt: the signals stay due, untouched.
func TestSweepLeavesWhatItCannotFinish(t *testing.T) {
	t.Parallel()
	f := setup(t, 0, signals.Config{Timeout: time.Hour})
	run := f.ended(agent.RunCompleted)
	f.clock.advance(time.Hour)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // the context's deadline is real time, as Lambda's
	defer cancel()
	if n, err := f.box.Sweep(ctx); n != 0 || err != nil || len(f.rcv.Requests()) != 0 {
		t.Fatalf("sweep: %d delivered, %v, %d requests; want none started", n, err, len(f.rcv.Requests()))
	}
	if sg := f.signal(run); sg.Status != agent.SignalPending || sg.Attempts != 0 {
		t.Fatalf("signal %+v, want pending and unclaimed", sg)
	}
}
