// Package drain is the serving lifecycle of a long-lived process (`agentloop serve`, many replicas on one table):
// a Gate that admits new work until the process begins to drain and refuses it from then on, the drain itself
// (Run: let the runs the process holds finish within a grace period, then stop the rest as the stop endpoint
// does), and the readiness route a load balancer or an orchestrator polls (Ready: GET /readyz).
//
// The order on SIGTERM (lib/devserver's Serve, cmd/agentloop serve):
//
//  1. The Gate closes: a request that would start a run (POST /chat) or attach a stream reader (GET
//     /chat/{threadId}/stream) is refused before anything reads or stores it, 503 with code draining and a
//     Retry-After (DefaultRetryAfter): the client sends it again and another replica takes it. GET /readyz answers
//     the same 503, so the balancer stops routing here. Every other route (reads, stop, delete) is served as
//     before, and the listener stays open: a request that arrives in the moment before the balancer notices gets
//     a 503 it can act on, not a refused connection.
//  2. The runs the process holds go on, each bounded by its own wall clock as always, for at most Grace
//     (AGENT_DRAIN_GRACE, DefaultGrace): a reply that ends within it ends here.
//  3. What is still running then hands over at its next step boundary (Runs.HandOver: the engine's HandOverAll):
//     its reply and stream stored as they stand, its continuation left to another replica (the draining
//     process starts none: its launcher declines, and its reaper is held), whose reaper continues the run once
//     its claim is stale (lib/reaper's relaunch). The reply stays one message, its stream one sequence of
//     segments: a reader attached elsewhere sees one continuous stream. Each run gets StopWait to reach a step
//     boundary.
//  4. A run that has not handed over by then (a step that does not end: a long model step, a slow tool) is
//     stopped as the stop endpoint stops a run: the stop is stored on the claim, then the run is told in memory;
//     it ends through the engine's normal stop path (its reply stored, marked canceled, its claim released, its
//     stream finished), within StopWait. A run that does not end by then (a store that does not answer) is left
//     to the reaper of another replica, as a crashed process's is: nothing it stored is lost.
//  5. The caller closes the listener and exits 0.
//
// Every wait is on the injected timers (agent.Timers).
package drain

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here (lib/config maps AGENT_DRAIN_GRACE onto Config.Grace).
const (
	// DefaultGrace is how long a drain lets the process's runs finish before it hands them over: with the
	// hand-over's and the stop's waits (StopWait each) it stays within the 30 s an orchestrator gives a container
	// between SIGTERM and SIGKILL by default (ECS stopTimeout, Kubernetes terminationGracePeriodSeconds). Replies
	// longer than that are continued by another replica (or stopped, canceled with what they streamed kept, when
	// they reach no step boundary); raise both together to let them finish here (README "agentloop serve").
	DefaultGrace = 15 * time.Second
	// DefaultStopWait bounds how long the runs take to hand over at the end of the grace, and then how long the
	// runs stopped after it take to store their end.
	DefaultStopWait = 5 * time.Second
	// DefaultRetryAfter is the Retry-After of a draining refusal: by then the balancer has taken the replica out.
	DefaultRetryAfter = 5 * time.Second
	// DefaultCheckTimeout bounds one readiness check (the store's read, the model's endpoint).
	DefaultCheckTimeout = 2 * time.Second
	// poll is how often a drain looks at the runs still running (an in-memory count: no store request).
	poll = 50 * time.Millisecond
)

// Config is a drain's bounds; zero values take the defaults.
type Config struct {
	Grace      time.Duration
	StopWait   time.Duration
	RetryAfter time.Duration
}

func (c Config) withDefaults() Config {
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.StopWait = cmp.Or(c.StopWait, DefaultStopWait)
	c.RetryAfter = cmp.Or(c.RetryAfter, DefaultRetryAfter)
	return c
}

// Gate admits new work until Close.
type Gate struct {
	closed     atomic.Bool
	retryAfter time.Duration
}

// NewGate is an open gate whose refusals say Retry-After retryAfter (0: DefaultRetryAfter).
func NewGate(retryAfter time.Duration) *Gate {
	return &Gate{retryAfter: cmp.Or(retryAfter, DefaultRetryAfter)}
}

// Admit is nil while the gate is open, and the draining refusal once it is closed (httpapi.Deps.Admit).
func (g *Gate) Admit(*http.Request) error {
	if g.closed.Load() {
		return g.refusal()
	}
	return nil
}

// Close closes the gate; it reports whether this call closed it.
func (g *Gate) Close() bool { return g.closed.CompareAndSwap(false, true) }

// Closed reports whether the gate is closed.
func (g *Gate) Closed() bool { return g.closed.Load() }

