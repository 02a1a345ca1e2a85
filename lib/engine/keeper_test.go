package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
)

// keptStore hands each KeepClaims batch's size to the test once the batch is done.
type keptStore struct {
	agent.Store
	done chan int
}

func (k *keptStore) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	res := k.Store.KeepClaims(ctx, claims, now)
	k.done <- len(claims)
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
				}))
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
			// The keeper's next tick may be armed a moment after a batch ends: the clock moves on again until
			// the batch comes (its statements are what is counted, not how many ticks it took).
			beat := func() int {
				t.Helper()
				for range 100 {
					clock.add(time.Second)
					select {
					case size := <-kept.done:
						return size
					case <-time.After(20 * time.Millisecond):
					}
				}
				t.Fatal("no KeepClaims batch")
				return 0
			}
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
		})
	}
}
