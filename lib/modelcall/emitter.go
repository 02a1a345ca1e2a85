package modelcall

import "github.com/agentloop/agentloop/lib/agent"

// Emitter sends an attempt's events to the caller, each held back until the next one is at hand, so that it can
// say more follows at once (agent.ModelEvent.More), or until Release: the attempt is about to wait on the
// provider, or to return. Nothing goes to a caller whose context has ended (an event held back when the caller
// cancelled would otherwise go out after it). Attempt.Emitter makes one.
type Emitter struct {
	attempt *Attempt
	emit    func(agent.ModelEvent) error
	held    agent.ModelEvent
	holding bool // held is the newest event, not emitted yet
	// Emitted says an event went out or is held back: the attempt can no longer be retried.
	Emitted bool
}

// Emitter is an Emitter of the attempt's events to emit.
func (a *Attempt) Emitter(emit func(agent.ModelEvent) error) Emitter {
	return Emitter{attempt: a, emit: emit}
}

// Send emits the event held back (More: ev follows it at once) and holds ev back in its place.
func (e *Emitter) Send(ev agent.ModelEvent) error {
	e.Emitted = true
	held, ok := e.held, e.holding
	e.held, e.holding = ev, true
	if !ok {
		return nil
	}
	held.More = true
	return e.toCaller(held)
}

// Release emits the event held back, with More false.
func (e *Emitter) Release() error {
	if !e.holding {
		return nil
	}
	held := e.held
	e.held, e.holding = agent.ModelEvent{}, false
	return e.toCaller(held)
}

// Drop forgets the event held back: the caller cancelled, and asked for nothing more.
func (e *Emitter) Drop() { e.held, e.holding = agent.ModelEvent{}, false }

func (e *Emitter) toCaller(ev agent.ModelEvent) error {
	if e.attempt != nil && e.attempt.CallerDone() {
		return nil
	}
	return e.emit(ev)
}
