// Package toolrouter chooses which tools of a large catalog each step offers the model (issue 19 item 5; the
// engine asks it through agent.ToolRouter and holds no routing rule). A catalog of at most Config.Min tools is
// offered whole. Above it, a step offers, in the catalog's order:
//
//   - the always-on tools (agent.Tool.AlwaysOn: the deployer's core tools; the Go demo tools are);
//   - the tools the thread used already (their calls are in the transcript the step sends, and a model that
//     called a tool once may well call it again);
//   - the keyword matches of the newest user text: the TopK tools whose BM25 score reaches Threshold.
//
// Keywords. A tool's document is its name (split at _ - . and case changes, counted twice: a name says more
// than a sentence) and its description. Text is cut into words at word boundaries (letters and digits; "file"
// never matches "profile"), lowered, stripped of a plural s and of common English words. Scores are BM25 (k1
// 1.2, b 0.75, idf ln(1+(N-df+0.5)/(df+0.5))); a word the whole catalog shares scores little, a word one tool
// holds scores most.
//
// Negation (query.go). A negated word is left out of the query, and a tool whose name holds it is not matched by
// keywords, so "don't delete the file" never picks delete_file (it stays offered only when always-on or used).
// A negator (not, no, never, neither, nor, without, avoid, cannot, any word ending in n't) negates the first content
// word after it and the list coordinated with that word: a word right after "or", "and" or "nor" ("don't delete
// or archive the files"), and a word after a comma when a comma or a conjunction follows it, that is a comma
// list a conjunction closes ("never erase, remove or drop anything", the serial comma too). The list ends at:
//
//   - the first word not joined to it, the verb's object ("the files", "it"): "don't delete it or archive it"
//     negates delete only. A wrongly negated word hides a tool the user asked for, while a tool wrongly kept is
//     still read by a model that reads the user's "don't", so the scope stays the list and no wider;
//   - a comma that does not continue it: "don't delete it, just archive it" and "don't delete, archive the
//     file" pick archive_file; so does "never erase, remove the member" (a comma list needs its conjunction);
//   - a clause break: . ; : ! ? (not between two letters or digits: "1,000", "notes.txt"), "but", "instead",
//     "then"; and a new negator opens a new scope ("don't archive, never delete the files").
//
// Embeddings (embed.go, cache.go). When keywords find fewer than MinMatches (3) tools and the router has an
// Embedder, the nearest tools by cosine similarity of their vectors to the user's content words (at least
// Similarity) fill up to MinMatches, a tool named by a negated word and a tool near a negated word (at least
// Similarity) left out. A tool's vector is of its name's and description's content words; it is computed once
// per definition and cached in the store's value area (namespace tool-vectors/<model>, keyed by a hash of the
// text embedded, read in one ListValues per catalog), so a cold start embeds only the tools it has never seen.
//
// A failed embeddings call fails only the fallback of the step that made it: that step is routed by keywords
// alone, and the failure is logged once (toolrouter.vectors or toolrouter.nearest, outcome embed_failed, with
// the error's code; nothing reaches the client, whose step goes on). Then the router leaves the embedder alone
// for a cool-down on its clock (Deps.Clock): CoolDown after the first failure, doubled after each further one up
// to MaxCoolDown, so a provider outage costs one failed request per cool-down, not one per step; after it, one
// step at a time tries again, and a success ends the backoff. A step whose own context ends counts no failure.
//
// Stale vectors. A row is keyed by its definition's hash, so a changed definition leaves its old row behind, and
// so does a tool that left the catalog. Each row carries the time a catalog last used it; loading a catalog's
// vectors (the one ListValues it reads anyway) rewrites its own rows once they are older than half of VectorTTL
// (30 days; so a used row is written again at most every 15 days, with no embedding), and deletes the rows no
// catalog has used for VectorTTL. A TTL rather than deleting, at each load, the rows the catalog lacks: processes with
// different catalogs share the namespace (a deploy rolling out a changed definition, a source that is down for a
// turn, a process whose tools file differs), and each would delete the others' rows and embed them again at its
// next cold start; a TTL bounds the rows to the definitions used in the last VectorTTL, whoever uses them. The
// store needs no TTL of its own (the value area has none). An embedding model no longer configured keeps its
// namespace (nothing lists it again); its rows are one per tool.
package toolrouter