func (g *Gate) refusal() *agent.Error {
	err := agent.E(agent.KindUnavailable, agent.CodeDraining, "this server is shutting down; send the request again shortly")
	err.RetryAfter = g.retryAfter
	return err
}

// Runs is what a drain waits for and stops: the runs of this process.
type Runs interface {
	// Running is how many runs the process is running (claimed or being claimed, not yet ended).
	Running() int
	// Stop asks each run still running to stop, as the stop endpoint does, skipping those already asked; it
	// returns how many it asked now.
	Stop(ctx context.Context) int
	// HandOver makes every run hand over at its next step boundary, its continuation left to another process.
	HandOver()
}

// Stats is what a drain did.
type Stats struct {
	Finished   int // runs that ended on their own within the grace
	HandedOver int // runs that ended here once the grace was over, handed over (or finished) at a step boundary
	Stopped    int // runs asked to stop once no hand-over came within StopWait
	Left       int // runs still running when the drain gave up (the reaper of another replica takes them)
}

// Run drains: it closes g, waits until runs runs nothing or cfg.Grace has passed, then hands what is left over
// and waits for it to end, at most cfg.StopWait, then stops what is still left and waits for it to end, at most
// cfg.StopWait again. ctx ending cuts the waits short (what is running is then left).
func Run(ctx context.Context, g *Gate, runs Runs, cfg Config, timers agent.Timers, log *slog.Logger) Stats {
	cfg = cfg.withDefaults()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g.Close()
	at := runs.Running()
	log.Info("drain.begin", "running", at, "grace", cfg.Grace)
	var st Stats
	left := waitIdle(ctx, runs, cfg.Grace, timers)
	st.Finished = max(at-left, 0)
	if left > 0 {
		log.Info("drain.handover", "running", left, "wait", cfg.StopWait)
		runs.HandOver()
		was := left
		left = waitIdle(ctx, runs, cfg.StopWait, timers)
		st.HandedOver = max(was-left, 0)
	}
	if left > 0 {
		// The stops go on while the runs end (a run claimed in the meantime joins late), each run asked once. The
		// runs are asked at least once, however soon the stop wait ends (a loop that checked the wait first asked
		// none when its timer fired at once: lib/drain TestRun "one will not end", 1 run in a loaded make test).
		stopCtx, cancel := timers.WithTimeoutCause(ctx, cfg.StopWait, context.DeadlineExceeded)
		for {
			st.Stopped += runs.Stop(stopCtx)
			if left = waitIdle(stopCtx, runs, poll, timers); left == 0 || stopCtx.Err() != nil {
				break
			}
		}
		cancel()
		left = runs.Running()
	}
	st.Left = left
	log.Info("drain.end", "finished", st.Finished, "handed_over", st.HandedOver, "stopped", st.Stopped, "left", st.Left)
	return st
}

// waitIdle waits until runs runs nothing, at most d; it returns how many still run.
func waitIdle(ctx context.Context, runs Runs, d time.Duration, timers agent.Timers) int {
	deadline := timers.After(d)
	for {
		n := runs.Running()
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-deadline:
			return runs.Running()
		case <-timers.After(poll):
		}
	}
}

// Check is one dependency readiness asks after.
type Check struct {
	Name  string                          // what is checked, e.g. "store", "model"
	Code  string                          // the code GET /readyz answers when it fails (agent's catalog)
	Probe func(ctx context.Context) error // nil error: reachable
}

// Ready serves GET /readyz: 200 {"ok": true, "checks": {...}} while g is open and every check passes within
// timeout (0: DefaultCheckTimeout; the checks run at once, beside one another); otherwise 503 with the error
// contract's body and the code of the first failure, in this order: draining (with its Retry-After), then each
// check's code in checks' order. A check's error goes to the log, never to the body.
func Ready(g *Gate, timeout time.Duration, log *slog.Logger, checks ...Check) http.Handler {
	timeout = cmp.Or(timeout, DefaultCheckTimeout)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.Closed() {
			w.Header().Set("Retry-After", strconv.Itoa(int((g.retryAfter+time.Second-1)/time.Second)))
			writeError(w, agent.CodeDraining, "this server is shutting down")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		errs := make([]error, len(checks))
		var wg sync.WaitGroup
		for i, c := range checks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = c.Probe(ctx)
			}()
		}
		wg.Wait()
		status := map[string]string{}
		for i, c := range checks {
			if errs[i] != nil {
				log.Warn("readyz.failed", "check", c.Name, "err", errs[i])
				writeError(w, c.Code, c.Name+" unreachable")
				return
			}
			status[c.Name] = "ok"
		}
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "checks": status})
	})
}

func writeError(w http.ResponseWriter, code, message string) {
	writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{"code": code, "message": message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
