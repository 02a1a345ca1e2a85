package toolrouter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

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

// vectors returns the index's tool vectors, had at the first call that succeeds (load); nil while they are not
// (a failure, or the cool-down after one: the step goes on with keywords alone).
func (x *index) vectors(ctx context.Context, e *embedding) [][]float32 {
	x.vecMu.Lock()
	defer x.vecMu.Unlock()
	if x.vecs != nil {
		return x.vecs
	}
	if !e.admit() {
		return nil
	}
	vecs, embedded, err := x.load(ctx, e)
	e.done(ctx, "toolrouter.vectors", err, "tools", embedded)
	if err != nil {
		return nil
	}
	e.Logger.InfoContext(ctx, "toolrouter.vectors", "outcome", "ready", "tools", len(x.tools), "embedded", embedded,
		"model", e.Embedder.EmbeddingModel())
	x.vecs, x.norms = vecs, make([]float64, len(vecs))
	for i, v := range vecs {
		x.norms[i] = math.Sqrt(dot(v, v))
	}
	return x.vecs
}

// load reads the tools' cached vectors (one ListValues), deletes the rows no catalog used for VectorTTL, embeds
// the tools it lacks (one request, reporting how many), and stores them with the rows it used that are older
// than half the TTL (their time renewed).
func (x *index) load(ctx context.Context, e *embedding) (vecs [][]float32, embedded int, err error) {
	ns := vectorsNS(e.Embedder.EmbeddingModel())
	now := e.Clock.Now()
	texts := make([]string, len(x.tools))
	keys := make([]string, len(x.tools))
	for i, t := range x.tools {
		texts[i] = toolText(t)
		keys[i] = definitionKey(texts[i])
	}
	rows := map[string]row{}
	if e.Values != nil {
		kvs, err := e.Values.ListValues(ctx, ns)
		if err != nil {
			e.Logger.WarnContext(ctx, "toolrouter.vectors", "outcome", "cache_unreadable", "err", err.Error())
		}
		for _, kv := range kvs {
			rows[kv.Key] = decodeRow(kv.Value)
		}
		e.sweep(ctx, ns, now, rows, keys)
	}
	vecs = make([][]float32, len(x.tools))
	var missing, aging []int
	for i, k := range keys {
		switch r, ok := rows[k]; {
		case !ok || r.vec == nil:
			missing = append(missing, i)
		case now.Sub(r.used) >= e.cfg.VectorTTL/2:
			vecs[i] = r.vec
			aging = append(aging, i)
		default:
			vecs[i] = r.vec
		}
	}
	if len(missing) > 0 {
		in := make([]string, len(missing))
		for j, i := range missing {
			in[j] = texts[i]
		}
		got, err := e.embed(ctx, in)
		if err != nil {
			return nil, len(missing), err
		}
		for j, i := range missing {
			vecs[i] = got[j]
		}
	}
	if e.Values != nil {
		write := append(missing, aging...)
		e.each(ctx, len(write), "cache_unwritable", func(j int) error {
			i := write[j]
			return e.Values.PutValue(ctx, ns, keys[i], encodeRow(row{vec: vecs[i], used: now}))
		})
	}
	return vecs, len(missing), nil
}

// sweep deletes the rows of ns that keys (the catalog's) lack and no catalog used for VectorTTL.
func (e *embedding) sweep(ctx context.Context, ns string, now time.Time, rows map[string]row, keys []string) {
	catalog := make(map[string]bool, len(keys))
	for _, k := range keys {
		catalog[k] = true
	}
	var stale []string
	for k, r := range rows {
		if now.Sub(r.used) >= e.cfg.VectorTTL && !catalog[k] {
			stale = append(stale, k)
		}
	}
	if len(stale) == 0 {
		return
	}
	slices.Sort(stale)
	e.each(ctx, len(stale), "stale_undeletable", func(j int) error { return e.Values.DeleteValue(ctx, ns, stale[j]) })
	e.Logger.InfoContext(ctx, "toolrouter.vectors", "outcome", "stale_deleted", "rows", len(stale))
}

// vectorWriters is how many cache rows are written at once: a cold start that meets 2,000 new tools writes 2,000
// items, which one at a time on DynamoDB would hold up its first step for seconds.
const vectorWriters = 16

// each runs write(0..n-1), vectorWriters at a time; a failure is logged once, as outcome.
func (e *embedding) each(ctx context.Context, n int, outcome string, write func(int) error) {
	var wg sync.WaitGroup
	var failed sync.Once
	slots := make(chan struct{}, vectorWriters)
	for j := range n {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := write(j); err != nil {
				failed.Do(func() {
					e.Logger.WarnContext(ctx, "toolrouter.vectors", "outcome", outcome, "err", err.Error())
				})
			}
		}()
	}
	wg.Wait()
}

// row is a cached tool vector and the time a catalog last used it.
type row struct {
	vec  []float32 // nil: unreadable
	used time.Time
}

// rowMagic starts a cached row; then come the time a catalog last used it (Unix seconds, int64 little-endian)
// and the vector (float32s, little-endian). A row without it, written before rows carried a time, reads as used
// at the zero time: rewritten by a catalog that has it, deleted by the others.
const rowMagic = "tv1\x00"

func encodeRow(r row) []byte {
	b := make([]byte, len(rowMagic)+8+4*len(r.vec))
	copy(b, rowMagic)
	binary.LittleEndian.PutUint64(b[len(rowMagic):], uint64(r.used.Unix()))
	for i, x := range r.vec {
		binary.LittleEndian.PutUint32(b[len(rowMagic)+8+4*i:], math.Float32bits(x))
	}
	return b
}

// decodeRow reads encodeRow's bytes (or an older row's bare vector); vec is nil when they are neither.
func decodeRow(b []byte) row {
	var r row
	if bytes.HasPrefix(b, []byte(rowMagic)) && len(b) >= len(rowMagic)+8 {
		r.used = time.Unix(int64(binary.LittleEndian.Uint64(b[len(rowMagic):])), 0).UTC()
		b = b[len(rowMagic)+8:]
	}
	if len(b) == 0 || len(b)%4 != 0 {
		return row{used: r.used}
	}
	r.vec = make([]float32, len(b)/4)
	for i := range r.vec {
		r.vec[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return r
}