import (
	"cmp"
	"context"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here (lib/config maps AGENT_TOOL_ROUTER_* onto Config).
const (
	// DefaultMin is the largest catalog offered whole: above it each step offers a subset.
	DefaultMin = 20
	// DefaultTopK is how many keyword matches a step offers at most (beside always-on and used tools).
	DefaultTopK = 8
	// DefaultThreshold is the BM25 score a keyword match needs. A word held by one tool of twenty scores about
	// 2.8 on its own; a word held by half the catalog about 0.7, so it counts only beside another.
	DefaultThreshold = 1.0
	// DefaultMinMatches is how many tools the keywords must find before the embedding fallback stays out: below
	// it, the nearest tools by embedding fill up to it.
	DefaultMinMatches = 3
	// DefaultSimilarity is the cosine similarity to the user's text a tool needs to be offered by the fallback.
	DefaultSimilarity = 0.3
	// DefaultCoolDown is how long the fallback leaves the embedder alone after a failed call; each further
	// failure doubles it, up to DefaultMaxCoolDown.
	DefaultCoolDown    = 30 * time.Second
	DefaultMaxCoolDown = 10 * time.Minute
	// DefaultVectorTTL is how long a cached tool vector no catalog uses is kept.
	DefaultVectorTTL = 30 * 24 * time.Hour
)

// BM25 parameters.
const (
	k1 = 1.2
	b  = 0.75
	// nameWeight is how many times a name's words count in its tool's document.
	nameWeight = 2
)

// Config tunes the router. Zero values take the defaults; a negative Min routes every catalog, a negative
// Threshold means none (every match counts).
type Config struct {
	Min        int
	TopK       int
	Threshold  float64
	MinMatches int
	Similarity float64
	// CoolDown and MaxCoolDown bound the backoff after a failed embeddings call.
	CoolDown    time.Duration
	MaxCoolDown time.Duration
	// VectorTTL is how long a cached tool vector no catalog uses is kept.
	VectorTTL time.Duration
}

func (c Config) withDefaults() Config {
	c.MinMatches = cmp.Or(c.MinMatches, DefaultMinMatches)
	c.Similarity = cmp.Or(c.Similarity, DefaultSimilarity)
	c.Min = cmp.Or(c.Min, DefaultMin)
	c.TopK = cmp.Or(c.TopK, DefaultTopK)
	c.Threshold = cmp.Or(c.Threshold, DefaultThreshold)
	c.CoolDown = cmp.Or(c.CoolDown, DefaultCoolDown)
	c.MaxCoolDown = max(cmp.Or(c.MaxCoolDown, DefaultMaxCoolDown), c.CoolDown)
	c.VectorTTL = cmp.Or(c.VectorTTL, DefaultVectorTTL)
	return c
}

// Router is an agent.ToolRouter. It keeps the index of the newest catalog it saw above the minimum: a turn
// whose tools read the same (names, descriptions, always-on; the sources cache their listings, so this is the
// rule) reuses it instead of indexing again (BenchmarkRoute: 2,000 tools take some 20 ms to index).
type Router struct {
	cfg   Config
	embed *embedding // nil: keywords only
	mu    sync.Mutex
	last  *index
}

// Deps are what the embedding fallback uses; all optional.
type Deps struct {
	// Embedder embeds tools and user text (nil: keywords only).
	Embedder agent.Embedder
	// Values caches the tools' vectors across processes (nil: in memory, per index).
	Values agent.ValueStore
	Logger *slog.Logger
	// Clock times the cool-down after a failed embeddings call and the cached vectors' age (nil: the system
	// clock).
	Clock agent.Clock
}

// New returns a router with cfg (zero fields take the defaults).
func New(d Deps, cfg Config) *Router {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.Clock == nil {
		d.Clock = agent.SystemClock{}
	}
	r := &Router{cfg: cfg.withDefaults()}
	if d.Embedder != nil {
		r.embed = &embedding{Deps: d, cfg: r.cfg}
	}
	return r
}

var _ agent.ToolRouter = (*Router)(nil)

// Catalog prepares tools for the steps of one turn: a catalog at most Min long is not indexed at all.
func (r *Router) Catalog(tools []agent.Tool) agent.ToolCatalog {
	c := &catalog{cfg: r.cfg, specs: make([]agent.ToolSpec, len(tools))}
	for i, t := range tools {
		c.specs[i] = t.Spec()
	}
	if len(tools) <= r.cfg.Min {
		return c
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil || !r.last.of(tools) {
		r.last = newIndex(tools)
	}
	c.index = r.last
	c.embed = r.embed
	return c
}

// index is the keyword index of one catalog; read-only once built (turns share it).
type index struct {
	tools     []agent.Tool         // what it indexed (Name, Description, AlwaysOn are read)
	position  map[string]int       // tool name -> position
	names     [][]string           // each tool's name words
	postings  map[string][]posting // word -> the tools that hold it
	length    []int                // each document's words (names counted nameWeight times)
	avgLength float64
	// The tools' vectors for the embedding fallback (cache.go), loaded or computed at its first use that
	// succeeds.
	vecMu sync.Mutex
	vecs  [][]float32 // nil: not had yet
	norms []float64   // each vector's length
}

// posting is one word's count in one tool's document.
type posting struct{ tool, tf int }

func newIndex(tools []agent.Tool) *index {
	x := &index{tools: slices.Clone(tools), position: make(map[string]int, len(tools)), postings: map[string][]posting{},
		names: make([][]string, len(tools)), length: make([]int, len(tools))}
	total := 0
	tf := map[string]int{}
	for i, t := range tools {
		x.position[t.Name] = i
		clear(tf)
		x.names[i] = words(t.Name, nil)
		for _, w := range x.names[i] {
			tf[w] += nameWeight
		}
		for _, w := range words(t.Description, nil) {
			tf[w]++
		}
		for w, k := range tf {
			x.postings[w] = append(x.postings[w], posting{tool: i, tf: k})
			x.length[i] += k
		}
		total += x.length[i]
	}
	x.avgLength = float64(total) / float64(len(tools))
	return x
}

// of reports whether x indexed tools as they read now.
func (x *index) of(tools []agent.Tool) bool {
	if len(x.tools) != len(tools) {
		return false
	}
	for i, t := range tools {
		if o := x.tools[i]; o.Name != t.Name || o.Description != t.Description || o.AlwaysOn != t.AlwaysOn {
			return false
		}
	}
	return true
}

// catalog is one turn's tools and, above the minimum, their keyword index.
type catalog struct {
	cfg   Config
	specs []agent.ToolSpec
	index *index     // nil: under the minimum, offered whole
	embed *embedding // nil: keywords only
	// The turn's newest query vectors (embed.go), kept while the text is the same.
	qKey string
	qVec []float32
	nVec [][]float32
}

// Offer implements agent.ToolCatalog.
func (c *catalog) Offer(ctx context.Context, q agent.ToolQuery) ([]agent.ToolSpec, bool) {
	if c.index == nil {
		return c.specs, false
	}
	keep := make([]bool, len(c.specs))
	for i, t := range c.index.tools {
		keep[i] = t.AlwaysOn
	}
	for _, name := range q.Used {
		if i, ok := c.index.position[name]; ok {
			keep[i] = true
		}
	}
	query, negated := queryWords(q.Text)
	found := c.matches(query, negated)
	for _, i := range found {
		keep[i] = true
	}
	if len(found) < c.cfg.MinMatches && c.embed != nil {
		for _, i := range c.nearest(ctx, query, negated, found, c.cfg.MinMatches-len(found)) {
			keep[i] = true
		}
	}
	offered := make([]agent.ToolSpec, 0, c.cfg.TopK+8)
	for i, k := range keep {
		if k {
			offered = append(offered, c.specs[i])
		}
	}
	return offered, true
}

// matches returns the positions of the TopK tools whose BM25 score for text reaches the threshold, best first
// (ties in catalog order); tools named by a negated word are never among them.
func (c *catalog) matches(query, negated []string) []int {
	if len(query) == 0 {
		return nil
	}
	n := float64(len(c.specs))
	scores := make([]float64, len(c.specs))
	for _, w := range query {
		ps := c.index.postings[w]
		if len(ps) == 0 {
			continue
		}
		idf := math.Log(1 + (n-float64(len(ps))+0.5)/(float64(len(ps))+0.5))
		for _, p := range ps {
			tf := float64(p.tf)
			scores[p.tool] += idf * tf * (k1 + 1) / (tf + k1*(1-b+b*float64(c.index.length[p.tool])/c.index.avgLength))
		}
	}
	type hit struct {
		tool  int
		score float64
	}
	var hits []hit
	for i, s := range scores {
		if s == 0 || s < c.cfg.Threshold || c.namesAny(i, negated) {
			continue
		}
		hits = append(hits, hit{i, s})
	}
	slices.SortFunc(hits, func(a, b hit) int {
		if a.score != b.score {
			return cmp.Compare(b.score, a.score)
		}
		return cmp.Compare(a.tool, b.tool)
	})
	out := make([]int, 0, min(len(hits), c.cfg.TopK))
	for _, h := range hits[:min(len(hits), c.cfg.TopK)] {
		out = append(out, h.tool)
	}
	return out
}

// namesAny reports whether tool i's name holds one of ws.
func (c *catalog) namesAny(i int, ws []string) bool {
	for _, w := range ws {
		if slices.Contains(c.index.names[i], w) {
			return true
		}
	}
	return false
}

// words appends the content words of s (a name or a description) to dst.
func words(s string, dst []string) []string {
	for _, raw := range rawWords(splitCase(s)) {
		if w, ok := normalize(raw); ok {
			dst = append(dst, w)
		}
	}
	return dst
}

// splitCase puts a space at each lower-to-upper case change ("getWeather" -> "get Weather").
func splitCase(s string) string {
	var out strings.Builder
	prev := rune(0)
	for _, r := range s {
		if unicode.IsUpper(r) && unicode.IsLower(prev) {
			out.WriteByte(' ')
		}
		out.WriteRune(r)
		prev = r
	}
	return out.String()
}

// normalize turns a lowered word into its index form: a possessive 's and a plural s dropped ("files" ->
// "file", "notes" -> "note"; not "class"); false for common words that say nothing of a tool.
func normalize(w string) (string, bool) {
	w = strings.TrimSuffix(w, "'s")
	if strings.ContainsRune(w, '\'') || isStop(w) {
		return "", false
	}
	if len(w) > 3 && strings.HasSuffix(w, "ies") {
		w = w[:len(w)-3] + "y"
	} else if len(w) > 3 && strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") && !strings.HasSuffix(w, "us") {
		w = w[:len(w)-1]
	}
	return w, true
}

// isStop reports the common English words left out of documents and queries.
func isStop(w string) bool {
	switch w {
	case "a", "an", "and", "are", "as", "at", "be", "by", "can", "could", "do", "does", "for", "from", "has",
		"have", "how", "i", "if", "in", "into", "is", "it", "its", "me", "my", "of", "on", "or", "our", "please",
		"so", "some", "than", "that", "the", "their", "them", "then", "there", "these", "this", "those", "to",
		"us", "was", "we", "what", "when", "where", "which", "who", "why", "will", "with", "would", "you", "your",
		"any", "all", "also", "just", "get", "want", "need", "use", "tool", "ever", "anything", "ok", "now":
		return true
	}
	return false
}
