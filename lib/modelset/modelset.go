// Package modelset is the Model port over a models file (lib/modelsfile): one adapter per entry, and Stream routes
// each request by its model name, an entry's name, to that entry's adapter. The engine and the sub-agent ask for
// entries by name (AGENT_MODEL, AGENT_SUBAGENT_MODEL, AGENT_TITLE_MODEL); the provider sees its own model id.
//
// Stream replaces the request's model with the entry's provider model id, caps MaxOutputTokens by the entry's
// maxOutputTokens (and sets it when the request has none), and reports ModelResult.Model as the provider
// returned it (the entry's model id when the provider named none), so metadata.model shows which model answered.
// A name that is no entry is an error with code agent.CodeUnknownModel, before anything is sent.
//
// The adapters are built by constructors the wiring gives, one per provider (Constructors): this package imports
// no adapter. An entry whose provider has no constructor fails New, naming the provider as not built yet.
//
// # Failover
//
// An entry's fallback list (modelsfile: other entries' names) is tried in order when the entry's adapter fails
// with an error Retryable accepts and nothing has been emitted yet: each fallback gets the request as its own
// entry would (its provider model id, its maxOutputTokens cap), and ModelResult.Model names the model that
// answered, so metadata.model shows the fallback. The adapters have already retried a transient failure
// themselves (before their first emit) by then: failover is what comes after the retries of one provider.
//
// Only the requested entry's list is followed, not a fallback's own list: the list beside an entry is the whole
// plan for that entry, read in one place, and bounds the extra requests (and their cost and latency) to its
// length. (The file refuses cycles, so following would be safe, but a fallback's list is written for requests to
// that fallback, and would make what a request to "main" may reach depend on every entry it can reach.)
//
// The chain stops at the first answer, at the first error Retryable refuses (a refused request, a context too
// long, a file the provider cannot read: another model would refuse it as well, or the caller must see it), at
// the first event emitted (a reply begun is never restarted elsewhere: the engine keeps the partial reply and
// ends the run with agent.CodeModelInterrupted), and when ctx ends. When every entry failed, the last error is
// returned. A fallback may have a smaller context (contextTokens) than the entry the request was pruned for: the
// provider then refuses it, and that refusal is returned.
//
// Each failover is logged (one line, "model.failover": from, the entry that just failed; to; the code of its
// error; attempt, 1 for the first fallback) and counted through agent.Failovers (lib/emf: the Failovers metric,
// by the entry that failed), and Set.Failovers counts them in the process.
package modelset

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modelsfile"
	"github.com/agentloop/agentloop/lib/secretref"
)

// Constructor builds the adapter of one entry; apiKey is the entry's key, resolved ("" when it has none).
type Constructor func(e modelsfile.Model, apiKey string) (agent.Model, error)

// Constructors are the adapters the wiring can build, by provider (modelsfile.OpenAIChat and the like).
type Constructors map[string]Constructor

// Set routes requests to its entries' adapters by name.
type Set struct {
	file      string
	entries   map[string]entry
	names     []string
	log       *slog.Logger
	metrics   agent.Failovers
	failovers atomic.Int64
}

// Option sets what a Set reports to.
type Option func(*Set)

// WithLogger logs failovers to log (the default: slog.Default()).
func WithLogger(log *slog.Logger) Option {
	return func(s *Set) {
		if log != nil {
			s.log = log
		}
	}
}

// WithFailovers counts failovers in m (lib/emf's Writer); nil counts none but Set.Failovers.
func WithFailovers(m agent.Failovers) Option { return func(s *Set) { s.metrics = m } }

type entry struct {
	cfg   modelsfile.Model
	model agent.Model
}

var _ agent.Model = (*Set)(nil)

// New builds one adapter per entry of f, with keys, the values of the entries' apiKey references.
func New(f *modelsfile.File, keys secretref.Values, build Constructors, opts ...Option) (*Set, error) {
	s := &Set{file: f.Name, entries: make(map[string]entry, len(f.Models)), names: f.Names(), log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	built := make([]string, 0, len(build))
	for p := range build {
		built = append(built, p)
	}
	slices.Sort(built)
	for i, m := range f.Models {
		c, ok := build[m.Provider]
		if !ok {
			return nil, fmt.Errorf("%s:%d: models[%d].provider: %s is not built yet in this agentloop (built: %s)",
				f.Name, m.Line, i, m.Provider, strings.Join(built, ", "))
		}
		key := ""
		if m.APIKey != "" {
			key = keys.Expand(m.APIKey)
		}
		model, err := c(m, key)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: models[%d] (%s): %w", f.Name, m.Line, i, m.Name, err)
		}
		s.entries[m.Name] = entry{cfg: m, model: model}
	}
	return s, nil
}

