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
package modelset

import (
	"context"
	"fmt"
	"slices"
	"strings"

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
	file    string
	entries map[string]entry
	names   []string
}

type entry struct {
	cfg   modelsfile.Model
	model agent.Model
}

var _ agent.Model = (*Set)(nil)

// New builds one adapter per entry of f, with keys, the values of the entries' apiKey references.
func New(f *modelsfile.File, keys secretref.Values, build Constructors) (*Set, error) {
	s := &Set{file: f.Name, entries: make(map[string]entry, len(f.Models)), names: f.Names()}
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

// Stream sends req to the adapter of the entry req.Model names.
func (s *Set) Stream(ctx context.Context, req agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	e, ok := s.entries[req.Model]
	if !ok {
		return agent.ModelResult{}, agent.E(agent.KindInternal, agent.CodeUnknownModel,
			"model %q is no entry of the models file %s (its entries: %s)", req.Model, s.file, strings.Join(s.names, ", "))
	}
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
