package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Admission control (issue 18 item 3): a process that cannot keep up refuses new work early instead of admitting
// runs it would lose. Load never costs a reply: a run admitted into a process whose heartbeats fall behind may
// reach its claim's horizon (half of StaleAfter without an accepted heartbeat) and stop itself (principle 8), so
// the process stops taking new runs well before that, while the runs it holds can still finish.
//
// Before its claim, and so before anything is written (no lease, no thread, no message), Begin asks two signals of
// the engine's own state (no store request, no wall clock: the engine's injected clock):
//
//   - Running: the runs this engine is running (claimed, not yet ended; begun turns included) are at or above
//     MaxRunsPerProcess.
//   - Heartbeat lag: the oldest running run's claim was last known good (its claim, or its newest accepted
//     heartbeat: Turn.goodAt, which the run's heartbeats move on, whoever sends them) more than Heartbeat +
//     MaxHeartbeatLag ago. The heartbeats are the first store work that falls behind when the store or the CPU
//     is saturated, and the one that decides whether a run survives: so their lag is the measure.
//
// Either refuses with 503 CodeOverloaded and a Retry-After (OverloadRetryAfter). Only the requests a user makes
// to start a run (a new message, an answer, a regenerate, an edit: countsAsUserRun) are refused; server-side turns
// (delivery passes, queued messages) answer work already accepted and always run, counted like any other.
// Resuming a stream (GET /chat/{id}/stream) and stopping a run never pass here, so they are never refused. The
// running count is exact (a request takes its place before the check is left), so N requests at once cannot all
// pass a bound they cross together.
const (
	// DefaultMaxRunsPerProcess bounds the runs one process runs at once (AGENT_MAX_RUNS_PER_PROCESS). Above the
	// issue's target, 1,000 concurrent streams on a 2-core machine that all complete (at ~100 µs of CPU per word
	// and ~200 KB per run, 1,000 streams use a third of such a machine and a few hundred MB): the bound leaves
	// room for twice that, server-side turns and runs closing out beside new ones included. It is the backstop
	// for a flood; a process that falls behind with fewer runs is caught by the heartbeat lag, which measures what
	// the runs need rather than guessing it from a count (a tool-heavy run costs more than a text stream).
	DefaultMaxRunsPerProcess = 2000
	// DefaultMaxHeartbeatLag bounds how far behind the process's heartbeats may fall before it refuses new runs
	// (AGENT_MAX_HEARTBEAT_LAG): three missed beats of one second, a tenth of DefaultStaleAfter and a fifth of
	// its half, so the runs already admitted keep 12 s before their horizon while the load drains.
	DefaultMaxHeartbeatLag = 3 * time.Second
	// OverloadRetryAfter is the Retry-After of an overloaded refusal: runs end, and heartbeats catch up, within
	// seconds.
	OverloadRetryAfter = 2 * time.Second
)

// admission is the engine's count of the runs it is running; each holds a ticket from before its claim to its
// end (Turn.releaseSlot).
type admission struct {
	mu      sync.Mutex
	tickets map[*ticket]struct{}
}

// ticket is one run's place in the count. turn is set once the run is claimed (its claim's age is the lag).
type ticket struct {
	a    *admission
	turn atomic.Pointer[Turn]
	kept atomic.Bool
	once sync.Once
}

// Load is what admission control sees of the engine.
type Load struct {
	// Running is the runs the engine is running (claimed or being claimed, not yet ended).
	Running int
	// HeartbeatLag is how far the oldest running run's last accepted heartbeat is behind the heartbeat period
	// (zero when every run is on time, or none runs).
	HeartbeatLag time.Duration
}

// Load reports the engine's load as admission control sees it.
func (e *Engine) Load() Load {
	a := &e.admission
	a.mu.Lock()
	defer a.mu.Unlock()
	return e.loadLocked()
}

func (e *Engine) loadLocked() Load {
	a := &e.admission
	l := Load{Running: len(a.tickets)}
	var oldest time.Time
	for tk := range a.tickets {
		if t := tk.turn.Load(); t != nil {
			if at := t.goodAt(); oldest.IsZero() || at.Before(oldest) {
				oldest = at
			}
		}
	}
	if !oldest.IsZero() {
		l.HeartbeatLag = max(e.clock.Now().Sub(oldest)-e.cfg.Heartbeat, 0)
	}
	return l
}

// admit takes req's place among the engine's runs, or refuses it with CodeOverloaded when the engine cannot keep
// up (only requests that start a run on a user's behalf are refused). The ticket is given back by leave, or by
// unlessKept when no turn took it.
func (e *Engine) admit(req Request) (*ticket, error) {
	a := &e.admission
	a.mu.Lock()
	defer a.mu.Unlock()
	if countsAsUserRun(req) {
		l := e.loadLocked()
		if limit := e.cfg.MaxRunsPerProcess; limit >= 0 && l.Running >= limit {
			return nil, overloaded("this server is running as many replies as it takes at once (%d); try again shortly", limit)
		}
		if limit := e.cfg.MaxHeartbeatLag; limit >= 0 && l.HeartbeatLag > limit {
			return nil, overloaded("this server is behind on the replies it is running; try again shortly")
		}
	}
	if a.tickets == nil {
		a.tickets = map[*ticket]struct{}{}
	}
	tk := &ticket{a: a}
	a.tickets[tk] = struct{}{}
	return tk, nil
}

func overloaded(format string, args ...any) *agent.Error {
	err := agent.E(agent.KindUnavailable, agent.CodeOverloaded, format, args...)
	err.RetryAfter = OverloadRetryAfter
	return err
}

// keep hands the ticket to the claimed turn t: from now on it is given back when the run ends.
func (tk *ticket) keep(t *Turn) {
	if tk != nil {
		tk.turn.Store(t)
		tk.kept.Store(true)
	}
}

// unlessKept gives the ticket back when no turn took it (Begin refused or queued the request).
func (tk *ticket) unlessKept() {
	if tk != nil && !tk.kept.Load() {
		tk.leave()
	}
}

// leave gives the ticket back (once; nil-safe).
func (tk *ticket) leave() {
	if tk == nil {
		return
	}
	tk.once.Do(func() {
		tk.a.mu.Lock()
		delete(tk.a.tickets, tk)
		tk.a.mu.Unlock()
	})
}
