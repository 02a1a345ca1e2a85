package threads

import (
	"cmp"
	"context"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// Stream readers per user and per run (DESIGN.md principle 6), enforced through the store's agent.LimitStore so
// they hold across every instance and Lambda. lib/config maps AGENT_MAX_STREAMS_PER_USER,
// AGENT_MAX_STREAMS_PER_RUN and AGENT_STREAM_LEASE_TTL onto Config.
//
// A reader attached to a live run (GET /chat/{id}/stream that does not answer 204) holds one lease in
// "streams/user/<owner>" and one in "streams/run/<runId>" (agent.StreamUserScope, agent.StreamRunScope) for as
// long as it tails, renewed every third of StreamLeaseTTL and given back when it ends. Its holder id names the run
// (agent.ReaderHolder), so that when the run is reaped the reaper gives back every lease of its readers at once: a
// reader whose process died with the run frees both then, and within StreamLeaseTTL in any case (its process died
// while the run lives on elsewhere). A live reader of a reaped run loses its leases too, but it is ending (the
// reaper's final segment ends it), and until it ends a renewal that finds its lease gone takes it again when there
// is room (agent.KeepLeases), so it is never cut off. A
// reader over either limit is refused before a byte is written: 429 too_many_streams with Retry-After. The AI
// SDK's resume treats any status but 200 and 204 as an error, so a client over the limit sees an error, which is
// what it should see: it already has that many readers open.
const (
	DefaultMaxStreamsPerUser = 16
	DefaultMaxStreamsPerRun  = 8
	DefaultStreamLeaseTTL    = 30 * time.Second
)

// withLimits fills the limits' zero values (a negative limit means none).
func (c Config) withLimits() Config {
	c.MaxStreamsPerUser = cmp.Or(c.MaxStreamsPerUser, DefaultMaxStreamsPerUser)
	c.MaxStreamsPerRun = cmp.Or(c.MaxStreamsPerRun, DefaultMaxStreamsPerRun)
	c.StreamLeaseTTL = cmp.Or(c.StreamLeaseTTL, DefaultStreamLeaseTTL)
	return c
}

// holdStream takes the reader's leases for a reader of owner on runID and keeps them renewed; the returned func
// stops the renewals and gives them back.
func (s *Service) holdStream(ctx context.Context, owner, runID string) (func(), error) {
	holder := agent.ReaderHolder(runID, agent.RandomIDs{Clock: s.clock}.New("reader"))
	var held []agent.LeaseRequest
	release := func() {
		ctx := context.WithoutCancel(ctx)
		for _, r := range held {
			if err := s.store.ReleaseLease(ctx, r.Scope, r.Holder); err != nil {
				s.log.Warn("release stream lease", "scope", r.Scope, "err", err)
			}
		}
	}
	for _, l := range []struct {
		scope string
		limit int
		who   string
	}{
		{agent.StreamUserScope(owner), s.cfg.MaxStreamsPerUser, "you have"},
		{agent.StreamRunScope(runID), s.cfg.MaxStreamsPerRun, "this reply has"},
	} {
		if l.limit < 0 {
			continue
		}
		r := agent.LeaseRequest{Scope: l.scope, Holder: holder, Limit: l.limit, TTL: s.cfg.StreamLeaseTTL, Now: s.clock.Now()}
		retry, err := s.store.AcquireLease(ctx, r)
		if err == nil && retry > 0 {
			err = agent.Limited(agent.CodeTooManyStreams, retry, "%s %d live streams open, the most allowed; close one first", l.who, l.limit)
		}
		if err != nil {
			release()
			return nil, err
		}
		held = append(held, r)
	}
	if len(held) == 0 {
		return func() {}, nil
	}
	// Renewed every third of the TTL for as long as the reader tails.
	stop := agent.KeepLeases(context.WithoutCancel(ctx), s.store, s.clock, held, s.cfg.StreamLeaseTTL/3, 0,
		func(r agent.LeaseRequest, err error) { s.log.Warn("renew stream lease", "scope", r.Scope, "err", err) })
	var once sync.Once
	return func() {
		once.Do(func() {
			stop()
			release()
		})
	}, nil
}
