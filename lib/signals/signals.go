// Package signals delivers completion signals (issue 21 item 4): when a run ends, whatever its status and whoever
// records the end (the run itself, or the reaper), an agentloop.run.finished signal goes to every sink (the
// EventBridge bus, lib/eventbridge, or the log in `agentloop dev`; an HTTPS webhook, lib/webhooks, when
// configured), at least once, and nothing of it ever changes the run.
//
// The outbox is the run item (agent.SignalStore). The engine and the reaper arm the run's signal (Arm) before the
// write that records its outcome, which stores it pending in that same write: there is no moment at which a run
// is recorded ended without a pending signal, so a process that dies right after the end leaves the signal to the
// sweep. Then they call Deliver, which makes the first attempt (in the background in a long-lived process; in
// Lambda on the request's goroutine after the stream's last byte, as titles do) and settles the signal delivered
// when every sink took it. A failed attempt leaves it pending: it is due Config.Backoff after the run's end.
//
// The reaper's tick calls Sweep: it lists the due signals, takes each one's next attempt by compare-and-set
// (ClaimSignal: of concurrent sweepers one sends, and the signal is due again after the next backoff should this
// attempt die with its process), sends, and settles. Backoff doubles from Config.Backoff to Config.MaxBackoff;
// after Config.MaxAttempts attempts the signal is settled dropped and logged at error level.
//
// Every attempt carries the same signal id (agent.SignalID: the webhook-id), so receivers deduplicate. A retry
// sends to every sink again: the EventBridge event may then arrive more than once too, each with the same
// detail.signalId. Every attempt is logged once as "agent.signal".
package signals

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here (lib/config maps env names onto Config).
const (
	// DefaultBackoff is how long after a failed attempt (or the run's end) the signal is due again; it doubles
	// with every attempt.
	DefaultBackoff = 30 * time.Second
	// DefaultMaxBackoff caps the backoff.
	DefaultMaxBackoff = time.Hour
	// DefaultMaxAttempts bounds the attempts at one signal (about a day with the defaults).
	DefaultMaxAttempts = 30
	// DefaultTimeout bounds one attempt at every sink.
	DefaultTimeout = 10 * time.Second
	// DefaultBatch bounds one sweep.
	DefaultBatch = 100
	// DefaultParallel is how many signals one sweep sends at once.
	DefaultParallel = 8
)

// Config tunes delivery. Zero values take the defaults.
type Config struct {
	Backoff     time.Duration
	MaxBackoff  time.Duration
	MaxAttempts int
	Timeout     time.Duration
	Batch       int
	Parallel    int
	// Background: Deliver returns at once and the first attempt goes on in a goroutine of its own (a long-lived
	// process: `agentloop dev`, `agentloop serve`); Wait waits for them. Unset (Lambda): Deliver attempts on the
	// caller's goroutine.
	Background bool
}

