package toolrouter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/offline"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/toolrouter"
)

// embedder is the openai adapter's embeddings against the offline model over HTTP (deterministic vectors in
// which "remove" and "erase" mean "delete", "document" means "file", "forecast" means "weather").
func embedder(t *testing.T) (*openai.Model, *offline.Server) {
	t.Helper()
	srv := offline.New()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return openai.New(openai.Config{BaseURL: hs.URL + "/v1/", Model: offline.DefaultModel}), srv
}

// Issue 19 item 5: when keywords find fewer than 3 tools, the nearest by embedding fill up to 3: synonyms no
// keyword matches are found, a negated word keeps its near tools out, and enough keyword hits leave the
// fallback out.
func TestEmbeddingFallback(t *testing.T) {
	t.Parallel()
	model, _ := embedder(t)
	always := []string{"add_note", "ask_user_question"}
	tests := []struct {
		name string
		text string
		want []string // the offer, in catalog order
		none []string // never offered
	}{
		{name: "synonyms only embeddings find", text: "remove that document",
			want: append(always, "delete_file"), none: nil},
		{name: "a synonym of weather", text: "is rain likely tomorrow", want: append(always, "get_weather")},
		{name: "negated synonym keeps delete out", text: "never erase a document", none: []string{"delete_file", "delete_user"}},
		{name: "keywords enough: no fallback", text: "delete the file",
			want: append(always, "delete_file", "read_file", "write_file", "delete_user", "archive_file")},
	}
	r := toolrouter.New(toolrouter.Deps{Embedder: model}, toolrouter.Config{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := r.Catalog(catalog()).Offer(context.Background(), agent.ToolQuery{Text: tc.text})
			names := names(got)
			t.Logf("offer %q = %v", tc.text, names)
			for _, w := range tc.want {
				if !slices.Contains(names, w) {
					t.Errorf("offer %q = %v: want %s in it", tc.text, names, w)
				}
			}
			for _, n := range tc.none {
				if slices.Contains(names, n) {
					t.Errorf("offer %q = %v: want no %s", tc.text, names, n)
				}
			}
			if tc.name == "keywords enough: no fallback" && !slices.Equal(names, tc.want) {
				t.Errorf("offer %q = %v, want exactly %v", tc.text, names, tc.want)
			}
			if len(names) > len(always)+max(3, 5) {
				t.Errorf("offer %q = %v: more than the fallback's 3", tc.text, names)
			}
		})
	}
	// Without embeddings the synonym finds nothing.
	got, _ := toolrouter.New(toolrouter.Deps{}, toolrouter.Config{}).Catalog(catalog()).Offer(context.Background(), agent.ToolQuery{Text: "remove that document"})
	if !slices.Equal(names(got), always) {
		t.Errorf("keywords only: %v, want %v", names(got), always)
	}
}

// The tools' vectors are embedded once per definition and kept in the store: a second process (a new router
// over the same SQLite file) embeds only the user's text, and a changed description only that tool.
func TestVectorsCachedAcrossColdStarts(t *testing.T) {
	t.Parallel()
	model, srv := embedder(t)
	path := filepath.Join(t.TempDir(), "db.sqlite")
	offer := func(tools []agent.Tool) (requests, inputs int64) {
		t.Helper()
		store, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		r0, i0 := srv.Embedded()
		got, _ := toolrouter.New(toolrouter.Deps{Embedder: model, Values: store}, toolrouter.Config{}).Catalog(tools).
			Offer(t.Context(), agent.ToolQuery{Text: "remove that document"})
		if !slices.Contains(names(got), "delete_file") {
			t.Fatalf("offer %v: want delete_file", names(got))
		}
		r1, i1 := srv.Embedded()
		return r1 - r0, i1 - i0
	}
	n := int64(len(catalog()))
	if req, in := offer(catalog()); req != 2 || in != n+1 {
		t.Errorf("first cold start: %d embedding requests of %d inputs, want 2 of %d (the tools, the text)", req, in, n+1)
	}
	if req, in := offer(catalog()); req != 1 || in != 1 {
		t.Errorf("second cold start: %d embedding requests of %d inputs, want 1 of 1 (the text only)", req, in)
	}
	changed := catalog()
	changed[5].Description = "List what a directory of the workspace holds."
	if req, in := offer(changed); req != 2 || in != 2 {
		t.Errorf("a changed description: %d embedding requests of %d inputs, want 2 of 2 (that tool, the text)", req, in)
	}
}

