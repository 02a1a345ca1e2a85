package toolrouter

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/agentloop/agentloop/lib/agent"
)

// vectorsNS is the value namespace of the tools' vectors of one embedding model.
func vectorsNS(model string) string { return "tool-vectors/" + model }

// definitionKey is the cache key of a tool's vector: what is embedded, hashed.
func definitionKey(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:16])
}

// toolText is what a tool's vector embeds: its name's and description's content words.
func toolText(t agent.Tool) string {
	return strings.Join(words(t.Description, words(t.Name, nil)), " ")
}

// vectors returns the index's tool vectors, computing them at the first call: those the store holds are read
// (one ListValues), the others embedded in one request and stored. Nil when they cannot be had (logged).
func (x *index) vectors(ctx context.Context, d *Deps) [][]float32 {
	x.vecOnce.Do(func() {
		model := d.Embedder.EmbeddingModel()
		texts := make([]string, len(x.tools))
		keys := make([]string, len(x.tools))
		for i, t := range x.tools {
			texts[i] = toolText(t)
			keys[i] = definitionKey(texts[i])
		}
		cached := map[string][]float32{}
		if d.Values != nil {
			kvs, err := d.Values.ListValues(ctx, vectorsNS(model))
			if err != nil {
				d.Logger.WarnContext(ctx, "toolrouter.vectors", "outcome", "cache_unreadable", "err", err.Error())
			}
			for _, kv := range kvs {
				cached[kv.Key] = decodeVector(kv.Value)
			}
		}
		vecs := make([][]float32, len(x.tools))
		var missing []int
		for i, k := range keys {
			if v, ok := cached[k]; ok && v != nil {
				vecs[i] = v
			} else {
				missing = append(missing, i)
			}
		}
		if len(missing) > 0 {
			in := make([]string, len(missing))
			for j, i := range missing {
				in[j] = texts[i]
			}
			got, err := d.Embedder.Embed(ctx, in)
			if err != nil {
				d.Logger.WarnContext(ctx, "toolrouter.vectors", "outcome", "embed_failed", "tools", len(missing), "err", err.Error())
				return
			}
			for j, i := range missing {
				vecs[i] = got[j]
			}
			if d.Values != nil {
				storeVectors(ctx, d, model, missing, keys, vecs)
			}
		}
		d.Logger.InfoContext(ctx, "toolrouter.vectors", "outcome", "ready", "tools", len(x.tools), "embedded", len(missing), "model", model)
		x.vecs, x.norms = vecs, make([]float64, len(vecs))
		for i, v := range vecs {
			x.norms[i] = math.Sqrt(dot(v, v))
		}
	})
	return x.vecs
}

// vectorWriters is how many vectors are stored at once: a cold start that meets 2,000 new tools writes 2,000
// items, which one at a time on DynamoDB would hold up its first step for seconds.
const vectorWriters = 16

// storeVectors writes the vectors of the tools at positions, vectorWriters at a time; a failure is logged once.
func storeVectors(ctx context.Context, d *Deps, model string, positions []int, keys []string, vecs [][]float32) {
	var wg sync.WaitGroup
	var failed sync.Once
	slots := make(chan struct{}, vectorWriters)
	for _, i := range positions {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := d.Values.PutValue(ctx, vectorsNS(model), keys[i], encodeVector(vecs[i])); err != nil {
				failed.Do(func() {
					d.Logger.WarnContext(ctx, "toolrouter.vectors", "outcome", "cache_unwritable", "err", err.Error())
				})
			}
		}()
	}
	wg.Wait()
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
		got, err := c.embed.Embedder.Embed(ctx, append([]string{strings.Join(query, " ")}, negated...))
		if err != nil {
			c.embed.Logger.WarnContext(ctx, "toolrouter.nearest", "outcome", "embed_failed", "err", err.Error())
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

// encodeVector is a vector as the store keeps it: little-endian float32s.
func encodeVector(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// decodeVector reads encodeVector's bytes (nil when they are not a whole number of float32s).
func decodeVector(b []byte) []float32 {
	if len(b) == 0 || len(b)%4 != 0 {
		return nil
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}