// Stream sends req to the adapter of the entry req.Model names, and to its fallbacks in order while the
// failures are retryable and nothing was emitted (the package doc's Failover).
func (s *Set) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	e, ok := s.entries[req.Model]
	if !ok {
		return agent.ModelResult{}, agent.E(agent.KindInternal, agent.CodeUnknownModel,
			"model %q is no entry of the models file %s (its entries: %s)", req.Model, s.file, strings.Join(s.names, ", "))
	}
	emitted := false
	seen := func(ev agent.ModelEvent) error {
		emitted = true
		return emit(ev)
	}
	res, err := e.stream(ctx, req, seen)
	failed := e.cfg.Name
	for attempt, name := range e.cfg.Fallback {
		if err == nil || emitted || ctx.Err() != nil || !Retryable(err) {
			break
		}
		s.failovers.Add(1)
		if s.metrics != nil {
			s.metrics.FailedOver(failed, agent.CodeOf(err))
		}
		s.log.WarnContext(ctx, "model.failover", "from", failed, "to", name, "code", agent.CodeOf(err),
			"attempt", attempt+1, "err", err)
		// The file checked that each fallback is an entry.
		res, err = s.entries[name].stream(ctx, req, seen)
		failed = name
	}
	return res, err
}

// stream sends req to the entry's adapter, as the entry's provider model id and within its output cap.
func (e entry) stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	req.Model = e.cfg.Model
	if limit := e.cfg.MaxOutputTokens; limit > 0 && (req.MaxOutputTokens <= 0 || req.MaxOutputTokens > limit) {
		req.MaxOutputTokens = limit
	}
	res, err := e.model.Stream(ctx, req, emit)
	if res.Model == "" {
		res.Model = e.cfg.Model
	}
	return res, err
}

// Retryable reports whether an adapter's error may pass with another model: a failure of the provider, not of
// the request. Every adapter (lib/openai, lib/openairesponses, lib/anthropic, lib/bedrockconverse) returns
// *agent.Error with these kinds and codes, and the same safe messages for the same failures; an error this list
// does not name is not failed over (a new message fails loudly rather than doubling requests):
//
//	KindUnavailable, CodeModelTimeout                     yes  no first token in time, or the stream stalled
//	KindUnavailable, CodeModelError, with the message
//	  "the model provider returned HTTP 408/409/429/5xx"  yes  the provider timed out, conflicted, rate-limited us,
//	                                                           is down or overloaded (Anthropic's 529 included)
//	  "the model provider returned HTTP <other 4xx>"      no   the request is refused (400), or this entry's key or
//	                                                           model id is wrong (401, 403, 404): the entry's own
//	                                                           fault, which a fallback would hide from the operator
//	  "the connection to the model provider failed"       yes  refused or reset connections
//	  "the model stream ended before the model finished"  yes  the stream was cut before its end
//	  "the model provider failed mid-stream"              yes  an error event in the stream (before any event here)
//	  "the model provider failed (<code>)"                yes  Bedrock's throttling and server exceptions
//	  anything else                                       no   "the model provider refused the request (…)",
//	                                                           "the deployment may not call this model on
//	                                                           Bedrock", no AWS credentials, a malformed chunk
//	KindLimited                                           yes  a rate limit
//	KindCanceled                                          no   ctx ended (a stop, the run's wall clock)
//	KindTooLarge, KindInvalid, anything else              no   context too long, a file refused, content filtered,
//	                                                           a request that cannot be built
//
// What is left: the adapters decide "transient" themselves (their retry flag) and could say so on the error,
// which would replace the messages here.
func Retryable(err error) bool {
	var ae *agent.Error
	if err == nil || !errors.As(err, &ae) {
		return false
	}
	switch {
	case ae.Kind == agent.KindLimited:
		return true
	case ae.Kind != agent.KindUnavailable:
		return false
	case ae.Code == agent.CodeModelTimeout:
		return true
	case ae.Code != agent.CodeModelError:
		return false
	}
	var status int
	if _, err := fmt.Sscanf(ae.Message, "the model provider returned HTTP %d", &status); err == nil {
		return status == 408 || status == 409 || status == 429 || status >= 500
	}
	switch msg := ae.Message; {
	case msg == "the connection to the model provider failed",
		msg == "the model stream ended before the model finished",
		msg == "the model provider failed mid-stream",
		strings.HasPrefix(msg, "the model provider failed ("):
		return true
	}
	return false
}

// Failovers is how many times a request went on to a fallback since the Set was built.
func (s *Set) Failovers() int64 { return s.failovers.Load() }

// Entry is the entry called name.
func (s *Set) Entry(name string) (modelsfile.Model, bool) {
	e, ok := s.entries[name]
	return e.cfg, ok
}

// Adapter is the adapter of the entry called name (nil: no such entry).
func (s *Set) Adapter(name string) agent.Model { return s.entries[name].model }

// ContextTokens is the context budget of the entry called name (0: the deployment's, AGENT_CONTEXT_TOKENS).
func (s *Set) ContextTokens(name string) int { return s.entries[name].cfg.ContextTokens }

// Embedder is the embeddings of the entry called name, when its adapter has them (nil otherwise): the tool
// router embeds through the default entry.
func (s *Set) Embedder(name string) agent.Embedder {
	emb, _ := s.entries[name].model.(agent.Embedder)
	return emb
}