// Turns at once share the router's index and its vectors: the tools are embedded once (run with -race).
func TestConcurrentTurns(t *testing.T) {
	t.Parallel()
	model, srv := embedder(t)
	r := toolrouter.New(toolrouter.Deps{Embedder: model}, toolrouter.Config{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, _ := r.Catalog(catalog()).Offer(context.Background(), agent.ToolQuery{Text: "remove that document"})
			if !slices.Contains(names(got), "delete_file") {
				t.Errorf("offer %v: want delete_file", names(got))
			}
		}()
	}
	wg.Wait()
	if _, inputs := srv.Embedded(); inputs != int64(len(catalog()))+8 {
		t.Errorf("%d inputs embedded, want the %d tools once and 8 texts", inputs, len(catalog()))
	}
}

// clock is a test clock that moves only when told.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// outage is the offline model with its POST /v1/embeddings failing (503, OpenAI's error shape) while down.
type outage struct {
	http.Handler
	down     atomic.Bool
	attempts atomic.Int64 // embeddings requests received, failed ones included
}

func (o *outage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/embeddings") {
		o.attempts.Add(1)
		if o.down.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"embeddings shard 7 is down","type":"server_error","code":null}}`)
			return
		}
	}
	o.Handler.ServeHTTP(w, r)
}

// A failed embeddings call fails only that step's fallback: the step is routed by keywords alone, the failure
// is logged once with its code, and the router leaves the embedder alone for a cool-down on its clock (30 s,
// doubled per further failure up to MaxCoolDown), so an outage costs one request per cool-down, not one per
// step; after it, the fallback works again. The query's embedding is gated the same way, and a step whose own
// context ended counts no failure.
func TestEmbedderOutage(t *testing.T) {
	t.Parallel()
	o := &outage{Handler: offline.New()}
	hs := httptest.NewServer(o)
	t.Cleanup(hs.Close)
	model := openai.New(openai.Config{BaseURL: hs.URL + "/v1/", Model: offline.DefaultModel})
	clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	r := toolrouter.New(toolrouter.Deps{Embedder: model, Clock: clk, Logger: logger},
		toolrouter.Config{CoolDown: 30 * time.Second, MaxCoolDown: time.Minute})
	always := []string{"add_note", "ask_user_question"}
	steps := []struct {
		name     string
		down     bool
		advance  time.Duration
		canceled bool
		attempts int64 // embeddings requests the step sends
		fallback bool  // delete_file offered (the fallback worked); else exactly the keywords' offer
	}{
		{name: "outage: keywords alone", down: true, attempts: 1},
		{name: "in the cool-down: no request", down: true},
		{name: "a second before its end", down: true, advance: 29 * time.Second},
		{name: "after it: one try, failing", down: true, advance: time.Second, attempts: 1},
		{name: "the cool-down doubled", down: true, advance: 59 * time.Second},
		{name: "after it: one try, failing", down: true, advance: time.Second, attempts: 1},
		{name: "the cool-down at its bound", down: true, advance: 59 * time.Second},
		{name: "back: the tools and the text", advance: time.Second, attempts: 2, fallback: true},
		{name: "the text's embedding fails", down: true, attempts: 1},
		{name: "the backoff starts over", down: true, advance: 29 * time.Second},
		{name: "back: the text", advance: time.Second, attempts: 1, fallback: true},
		{name: "the step's context ended", canceled: true},
		{name: "no failure counted", attempts: 1, fallback: true},
	}
	for i, s := range steps {
		clk.advance(s.advance)
		o.down.Store(s.down)
		ctx, cancel := context.WithCancel(context.Background())
		if s.canceled {
			cancel()
		}
		before := o.attempts.Load()
		got, _ := r.Catalog(catalog()).Offer(ctx, agent.ToolQuery{Text: "remove that document"}) // a new turn
		cancel()
		names := names(got)
		if n := o.attempts.Load() - before; n != s.attempts {
			t.Errorf("step %d (%s): %d embeddings requests, want %d", i, s.name, n, s.attempts)
		}
		if s.fallback != slices.Contains(names, "delete_file") || !s.fallback && !slices.Equal(names, always) {
			t.Errorf("step %d (%s): offered %v, want the fallback %v (else the keywords' %v)", i, s.name, names, s.fallback, always)
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	var waits []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["outcome"] != "embed_failed" {
			continue
		}
		if rec["code"] != agent.CodeModelError || rec["level"] != "WARN" {
			t.Errorf("log line %v: want a warning with code model_error", rec)
		}
		waits = append(waits, fmt.Sprint(rec["retry_in"]))
	}
	if want := []string{"30s", "1m0s", "1m0s", "30s"}; !slices.Equal(waits, want) {
		t.Errorf("embed_failed lines with retry_in %v, want one per failed request: %v", waits, want)
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Cached vectors are bounded: a row no catalog used for VectorTTL (30 days) is deleted by the next load of any
// catalog, and a catalog renews the rows it uses once they are older than half the TTL, so that another
// catalog's load does not delete them (here A and B differ in one tool's description, as two processes during
// a deploy). A row written before rows carried a time is renewed by a catalog that has it, deleted otherwise.
func TestStaleVectorsExpire(t *testing.T) {
	t.Parallel()
	model, srv := embedder(t)
	path := filepath.Join(t.TempDir(), "db.sqlite")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	ns := "tool-vectors/" + model.EmbeddingModel()
	a := catalog()
	b := catalog()
	b[5].Description = "List what a directory of the workspace holds."
	n := len(a)

	store, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	legacy := make([]byte, 4*offline.EmbeddingDims) // a bare vector, as rows were written before they carried a time
	if err := store.PutValue(t.Context(), ns, "0000-a-definition-long-gone", legacy); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		name     string
		at       time.Duration
		tools    []agent.Tool
		embedded int64 // inputs embedded: the tools the cache lacks, and the text
		rows     int
	}{
		{name: "A's first cold start: the legacy row goes", at: 0, tools: a, embedded: int64(n) + 1, rows: n},
		{name: "B: one changed tool", at: day, tools: b, embedded: 2, rows: n + 1},
		{name: "A at 20 days renews its rows", at: 20 * day, tools: a, embedded: 1, rows: n + 1},
		{name: "B at 40 days: A's row renewed at 20", at: 40 * day, tools: b, embedded: 1, rows: n + 1},
		{name: "B at 51 days: A's row unused for 31 days goes", at: 51 * day, tools: b, embedded: 1, rows: n},
		{name: "A again: that tool embedded anew", at: 51 * day, tools: a, embedded: 2, rows: n + 1},
	}
	for _, s := range steps {
		clk := &clock{now: t0.Add(s.at)}
		_, before := srv.Embedded()
		r := toolrouter.New(toolrouter.Deps{Embedder: model, Values: store, Clock: clk, Logger: slog.New(slog.DiscardHandler)}, toolrouter.Config{}) // a cold start
		got, _ := r.Catalog(s.tools).Offer(t.Context(), agent.ToolQuery{Text: "remove that document"})
		if !slices.Contains(names(got), "delete_file") {
			t.Errorf("%s: offered %v, want delete_file", s.name, names(got))
		}
		_, after := srv.Embedded()
		rows, err := store.ListValues(t.Context(), ns)
		if err != nil {
			t.Fatal(err)
		}
		if after-before != s.embedded || len(rows) != s.rows {
			t.Errorf("%s: %d inputs embedded and %d rows, want %d and %d", s.name, after-before, len(rows), s.embedded, s.rows)
		}
	}
}

// MinMatches and Similarity bound the fallback (AGENT_TOOL_ROUTER_MIN_MATCHES, AGENT_TOOL_ROUTER_SIMILARITY): the
// nearest tools fill the offer up to MinMatches, and only those at least Similarity near the text.
func TestFallbackBounds(t *testing.T) {
	t.Parallel()
	model, _ := embedder(t)
	always := []string{"add_note", "ask_user_question"}
	keywords := []string{"delete_file", "read_file", "write_file", "delete_user", "archive_file"} // "delete the file"
	tests := []struct {
		name  string
		cfg   toolrouter.Config
		text  string
		check func(t *testing.T, offered []string)
	}{
		{"one match is enough", toolrouter.Config{MinMatches: 1}, "remove that document", func(t *testing.T, got []string) {
			if want := append(slices.Clone(always), "delete_file"); !slices.Equal(got, want) {
				t.Errorf("offer %v, want exactly %v (the one nearest)", got, want)
			}
		}},
		{"the default fills up to three", toolrouter.Config{}, "remove that document", func(t *testing.T, got []string) {
			if n := len(got) - len(always); n < 2 || n > 3 || !slices.Contains(got, "delete_file") {
				t.Errorf("offer %v: want delete_file among at most 3 nearest", got)
			}
		}},
		{"five keyword hits under a bound of eight", toolrouter.Config{MinMatches: 8, Similarity: -1}, "delete the file", func(t *testing.T, got []string) {
			for _, k := range keywords {
				if !slices.Contains(got, k) {
					t.Errorf("offer %v: want the keyword hit %s", got, k)
				}
			}
			// The keyword hits (the always-on tools among them when they match) and the nearest make 8.
			if len(got) <= len(always)+len(keywords) || len(got) > len(always)+8 {
				t.Errorf("offer %v: want the fallback to add the nearest tools, up to 8 found in all", got)
			}
		}},
		{"nothing near enough", toolrouter.Config{Similarity: 0.999}, "remove that document", func(t *testing.T, got []string) {
			if !slices.Equal(got, always) {
				t.Errorf("offer %v, want only the always-on tools %v", got, always)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := toolrouter.New(toolrouter.Deps{Embedder: model}, tc.cfg).Catalog(catalog()).Offer(t.Context(), agent.ToolQuery{Text: tc.text})
			tc.check(t, names(got))
		})
	}
}
