package reaper_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/tools"
	"github.com/agentloop/agentloop/lib/webhooks"
	"github.com/agentloop/agentloop/lib/webhooks/webhookstest"
)

// manualClock is moved by the test only.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// A run whose process died is reaped: the reaper records it failed (stale) with its signal armed in that write,
// and delivers it; the receiver is down for the first attempt, and the next tick's sweep, once the backoff has
// passed, delivers it (one webhook-id, a valid signature, status failed, error code stale).
func TestReapedRunSignalsFailed(t *testing.T) {
	t.Parallel()
	st := sqliteStore(t)
	clock := &manualClock{t: time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)}
	rcv := webhookstest.New(t, 1)
	hook, err := webhooks.New(webhooks.Config{URL: rcv.URL, Secret: webhookstest.Secret, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	box := signals.New(signals.Deps{Store: st, Sinks: []agent.SignalSink{hook}, Clock: clock}, signals.Config{Backoff: time.Minute})
	r := reaper.New(reaper.Deps{Store: st, Tools: tools.Demo(st, clock), Clock: clock, Signals: box}, reaper.Config{StaleAfter: staleAfter})
	f := &fixture{store: st, r: r}
	run := f.claim(t, "th_reaped", "run_dead", clock.Now())
	clock.add(2 * staleAfter)
	stats, err := r.Tick(context.Background())
	if err != nil || stats.Reaped != 1 {
		t.Fatalf("tick: %+v %v, want one reaped", stats, err)
	}
	if n := len(rcv.Requests()); n != 1 || len(rcv.Delivered()) != 0 {
		t.Fatalf("%d requests, %d taken: want the first attempt, refused", n, len(rcv.Delivered()))
	}
	got, err := st.GetRun(context.Background(), run.ThreadID, run.ID)
	if err != nil || got.Status != agent.RunFailed || got.Signal == nil || got.Signal.Status != agent.SignalPending {
		t.Fatalf("run %+v %v: want failed with its signal pending", got, err)
	}
	clock.add(time.Minute + time.Millisecond)
	if stats, err := r.Tick(context.Background()); err != nil || stats.Signaled != 1 {
		t.Fatalf("second tick: %+v %v, want one signal delivered", stats, err)
	}
	taken := rcv.Delivered()
	if len(taken) != 1 {
		t.Fatalf("receiver took %d, want 1", len(taken))
	}
	var d agent.SignalDetail
	if err := json.Unmarshal(taken[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.RunID != run.ID || d.ThreadID != "th_reaped" || d.Owner != "alice" || d.Status != "failed" || d.ErrorCode != agent.CodeStale {
		t.Fatalf("signal %+v: want run_dead failed with code stale, owned by alice", d)
	}
	for _, q := range rcv.Requests() {
		if !q.Valid || q.ID != agent.SignalID(run.ID) {
			t.Fatalf("request %+v", q)
		}
	}
}
