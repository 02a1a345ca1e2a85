package engine

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

type admitClock struct{ now time.Time }

func (c admitClock) Now() time.Time { return c.now }

// Admission control decides from the engine's own count and its runs' last accepted heartbeats, on the injected
// clock: at the run bound or past the lag bound a user's request is refused with overloaded (and a Retry-After);
// a server-side turn never is; a negative bound is none.
func TestAdmit(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	const heartbeat, lag = time.Second, 3 * time.Second
	submit := Request{Kind: TurnSubmit}
	for _, c := range []struct {
		name     string
		runs     int           // running runs, each last known good at now - age
		age      time.Duration // how long ago the oldest run's claim was last known good
		maxRuns  int
		maxLag   time.Duration
		req      Request
		refused  bool
		wantRuns int // the count after the request (a ticket taken, not yet kept)
	}{
		{"below the run bound", 2, 0, 3, lag, submit, false, 3},
		{"at the run bound", 3, 0, 3, lag, submit, true, 3},
		{"at the run bound, a regenerate", 3, 0, 3, lag, Request{Kind: TurnRegenerate}, true, 3},
		{"at the run bound, a server-side turn", 3, 0, 3, lag, Request{Kind: TurnQueued}, false, 4},
		{"no run bound", 3, 0, -1, lag, submit, false, 4},
		{"heartbeats on time", 1, heartbeat + lag, 10, lag, submit, false, 2},
		{"heartbeats behind", 1, heartbeat + lag + time.Millisecond, 10, lag, submit, true, 1},
		{"heartbeats behind, a server-side turn", 1, heartbeat + lag + time.Millisecond, 10, lag, Request{Kind: TurnQueued}, false, 2},
		{"no lag bound", 1, time.Hour, 10, -1, submit, false, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := New(Deps{Clock: admitClock{now}}, Config{Heartbeat: heartbeat, MaxRunsPerProcess: c.maxRuns, MaxHeartbeatLag: c.maxLag})
			for i := range c.runs {
				tk, err := e.admit(Request{Kind: TurnQueued})
				if err != nil {
					t.Fatal(err)
				}
				at := now
				if i == 0 {
					at = now.Add(-c.age)
				}
				tk.keep(&Turn{e: e, claimedAt: at})
			}
			tk, err := e.admit(c.req)
			if c.refused {
				var ae *agent.Error
				if !errors.Is(err, agent.ErrOverloaded) || !errors.As(err, &ae) || ae.Kind != agent.KindUnavailable ||
					agent.RetryAfterOf(err) != OverloadRetryAfter {
					t.Fatalf("admit: %v, want overloaded (unavailable) with a Retry-After of %s", err, OverloadRetryAfter)
				}
			} else if err != nil || tk == nil {
				t.Fatalf("admit: %v", err)
			}
			if got := e.Load().Running; got != c.wantRuns {
				t.Fatalf("running %d, want %d", got, c.wantRuns)
			}
			tk.unlessKept()
			if got := e.Load().Running; got != c.runs {
				t.Fatalf("running %d after the request left, want %d", got, c.runs)
			}
		})
	}
}

// Many requests at once cannot all pass a bound they cross together: each takes its place before the next is
// checked. A place is given back once, however often its run's end is reported.
func TestAdmitConcurrent(t *testing.T) {
	t.Parallel()
	const bound, requests = 5, 50
	e := New(Deps{Clock: admitClock{time.Now()}}, Config{MaxRunsPerProcess: bound})
	var mu sync.Mutex
	var admitted []*ticket
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			tk, err := e.admit(Request{Kind: TurnSubmit})
			if err == nil {
				mu.Lock()
				admitted = append(admitted, tk)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(admitted) != bound {
		t.Fatalf("%d of %d requests admitted at once, bound %d", len(admitted), requests, bound)
	}
	for _, tk := range admitted {
		tk.leave()
		tk.leave()
	}
	if l := e.Load(); l.Running != 0 {
		t.Fatalf("load %+v after every run left", l)
	}
}
