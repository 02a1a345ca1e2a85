package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

// keptStore hands each KeepClaims batch's size to the test once the batch is done (dropped when done is full).
type keptStore struct {
	agent.Store
	done chan int
}

func (k *keptStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	res := k.Store.KeepClaims(ctx, claims, now)
	select {
	case k.done <- len(claims):
	default: // the test is not counting: the batch goes on
	}
	return res
}

// parkTool is a server tool that reports its call and waits until release.
func parkTool(started chan<- string, release <-chan struct{}) agent.Tool {
	return agent.Tool{Name: "park", Description: "waits", InputSchema: emptySchema, Kind: agent.ToolServer,
		Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			started <- inv.ToolCallID
			<-release
			return json.RawMessage(`"done"`), nil
		}}
}

// The store work that keeps a process's runs alive does not grow with its runs (issue 18 item 3): with N runs
// streaming on SQLite (each parked in a tool, so nothing else writes), every Heartbeat of the injected clock costs
// one KeepClaims batch that carries all N claims and runs one SQL statement, for 1 run as for 8. Before the keeper
// each run heartbeat on its own and polled for a stop every CancelPoll: 8 runs cost at least 8 statements per
// Heartbeat.
func TestKeepingRunsAliveCostsOneStatementPerHeartbeat(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 8} {
		t.Run(fmt.Sprintf("%d runs", n), func(t *testing.T) {
			t.Parallel()
			clock := newTimerClock()
			kept := &keptStore{done: make(chan int, 16)}
			started, release := make(chan string, n), make(chan struct{})
			f := setup(t, withClock(clock), withTools(parkTool(started, release)),
				withStore(func(s agent.Store) agent.Store { kept.Store = s; return kept }),
				withConfig(func(c *config.Config) {
					c.Heartbeat, c.StaleAfter, c.ToolTimeout, c.CancelPoll = time.Second, time.Minute, time.Hour, time.Millisecond
					c.MaxActiveRunsPerUser, c.ThreadsPerMinute = -1, -1
					c.ReaderProbe = -1 // its reads are counted on their own (TestReaderProbeCostsOneReadPerProbe)
				}))
			ran := parkRuns(t, f, started, n)
			beat := func() int { return tickUntil(t, clock, time.Second, kept.done, "KeepClaims batch") }
			beat() // the first batch may overlap the runs' own last writes before their tools
			const beats = 5
			before := f.stack.SQLite.Statements()
			for range beats {
				if size := beat(); size != n {
					t.Fatalf("a batch carried %d claims, want all %d runs", size, n)
				}
			}
			if got := f.stack.SQLite.Statements() - before; got != beats {
				t.Fatalf("%d runs: %d statements over %d heartbeats, want %d (one per batch)", n, got, beats, beats)
			}
			close(release)
			awaitCompleted(t, ran)
		})
	}
}

// parkRuns starts n runs on threads th0…th(n-1), each calling the park tool, and waits until all are parked.
func parkRuns(t *testing.T, f *fixture, started <-chan string, n int) []<-chan agent.Run {
	t.Helper()
	var ran []<-chan agent.Run
	for i := range n {
		ran = append(ran, f.streaming(t, submit(fmt.Sprintf("th%d", i), "u1", "/tool park {}")))
	}
	for range n {
		select {
		case <-started:
		case <-time.After(hangBound):
			t.Fatal("the runs never reached their tool")
		}
	}
	return ran
}

// awaitCompleted waits for every run of ran to end completed.
func awaitCompleted(t *testing.T, ran []<-chan agent.Run) {
	t.Helper()
	for _, r := range ran {
		select {
		case run := <-r:
			if run.Status != agent.RunCompleted {
				t.Fatalf("run %s: %s %+v, want completed", run.ID, run.Status, run.Error)
			}
		case <-time.After(hangBound):
			t.Fatal("a run never ended")
		}
	}
}

