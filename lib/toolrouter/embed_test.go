package toolrouter_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"testing"

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