func (c Config) withDefaults() Config {
	c.Backoff = cmp.Or(c.Backoff, DefaultBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Parallel = cmp.Or(c.Parallel, DefaultParallel)
	return c
}

// Deps are the outbox's ports.
type Deps struct {
	Store agent.SignalStore
	// Sinks receive every signal; a signal is delivered once all of them took it.
	Sinks  []agent.SignalSink
	Clock  agent.Clock
	Logger *slog.Logger
}

// Outbox is agent.RunSignals over the store's outbox.
type Outbox struct {
	store  agent.SignalStore
	sinks  []agent.SignalSink
	clock  agent.Clock
	timers agent.Timers
	log    *slog.Logger
	cfg    Config
	// inflight counts the first attempts running in the background (a mutex and a condition, not a WaitGroup: a
	// run may end, and Deliver start one, while Wait waits).
	mu       sync.Mutex
	idle     *sync.Cond
	inflight int
}

var _ agent.RunSignals = (*Outbox)(nil)

// New builds an outbox.
func New(d Deps, cfg Config) *Outbox {
	o := &Outbox{store: d.Store, sinks: d.Sinks, clock: d.Clock, log: d.Logger, cfg: cfg.withDefaults()}
	if o.clock == nil {
		o.clock = agent.SystemClock{}
	}
	o.timers = agent.TimersOf(o.clock)
	o.idle = sync.NewCond(&o.mu)
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Config returns the effective configuration.
func (o *Outbox) Config() Config { return o.cfg }

// Arm is the pending signal of a run of owner's that ends at now: due one backoff later, when the sweep takes over
// from the run's own attempt.
func (o *Outbox) Arm(owner string, now time.Time) *agent.RunSignal {
	return &agent.RunSignal{Status: agent.SignalPending, Owner: owner, DueAt: now.Add(o.cfg.Backoff)}
}

// Deliver makes the first attempt at the signal of run, whose outcome was stored with it armed.
func (o *Outbox) Deliver(ctx context.Context, run agent.Run) {
	if run.Signal == nil || run.Signal.Status != agent.SignalPending {
		return
	}
	ctx = agent.WithStoreMeter(context.WithoutCancel(ctx), nil) // not the run's store usage
	if !o.cfg.Background {
		o.attempt(ctx, run, 1)
		return
	}
	o.mu.Lock()
	o.inflight++
	o.mu.Unlock()
	go func() {
		defer func() {
			o.mu.Lock()
			if o.inflight--; o.inflight == 0 {
				o.idle.Broadcast()
			}
			o.mu.Unlock()
		}()
		o.attempt(ctx, run, 1)
	}()
}

// Wait waits for the attempts Deliver left in the background.
func (o *Outbox) Wait() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.inflight > 0 {
		o.idle.Wait()
	}
}

// Sweep sends the signals that are due: for each, it takes the next attempt (compare-and-set), sends, and settles;
// one past Config.MaxAttempts is dropped. It returns how many it delivered.
func (o *Outbox) Sweep(ctx context.Context) (int, error) {
	now := o.clock.Now()
	runs, err := o.store.ListDueSignals(ctx, now, o.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("signals: list due: %w", err)
	}
	var (
		mu        sync.Mutex
		delivered int
		wg        sync.WaitGroup
		slots     = make(chan struct{}, o.cfg.Parallel)
	)
	for _, run := range runs {
		if err := ctx.Err(); err != nil {
			break
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < o.cfg.Timeout {
			// An attempt started now could be cut by the invocation's end (the reaper Lambda's timeout) after it
			// took its claim: leave the rest to the next sweep, due as they are.
			break
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if o.retry(ctx, run, now) {
				mu.Lock()
				delivered++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return delivered, ctx.Err()
}

// retry takes and makes the next attempt at run's due signal; it reports whether the signal was delivered.
func (o *Outbox) retry(ctx context.Context, run agent.Run, now time.Time) bool {
	sg := run.Signal
	made := sg.Attempts + 1 // the run's own attempt, and the sweeps'
	log := o.log.With("thread_id", run.ThreadID, "run_id", run.ID, "signal_id", agent.SignalID(run.ID))
	if made >= o.cfg.MaxAttempts {
		if err := o.store.SettleSignal(ctx, run.ThreadID, run.ID, agent.SignalDropped); err != nil {
			log.Warn("agent.signal", "outcome", "drop_failed", "err", err)
			return false
		}
		log.Error("agent.signal", "outcome", "dropped", "attempts", made)
		return false
	}
	next := now.Add(o.backoff(made + 1)) // due again if this attempt (number made+1) fails
	err := o.store.ClaimSignal(ctx, agent.SignalClaim{ThreadID: run.ThreadID, RunID: run.ID, Attempts: sg.Attempts, NextDue: next})
	if errors.Is(err, agent.ErrSignalTaken) || agent.IsKind(err, agent.KindNotFound) {
		return false // another sweeper has it, or it was settled (or the thread deleted) meanwhile
	}
	if err != nil {
		log.Warn("agent.signal", "outcome", "claim_failed", "err", err)
		return false
	}
	return o.attempt(ctx, run, made+1)
}

// backoff is how long after attempt n (from 1) the signal is due again.
func (o *Outbox) backoff(n int) time.Duration {
	d := o.cfg.Backoff
	for i := 1; i < n && d < o.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, o.cfg.MaxBackoff)
}

var errAttemptTimeout = errors.New("signal attempt timed out")

// attempt sends run's signal to every sink (attempt n) and settles it delivered when all took it. It reports
// whether the signal was delivered.
func (o *Outbox) attempt(ctx context.Context, run agent.Run, n int) bool {
	ctx, cancel := o.timers.WithTimeoutCause(ctx, o.cfg.Timeout, errAttemptTimeout)
	defer cancel()
	f := agent.Finished(run, run.Signal.Owner)
	f.Attempt = n
	log := o.log.With("thread_id", run.ThreadID, "run_id", run.ID, "signal_id", f.ID, "status", run.Status, "attempt", n)
	var errs []error
	for _, s := range o.sinks {
		if err := s.Send(ctx, f); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		log.Warn("agent.signal", "outcome", "failed", "err", err)
		return false
	}
	if err := o.store.SettleSignal(context.WithoutCancel(ctx), run.ThreadID, run.ID, agent.SignalDelivered); err != nil {
		// Sent but not marked: the sweep sends it again (receivers deduplicate by its id).
		log.Warn("agent.signal", "outcome", "settle_failed", "err", err)
		return true
	}
	log.Info("agent.signal", "outcome", "delivered")
	return true
}