// tickUntil moves clock on by step until done reports (a keeper batch or probe, with its size): the keeper's next
// tick may be armed a moment after the last one ends, so the clock moves on again until it comes (what is counted
// is its statements, not how many ticks it took).
func tickUntil(t *testing.T, clock *timerClock, step time.Duration, done <-chan int, what string) int {
	t.Helper()
	for range 100 {
		clock.add(step)
		select {
		case size := <-done:
			return size
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no " + what)
	return 0
}

// probedStore hands each reader probe's size to the test once it is done (dropped when done is full).
type probedStore struct {
	agent.Store
	done  chan int
	calls atomic.Int64
}

func (p *probedStore) ReadersOf(ctx context.Context, threadIDs []string) ([]agent.ReaderMark, error) {
	marks, err := p.Store.ReadersOf(ctx, threadIDs)
	p.calls.Add(1)
	select {
	case p.done <- len(threadIDs):
	default:
	}
	return marks, err
}

// The keeper's reader probe (issue 18 item 4) is one read per probe period for all of a process's runs, and
// writes nothing: with N runs streaming on SQLite (parked in a tool; the batches an hour apart), each probe
// carries all N threads and runs one SQL statement and no transaction, for 1 run as for 8.
func TestReaderProbeCostsOneReadPerProbe(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 8} {
		t.Run(fmt.Sprintf("%d runs", n), func(t *testing.T) {
			t.Parallel()
			clock := newTimerClock()
			probed := &probedStore{done: make(chan int, 16)}
			started, release := make(chan string, n), make(chan struct{})
			f := setup(t, withClock(clock), withTools(parkTool(started, release)),
				withStore(func(s agent.Store) agent.Store { probed.Store = s; return probed }),
				withConfig(func(c *config.Config) {
					c.Heartbeat, c.StaleAfter, c.ToolTimeout, c.ReaderProbe = time.Hour, 10*time.Hour, 10*time.Hour, 100*time.Millisecond
					c.MaxActiveRunsPerUser, c.ThreadsPerMinute = -1, -1
				}))
			ran := parkRuns(t, f, started, n)
			probe := func() int { return tickUntil(t, clock, 100*time.Millisecond, probed.done, "reader probe") }
			probe() // the first may overlap the runs' own last writes before their tools
			const probes = 5
			before, txs, calls := f.stack.SQLite.Statements(), f.stack.SQLite.Transactions(), probed.calls.Load()
			for range probes {
				if size := probe(); size != n {
					t.Fatalf("a probe read %d threads, want all %d runs'", size, n)
				}
			}
			sent := probed.calls.Load() - calls
			if got := f.stack.SQLite.Statements() - before; sent < probes || got != sent {
				t.Fatalf("%d runs: %d statements over %d probes, want one per probe", n, got, sent)
			}
			if got := f.stack.SQLite.Transactions() - txs; got != 0 {
				t.Fatalf("%d runs: %d write transactions over %d probes, want none", n, got, sent)
			}
			close(release)
			awaitCompleted(t, ran)
		})
	}
}

// One batch, three runs of one process on SQLite, three answers: a stop stored by another process cancels only
// its run (it ends canceled once its tool returns, its claim kept meanwhile), a takeover fences only its run (it
// writes nothing more: the thread stays the taker's), and the third run is kept and completes.
func TestKeeperAnswersEachRunAlone(t *testing.T) {
	t.Parallel()
	clock := newManualClock() // the batches tick in real time (every 50 ms); the claims' horizons never pass
	kept := &keptStore{done: make(chan int, 1)}
	started, release := make(chan string, 3), make(chan struct{})
	logs := &syncBuffer{}
	defer func() {
		if t.Failed() {
			logs.mu.Lock()
			t.Log(logs.buf.String())
			logs.mu.Unlock()
		}
	}()
	f := setup(t, withClock(clock), withTools(parkTool(started, release)), withJSONLog(logs),
		withStore(func(s agent.Store) agent.Store { kept.Store = s; return kept }),
		withConfig(func(c *config.Config) {
			c.Heartbeat, c.StaleAfter, c.ToolTimeout = 50*time.Millisecond, time.Minute, time.Hour
			c.MaxActiveRunsPerUser, c.ThreadsPerMinute = -1, -1
		}))
	ctx := context.Background()
	threads := []string{"th-stop", "th-taken", "th-kept"}
	ran := map[string]<-chan agent.Run{}
	runs := map[string]agent.Claim{}
	for _, th := range threads {
		ran[th] = f.streaming(t, submit(th, "u1", "/tool park {}"))
	}
	for range threads {
		select {
		case <-started:
		case <-time.After(hangBound):
			t.Fatal("the runs never reached their tool")
		}
	}
	for _, th := range threads {
		got, err := f.store.GetThread(ctx, th)
		if err != nil || got.ActiveRun == nil {
			t.Fatalf("thread %s: %+v, %v: want a claim", th, got.ActiveRun, err)
		}
		runs[th] = *got.ActiveRun
	}
	// Another process stops th-stop and a reaper takes th-taken: only the store knows.
	if _, err := f.store.RequestCancel(ctx, "th-stop", runs["th-stop"].RunID, clock.Now()); err != nil {
		t.Fatal(err)
	}
	taker, err := f.store.TakeOver(ctx, agent.TakeRequest{ThreadID: "th-taken",
		Fence: agent.Fence{RunID: runs["th-taken"].RunID, Epoch: runs["th-taken"].Epoch}, RunID: runs["th-taken"].RunID, Now: clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	clock.add(time.Second)
	batchAt := clock.Now()
	// The third batch reported from now began after the store changed: the first may have ended before, the
	// second been in flight (the keeper sends one batch at a time).
	for range 3 {
		select {
		case <-kept.done:
		case <-time.After(hangBound):
			t.Fatal("no batch")
		}
	}
	// The fenced run gives its tool up at once and ends without writing; the others wait for their tools.
	select {
	case run := <-ran["th-taken"]:
		if run.Status == agent.RunCompleted || run.Status == agent.RunCanceled {
			t.Fatalf("fenced run ended %s, want it left to the reaper", run.Status)
		}
	case <-time.After(hangBound):
		t.Fatal("the fenced run never stopped")
	}
	got, err := f.store.GetThread(ctx, "th-kept")
	if err != nil || got.ActiveRun == nil || !got.ActiveRun.HeartbeatAt.Equal(batchAt) {
		t.Fatalf("kept run's claim %+v (%v): want its heartbeat from the batch", got.ActiveRun, err)
	}
	close(release)
	for th, want := range map[string]agent.RunStatus{"th-stop": agent.RunCanceled, "th-kept": agent.RunCompleted} {
		select {
		case run := <-ran[th]:
			if run.Status != want {
				t.Fatalf("%s: run %s %+v, want %s", th, run.Status, run.Error, want)
			}
		case <-time.After(hangBound):
			t.Fatalf("%s: the run never ended", th)
		}
	}
	got, err = f.store.GetThread(ctx, "th-taken")
	if err != nil || got.ActiveRun == nil || got.ActiveRun.RunID != taker.RunID || got.ActiveRun.Epoch != taker.Epoch {
		t.Fatalf("taken thread's claim %+v (%v): want the taker's %+v", got.ActiveRun, err, taker)
	}
}
