package toolrouter

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// embedding is the router's fallback: what it uses, its config, and the backoff after failed embeddings calls
// (one per router: an outage is the provider's, whatever the catalog).
type embedding struct {
	Deps
	cfg  Config
	gate gate
}

// gate is the backoff after failed embeddings calls.
type gate struct {
	mu       sync.Mutex
	failures int       // consecutive failures; 0: every call goes through
	until    time.Time // while failing: no call before this
	probing  bool      // while failing: a call after the cool-down is in flight
}

// admit reports whether a call to the embedder may go now: always while none failed; after a failure, one at
// a time once the cool-down has passed.
func (e *embedding) admit() bool {
	g := &e.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failures == 0 {
		return true
	}
	if g.probing || e.Clock.Now().Before(g.until) {
		return false
	}
	g.probing = true
	return true
}

// done records an admitted call's outcome: a success ends the backoff; a failure (unless ctx ended: the step's
// own end is no failure of the provider) starts or doubles the cool-down, and is logged once, as msg with the
// error's code.
func (e *embedding) done(ctx context.Context, msg string, err error, attrs ...any) {
	g := &e.gate
	g.mu.Lock()
	g.probing = false
	if err == nil || ctx.Err() != nil {
		if err == nil {
			g.failures = 0
		}
		g.mu.Unlock()
		return
	}
	now := e.Clock.Now()
	if !now.Before(g.until) { // calls in flight when the cool-down began count as one failure
		g.failures++
	}
	wait := e.cfg.CoolDown << min(g.failures-1, 30)
	if wait <= 0 || wait > e.cfg.MaxCoolDown {
		wait = e.cfg.MaxCoolDown
	}
	g.until = now.Add(wait)
	failures := g.failures
	g.mu.Unlock()
	e.Logger.WarnContext(ctx, msg, append([]any{"outcome", "embed_failed", "code", errCode(err), "failures", failures,
		"retry_in", wait.String(), "err", err.Error()}, attrs...)...)
}

// errCode is an embeddings failure's code for the log: its *agent.Error's, or model_error (an Embedder is the
// model provider's endpoint, and the openai adapter returns its HTTP errors without a code).
func errCode(err error) string {
	if code := agent.CodeOf(err); code != agent.CodeInternal {
		return code
	}
	return agent.CodeModelError
}

// embed is e.Embedder.Embed, checked to answer one vector per text.
func (e *embedding) embed(ctx context.Context, texts []string) ([][]float32, error) {
	got, err := e.Embedder.Embed(ctx, texts)
	if err == nil && len(got) != len(texts) {
		err = fmt.Errorf("toolrouter: the embedder answered %d vectors for %d texts", len(got), len(texts))
	}
	return got, err
}

// nearest returns up to n tools not in found, nearest to the query words by embedding (at least Similarity),
// none named by or near a negated word.
func (c *catalog) nearest(ctx context.Context, query, negated []string, found []int, n int) []int {
	if len(query) == 0 {
		return nil
	}
	vecs := c.index.vectors(ctx, c.embed)
	if vecs == nil {
		return nil
	}
	key := strings.Join(query, " ") + "\x00" + strings.Join(negated, " ")
	if c.qKey != key || c.qVec == nil {
		if !c.embed.admit() {
			return nil
		}
		got, err := c.embed.embed(ctx, append([]string{strings.Join(query, " ")}, negated...))
		c.embed.done(ctx, "toolrouter.nearest", err)
		if err != nil {
			return nil
		}
		c.qKey, c.qVec, c.nVec = key, got[0], got[1:]
	}
	type hit struct {
		tool int
		sim  float64
	}
	var hits []hit
	qNorm := math.Sqrt(dot(c.qVec, c.qVec))
	nNorms := make([]float64, len(c.nVec))
	for j, nv := range c.nVec {
		nNorms[j] = math.Sqrt(dot(nv, nv))
	}
	similarity := func(q []float32, qn float64, i int) float64 {
		n := qn * c.index.norms[i]
		if n == 0 || len(q) != len(vecs[i]) {
			return 0
		}
		return dot(q, vecs[i]) / n
	}
	near := func(i int) bool { // to a negated word
		for j, nv := range c.nVec {
			if similarity(nv, nNorms[j], i) >= c.cfg.Similarity {
				return true
			}
		}
		return false
	}
	for i := range vecs {
		if slices.Contains(found, i) || c.namesAny(i, negated) {
			continue
		}
		sim := similarity(c.qVec, qNorm, i)
		if sim < c.cfg.Similarity || near(i) {
			continue
		}
		hits = append(hits, hit{i, sim})
	}
	slices.SortStableFunc(hits, func(a, b hit) int {
		switch {
		case a.sim > b.sim:
			return -1
		case a.sim < b.sim:
			return 1
		}
		return 0
	})
	out := make([]int, 0, n)
	for _, h := range hits[:min(n, len(hits))] {
		out = append(out, h.tool)
	}
	return out
}

// dot is a . b over their common length.
func dot(a, b []float32) float64 {
	var s float64
	for i := range min(len(a), len(b)) {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}
