// Package locallaunch is the in-process agent.RunLauncher of `agentloop dev` and `agentloop serve`: a run's
// continuation (a hand-over, a background run) starts on a goroutine of this process, under the launcher's own
// lifetime, not the request's. It honours the claim rules as any launcher does: the continuation takes the claim
// at the next epoch with a conditional write (engine.Continue), so a continuation of a run that moved on does
// nothing. Close stops taking continuations (Launch then fails, and the handing-over run goes on where it is)
// and waits for those in flight; those still running when its context ends are left to go stale and be reaped.
package locallaunch

import (
	"context"
	"log/slog"
	"sync"

	"github.com/agentloop/agentloop/lib/agent"
)

// Continue runs one continuation to its end (engine.Engine.Continue).
type Continue func(ctx context.Context, c agent.Continuation) (agent.Run, error)

// Launcher starts continuations on goroutines.
type Launcher struct {
	run Continue
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns a launcher that runs continuations with run (set later with SetContinue when run needs the
// launcher itself: the engine is built with it).
func New(run Continue, log *slog.Logger) *Launcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Launcher{run: run, log: log, ctx: ctx, cancel: cancel}
}

// SetContinue sets what runs continuations (before the first Launch).
func (l *Launcher) SetContinue(run Continue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.run = run
}

// Launch starts c's continuation on a goroutine and returns at once.
func (l *Launcher) Launch(_ context.Context, c agent.Continuation) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.run == nil {
		return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable, "the launcher is closed")
	}
	run := l.run
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if _, err := run(l.ctx, c); err != nil {
			l.log.Info("continuation not run", "thread_id", c.ThreadID, "run_id", c.RunID, "err", err)
		}
	}()
	return nil
}

// Wait blocks until every continuation launched so far has ended.
func (l *Launcher) Wait() { l.wg.Wait() }

// Close stops taking continuations and waits for those running until ctx ends.
func (l *Launcher) Close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		l.cancel()
		return ctx.Err()
	}
}
